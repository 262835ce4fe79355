"""The routes decode messages through `parley.protocol`'s decoders: one set of rules per wire format.

Each body below passes the strict schema; the route's conversation (or its 400) must be exactly what
`protocol.*.decode_request` gives for the raw JSON, so no rule can live in only one of the two.
"""

from __future__ import annotations

from typing import Any

import pytest

from parley.protocol import ProtocolError
from parley.protocol import anthropic as anthropic_wire
from parley.protocol import openai as openai_wire
from parley.server import anthropic_schema as an
from parley.server import openai_schema as oa
from parley.server.anthropic_routes import to_conversation as anthropic_conversation
from parley.server.errors import ApiError
from parley.server.openai_routes import to_conversation as openai_conversation
from parley.server.validation import validate_as

USER = {"role": "user", "content": "hi"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
ANSWER = {"role": "tool", "tool_call_id": "call_1", "content": "1"}
USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": None}}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "1"}]}
HOUR = {"type": "ephemeral", "ttl": "1h"}

OPENAI_BODIES: dict[str, list[dict[str, Any]]] = {
    "text and names": [{"role": "system", "content": "s", "name": "boss"}, {**USER, "name": "ann"}],
    "part lists": [{"role": "developer", "content": [{"type": "text", "text": "d"}]},
                   {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    "tool loop": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "r"},
                  ANSWER, {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}, USER],
    "image": [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url",
                                                                          "image_url": {"url": "u"}}]}],
    "orphan tool message": [USER, ANSWER],
    "duplicate call id": [USER, {"role": "assistant", "tool_calls": [CALL]}, ANSWER,
                          {"role": "assistant", "tool_calls": [CALL]}],
    "arguments not JSON": [USER, {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f",
                                                                                             "arguments": "{"}}]}],
    "arguments not an object": [USER, {"role": "assistant",
                                       "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[]"}}]}],
}

ANTHROPIC_BODIES: dict[str, dict[str, Any]] = {
    "system string": {"system": "s", "messages": [USER]},
    "system blocks with a mark": {"system": [{"type": "text", "text": "a", "cache_control": HOUR},
                                             {"type": "text", "text": "b"}], "messages": [USER]},
    "tool loop with thinking": {"messages": [
        USER,
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                                          {"type": "redacted_thinking", "data": "x"}, USE]},
        {"role": "user", "content": [{"type": "text", "text": "first"}, {**RESULT, "cache_control": HOUR}]},
    ]},
    "image": {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}]},
    "tool_result in an assistant message": {"messages": [USER, {"role": "assistant", "content": [RESULT]}]},
    "tool_result answering nothing": {"messages": [{"role": "user", "content": [RESULT]}]},
    "tool_use left unanswered": {"messages": [USER, {"role": "assistant", "content": [USE]}, USER]},
    "tool_use at the end": {"messages": [USER, {"role": "assistant", "content": [USE]}]},
    "thinking in a user message": {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
    "repeated tool_use id": {"messages": [USER, {"role": "assistant", "content": [USE, USE]},
                                          {"role": "user", "content": [RESULT]}]},
    "prefill": {"messages": [USER, {"role": "assistant", "content": "The answer is"}]},
}


def _same(route: Any, decode: Any) -> None:
    try:
        expected = decode()
    except ProtocolError as exc:
        with pytest.raises(ApiError) as caught:
            route()
        assert (caught.value.status, caught.value.param, caught.value.message) == (400, exc.param, str(exc))
        return
    assert route() == expected


@pytest.mark.parametrize("name", OPENAI_BODIES)
def test_chat_completions_route_decodes_as_the_protocol_does(name: str) -> None:
    body = {"model": "m", "messages": OPENAI_BODIES[name]}
    parsed = validate_as(oa.ChatCompletionRequest, body)
    _same(lambda: openai_conversation(parsed), lambda: openai_wire.decode_request(body)[0])


@pytest.mark.parametrize("name", ANTHROPIC_BODIES)
def test_messages_and_count_tokens_routes_decode_as_the_protocol_does(name: str) -> None:
    body = {"model": "m", "max_tokens": 8, **ANTHROPIC_BODIES[name]}
    parsed = validate_as(an.MessagesRequest, body)
    counted = validate_as(an.CountTokensRequest, {k: v for k, v in body.items() if k != "max_tokens"})

    def decode() -> Any:
        return anthropic_wire.decode_request(body, allow_prefill=False)[0]

    _same(lambda: anthropic_conversation(parsed), decode)
    _same(lambda: anthropic_conversation(counted), decode)


def test_anthropic_replies_encode_blocks_as_requests_do() -> None:
    from parley.protocol import Message, ReasoningPart, Role, TextPart, ToolCall
    from parley.server.anthropic_routes import _content_json

    message = Message(role=Role.ASSISTANT, parts=[ReasoningPart(text="hm"), TextPart(text="hi"),
                                                  ToolCall(id="call_0", name="f", arguments='{"a": 1}')])
    assert _content_json(message) == [
        {"type": "thinking", "thinking": "hm", "signature": ""},
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "call_0", "name": "f", "input": {"a": 1}},
    ]
    assert _content_json(Message(role=Role.ASSISTANT, parts=[])) == []
