"""The model phase of a run: one request to the backend, one validated assistant turn back.

The turn is taken with `generate`, or with `stream` when the caller wants events (they are
forwarded as they come). What the model returns is then made safe for the rest of the loop: tool
call ids that are empty or that repeat an id already used in the run (a real failure of small
local models and of some proxies) are replaced by fresh unique ids, so results can never be paired
with the wrong call.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from parley.backends.base import Backend, ModelRequest, ModelResponse
from parley.errors import AgentError
from parley.protocol import Event, Message, MessageEnd, Role, ToolCall, Usage, UsageEvent

EventSink = Callable[[Any], Awaitable[None]]


async def take_turn(backend: Backend, request: ModelRequest, emit: EventSink | None) -> ModelResponse:
    if emit is None:
        return await backend.generate(request)
    messages: list[Message] = []
    usage = Usage()
    finish = "stop"
    event: Event
    async for event in backend.stream(request):
        await emit(event)
        if isinstance(event, MessageEnd):
            messages.append(event.message)
            finish = event.finish_reason or finish
        elif isinstance(event, UsageEvent):
            usage = usage + event.usage
    if not messages:
        raise AgentError(f"backend {backend.name!r} ended its stream without a message")
    return ModelResponse(messages=messages, usage=usage, finish_reason=finish, model=backend.name)


def unique_call_ids(messages: list[Message], seen: set[str], turn: int) -> list[Message]:
    """Return `messages` with every tool call id unique within the run (`seen` is updated)."""
    out: list[Message] = []
    counter = itertools.count(1)
    for message in messages:
        if message.role is not Role.ASSISTANT or not message.tool_calls:
            out.append(message)
            continue
        changed = False
        parts: list[Any] = []
        for part in message.parts:
            if isinstance(part, ToolCall):
                call_id = part.id
                if not call_id or call_id in seen:
                    base = call_id or "call"
                    call_id = f"{base}_t{turn}_{next(counter)}"
                    while call_id in seen:
                        call_id = f"{base}_t{turn}_{next(counter)}"
                    part = part.model_copy(update={"id": call_id})
                    changed = True
                seen.add(call_id)
            parts.append(part)
        out.append(message.model_copy(update={"parts": parts}) if changed else message)
    return out
