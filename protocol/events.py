"""Streaming events shared by every backend and codec stream parser.

A stream is a sequence of these, discriminated by `kind`. Stream parsers never raise mid-stream:
malformed input becomes an `ErrorEvent`, the partial message is flushed, and parsing goes on.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from parley.protocol.envelope import Message, ToolCall
from parley.protocol.usage import Usage


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextDelta(_Event):
    kind: Literal["text_delta"] = "text_delta"
    text: str
    channel: str | None = None


class ReasoningDelta(_Event):
    kind: Literal["reasoning_delta"] = "reasoning_delta"
    text: str
    signature: str | None = None


class ToolCallStart(_Event):
    kind: Literal["tool_call_start"] = "tool_call_start"
    index: int
    id: str
    name: str


class ToolCallDelta(_Event):
    """A fragment of a tool call's JSON arguments."""

    kind: Literal["tool_call_delta"] = "tool_call_delta"
    index: int
    arguments_delta: str


class ToolCallEnd(_Event):
    kind: Literal["tool_call_end"] = "tool_call_end"
    index: int
    call: ToolCall


class MessageEnd(_Event):
    kind: Literal["message_end"] = "message_end"
    message: Message
    finish_reason: str | None = None


class UsageEvent(_Event):
    kind: Literal["usage"] = "usage"
    usage: Usage


class ToolCallRepeated(_Event):
    """The run answered a tool call from an identical earlier one instead of running it (the repeat rule).

    `action` is ``reused`` (the model got the earlier outcome, marked as a repeat) or ``error`` (the
    tool's ``on_repeat="error"``); the call's result follows as a tool `MessageEnd`.
    """

    kind: Literal["tool_call_repeated"] = "tool_call_repeated"
    call_id: str
    tool_name: str
    original_call_id: str
    action: Literal["reused", "error"]


class ErrorEvent(_Event):
    """Something went wrong in the stream; `code` is machine-readable."""

    kind: Literal["error"] = "error"
    code: str
    message: str


PlainEvent = Annotated[
    TextDelta
    | ReasoningDelta
    | ToolCallStart
    | ToolCallDelta
    | ToolCallEnd
    | MessageEnd
    | UsageEvent
    | ToolCallRepeated
    | ErrorEvent,
    Field(discriminator="kind"),
]
"""Every event a run's own model turns and tool calls produce (what an `AgentToolEvent` carries)."""


class AgentToolEvent(_Event):
    """An event of an agent running as a tool (`Agent.as_tool`) inside a streamed parent run.

    `event` is the event exactly as the child run produced it (a text or reasoning delta, a tool
    call's start/delta/end, a tool result as a tool `MessageEnd`, usage, ...). `path` is the chain of
    call ids from the streamed run down to the run that produced it: ``[parent_call_id]`` for a
    child, ``[parent_call_id, child_call_id]`` for a grandchild — the prefix of the `path` an
    `Interruption` raised in that run carries. `agent` names the agent that produced it. Nested
    children arrive as one `AgentToolEvent` with the full path, never as wrappers of wrappers.

    A child's `UsageEvent`s come wrapped too, so summing the top-level `UsageEvent`s of a stream
    gives the parent's own usage; `RunResult.usage` is the parent's plus its children's.
    """

    kind: Literal["agent_tool"] = "agent_tool"
    path: list[str]
    agent: str
    event: PlainEvent


Event = Annotated[
    TextDelta
    | ReasoningDelta
    | ToolCallStart
    | ToolCallDelta
    | ToolCallEnd
    | MessageEnd
    | UsageEvent
    | ToolCallRepeated
    | ErrorEvent
    | AgentToolEvent,
    Field(discriminator="kind"),
]
