"""`POST /v1/completions` (OpenAI's legacy text completions, as vLLM serves them), `/tokenize`, `/detokenize`.

Each prompt (text, token ids, or a batch of either) runs `n` times as separate engine requests
(`RawTurn`), all admitted before the response starts; they share the prompt's KV blocks through
the prefix cache, and each has its own random stream (`seed + i` when a seed is given, fresh
randomness otherwise), so the `n` completions are independent draws. Choices are numbered prompt
by prompt (`prompt_index * n + i`). Streams interleave the choices' chunks as their tokens come
and end with `data: [DONE]`; `usage` counts each prompt once and every choice's tokens.
`structured_outputs` and `grammar` constrain every draw from its first token, as on chat.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from parley.backends.errors import LocalRequestError
from parley.backends.local.constraints import check_schema, compile_constraint
from parley.constrained import BackendUnavailableError, ConstraintHook, Grammar, JsonSchema, Spec
from parley.local_engine.config import SamplingParams
from parley.local_engine.errors import InvalidRequestError
from parley.server import completions_schema as cs
from parley.server.context import (
    ServerState,
    arrival_of,
    deadline_from,
    endpoint,
    read_json,
    run_or_cancel_on_disconnect,
    state_of,
    tenant_of,
)
from parley.server.errors import ApiError, ErrorKind, invalid
from parley.server.raw_turn import RawEnd, RawPiece, RawTurn
from parley.server.streaming import SSE_HEADERS, sse_data
from parley.server.tenants import cache_salt
from parley.server.validation import validate_as

__all__ = ["completions", "detokenize", "tokenize"]


def _prompt_ids(state: ServerState, prompt: str | list[int], param: str) -> list[int]:
    if isinstance(prompt, str):
        return [int(t) for t in state.engine.tokenizer.encode(prompt, add_special_tokens=True)]
    vocab = state.engine.vocab_size
    for j, token in enumerate(prompt):
        if not 0 <= token < vocab:
            raise invalid(f"{param}[{j}]: token id {token} is outside the vocabulary (0..{vocab - 1})", f"{param}[{j}]")
    return list(prompt)


def _params(parsed: cs.CompletionRequest, prompt_len: int, limit: int, seed: int | None, param: str) -> SamplingParams:
    room = limit - prompt_len
    if room < 1:
        raise invalid(f"{param}: the prompt is {prompt_len} tokens; this model's context length is {limit} tokens "
                      "(prompt plus output must fit)", param, "context_length_exceeded")
    max_tokens = parsed.max_tokens if parsed.max_tokens is not None else room
    if max_tokens > room:
        raise invalid(f"max_tokens is {max_tokens}, but the prompt takes {prompt_len} of the {limit}-token context, "
                      f"leaving {room}", "max_tokens", "context_length_exceeded")
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=1.0 if parsed.temperature is None else parsed.temperature,
            top_p=1.0 if parsed.top_p is None else parsed.top_p, top_k=parsed.top_k or 0, seed=seed,
            logprobs=parsed.logprobs, ignore_eos=bool(parsed.ignore_eos), min_tokens=parsed.min_tokens or 0,
            repetition_penalty=1.0 if parsed.repetition_penalty is None else parsed.repetition_penalty,
            frequency_penalty=parsed.frequency_penalty or 0.0, presence_penalty=parsed.presence_penalty or 0.0,
            min_p=parsed.min_p or 0.0,
        )
    except InvalidRequestError as exc:
        raise invalid(str(exc)) from None


def _constraint(parsed: cs.CompletionRequest) -> tuple[Spec, str] | None:
    """The request's constraint and the field that set it (None: unconstrained)."""
    from parley.server.openai_routes import _constraint_of, _schema_of

    so = parsed.structured_outputs
    if so is not None and so.json_ is not None:
        return JsonSchema(_schema_of(so.json_)), "structured_outputs.json"
    if so is not None:
        return _constraint_of(so)
    if parsed.grammar is not None:
        return Grammar(parsed.grammar), "grammar"
    return None


