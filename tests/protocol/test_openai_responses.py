"""OpenAI Responses API wire JSON: input items, tools, decoding, streaming events, response chains."""

from __future__ import annotations

from typing import Any

import pytest

from parley.protocol import (
    ErrorEvent,
    Message,
    MessageEnd,
    ReasoningDelta,
    ReasoningPart,
    Role,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    ToolSpec,
)
from parley.protocol import openai_responses as wire
from parley.protocol.envelope import DocumentPart, ImagePart
from parley.protocol.errors import OrphanToolResultError, ProtocolError, UnsupportedPartError
from tests.protocol.responses_shapes import (
    CALL_ITEM,
    ENCRYPTED,
    REASONING_ITEM,
    STREAMED_FINAL,
    message_item,
    response,
    stream_events,
    usage,
)

WEATHER = ToolSpec(name="get_weather", description="Get the weather",
                   parameters={"type": "object", "properties": {"location": {"type": "string"}}})


def _assistant_turn() -> Message:
    return Message(role=Role.ASSISTANT, parts=[
        ReasoningPart(text="thinking", signature="rs_1", redacted=ENCRYPTED, provider="openai"),
        TextPart(text="Let me "), TextPart(text="check."),
        ToolCall(id="call_1", name="get_weather", arguments="{\"location\":\"Paris\"}"),
    ])


def test_input_items_in_order() -> None:
    messages = [Message.system("Be brief."), Message.developer("Use metric."), Message.user("Paris?"),
                _assistant_turn(), Message.tool("call_1", "get_weather", "18 C")]
    items = wire.encode_input(messages)
    assert items == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "developer", "content": "Use metric."},
        {"type": "message", "role": "user", "content": "Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}],
         "encrypted_content": ENCRYPTED},
        {"type": "message", "role": "assistant", "content": "Let me check."},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"location\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
    ]
    assert wire.encode_input([Message.developer("x")], developer_role=False)[0]["role"] == "system"


def test_reasoning_items_only_go_back_to_their_provider_and_when_they_can_be_found() -> None:
    parts: list[Any] = [
        ReasoningPart(text="anthropic thought", signature="sig", provider="anthropic"),
        ReasoningPart(text="local thought"),
        ReasoningPart(text="stored only", signature="rs_stored", provider="openai"),
        ReasoningPart(redacted=ENCRYPTED, signature="rs_enc", provider="openai"),
        TextPart(text="done"),
    ]
    message = Message(role=Role.ASSISTANT, parts=parts)
    stateless = wire.encode_input([Message.user("q"), message])
    assert [i.get("id") for i in stateless if i["type"] == "reasoning"] == ["rs_enc"]
    assert stateless[1] == {"type": "reasoning", "id": "rs_enc", "summary": [], "encrypted_content": ENCRYPTED}
    stored = wire.encode_input([Message.user("q"), message], stored=True)
    assert [i["id"] for i in stored if i["type"] == "reasoning"] == ["rs_stored", "rs_enc"]


def test_long_call_ids_are_shortened_the_same_way_for_call_and_output() -> None:
    long_id = "toolu_" + "x" * 60
    messages = [Message.user("q"), Message.assistant(tool_calls=[ToolCall(id=long_id, name="f")]),
                Message.tool(long_id, "f", "ok")]
    items = wire.encode_input(messages)
    assert items[1]["call_id"] == items[2]["call_id"] and len(items[1]["call_id"]) <= 40


def test_orphan_results_and_unsupported_parts_are_refused() -> None:
    with pytest.raises(OrphanToolResultError):
        wire.encode_input([Message.tool("nope", "f", "x")])
    # a tail that answers a stored response's calls (previous_response_id) skips the pairing check
    assert wire.encode_input([Message.tool("c", "f", "x")], check_pairing=False)[0]["type"] == "function_call_output"
    odd = Message(role=Role.ASSISTANT, parts=[ToolResult(call_id="c", name="f", content="x")])
    with pytest.raises(UnsupportedPartError, match="tool_result") as info:
        wire.encode_input([Message.user("q"), odd], check_pairing=False)
    assert info.value.where == "messages[1].content[0]"


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def test_images_and_documents_in_user_messages() -> None:
    message = Message(role=Role.USER, parts=[
        TextPart(text="What is in these?"), ImagePart.from_bytes(PNG), ImagePart.from_url("https://example.com/a.jpg"),
        DocumentPart.from_bytes(b"%PDF-1.4 tiny", title="report.pdf"), DocumentPart.from_url("https://example.com/b.pdf"),
    ])
    [item] = wire.encode_input([message])
    text, data_image, url_image, data_file, url_file = item["content"]
    assert item["role"] == "user" and text == {"type": "input_text", "text": "What is in these?"}
    assert data_image["type"] == "input_image" and data_image["image_url"].startswith("data:image/png;base64,")
    assert url_image == {"type": "input_image", "image_url": "https://example.com/a.jpg", "detail": "auto"}
    assert data_file["file_data"].startswith("data:application/pdf;base64,") and data_file["filename"] == "report.pdf"
    assert url_file == {"type": "input_file", "file_url": "https://example.com/b.pdf"}
    # (a tool result's images: tests/protocol/test_openai_responses_items.py)


