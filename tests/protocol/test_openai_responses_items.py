"""Responses API input items read back (`decode_input`), tool results with images, compaction items.

Documented shapes (the OpenAI API reference, as typed by the ``openai`` SDK's
``ResponseInputItemParam.FunctionCallOutput``): a ``function_call_output``'s ``output`` is a string
or a list of ``input_text`` / ``input_image`` / ``input_file`` items; a ``compaction`` item
(``{"type": "compaction", "id", "encrypted_content"}``, from ``context_management`` or
``/responses/compact``) is opaque and goes back in ``input`` unchanged.
"""

from __future__ import annotations

import pytest

from parley.protocol import CompactionPart, Message, ReasoningPart, Role, TextPart, ToolCall, ToolResult
from parley.protocol import openai_responses as wire
from parley.protocol._wire_history import prepare_history
from parley.protocol.envelope import DocumentPart, ImagePart
from parley.protocol.errors import ProtocolError

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
COMPACTION = {"id": "cmp_0123", "type": "compaction", "encrypted_content": "gAAAAB-opaque=="}


def _tool_turn() -> list[Message]:
    result = ToolResult(call_id="call_1", name="screenshot", content="the page",
                        attachments=[ImagePart.from_bytes(PNG), ImagePart.from_url("https://example.com/b.jpg"),
                                     DocumentPart.from_bytes(b"%PDF-1.4 tiny", title="page.pdf")])
    return [
        Message.user("What does the page show?"),
        Message.assistant(tool_calls=[ToolCall(id="call_1", name="screenshot", arguments={"url": "a"})]),
        Message(role=Role.TOOL, parts=[result], name="screenshot"),
    ]


def test_a_tool_result_with_images_is_an_output_list_of_input_items() -> None:
    items = wire.encode_input(_tool_turn())
    output = items[-1]
    assert output["type"] == "function_call_output" and output["call_id"] == "call_1"
    text, data_image, url_image, document = output["output"]
    assert text == {"type": "input_text", "text": "the page"}
    assert data_image["type"] == "input_image" and data_image["image_url"].startswith("data:image/png;base64,")
    assert url_image == {"type": "input_image", "image_url": "https://example.com/b.jpg", "detail": "auto"}
    assert document["type"] == "input_file" and document["filename"] == "page.pdf"
    assert document["file_data"].startswith("data:application/pdf;base64,")
    # a result without media stays a plain string, as before
    plain = wire.encode_input([*_tool_turn()[:2], Message.tool("call_1", "screenshot", "text only")])
    assert plain[-1]["output"] == "text only"


def test_tool_results_with_images_round_trip_with_their_hashes() -> None:
    messages = _tool_turn()
    back = wire.decode_input(wire.encode_input(messages))
    assert back == messages
    sent = messages[2].tool_results[0].attachments
    assert [a.sha256 for a in back[2].tool_results[0].attachments] == [a.sha256 for a in sent]
    assert sent[0].sha256 is not None


def test_decode_input_merges_assistant_items_and_reads_every_role() -> None:
    items = [
        {"type": "message", "role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        COMPACTION,
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc"},
        {"type": "message", "role": "assistant", "content": "calling"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
    ]
    developer, user, assistant, tool = wire.decode_input(items)
    assert developer == Message.developer("be brief") and user == Message.user("hi")
    kinds = [p.kind for p in assistant.parts]
    assert kinds == ["compaction", "reasoning", "text", "tool_call"]
    assert isinstance(assistant.parts[1], ReasoningPart) and assistant.parts[1].redacted == "enc"
    assert tool.tool_results[0].name == "f" and tool.tool_results[0].content == "ok"
    assert wire.encode_input([developer, user, assistant, tool])[2:] == [
        COMPACTION, items[3] | {"summary": []}, items[4], items[5], items[6]]


def test_decode_input_names_a_bad_item() -> None:
    with pytest.raises(ProtocolError) as info:
        wire.decode_input([{"type": "function_call_output", "call_id": "c",
                            "output": [{"type": "input_image", "file_id": "file-1"}]}])
    assert info.value.param == "input[0].output[0]"
    with pytest.raises(ProtocolError) as info:
        wire.decode_input([{"type": "web_search_call"}])
    assert info.value.param == "input[0]"


def test_a_compaction_item_is_kept_verbatim_and_sent_back_only_to_openai() -> None:
    decoded = wire.decode_response({"id": "resp_1", "status": "completed", "output": [
        COMPACTION, {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}]})
    compaction, text = decoded.message.parts
    assert isinstance(compaction, CompactionPart) and compaction.payload == COMPACTION
    assert compaction.provider == "openai" and compaction.text == "" and isinstance(text, TextPart)
    history = [Message.user("go on"), decoded.message, Message.user("next")]
    assert wire.encode_input(history)[1] == COMPACTION  # the same bytes, id included
    # the envelope's JSON keeps it (a RunState or a session row round-trips it)
    assert Message.model_validate_json(decoded.message.model_dump_json()) == decoded.message
    # another provider never sees it (the messages it summarised are still in the history)
    assert not any(isinstance(p, CompactionPart) for m in prepare_history(history, provider="anthropic")
                   for p in m.parts)


def test_a_streamed_compaction_item_lands_in_the_message() -> None:
    decoder = wire.StreamDecoder()
    events = [
        {"type": "response.created", "response": {"id": "resp_2", "model": "gpt-5"}},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": "cmp_0123", "type": "compaction", "encrypted_content": ""}},
        {"type": "response.compaction.compacting", "item_id": "cmp_0123", "output_index": 0, "sequence_number": 2},
        {"type": "response.output_item.done", "output_index": 0, "item": COMPACTION},
        {"type": "response.output_text.delta", "output_index": 1, "delta": "Done."},
        {"type": "response.completed", "response": {"id": "resp_2", "status": "completed", "usage": {}}},
    ]
    for event in events:
        decoder.feed(event)
    decoder.finish()
    (message,) = decoder.messages
    assert [p.kind for p in message.parts] == ["compaction", "text"]
    part = message.parts[0]
    assert isinstance(part, CompactionPart) and part.payload == COMPACTION