def _hook(state: ServerState, constraint: tuple[Spec, str] | None) -> ConstraintHook | None:
    """A fresh matcher per draw (matchers hold their position); the grammar may end at end-of-sequence."""
    if constraint is None:
        return None
    spec, param = constraint
    if isinstance(spec, JsonSchema):
        try:
            check_schema(spec.schema, param)
        except LocalRequestError as exc:
            raise invalid(str(exc), param, exc.code) from None
    eos = getattr(state.engine.tokenizer, "eos_token_id", None)
    try:
        matcher = compile_constraint(spec, state.engine, [eos] if isinstance(eos, int) else [], param)
    except LocalRequestError as exc:
        raise invalid(str(exc), param, exc.code) from None
    except BackendUnavailableError as exc:  # our installation's fault, not the client's
        raise ApiError(f"structured output is unavailable: {exc}", kind=ErrorKind.INTERNAL) from None
    return ConstraintHook(matcher)


def _logprobs_json(entries: list[tuple[str, float, list[tuple[str, float]]]], offset: int) -> dict[str, Any]:
    tokens, values, tops, offsets = [], [], [], []
    for token, value, top in entries:
        tokens.append(token)
        values.append(value)
        tops.append(dict(top))
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


class _Choice:
    """One of the request's completions: its turn, and the prompt text `echo` puts first."""

    def __init__(self, index: int, turn: RawTurn, echo: str) -> None:
        self.index = index
        self.turn = turn
        self.echo = echo


@endpoint("openai", "completions")
async def completions(request: Request) -> Response:
    state = state_of(request)
    tenant = tenant_of(request)
    parsed = validate_as(cs.CompletionRequest, await read_json(request))
    state.check_model(parsed.model)
    salt = cache_salt(tenant, parsed.cache_salt)
    deadline = deadline_from(request, parsed.deadline_s)
    batched = len(parsed.prompts) > 1
    base = uuid.uuid4().hex
    constraint = _constraint(parsed)
    choices: list[_Choice] = []
    prompt_counts: list[int] = []
    for p, prompt in enumerate(parsed.prompts):
        param = f"prompt[{p}]" if batched else "prompt"
        ids = _prompt_ids(state, prompt, param)
        prompt_counts.append(len(ids))
        echo = (prompt if isinstance(prompt, str) else state.engine.tokenizer.decode(ids)) if parsed.echo else ""
        for i in range(parsed.n):
            seed = None if parsed.seed is None else parsed.seed + i
            params = _params(parsed, len(ids), state.engine.max_model_len, seed, param)
            turn = RawTurn(state.engine, ids, params, stops=parsed.stops, tenant=salt,
                           request_id=f"{base}-{p}-{i}", deadline_s=deadline, arrival=arrival_of(request),
                           hook=_hook(state, constraint))
            choices.append(_Choice(p * parsed.n + i, turn, str(echo)))

    async def close_all() -> None:
        for choice in choices:
            await choice.turn.close()

    try:
        await run_or_cancel_on_disconnect(request, asyncio.gather(*(c.turn.start() for c in choices)))
    except BaseException:
        await close_all()
        raise
    completion_id = "cmpl-" + base
    created = int(time.time())
    if parsed.stream:
        include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
        stream = _stream(state, parsed, choices, prompt_counts, completion_id, created, include_usage)
        return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS,
                                 background=BackgroundTask(close_all))
    try:
        ends = await run_or_cancel_on_disconnect(request, asyncio.gather(*(_collect(c, parsed) for c in choices)))
    finally:
        await close_all()
    body = {
        "id": completion_id, "object": "text_completion", "created": created, "model": parsed.model,
        "choices": [entry for entry, _ in ends],
        "usage": _usage(state, prompt_counts, [end for _, end in ends], parsed.n),
        "system_fingerprint": None,
    }
    return JSONResponse(body)


async def _collect(choice: _Choice, parsed: cs.CompletionRequest) -> tuple[dict[str, Any], RawEnd]:
    text = choice.echo
    logprobs: list[tuple[str, float, list[tuple[str, float]]]] = []
    async for item in choice.turn.events():
        if isinstance(item, RawPiece):
            text += item.text
            logprobs.extend(item.logprobs)
        else:
            entry = {"index": choice.index, "text": text, "finish_reason": item.finish_reason,
                     "logprobs": _logprobs_json(logprobs, 0) if parsed.logprobs is not None else None}
            return entry, item
    raise ApiError("the completion ended without a result")


