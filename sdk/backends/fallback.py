"""`FallbackBackend`: try backends in order; the first that answers serves the request.

    backend = FallbackBackend([OpenAIBackend("gpt-4o"), AnthropicBackend("claude-sonnet-4-5")])

Each request goes to the first backend; when it fails with an error the fallback may fall through
on, the same request goes to the next one, and so on. By default (`should_fall_back`) that is:

* a retryable `ModelAPIError` (429, 5xx, 529, a connection error, a dropped stream before any
  event), so `OverloadedError`, `RateLimitError`, `ServerError` and `APIConnectionError`;
* a context-length error: a `BadRequestError` whose error code is ``context_length_exceeded`` or
  whose message says the prompt is past the model's context (OpenAI, vLLM, Anthropic wording), or a
  `LocalRequestError` with code ``context_length_exceeded`` (the local engine);

and nothing else: a bad request, a wrong API key or a setting a model rejects is raised at once
(the next backend would most likely fail the same way, and the error names the bug). ``on=``
chooses instead: a tuple of exception types, or a predicate ``(exception) -> bool`` (combine with
`should_fall_back` to extend the default).

A backend's own retries (``max_retries`` of the hosted backends) run before the fallback moves on;
give the primary ``max_retries=0`` to fall through at the first failure.

When every backend fails, `AllBackendsFailed` (a `ModelAPIError`) carries ``(name, error)`` for
each, in order. An error the fallback does not fall through on is raised unchanged, with a note
naming the backends that failed before it.

Streams: the fallback moves on only while the failing backend has not yet sent the caller any
event (its `ErrorEvent`s are held back until something else comes, so an error reported at the
start of a stream still falls through; held events of a backend fallen past are dropped, and every
fall-through is logged as a warning on the ``parley.backends.fallback`` logger). Once text,
reasoning or a tool call has reached the caller, the error is raised as is, unless
``after_stream_start=True``: then the caller sees the events the failed backend already sent,
followed by an ``ErrorEvent(code="fallback_restart")`` saying they are void, followed by the next
backend's whole answer from the start (so a UI must discard what it showed of the failed attempt;
the agent loop only keeps `MessageEnd` messages, and those come from the backend that served).
A backend that already completed a message (sent a `MessageEnd`) is never fallen through, even
then: a finished message cannot be taken back. The failed attempt's usage is not reported (its
stream never got that far; the provider may still bill it).

Attribution: every `Usage.raw` entry of a served request gains ``"served_by": <backend name>`` (an
entry is added when the backend reported none), so a run's `RunState.usage.raw` records which
backend served each model turn; `ModelResponse.model` is the serving backend's name, and
`last_served` holds the latest one (shared by concurrent runs: for logs only).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextvars import ContextVar
from typing import Any

from parley.backends.base import Backend, BackendCapabilities, ModelRequest, ModelResponse
from parley.backends.errors import AllBackendsFailed, BadRequestError, LocalRequestError, ModelAPIError
from parley.errors import ConfigurationError
from parley.protocol import ErrorEvent, Event, MessageEnd, Usage, UsageEvent

logger = logging.getLogger("parley.backends.fallback")

ATTEMPTS: ContextVar[Callable[[Backend, int, BaseException | None], None] | None] = ContextVar(
    "parley_fallback_attempts", default=None
)
"""Told of each attempt, ``(backend, start time in ns, its error or None when it served)``: how
tracing gives every attempt its own span (`parley.tracing`). None: nobody listens."""


def _attempted(backend: Backend, started: int, error: BaseException | None) -> None:
    listener = ATTEMPTS.get()
    if listener is not None:
        listener(backend, started, error)

FallbackOn = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]

_CONTEXT_WORDS = re.compile(
    r"context[ _](length|window)|maximum context|prompt is too long|too many (input )?tokens|"
    r"input (is )?too long|exceeds the (model's )?(maximum|context)",
    re.IGNORECASE,
)


def is_context_length_error(exc: BaseException) -> bool:
    """A request past the model's context window (whatever the provider's wording)."""
    if isinstance(exc, LocalRequestError):
        return exc.code == "context_length_exceeded"
    if not isinstance(exc, BadRequestError):
        return False
    body = exc.body
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("code") == "context_length_exceeded":
        return True
    return bool(_CONTEXT_WORDS.search(str(exc)))


def should_fall_back(exc: BaseException) -> bool:
    """The default ``on=``: retryable API errors (overload, rate limit, 5xx, connection) and context length."""
    if is_context_length_error(exc):
        return True
    return isinstance(exc, ModelAPIError) and exc.retryable


def _predicate(on: FallbackOn) -> Callable[[BaseException], bool]:
    if isinstance(on, type):
        on = (on,)
    if isinstance(on, tuple):
        types: tuple[type[BaseException], ...] = on
        if not types or not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
            raise ConfigurationError("FallbackBackend on= must be a non-empty tuple of exception types or a predicate")
        return lambda exc: isinstance(exc, types)
    if callable(on):
        predicate: Callable[[BaseException], bool] = on
        return predicate
    raise ConfigurationError(f"FallbackBackend on= must be exception types or a predicate, not {type(on).__name__}")


def attribute(usage: Usage, name: str) -> Usage:
    """`usage` with every raw entry marked ``served_by`` (an inner fallback's mark is kept)."""
    raw: list[dict[str, Any]] = [{**entry, "served_by": entry.get("served_by", name)} for entry in usage.raw]
    return usage.model_copy(update={"raw": raw or [{"served_by": name}]})


class FallbackBackend:
    """A `Backend` that serves each request from the first of `backends` that answers (module docstring)."""

    def __init__(
        self,
        backends: Iterable[Backend],
        *,
        on: FallbackOn = should_fall_back,
        after_stream_start: bool = False,
        name: str | None = None,
    ) -> None:
        self.backends: tuple[Backend, ...] = tuple(backends)
        if not self.backends:
            raise ConfigurationError("FallbackBackend needs at least one backend")
        for index, backend in enumerate(self.backends):
            if not isinstance(backend, Backend):
                raise ConfigurationError(
                    f"FallbackBackend backends[{index}] is a {type(backend).__name__}, not a Backend "
                    "(it needs name, capabilities, generate and stream)"
                )
        self._on = _predicate(on)
        self.after_stream_start = after_stream_start
        self._name = name
        self.last_served: str | None = None

    @property
    def name(self) -> str:
        if self._name is not None:
            return self._name
        return "fallback(" + ", ".join(b.name for b in self.backends) + ")"

    @property
    def capabilities(self) -> BackendCapabilities:
        """What every backend can do (tools, structured output, streaming, native compaction: a request
        any of them may serve must be compacted); reasoning/caching if any can."""
        caps = [b.capabilities for b in self.backends]
        return BackendCapabilities(
            tools=all(c.tools for c in caps),
            structured_output=all(c.structured_output for c in caps),
            streaming=all(c.streaming for c in caps),
            reasoning=any(c.reasoning for c in caps),
            prompt_cache=any(c.prompt_cache for c in caps),
            native_compaction=all(c.native_compaction for c in caps),
        )

    # -- decisions --------------------------------------------------------------------------------
    def _falls_through(self, exc: BaseException) -> bool:
        try:
            return bool(self._on(exc))
        except Exception:  # a broken predicate must not hide the real error
            logger.exception("FallbackBackend on= predicate raised; not falling through")
            return False

    def _fail(self, failures: list[tuple[str, BaseException]], exc: BaseException, index: int) -> None:
        """Record `exc` and return if the next backend should be tried; raise otherwise."""
        name = self.backends[index].name
        if not self._falls_through(exc):
            if failures:
                exc.add_note("FallbackBackend: failed before this: " + "; ".join(
                    f"{n}: {type(e).__name__}: {e}" for n, e in failures))
            raise exc
        failures.append((name, exc))
        if index + 1 < len(self.backends):
            logger.warning("backend %s failed (%s: %s); falling back to %s", name, type(exc).__name__, exc,
                           self.backends[index + 1].name)
            return
        detail = "; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in failures)
        raise AllBackendsFailed(f"all {len(failures)} backend(s) failed: {detail}", errors=failures) from exc

    def _served(self, backend: Backend) -> None:
        self.last_served = backend.name

    # -- Backend API ------------------------------------------------------------------------------
    async def generate(self, request: ModelRequest) -> ModelResponse:
        failures: list[tuple[str, BaseException]] = []
        for index, backend in enumerate(self.backends):
            started = time.time_ns()
            try:
                response = await backend.generate(request)
            except Exception as exc:
                _attempted(backend, started, exc)
                self._fail(failures, exc, index)
                continue
            _attempted(backend, started, None)
            self._served(backend)
            return ModelResponse(messages=response.messages, usage=attribute(response.usage, backend.name),
                                 finish_reason=response.finish_reason, model=backend.name)
        raise AssertionError("unreachable")  # pragma: no cover - _fail raises on the last backend

    async def stream(self, request: ModelRequest) -> AsyncIterator[Event]:
        failures: list[tuple[str, BaseException]] = []
        for index, backend in enumerate(self.backends):
            held: list[Event] = []  # ErrorEvents before the first real event
            sent = False  # something of this attempt reached the caller
            finished_message = False
            started = time.time_ns()
            events = backend.stream(request)
            try:
                async for event in events:
                    if isinstance(event, ErrorEvent) and not sent:
                        held.append(event)
                        continue
                    for earlier in held:
                        yield earlier
                    held.clear()
                    sent = True
                    if isinstance(event, MessageEnd):
                        finished_message = True
                    elif isinstance(event, UsageEvent):
                        event = UsageEvent(usage=attribute(event.usage, backend.name))
                    yield event
            except Exception as exc:
                _attempted(backend, started, exc)
                if sent and (not self.after_stream_start or finished_message):
                    raise
                self._fail(failures, exc, index)
                if sent:
                    yield ErrorEvent(
                        code="fallback_restart",
                        message=f"backend {backend.name} failed after its stream started ({type(exc).__name__}: "
                        f"{exc}); the events above from it are void: the next backend answers from the start",
                    )
                continue
            finally:
                close = getattr(events, "aclose", None)
                if close is not None:
                    await close()
            for earlier in held:  # a stream of nothing but ErrorEvents that ended without raising
                yield earlier
            _attempted(backend, started, None)
            self._served(backend)
            return

    async def aclose(self) -> None:
        """Close every backend that can be closed."""
        for backend in self.backends:
            close = getattr(backend, "aclose", None)
            if close is not None:
                await close()
