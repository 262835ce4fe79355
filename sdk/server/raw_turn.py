"""`RawTurn`: one engine request for a raw prompt (token ids in, text out), for `/v1/completions`.

No chat template, no parser: the engine's tokens are detokenised incrementally (text held while it
ends inside a UTF-8 sequence, with the previous tokens as context so word-initial spaces come out
right), cut at the first stop string (`StopScanner`, shared with the chat turn), and reported with
their logprobs. As with `ServerTurn`, `start()` waits for the engine's first answer, so an admission
refusal is still a clean 429/503 before any byte, and `close()` always frees the KV blocks.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from parley.backends.local.engine_port import EnginePort
from parley.backends.local.turn import StopScanner
from parley.local_engine.config import SamplingParams
from parley.local_engine.errors import AdmissionError, InvalidRequestError, RequestAborted
from parley.local_engine.hooks import TokenHook
from parley.local_engine.outputs import StreamDelta
from parley.local_engine.tokenizer import Tokenizer
from parley.server.errors import ApiError, ErrorKind, engine_error

__all__ = ["Detokenizer", "RawEnd", "RawPiece", "RawTurn"]

_MAX_UTF8_HOLD = 6
"""Tokens to wait for the rest of a UTF-8 sequence before giving up and emitting U+FFFD."""


class Detokenizer:
    """Token ids in, new text out, decoding a short window so merges at token boundaries come out right."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, ids: tuple[int, ...] | list[int], *, final: bool = False) -> str:
        self.ids.extend(ids)
        if self.read >= len(self.ids):
            return ""
        before = self.tokenizer.decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        now = self.tokenizer.decode(self.ids[self.prefix :], skip_special_tokens=True)
        if now.endswith("\ufffd") and not final and len(self.ids) - self.read < _MAX_UTF8_HOLD:
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return str(now[len(before) :] if now.startswith(before) else now)


@dataclass(frozen=True)
class RawPiece:
    text: str
    logprobs: list[tuple[str, float, list[tuple[str, float]]]]
    """(token text, logprob, top alternatives) for each token that produced this text."""


@dataclass(frozen=True)
class RawEnd:
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float | None
    e2e_s: float


class RawTurn:
    """`await start()`, then `async for item in events()` (pieces, then one `RawEnd`); `close()` always."""

    def __init__(
        self,
        engine: EnginePort,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        stops: tuple[str, ...],
        tenant: str,
        request_id: str,
        deadline_s: float | None,
        arrival: float,
        hook: TokenHook | None = None,
    ) -> None:
        self.engine = engine
        self.prompt_ids = prompt_ids
        self.params = params
        self.stops = stops
        self.tenant = tenant
        self.request_id = request_id
        self.deadline_s = deadline_s
        self.arrival = arrival
        self.hook = hook
        self._stream: AsyncIterator[StreamDelta] | None = None
        self._first: StreamDelta | None = None
        self._first_at: float | None = None
        self._finished = False

    async def start(self) -> None:
        remaining = None if self.deadline_s is None else self.deadline_s - (time.perf_counter() - self.arrival)
        if remaining is not None and remaining <= 0:
            self._finished = True
            raise ApiError("the deadline passed before the request reached the engine", kind=ErrorKind.OVERLOADED,
                           code="deadline_unreachable", retry_after_s=1.0)
        self._stream = self.engine.stream(self.prompt_ids, self.params, hooks=self.hook, tenant=self.tenant,
                                          request_id=self.request_id, deadline_s=remaining)
        try:
            self._first = await anext(self._stream, None)
            self._first_at = time.perf_counter()
        except (AdmissionError, RequestAborted, InvalidRequestError) as exc:
            self._finished = True
            raise engine_error(exc) from None

    async def events(self) -> AsyncIterator[RawPiece | RawEnd]:
        detok = Detokenizer(self.engine.tokenizer)
        stops = StopScanner(self.stops)
        prompt_tokens, cached, output = len(self.prompt_ids), 0, 0
        ttft: float | None = None
        reason = "stop"
        delta = self._first
        try:
            while delta is not None:
                prompt_tokens, cached = delta.prompt_tokens, delta.cached_tokens
                if delta.token_ids and ttft is None:
                    ttft = (self._first_at or time.perf_counter()) - self.arrival
                output += len(delta.token_ids)
                text = stops.push(detok.push(delta.token_ids, final=delta.finished))
                logprobs = [self._logprob(lp) for lp in delta.logprobs or ()]
                if text or logprobs:
                    yield RawPiece(text, logprobs)
                if stops.stopped:
                    reason = "stop"
                    break
                if delta.finished:
                    if delta.finish_reason == "abort":
                        raise ApiError("request dropped by the engine (deadline passed or aborted)",
                                       kind=ErrorKind.OVERLOADED, retry_after_s=1.0)
                    reason = "length" if delta.finish_reason == "length" else "stop"
                    break
                delta = await anext(self._stream, None) if self._stream is not None else None
            tail = stops.flush() if not stops.stopped else ""
            if tail:
                yield RawPiece(tail, [])
        except RequestAborted as exc:
            raise engine_error(exc) from None
        finally:
            await self.close()
        yield RawEnd(reason, prompt_tokens, cached, output, ttft, time.perf_counter() - self.arrival)

    def _logprob(self, lp: Any) -> tuple[str, float, list[tuple[str, float]]]:
        decode = self.engine.tokenizer.decode
        top = sorted(lp.top.items(), key=lambda kv: -kv[1])[: self.params.logprobs or 0]
        return str(decode([lp.token_id])), float(lp.logprob), [(str(decode([t])), float(v)) for t, v in top]

    async def close(self) -> None:
        if self._finished:
            return
        self._finished = True
        self.engine.abort(self.request_id)
        stream, self._stream = self._stream, None
        if stream is not None and hasattr(stream, "aclose"):
            await stream.aclose()
