"""Anthropic-compatible route: `POST /v1/messages`.

Validation is strict (`anthropic_schema`); `tool_result` blocks must answer the `tool_use` blocks of
the assistant message right before them, and every `tool_use` must be answered in the next message
(Anthropic's own 400). `thinking.budget_tokens` opens a reasoning section that the reasoning-budget
hook closes after that many tokens. Usage follows Anthropic: `input_tokens` excludes the prompt
tokens our prefix cache served, which are `cache_read_input_tokens`.

Streams emit Anthropic's order: `message_start`, then per content block `content_block_start`,
`content_block_delta`s (`thinking_delta` then `signature_delta`, `text_delta`, `input_json_delta`),
`content_block_stop`, then `message_delta` (stop reason, usage) and `message_stop`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from parley.backends.base import ModelRequest, NamedToolChoice, SamplingSettings, ToolChoice
from parley.protocol import (
    Conversation,
    Message,
    ProtocolError,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolSpec,
)
from parley.protocol import anthropic as anthropic_wire
from parley.reasoning import Reasoning
from parley.server import anthropic_schema as an
from parley.server.context import (
    arrival_of,
    deadline_from,
    endpoint,
    read_json,
    run_or_cancel_on_disconnect,
    state_of,
    tenant_of,
)
from parley.server.errors import ApiError, invalid
from parley.server.streaming import SSE_HEADERS, observe_end, sse_event
from parley.server.tenants import cache_salt
from parley.server.turn import ServerTurn, TurnEnd, WireTurn, rendering_error
from parley.server.validation import validate_as


def to_conversation(request: an.MessagesRequest | an.CountTokensRequest) -> Conversation:
    """The validated system and messages, decoded by the one Messages decoder (`parley.protocol.anthropic`).

    Prefill (a last assistant message) is refused: this server always answers a user message.
    """
    body = request.model_dump(by_alias=True, exclude_none=True)
    try:
        conversation, _ = anthropic_wire.decode_request(body, allow_prefill=False)
    except ProtocolError as exc:
        raise invalid(str(exc), exc.param or "messages") from None
    return conversation


def to_wire_turn(request: an.MessagesRequest, salt: str, deadline_s: float | None) -> WireTurn:
    tools = [
        ToolSpec(name=t.name, description=t.description or "", parameters=t.input_schema, strict=bool(t.strict))
        for t in request.tools or []
    ]
    choice: ToolChoice = "auto" if tools else "none"
    parallel = True
    tc = request.tool_choice
    if isinstance(tc, an.ToolChoiceNone):
        choice = "none"
    elif isinstance(tc, an.ToolChoiceAny):
        choice = "required"
    elif isinstance(tc, an.ToolChoiceTool):
        choice = NamedToolChoice(tc.name)
    if tc is not None and not isinstance(tc, an.ToolChoiceNone) and tc.disable_parallel_tool_use:
        parallel = False
    budget = request.thinking.budget_tokens if isinstance(request.thinking, an.ThinkingEnabled) else None
    fmt = request.output_config.format if request.output_config is not None else None
    model_request = ModelRequest(
        conversation=to_conversation(request),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        output_schema=fmt.schema_ if fmt is not None else None,
        reasoning=Reasoning(budget_tokens=budget) if budget is not None else None,
        tenant=salt,
        sampling=request.settings(
            SamplingSettings(
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k,
                stop=tuple(request.stop_sequences or ()),
            )
        ),
    )
    return WireTurn(
        request=model_request,
        deadline_s=deadline_s,
        params={"output_schema": "output_config.format.schema", "conversation": "messages"},
    )


def _stop_reason(end: TurnEnd) -> str:
    if end.finish_reason == "tool_calls":
        return "tool_use"
    if end.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if end.stop_sequence is not None else "end_turn"


def _usage(end: TurnEnd) -> dict[str, Any]:
    return {
        "input_tokens": end.prompt_tokens - end.cached_tokens,
        "output_tokens": end.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": end.cached_tokens,
    }


def _content_json(message: Message) -> list[dict[str, Any]]:
    """The reply's blocks, encoded as requests encode assistant messages (unsigned thinking kept, signature "")."""
    return anthropic_wire.assistant_blocks(message, unsigned_reasoning=True)


