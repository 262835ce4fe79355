"""One assistant turn on the local engine: the code `LocalBackend` and `parley serve` share.

A `ModelRequest` (plus the few things only a server sends: request id, deadline, logprobs) is
rendered by the model's prompt family (`family.PromptFamily`), constrained by its hooks, mapped to
`SamplingParams`, streamed from the engine and parsed back into `parley.protocol` events, closed
by one `TurnEnd` carrying the assistant message and the token figures. Every rule lives here once:

* **Admission before any byte.** `start()` waits for the engine's first answer, so a refusal is
  still an exception (the server's clean 429/503), never a broken stream.
* **Context.** The prompt must leave room for output; an explicit `max_tokens` past the room is
  refused (`LocalRequestError`, ``context_length_exceeded``), an absent one is cut to the room.
* **Stop strings** end the turn at the first match in the answer text; the text is cut before
  it and the match reported (`TurnEnd.stop_sequence`); the engine request is aborted at once.
* **Tools off** (``tool_choice="none"``): tools are still rendered (the prompt prefix, and so its
  cache, does not change with the choice) and a call the model writes anyway is answer text.
* **`ignore_eos`** drops the codec's end-of-turn ids as well as the end-of-sequence token, so the
  turn runs to its token limit (what benchmarks send it for), as vLLM's does.
* **One call per turn** unless `parallel_tool_calls` is true: a turn ends after its first call.
* **Call ids** are unique across turns (``call_<request id>_<n>``); a malformed call is reported
  as an `ErrorEvent` and kept out of the message.

However the turn ends (finished, cancelled, stopped early), `close()` aborts the engine request,
so its KV blocks return to the pool at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from parley.backends.base import ModelRequest
from parley.backends.errors import LocalRequestError
from parley.backends.local.constraints import callable_tools, compile_constraint
from parley.backends.local.engine_port import EnginePort
from parley.backends.local.family import PromptFamily, TurnHooks
from parley.constrained import Choice, ConstraintHook, Grammar, Regex
from parley.local_engine.config import SamplingParams
from parley.local_engine.hooks import ComposedHook, TokenHook
from parley.local_engine.outputs import StreamDelta, TokenLogprob
from parley.protocol import (
    ErrorEvent,
    Event,
    Message,
    Part,
    ReasoningDelta,
    ReasoningPart,
    Role,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True, kw_only=True)
class TurnOptions:
    """What a caller adds to a `ModelRequest`: defaults, and the server's per-request extras."""

    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    deadline_s: float | None = None
    """Seconds from `arrival` by which the engine must be able to finish, or it refuses at admission."""
    arrival: float | None = None
    """When the request arrived (`time.perf_counter()`); default: when the turn was made."""
    logprobs: int | None = None
    """None: no logprobs; N: the chosen token's logprob and the top N alternatives."""
    default_max_tokens: int = 512
    default_temperature: float = 0.0
    """The SDK decodes greedily unless told otherwise; OpenAI's wire default is 1.0."""
    constrain_auto_tools: bool = True
    """With ``tool_choice="auto"``, constrain a call once the model opens one (a small model needs it)."""
    constraint: Regex | Grammar | Choice | None = None
    """A non-JSON constraint on the answer (a server's `structured_outputs`); the request may then have no
    output schema and no callable tools. A grammar that cannot compile is refused on ``output_constraint``."""


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
    """The turn's outcome: the assistant message and the token figures."""

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

    def usage(self) -> Usage:
        """The normalised ledger: `input_tokens` are the prompt tokens the prefix cache did not serve."""
        return Usage(
            input_tokens=self.prompt_tokens - self.cached_tokens,
            cache_read_tokens=self.cached_tokens,
            output_tokens=self.output_tokens,
            reasoning_tokens=self.reasoning_tokens,
            requests=1,
            cost=Decimal(0),  # local compute has no per-token price; a known zero keeps run totals known
            raw=[
                {
                    "backend": "local",
                    "prompt_tokens": self.prompt_tokens,
                    "cached_tokens": self.cached_tokens,
                    "output_tokens": self.output_tokens,
                    "reasoning_tokens": self.reasoning_tokens,
                    "finish_reason": self.finish_reason,
                }
            ],
        )


