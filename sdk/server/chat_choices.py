"""Chat completions with `n > 1`: `n` independent turns on one prompt, answered as `n` choices.

Each choice is its own engine request (`ServerTurn`), all admitted before the response starts; the
prompt's KV blocks are shared through the prefix cache, and each draw has its own random stream
(`seed + i` when a seed is given, fresh randomness otherwise), as vLLM's `n` gives. A plain answer
holds the `n` messages in order; a stream interleaves the choices' chunks (each with its `index`)
as their tokens come, then the usage chunk if asked for, then `data: [DONE]`. Usage counts the
prompt once and every choice's tokens, as OpenAI's does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from parley.protocol import ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart
from parley.server.context import ServerState, arrival_of, run_or_cancel_on_disconnect
from parley.server.errors import ApiError
from parley.server.streaming import SSE_HEADERS, observe_end, sse_data
from parley.server.turn import LogprobChunk, ServerTurn, TurnEnd, WireTurn

__all__ = ["many_choices"]


def _draw(wire: WireTurn, i: int) -> WireTurn:
    """The `i`-th draw: the same request on its own random stream."""
    sampling = wire.request.sampling
    seed = None if sampling.seed is None else sampling.seed + i
    return replace(wire, request=replace(wire.request, sampling=replace(sampling, seed=seed)))


def _delta(item: object) -> dict[str, Any] | None:
    """A turn item as a chat chunk's `delta` (the single-choice route's mapping)."""
    if isinstance(item, TextDelta):
        return {"content": item.text}
    if isinstance(item, ReasoningDelta):
        return {"reasoning_content": item.text}
    if isinstance(item, ToolCallStart):
        return {"tool_calls": [{"index": item.index, "id": item.id, "type": "function",
                                "function": {"name": item.name, "arguments": ""}}]}
    if isinstance(item, ToolCallDelta):
        return {"tool_calls": [{"index": item.index, "function": {"arguments": item.arguments_delta}}]}
    return None


def _usage(ends: list[TurnEnd]) -> dict[str, Any]:
    prompt, completion = ends[0].prompt_tokens, sum(e.output_tokens for e in ends)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": ends[0].cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": sum(e.reasoning_tokens for e in ends)}}


async def many_choices(
    request: Request, state: ServerState, wire: WireTurn, n: int, *, model: str, completion_id: str, created: int,
    stream: bool, include_usage: bool,
) -> Response:
    from parley.server.openai_routes import _logprob_json, _message_json

    turns = [ServerTurn(state, _draw(wire, i), arrival=arrival_of(request)) for i in range(n)]

    async def close_all() -> None:
        for turn in turns:
            await turn.close()

    try:
        await run_or_cancel_on_disconnect(request, asyncio.gather(*(t.start() for t in turns)))
    except BaseException:
        await close_all()
        raise
    head = {"id": completion_id, "created": created, "model": model}

    async def collect(i: int, turn: ServerTurn) -> tuple[dict[str, Any], TurnEnd]:
        logprobs: list[dict[str, Any]] = []
        async for item in turn.events():
            if isinstance(item, LogprobChunk):
                logprobs.extend(_logprob_json(item))
            elif isinstance(item, TurnEnd):
                observe_end(state.metrics, item)
                return {"index": i, "message": _message_json(item), "finish_reason": item.finish_reason,
                        "logprobs": {"content": logprobs} if turn.logprobs is not None else None}, item
        raise ApiError("the turn ended without a result")

    if not stream:
        try:
            done = await run_or_cancel_on_disconnect(request, asyncio.gather(*(collect(i, t) for i, t in
                                                                              enumerate(turns))))
        finally:
            await close_all()
        return JSONResponse({**head, "object": "chat.completion", "choices": [c for c, _ in done],
                             "usage": _usage([e for _, e in done]), "system_fingerprint": None})
    return StreamingResponse(_stream(state, turns, head, include_usage), media_type="text/event-stream",
                             headers=SSE_HEADERS, background=BackgroundTask(close_all))


async def _stream(
    state: ServerState, turns: list[ServerTurn], head: dict[str, Any], include_usage: bool
) -> AsyncIterator[str]:
    from parley.server.openai_routes import _logprob_json

    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(i: int, turn: ServerTurn) -> None:
        try:
            async for item in turn.events():
                await queue.put((i, item))
        except ApiError as exc:
            await queue.put((i, exc))
        finally:
            await queue.put((i, None))

    def chunk(i: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        body: dict[str, Any] = {**head, "object": "chat.completion.chunk",
                                "choices": [{"index": i, "delta": delta, "logprobs": logprobs,
                                             "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return sse_data(body)

    tasks = [asyncio.create_task(pump(i, t)) for i, t in enumerate(turns)]
    ends: dict[int, TurnEnd] = {}
    try:
        for i in range(len(turns)):
            yield chunk(i, {"role": "assistant", "content": ""})
        running = len(turns)
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, ApiError):
                yield sse_data(item.body("openai"))
            elif isinstance(item, TurnEnd):
                observe_end(state.metrics, item)
                ends[i] = item
                yield chunk(i, {}, finish=item.finish_reason)
            elif isinstance(item, LogprobChunk):
                yield chunk(i, {"content": ""}, logprobs={"content": _logprob_json(item)})
            elif (delta := _delta(item)) is not None:
                yield chunk(i, delta)
        if include_usage and len(ends) == len(turns):
            yield sse_data({**head, "object": "chat.completion.chunk", "choices": [],
                            "usage": _usage([ends[i] for i in range(len(turns))])})
    finally:
        for task in tasks:
            task.cancel()
        for turn in turns:
            await turn.close()
    yield "data: [DONE]\n\n"