def _usage(state: ServerState, prompt_counts: list[int], ends: list[RawEnd], n: int) -> dict[str, Any]:
    prompt = sum(prompt_counts)
    completion = sum(end.output_tokens for end in ends)
    cached = sum(end.cached_tokens for end in ends[::n])  # the first draw of each prompt: what its prompt cost
    state.metrics.inc("prompt_tokens_total", sum(end.prompt_tokens for end in ends))
    state.metrics.inc("cached_prompt_tokens_total", sum(end.cached_tokens for end in ends))
    state.metrics.inc("generation_tokens_total", completion)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _stream(
    state: ServerState, parsed: cs.CompletionRequest, choices: list[_Choice], prompt_counts: list[int],
    completion_id: str, created: int, include_usage: bool,
) -> AsyncIterator[str]:
    queue: asyncio.Queue[tuple[_Choice, RawPiece | RawEnd | ApiError | None]] = asyncio.Queue()

    async def pump(choice: _Choice) -> None:
        try:
            async for item in choice.turn.events():
                await queue.put((choice, item))
        except ApiError as exc:
            await queue.put((choice, exc))
        finally:
            await queue.put((choice, None))

    def chunk(index: int, text: str, finish: str | None = None, logprobs: Any = None) -> str:
        body: dict[str, Any] = {"id": completion_id, "object": "text_completion", "created": created,
                                "model": parsed.model,
                                "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                             "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return sse_data(body)

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    ends: dict[int, RawEnd] = {}
    offsets = {c.index: len(c.echo) for c in choices}
    try:
        for c in choices:
            if c.echo:
                yield chunk(c.index, c.echo)
        running = len(choices)
        while running:
            choice, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, ApiError):
                yield sse_data(item.body("openai"))
            elif isinstance(item, RawPiece):
                logprobs = _logprobs_json(item.logprobs, offsets[choice.index]) if parsed.logprobs is not None \
                    else None
                offsets[choice.index] += len(item.text)
                yield chunk(choice.index, item.text, logprobs=logprobs)
            else:
                ends[choice.index] = item
                yield chunk(choice.index, "", finish=item.finish_reason)
        if include_usage and len(ends) == len(choices):
            usage = _usage(state, prompt_counts, [ends[c.index] for c in choices], parsed.n)
            yield sse_data({"id": completion_id, "object": "text_completion", "created": created,
                            "model": parsed.model, "choices": [], "usage": usage})
    finally:
        for task in tasks:
            task.cancel()
        for c in choices:
            await c.turn.close()
    yield "data: [DONE]\n\n"


# -- vLLM's tokenizer endpoints ----------------------------------------------------------------------
@endpoint("openai", "tokenize")
async def tokenize(request: Request) -> Response:
    """`{"prompt"}` (raw text) or `{"messages"}` (a chat, rendered by the served model's template)."""
    state = state_of(request)
    tenant_of(request)
    parsed = validate_as(cs.TokenizeRequest, await read_json(request))
    if parsed.model is not None:
        state.check_model(parsed.model)
    if parsed.prompt is not None:
        add = parsed.add_special_tokens is not False
        ids = [int(t) for t in state.engine.tokenizer.encode(parsed.prompt, add_special_tokens=add)]
    else:
        from parley.protocol import ProtocolError
        from parley.protocol import openai as openai_wire

        try:
            conversation, _ = openai_wire.decode_request({"messages": parsed.messages})
            ids = list(state.codec.render(conversation, [], reasoning=None))
        except ProtocolError as exc:
            raise invalid(str(exc), exc.param or "messages") from None
    return JSONResponse({"count": len(ids), "max_model_len": state.engine.max_model_len, "tokens": ids,
                         "token_strs": None})


@endpoint("openai", "detokenize")
async def detokenize(request: Request) -> Response:
    state = state_of(request)
    tenant_of(request)
    parsed = validate_as(cs.DetokenizeRequest, await read_json(request))
    if parsed.model is not None:
        state.check_model(parsed.model)
    vocab = state.engine.vocab_size
    for j, token in enumerate(parsed.tokens):
        if not 0 <= token < vocab:
            raise invalid(f"tokens[{j}]: token id {token} is outside the vocabulary (0..{vocab - 1})", f"tokens[{j}]")
    return JSONResponse({"prompt": state.engine.tokenizer.decode(parsed.tokens)})