TurnItem = Event | LogprobChunk | TurnEnd


class StopScanner:
    """Finds stop strings in streamed text, holding back a tail that could still start one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buffer = ""
        self.matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, text: str) -> str:
        """Text safe to emit now (after a match: the text before it, and nothing ever again)."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.buffer += text
        hits = sorted((at, stop) for stop in self.stops if (at := self.buffer.find(stop)) >= 0)
        if hits:
            cut, self.matched = hits[0]
            out, self.buffer = self.buffer[:cut], ""
            return out
        keep = min(self.hold, len(self.buffer))
        out, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep :]
        return out

    def flush(self) -> str:
        out, self.buffer = self.buffer, ""
        return out


class _MessageBuilder:
    """The assistant message, built from exactly the events the caller sees, in their order."""

    def __init__(self) -> None:
        self.parts: list[Part] = []

    def text(self, text: str) -> None:
        self._extend(TextPart, text)

    def reasoning(self, text: str) -> None:
        self._extend(ReasoningPart, text)

    def _extend(self, kind: type[TextPart] | type[ReasoningPart], text: str) -> None:
        last = self.parts[-1] if self.parts else None
        if type(last) is kind:
            last.text += text
        else:
            self.parts.append(kind(text=text))

    @property
    def calls(self) -> list[ToolCall]:
        return [part for part in self.parts if isinstance(part, ToolCall)]

    def message(self) -> Message:
        return Message(role=Role.ASSISTANT, parts=list(self.parts))


