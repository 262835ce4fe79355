"""Envelopes round-trip through JSON and keep their part kinds."""

from __future__ import annotations

import pytest

from parley.protocol import (
    CacheMark,
    Conversation,
    InvalidArgumentsError,
    Message,
    OrphanToolResultError,
    ReasoningPart,
    Role,
    ToolCall,
)


def test_conversation_json_round_trip_keeps_every_field() -> None:
    conversation = Conversation(
        messages=[
            Message.system("sys"),
            Message(role=Role.USER, parts=[], name="alice", cache=CacheMark(ttl="1h")),
            Message(
                role=Role.ASSISTANT,
                channel="commentary",
                recipient="functions.f",
                content_type="json",
                parts=[
                    ReasoningPart(text="", redacted="opaque", provider="anthropic"),
                    ReasoningPart(text="hmm", signature="sig"),
                    ToolCall(id="c1", name="f", arguments={"a": 1}),
                ],
            ),
            Message.tool("c1", "f", "ok", is_error=True),
        ]
    )
    restored = Conversation.from_json(conversation.to_json())
    assert restored == conversation
    assert [p.kind for p in restored.messages[2].parts] == ["reasoning", "reasoning", "tool_call"]


def test_tool_call_arguments_are_json_text() -> None:
    call = ToolCall(id="c", name="f", arguments={"x": [1, 2]})
    assert call.arguments == '{"x":[1,2]}'
    assert call.parsed_arguments() == {"x": [1, 2]}
    with pytest.raises(InvalidArgumentsError):
        ToolCall(id="c", name="f", arguments="not json").parsed_arguments()
    with pytest.raises(InvalidArgumentsError):
        ToolCall(id="c", name="f", arguments="[1]").parsed_arguments()


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValueError):
        Message.model_validate({"role": "wizard", "parts": []})


def test_orphan_tool_result_is_detected() -> None:
    conversation = Conversation(messages=[Message.user("hi"), Message.tool("nope", "f", "x")])
    with pytest.raises(OrphanToolResultError):
        conversation.check_tool_pairing()
