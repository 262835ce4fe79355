"""`SummaryPart` (a compaction summary) is a kind of text: every codec renders it as its text."""

from __future__ import annotations

from parley.protocol import Conversation, Message, Role, SummaryPart, TextPart, anthropic, harmony, openai
from parley.protocol import openai_responses as responses
from parley.protocol.chat_template import ChatTemplateCodec

SUMMARY = "Summary so far: the user wants the Oslo forecast."


def _conversation(part: TextPart) -> list[Message]:
    return [Message.system("Be brief."), Message(role=Role.USER, parts=[part]), Message.user("and Rome?")]


def test_it_is_typed_in_json_and_loads_back_as_a_summary() -> None:
    message = Message(role=Role.USER, parts=[SummaryPart(text=SUMMARY)])
    text = Conversation(messages=[message]).to_json()
    assert '"kind":"summary"' in text
    back = Conversation.from_json(text).messages[0]
    assert type(back.parts[0]) is SummaryPart and back == message
    assert isinstance(back.parts[0], TextPart) and back.text == SUMMARY


def test_every_codec_renders_it_exactly_as_the_same_text_part() -> None:
    """The wire form of a summary equals that of a plain text part with the same text, codec by codec."""
    as_summary, as_text = _conversation(SummaryPart(text=SUMMARY)), _conversation(TextPart(text=SUMMARY))
    assert anthropic.encode_conversation(as_summary) == anthropic.encode_conversation(as_text)
    assert SUMMARY in str(anthropic.encode_conversation(as_summary)[1])
    assert openai.encode_conversation(as_summary) == openai.encode_conversation(as_text)
    assert SUMMARY in str(openai.encode_conversation(as_summary))
    assert responses.encode_input(as_summary) == responses.encode_input(as_text)
    assert SUMMARY in str(responses.encode_input(as_summary))
    chatml = ChatTemplateCodec(style="chatml")
    assert chatml.render(as_summary) == chatml.render(as_text)
    assert f"<|im_start|>user\n{SUMMARY}<|im_end|>" in chatml.render(as_summary)
    rendered = harmony.render_conversation_for_completion(as_summary).text
    assert rendered == harmony.render_conversation_for_completion(as_text).text and SUMMARY in rendered
