"""One assistant turn on the engine: what both endpoints share.

`TurnSpec` is the endpoint-neutral request (a `Conversation`, tools, output constraints, sampling,
tenant salt, deadline); `Turn` renders it, builds the hooks (grammar, reasoning budget), submits it,
and turns engine deltas into `parley.protocol` events plus a final `TurnEnd`. Admission is decided
before any byte is sent: `start()` waits for the engine's first answer, so a refusal is still a
clean 429/503 with `retry-after`, never a broken stream. However the turn ends — finished,
cancelled by a client that went away, or stopped early by a stop string — `close()` aborts the
engine request, so its KV blocks are returned at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from parley.protocol import (
    Conversation,
    Event,
    Message,
    ReasoningDelta,
    ReasoningPart,
    Role,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolSpec,
)
from parley.server.engine_port import EnginePort
from parley.server.errors import ApiError, ErrorKind, invalid
from parley.server.hooks import build_hooks
from parley.server.prompting import PromptCodec

ToolChoiceSpec = Literal["auto", "none", "required"] | tuple[Literal["named"], str]
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(kw_only=True)
class TurnSpec:
    """An endpoint-neutral generation request (already validated for shape and types)."""

    conversation: Conversation
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoiceSpec = "auto"
    parallel_tool_calls: bool = True
    output_schema: dict[str, Any] | None = None
    output_schema_param: str = "response_format.json_schema.schema"
    """Where the schema came from in the request (named by a 400 when it does not compile)."""
    json_object: bool = False
    thinking_budget: int | None = None
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    """None: no logprobs; N: the chosen token's logprob and the top N alternatives."""
    tenant_salt: str = ""
    deadline_s: float | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class TokenLogprobView:
    """A generated token's log-probability, with tokens as text (what both wire formats show)."""

    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float]]


@dataclass(frozen=True)
class LogprobChunk:
    kind: Literal["logprobs"]
    entries: list[TokenLogprobView]


@dataclass(frozen=True)
class TurnEnd:
    """The turn's outcome: the assistant message and the token figures for usage."""

    kind: Literal["turn_end"]
    finish_reason: FinishReason
    message: Message
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int
    ttft_s: float | None
    e2e_s: float
    stop_sequence: str | None = None
    """The stop string that ended the turn, if one did."""


TurnItem = Event | LogprobChunk | TurnEnd


class _StopScanner:
    """Finds stop strings in streamed text, holding back a tail that could still start one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buffer = ""
        self.stopped = False
        self.matched: str | None = None

    def push(self, text: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was found (text after it is dropped)."""
        if not self.stops:
            return text, False
        self.buffer += text
        hits = sorted((i, s) for s, i in ((s, self.buffer.find(s)) for s in self.stops) if i >= 0)
        if hits:
            cut, self.matched = hits[0]
            out, self.buffer = self.buffer[:cut], ""
            self.stopped = True
            return out, True
        keep = min(self.hold, len(self.buffer))
        out = self.buffer[: len(self.buffer) - keep]
        self.buffer = self.buffer[len(self.buffer) - keep :]
        return out, False

    def flush(self) -> str:
        out, self.buffer = self.buffer, ""
        return out