async def _complete(turn: ServerTurn, model: str, message_id: str, request: Request) -> dict[str, Any]:
    end: TurnEnd | None = None
    async for item in turn.events():
        if isinstance(item, TurnEnd):
            end = item
    assert end is not None
    observe_end(state_of(request).metrics, end)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content_json(end.message),
        "stop_reason": _stop_reason(end),
        "stop_sequence": end.stop_sequence,
        "usage": _usage(end),
    }


async def _stream(turn: ServerTurn, model: str, message_id: str, request: Request) -> AsyncIterator[str]:
    open_kind: str | None = None
    index = -1

    def close() -> list[str]:
        nonlocal open_kind
        out: list[str] = []
        if open_kind == "thinking":
            out.append(
                sse_event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": ""},
                    },
                )
            )
        if open_kind is not None:
            out.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        open_kind = None
        return out

    def open_block(kind: str, block: dict[str, Any]) -> list[str]:
        nonlocal open_kind, index
        out = close()
        index += 1
        open_kind = kind
        out.append(
            sse_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        )
        return out

    def delta(body: dict[str, Any]) -> str:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": body})

    start_usage = {
        "input_tokens": turn.prompt_tokens - turn.cached_tokens,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": turn.cached_tokens,
    }
    try:
        yield sse_event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        )
        yield sse_event("ping", {"type": "ping"})
        async for item in turn.events():
            if isinstance(item, ReasoningDelta):
                if open_kind != "thinking":
                    for line in open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""}):
                        yield line
                yield delta({"type": "thinking_delta", "thinking": item.text})
            elif isinstance(item, TextDelta):
                if open_kind != "text":
                    for line in open_block("text", {"type": "text", "text": ""}):
                        yield line
                yield delta({"type": "text_delta", "text": item.text})
            elif isinstance(item, ToolCallStart):
                for line in open_block("tool_use", {"type": "tool_use", "id": item.id, "name": item.name, "input": {}}):
                    yield line
            elif isinstance(item, ToolCallDelta):
                yield delta({"type": "input_json_delta", "partial_json": item.arguments_delta})
            elif isinstance(item, ToolCallEnd):
                for line in close():
                    yield line
            elif isinstance(item, TurnEnd):
                for line in close():
                    yield line
                observe_end(state_of(request).metrics, item)
                yield sse_event(
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": _stop_reason(item), "stop_sequence": item.stop_sequence},
                        "usage": _usage(item),
                    },
                )
                yield sse_event("message_stop", {"type": "message_stop"})
    except ApiError as exc:
        yield sse_event("error", exc.body("anthropic"))
    finally:
        await turn.close()


@endpoint("anthropic", "messages")
async def messages(request: Request) -> Response:
    state = state_of(request)
    tenant = tenant_of(request)
    body = await read_json(request)
    parsed = validate_as(an.MessagesRequest, body)
    state.check_model(parsed.model)
    wire = to_wire_turn(parsed, cache_salt(tenant), deadline_from(request, parsed.deadline_s))
    turn = ServerTurn(state, wire, arrival=arrival_of(request))
    message_id = "msg_" + turn.request_id
    await run_or_cancel_on_disconnect(request, turn.start())
    if parsed.stream:
        return StreamingResponse(
            _stream(turn, parsed.model, message_id, request),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
            background=BackgroundTask(turn.close),
        )
    try:
        result = await run_or_cancel_on_disconnect(request, _complete(turn, parsed.model, message_id, request))
    finally:
        await turn.close()
    return JSONResponse(result)


@endpoint("anthropic", "count_tokens")
async def count_tokens(request: Request) -> Response:
    """The prompt's token count as this server would render it (Anthropic's `messages.count_tokens`)."""
    state = state_of(request)
    tenant_of(request)
    parsed = validate_as(an.CountTokensRequest, await read_json(request))
    state.check_model(parsed.model)
    tools = [
        ToolSpec(name=t.name, description=t.description or "", parameters=t.input_schema, strict=bool(t.strict))
        for t in parsed.tools or []
    ]
    thinking = isinstance(parsed.thinking, an.ThinkingEnabled)
    try:  # rendered as a turn renders it: tools too under tool_choice none (the prompt does not change)
        ids = state.codec.render(to_conversation(parsed), tools, reasoning=thinking)
    except ProtocolError as exc:
        raise rendering_error(exc) from None
    return JSONResponse({"input_tokens": len(ids)})