class LocalTurn:
    """One request on the engine: `await start()`, then `async for item in events()`; `close()` always."""

    def __init__(
        self, engine: EnginePort, codec: PromptFamily, request: ModelRequest, options: TurnOptions | None = None
    ) -> None:
        self.engine = engine
        self.codec = codec
        self.request = request
        self.options = options = options or TurnOptions()
        self.request_id = options.request_id
        self.arrival = options.arrival if options.arrival is not None else time.perf_counter()
        self.reasoning = request.reasoning is not None
        self.tools_on = bool(callable_tools(request))
        self.prompt_ids = self._render()
        self.max_tokens = self._token_limit()
        self.hooks: TurnHooks = codec.build_hooks(request, engine, constrain_auto_tools=options.constrain_auto_tools)
        if options.constraint is not None:
            self.hooks = self._with_constraint(options.constraint)
        self.params = self._sampling_params()
        self._stream: AsyncIterator[StreamDelta] | None = None
        self._first: StreamDelta | None = None
        self._first_at: float | None = None
        self._finished = False

    # -- preparation: every failure here is the request's -----------------------------------------
    def _render(self) -> list[int]:
        request = self.request
        ids = self.codec.render(request.conversation, request.tools, reasoning=request.reasoning)
        limit = self.engine.max_model_len
        if len(ids) >= limit:
            raise LocalRequestError(
                f"conversation: the prompt is {len(ids)} tokens; this model's context length is {limit} tokens "
                "(prompt plus output must fit)",
                field="conversation",
                code="context_length_exceeded",
            )
        return ids

    def _with_constraint(self, spec: Regex | Grammar | Choice) -> TurnHooks:
        """The turn's hooks with `spec` constraining the answer (after any reasoning, as an output schema does)."""
        if self.request.output_schema is not None or callable_tools(self.request):
            raise LocalRequestError(
                "output_constraint: a regex, choice or grammar constraint cannot be combined with an output "
                "schema or callable tools",
                field="output_constraint",
                code="invalid_request",
            )
        reasoning = self.hooks.reasoning
        triggers = self.codec.answer_triggers(reasoning=reasoning is not None)
        if triggers is None:  # e.g. Harmony: the answer sits inside channel headers a text grammar cannot see
            raise LocalRequestError(
                "output_constraint: regex, choice and grammar constraints are not available for this model family",
                field="output_constraint",
                code="unsupported_value",
            )
        matcher = compile_constraint(spec, self.engine, self.codec.stop_token_ids, "output_constraint")
        constraint = ConstraintHook(matcher, triggers=list(triggers))
        hook: TokenHook = constraint if reasoning is None else ComposedHook([reasoning, constraint])
        return TurnHooks(hook=hook, reasoning=reasoning, constraint=constraint)

    def _token_limit(self) -> int:
        room = self.engine.max_model_len - len(self.prompt_ids)
        asked = self.request.sampling.max_tokens
        if asked is None:
            return max(1, min(self.options.default_max_tokens, room))
        if asked > room:
            raise LocalRequestError(
                f"max_tokens is {asked}, but the prompt takes {len(self.prompt_ids)} of the "
                f"{self.engine.max_model_len}-token context, leaving {room}",
                field="max_tokens",
                code="context_length_exceeded",
            )
        return asked

    def _sampling_params(self) -> SamplingParams:
        sampling = self.request.sampling
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.options.default_temperature if sampling.temperature is None else sampling.temperature,
            top_p=1.0 if sampling.top_p is None else sampling.top_p,
            top_k=sampling.top_k or 0,
            seed=sampling.seed,
            stop_token_ids=() if sampling.ignore_eos else self.codec.stop_token_ids,
            logprobs=self.options.logprobs,
            ignore_eos=bool(sampling.ignore_eos),
            min_tokens=sampling.min_tokens or 0,
            repetition_penalty=1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty,
            frequency_penalty=sampling.frequency_penalty or 0.0,
            presence_penalty=sampling.presence_penalty or 0.0,
            min_p=sampling.min_p or 0.0,
        )

    # -- running ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Submit and wait for the engine's first answer; admission refusals raise here, typed."""
        remaining = None
        if self.options.deadline_s is not None:
            remaining = self.options.deadline_s - (time.perf_counter() - self.arrival)
            if remaining <= 0:
                from parley.local_engine.errors import DeadlineUnreachableError

                self._finished = True
                raise DeadlineUnreachableError(
                    f"the deadline of {self.options.deadline_s:g}s passed before the request reached the engine",
                    retry_after_s=1.0,
                )
        self._stream = self.engine.stream(
            self.prompt_ids,
            self.params,
            hooks=self.hooks.hook,
            tenant=self.request.tenant,
            request_id=self.request_id,
            deadline_s=remaining,
        )
        try:
            self._first = await self._stream.__anext__()
            self._first_at = time.perf_counter()
        except StopAsyncIteration:
            self._first = None
        except BaseException:
            self._finished = True
            raise

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens as the engine counted them (known once `start()` returned)."""
        return self._first.prompt_tokens if self._first is not None else len(self.prompt_ids)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served (known once `start()` returned)."""
        return self._first.cached_tokens if self._first is not None else 0

    async def events(self) -> AsyncIterator[TurnItem]:
        """Protocol events (text, reasoning, tool calls, errors), logprob chunks, then one `TurnEnd`.

        Raises `RequestAborted` when the engine drops the request (deadline passed, aborted).
        """
        from parley.local_engine.errors import RequestAborted

        if self._stream is None:
            await self.start()
        parser = self.codec.parser(reasoning=self.reasoning, call_ids=self._call_id)
        stops = StopScanner(self.request.sampling.stop)
        built = _MessageBuilder()
        prompt_tokens, cached, output = len(self.prompt_ids), 0, 0
        ttft: float | None = None
        engine_reason: str | None = None
        cut = False
        delta = self._first
        try:
            while delta is not None:
                prompt_tokens, cached = delta.prompt_tokens, delta.cached_tokens
                if delta.token_ids and ttft is None:
                    seen_at = self._first_at if delta is self._first and self._first_at else time.perf_counter()
                    ttft = seen_at - self.arrival
                output += len(delta.token_ids)
                for event in parser.feed_tokens(delta.token_ids):
                    for item in self._route(event, stops, built):
                        yield item
                    if stops.stopped or (built.calls and self.request.parallel_tool_calls is not True):
                        cut = True
                        break
                if self.options.logprobs is not None and delta.logprobs:
                    yield LogprobChunk("logprobs", [self._logprob_view(lp) for lp in delta.logprobs])
                if cut or delta.finished:
                    engine_reason = delta.finish_reason
                    break
                delta = await anext(self._stream, None) if self._stream is not None else None
            if engine_reason == "abort" and not cut:
                raise RequestAborted("the request was dropped by the engine (deadline passed or aborted)")
            if not cut:
                for event in parser.finish(engine_reason or "stop"):
                    for item in self._route(event, stops, built):
                        yield item
            tail = stops.flush() if not stops.stopped else ""
            if tail:
                built.text(tail)
                yield TextDelta(text=tail, channel="final")
        finally:
            await self.close()
        reason: FinishReason = "stop"
        if built.calls:
            reason = "tool_calls"
        elif engine_reason == "length" and not cut:
            reason = "length"
        yield TurnEnd(
            "turn_end",
            finish_reason=reason,
            message=built.message(),
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            output_tokens=output,
            reasoning_tokens=self.hooks.reasoning.reasoning_tokens if self.hooks.reasoning is not None else 0,
            ttft_s=ttft,
            e2e_s=time.perf_counter() - self.arrival,
            stop_sequence=stops.matched,
        )

    def _call_id(self, index: int) -> str:
        return f"call_{self.request_id[:16]}_{index}"

    def _route(self, event: Event, stops: StopScanner, built: _MessageBuilder) -> list[TurnItem]:
        """What the caller sees of a parser event, recorded in the message as it is seen."""
        if stops.stopped:
            return []
        if isinstance(event, TextDelta):
            if event.channel not in (None, "final"):
                return []
            text = stops.push(event.text)
            if text and text == event.text and event.channel == "final":  # the parser's event, as the caller sees it
                built.text(text)
                return [event]
            return self._text(text, built)
        if isinstance(event, ToolCallEnd) and not self.tools_on:
            return self._text(stops.push(self.codec.call_as_text(event.call)), built)
        if isinstance(event, (ToolCallStart, ToolCallDelta)) and not self.tools_on:
            return []
        if not isinstance(event, (ReasoningDelta, ToolCallStart, ToolCallDelta, ToolCallEnd, ErrorEvent)):
            return []  # MessageEnd: the turn builds its own message from what was seen
        items = self._text(stops.flush(), built)  # text held for a stop string came before this event
        if isinstance(event, ReasoningDelta):
            built.reasoning(event.text)
        elif isinstance(event, ToolCallEnd):
            built.parts.append(event.call)
        items.append(event)
        return items

    @staticmethod
    def _text(text: str, built: _MessageBuilder) -> list[TurnItem]:
        if not text:
            return []
        built.text(text)
        return [TextDelta(text=text, channel="final")]

    def _logprob_view(self, lp: TokenLogprob) -> TokenLogprobView:
        token = self._token_text(lp.token_id)
        top = sorted(lp.top.items(), key=lambda kv: -kv[1])[: self.options.logprobs or 0]
        return TokenLogprobView(
            token=token,
            logprob=float(lp.logprob),
            bytes=list(token.encode("utf-8")),
            top=[(self._token_text(t), float(v)) for t, v in top],
        )

    def _token_text(self, token_id: int) -> str:
        text: str = self.engine.tokenizer.decode([token_id])
        return text

    async def close(self) -> None:
        """Abort the engine request if it is still running (frees its KV blocks); idempotent."""
        if self._finished:
            return
        self._finished = True
        self.engine.abort(self.request_id)
        stream, self._stream = self._stream, None
        if stream is not None and hasattr(stream, "aclose"):
            await stream.aclose()