class Turn:
    """One request on the engine: `await start()`, then `async for item in events()`, then `close()`."""

    def __init__(
        self,
        engine: EnginePort,
        codec: PromptCodec,
        spec: TurnSpec,
        *,
        max_tokens_default: int,
        constrain_auto_tools: bool = True,
        arrival: float | None = None,
    ) -> None:
        self.engine = engine
        self.codec = codec
        self.spec = spec
        self.request_id = spec.request_id
        self.arrival = arrival if arrival is not None else time.perf_counter()
        self._finished = False
        self._stream: AsyncIterator[Any] | None = None
        self._first: Any = None
        self._first_at: float | None = None
        self.prompt_ids = self._render()
        self.max_tokens = self._token_limit(max_tokens_default)
        self.hooks = build_hooks(spec, codec, engine, constrain_auto_tools=constrain_auto_tools)
        self.params = self._sampling_params()

    # -- preparation (every failure here is the client's: 400) ---------------------------------
    def _render(self) -> list[int]:
        spec = self.spec
        tools = spec.tools if spec.tool_choice != "none" else []
        ids = self.codec.render(spec.conversation, tools, thinking=spec.thinking_budget is not None)
        limit = self.engine.max_model_len
        if len(ids) >= limit:
            raise invalid(
                f"messages: the prompt is {len(ids)} tokens; this model's context length is {limit} tokens "
                "(prompt plus output must fit)",
                param="messages",
                code="context_length_exceeded",
            )
        return ids

    def _token_limit(self, default: int) -> int:
        room = self.engine.max_model_len - len(self.prompt_ids)
        asked = self.spec.max_tokens
        if asked is None:
            return max(1, min(default, room))
        if asked > room:
            raise invalid(
                f"{self.spec.max_tokens_param} is {asked}, but the prompt takes {len(self.prompt_ids)} of the "
                f"{self.engine.max_model_len}-token context, leaving {room}",
                param=self.spec.max_tokens_param,
                code="context_length_exceeded",
            )
        return asked

    def _sampling_params(self) -> Any:
        from parley.local_engine.config import SamplingParams
        from parley.local_engine.errors import InvalidRequestError

        spec = self.spec
        try:
            return SamplingParams(
                max_tokens=self.max_tokens,
                temperature=1.0 if spec.temperature is None else spec.temperature,
                top_p=1.0 if spec.top_p is None else spec.top_p,
                top_k=spec.top_k or 0,
                seed=spec.seed,
                stop_token_ids=tuple(self.codec.stop_token_ids),
                logprobs=spec.logprobs,
            )
        except InvalidRequestError as exc:
            raise invalid(str(exc)) from None

    # -- running -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Submit and wait for the engine's first answer; refusals become 429/503 with `retry-after`."""
        from parley.local_engine.errors import AdmissionError, InvalidRequestError, RequestAborted

        remaining = None
        if self.spec.deadline_s is not None:
            remaining = self.spec.deadline_s - (time.perf_counter() - self.arrival)
            if remaining <= 0:
                self._finished = True
                raise ApiError(
                    f"the deadline of {self.spec.deadline_s:g}s passed before the request reached the engine",
                    kind=ErrorKind.OVERLOADED,
                    code="deadline_unreachable",
                    retry_after_s=1.0,
                )
        self._stream = self.engine.stream(
            self.prompt_ids,
            self.params,
            hooks=self.hooks.hook,
            tenant=self.spec.tenant_salt,
            request_id=self.request_id,
            deadline_s=remaining,
        )
        try:
            self._first = await self._stream.__anext__()
            self._first_at = time.perf_counter()
        except StopAsyncIteration:
            self._first = None
        except AdmissionError as exc:
            self._finished = True
            full = "full" in str(exc).lower() or "queue" in str(exc).lower()
            raise ApiError(
                f"request refused at admission: {exc}",
                kind=ErrorKind.RATE_LIMIT if full else ErrorKind.OVERLOADED,
                code="queue_full" if full else "deadline_unreachable",
                retry_after_s=exc.retry_after_s if exc.retry_after_s is not None else 1.0,
            ) from None
        except RequestAborted as exc:
            self._finished = True
            raise ApiError(f"request dropped: {exc}", kind=ErrorKind.OVERLOADED, retry_after_s=1.0) from None
        except InvalidRequestError as exc:
            self._finished = True
            raise invalid(str(exc)) from None

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens as the engine counted them (known once `start()` returned)."""
        return int(getattr(self._first, "prompt_tokens", 0) or len(self.prompt_ids))

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served (known once `start()` returned)."""
        return int(getattr(self._first, "cached_tokens", 0) or 0)

    async def events(self) -> AsyncIterator[TurnItem]:
        """Protocol events (text, reasoning, tool calls), logprob chunks, then one `TurnEnd`."""
        from parley.local_engine.errors import RequestAborted

        assert self._stream is not None, "call start() first"
        spec = self.spec
        parser = self.codec.parser(thinking=spec.thinking_budget is not None, request_id=self.request_id)
        stops = _StopScanner(spec.stop)
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        prompt_tokens = len(self.prompt_ids)
        cached = output = 0
        reasoning_tokens = 0
        ttft: float | None = None
        engine_reason: str | None = None
        stopped_early = False
        delta = self._first
        try:
            while delta is not None:
                prompt_tokens = int(getattr(delta, "prompt_tokens", prompt_tokens) or prompt_tokens)
                cached = int(getattr(delta, "cached_tokens", 0) or 0)
                ids = list(delta.token_ids)
                if ids and ttft is None:
                    seen_at = self._first_at if delta is self._first and self._first_at else time.perf_counter()
                    ttft = seen_at - self.arrival
                output += len(ids)
                for event in parser.feed_tokens(ids):
                    for item in self._route(event, stops, text, reasoning, calls):
                        yield item
                    if stops.stopped or self._parallel_cut(calls):
                        stopped_early = True
                        break
                if spec.logprobs is not None and getattr(delta, "logprobs", None):
                    yield LogprobChunk("logprobs", [self._logprob_view(lp) for lp in delta.logprobs])
                if stopped_early:
                    break
                if delta.finished:
                    engine_reason = delta.finish_reason
                    break
                try:
                    delta = await self._stream.__anext__()
                except StopAsyncIteration:
                    break
            if engine_reason == "abort":
                raise ApiError(
                    "the request was dropped by the engine (deadline passed or aborted)",
                    kind=ErrorKind.OVERLOADED,
                    retry_after_s=1.0,
                )
            if not stopped_early:
                for event in parser.finish(engine_reason or "stop"):
                    for item in self._route(event, stops, text, reasoning, calls):
                        yield item
            tail = stops.flush() if not stops.stopped else ""
            if tail:
                text.append(tail)
                yield TextDelta(text=tail)
        except RequestAborted as exc:
            raise ApiError(f"request dropped: {exc}", kind=ErrorKind.OVERLOADED, retry_after_s=1.0) from None
        finally:
            await self.close()
        if self.hooks.reasoning is not None:
            reasoning_tokens = self.hooks.reasoning.reasoning_tokens
        reason: FinishReason
        if calls:
            reason = "tool_calls"
        elif engine_reason == "length" and not stopped_early:
            reason = "length"
        else:
            reason = "stop"
        parts: list[Any] = []
        if reasoning:
            parts.append(ReasoningPart(text="".join(reasoning)))
        if text:
            parts.append(TextPart(text="".join(text)))
        parts.extend(calls)
        yield TurnEnd(
            "turn_end",
            finish_reason=reason,
            message=Message(role=Role.ASSISTANT, parts=parts),
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            output_tokens=output,
            reasoning_tokens=reasoning_tokens,
            ttft_s=ttft,
            e2e_s=time.perf_counter() - self.arrival,
            stop_sequence=stops.matched,
        )

    def _call_id(self, index: int) -> str:
        """Unique across turns (the parser numbers calls per completion: `call_0` would repeat)."""
        return f"call_{self.request_id[:16]}_{index}"

    def _parallel_cut(self, calls: list[ToolCall]) -> bool:
        return bool(calls) and not self.spec.parallel_tool_calls

    def _route(
        self, event: Event, stops: _StopScanner, text: list[str], reasoning: list[str], calls: list[ToolCall]
    ) -> list[TurnItem]:
        """Keep what the client should see; tool calls become text when tools are off (`tool_choice: none`)."""
        if stops.stopped:
            return []
        if isinstance(event, TextDelta):
            if event.channel not in (None, "final"):
                return []
            safe, _ = stops.push(event.text)
            if safe:
                text.append(safe)
                return [TextDelta(text=safe)]
            return []
        if isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
            return [event]
        if isinstance(event, ToolCallStart):
            if self.spec.tool_choice == "none":
                return []
            return [ToolCallStart(index=event.index, id=self._call_id(event.index), name=event.name)]
        if isinstance(event, ToolCallDelta):
            return [] if self.spec.tool_choice == "none" else [event]
        if isinstance(event, ToolCallEnd):
            if self.spec.tool_choice == "none":
                raw = f'<tool_call>{{"name": "{event.call.name}", "arguments": {event.call.arguments}}}</tool_call>'
                safe, _ = stops.push(raw)
                text.append(safe)
                return [TextDelta(text=safe)] if safe else []
            call = ToolCall(id=self._call_id(event.index), name=event.call.name, arguments=event.call.arguments)
            calls.append(call)
            return [ToolCallEnd(index=event.index, call=call)]
        return []  # MessageEnd (we build our own), ErrorEvent (malformed output stays out of the reply)

    def _logprob_view(self, lp: Any) -> TokenLogprobView:
        token = self._token_text(int(lp.token_id))
        top = sorted(getattr(lp, "top", {}).items(), key=lambda kv: -kv[1])[: self.spec.logprobs or 0]
        return TokenLogprobView(
            token=token,
            logprob=float(lp.logprob),
            bytes=list(token.encode("utf-8")),
            top=[(self._token_text(int(t)), float(v)) for t, v in top],
        )

    def _token_text(self, token_id: int) -> str:
        text: str = self.engine.tokenizer.decode([token_id])
        return text

    async def close(self) -> None:
        """Abort the engine request if it is still running (frees its KV blocks); idempotent."""
        if self._finished:
            return
        self._finished = True
        try:
            self.engine.abort(self.request_id)
        except Exception:  # an unknown or already-finished id is fine
            pass
        stream, self._stream = self._stream, None
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                pass