def test_tools_choice_and_text_format() -> None:
    strict = ToolSpec(name="s", description="", parameters={"type": "object", "properties": {"a": {"type": "string"}}},
                      strict=True)
    loose, tight = wire.encode_tools([WEATHER, strict])
    assert loose == {"type": "function", "name": "get_weather", "description": "Get the weather",
                     "parameters": WEATHER.parameters, "strict": False}
    assert tight["strict"] is True and tight["parameters"]["additionalProperties"] is False
    assert tight["parameters"]["properties"]["a"]["type"] == ["string", "null"]
    assert wire.encode_tool_choice("required") == "required"
    assert wire.encode_tool_choice(tool_name="get_weather") == {"type": "function", "name": "get_weather"}
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    assert wire.text_format(schema, name="weather report") == {
        "type": "json_schema", "name": "weather_report", "strict": True,
        "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}


def test_build_request() -> None:
    body = wire.build_request("o4-mini", [Message.user("hi")], [WEATHER], tool_choice="auto",
                              parallel_tool_calls=False, stream=True, include=[wire.ENCRYPTED_REASONING],
                              max_output_tokens=100, temperature=None, reasoning={"effort": "low"})
    assert body == {"model": "o4-mini", "input": [{"type": "message", "role": "user", "content": "hi"}],
                    "store": False, "include": ["reasoning.encrypted_content"],
                    "tools": wire.encode_tools([WEATHER]), "tool_choice": "auto", "parallel_tool_calls": False,
                    "stream": True, "max_output_tokens": 100, "reasoning": {"effort": "low"}}
    chained = wire.build_request("o4-mini", [Message.tool("c", "f", "x")], store=True, previous_response_id="resp_1",
                                 check_pairing=False)
    assert chained["previous_response_id"] == "resp_1" and chained["store"] is True and "include" not in chained


def test_decode_a_reasoning_tool_call_response() -> None:
    decoded = wire.decode_response(response([REASONING_ITEM, CALL_ITEM]))
    reasoning, call = decoded.message.parts
    assert isinstance(reasoning, ReasoningPart) and isinstance(call, ToolCall)
    assert reasoning.signature == REASONING_ITEM["id"] and reasoning.redacted == ENCRYPTED
    assert reasoning.provider == "openai" and reasoning.text == REASONING_ITEM["summary"][0]["text"]
    assert call.id == "call_unLAR8MvFNptuiZK6K6HCy5k" and call.parsed_arguments() == {"location": "Paris, France"}
    assert decoded.finish_reason == "tool_calls" and decoded.model == "o4-mini-2025-04-16"
    assert decoded.usage == usage() and decoded.id.startswith("resp_")
    # and the reasoning item goes back exactly as it came
    assert wire.reasoning_item(reasoning) == REASONING_ITEM


def test_decode_text_refusal_incomplete_and_raw_reasoning() -> None:
    text = wire.decode_response(response([message_item("Hello.")]))
    assert text.message.text == "Hello." and text.finish_reason == "stop"
    refused = wire.decode_response(response([message_item("", refusal="I can't help with that.")]))
    assert refused.finish_reason == "refusal" and refused.refusal == "I can't help with that."
    cut = wire.decode_response(response([message_item("Partial")], status="incomplete", incomplete="max_output_tokens"))
    assert cut.finish_reason == "length"
    raw = {"type": "reasoning", "id": "rs_2", "summary": [],
           "content": [{"type": "reasoning_text", "text": "gpt-oss thinks aloud"}]}
    assert wire.decode_response(response([raw])).message.reasoning == "gpt-oss thinks aloud"
    hosted = {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    assert wire.decode_response(response([hosted, message_item("ok")])).message.text == "ok"
    with pytest.raises(ProtocolError):
        wire.decode_response({"id": "resp_x"})


def test_failed_responses_and_error_events_map_to_http_statuses() -> None:
    failed = {**response([]), "status": "failed",
              "error": {"code": "rate_limit_exceeded", "message": "Rate limit reached"}}
    status, body = wire.error_of(failed) or (0, {})
    assert status == 429 and body["error"]["message"] == "Rate limit reached"
    assert wire.error_of(response([message_item("fine")])) is None
    event = {"type": "error", "code": "context_length_exceeded", "message": "Your input exceeds the context window",
             "param": "input", "sequence_number": 3}
    status, body = wire.error_of(event) or (0, {})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert (wire.error_of({"type": "error", "code": "server_error", "message": "x"}) or (0,))[0] == 500


def _feed_all(decoder: wire.StreamDecoder, events: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for event in events:
        out += decoder.feed(event)
    return out + decoder.finish()


def test_stream_events_become_parley_events() -> None:
    decoder = wire.StreamDecoder()
    events = _feed_all(decoder, stream_events(STREAMED_FINAL))
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Need the weather.\n\nCall it."
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Let me check."
    [start] = [e for e in events if isinstance(e, ToolCallStart)]
    assert (start.index, start.id, start.name) == (0, "call_unLAR8MvFNptuiZK6K6HCy5k", "get_weather")
    assert "".join(e.arguments_delta for e in events if isinstance(e, ToolCallDelta)) == CALL_ITEM["arguments"]
    [end] = [e for e in events if isinstance(e, ToolCallEnd)]
    assert end.call.parsed_arguments() == {"location": "Paris, France"}
    assert isinstance(events[-1], MessageEnd) and events[-1].finish_reason == "tool_calls"
    message = events[-1].message
    assert message.reasoning == "Need the weather.\n\nCall it." and message.text == "Let me check."
    assert message.parts[0].redacted == ENCRYPTED and message.parts[0].signature == STREAMED_FINAL["output"][0]["id"]
    assert decoder.usage == usage() and decoder.id == STREAMED_FINAL["id"] and decoder.error is None
    assert not any(isinstance(e, ErrorEvent) for e in events)
    # the streamed reasoning item is sent back as the final one came
    assert wire.reasoning_item(message.parts[0])["encrypted_content"] == ENCRYPTED


def test_stream_builds_the_message_when_completed_has_no_output() -> None:
    final = {**STREAMED_FINAL, "output": []}
    done_events = [e for e in stream_events(final) if e["type"] != "response.output_item.done"]
    decoder = wire.StreamDecoder()
    events = _feed_all(decoder, done_events)
    message = events[-1].message
    assert message.text == "Let me check." and message.tool_calls[0].arguments == CALL_ITEM["arguments"]
    assert sum(isinstance(e, ToolCallEnd) for e in events) == 1 and events[-1].finish_reason == "tool_calls"


def test_stream_errors_and_malformed_events_never_raise() -> None:
    decoder = wire.StreamDecoder()
    [bad] = decoder.feed({"type": "response.output_item.added"})  # no output_index / item
    assert isinstance(bad, ErrorEvent) and bad.code == "malformed_chunk" and decoder.error is None
    failed = {"type": "response.failed", "response": {**response([]), "status": "failed",
                                                      "error": {"code": "server_error", "message": "boom"}}}
    [error] = decoder.feed(failed)
    assert isinstance(error, ErrorEvent) and error.code == "server_error" and decoder.error is not None
    assert decoder.error[0] == 500 and decoder.finish_reason is None


def test_response_chain_finds_the_longest_remembered_prefix() -> None:
    chain = wire.ResponseChain(capacity=2)
    first = [Message.system("s"), Message.user("q")]
    answer = Message.assistant(tool_calls=[ToolCall(id="c", name="f")])
    chain.remember([*first, answer], "resp_1")
    follow = [*first, answer, Message.tool("c", "f", "x")]
    assert chain.find(follow) == ("resp_1", 3)
    assert chain.find(follow, scope="tenant-b") is None  # another tenant never chains onto it
    assert chain.find([*first, answer]) is None  # nothing new to send: no chaining
    edited = [Message.system("s"), Message.user("q2"), answer, Message.tool("c", "f", "x")]
    assert chain.find(edited) is None
    chain.remember([Message.user("a")], "resp_a")
    chain.remember([Message.user("b")], "resp_b")
    assert chain.find(follow) is None  # evicted (capacity 2)
