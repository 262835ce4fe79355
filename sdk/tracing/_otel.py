"""The OpenTelemetry side of `parley.tracing` (imported only when a run is traced)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from parley._run_turn import EventSink, take_turn
from parley.protocol import ToolCall, ToolResult, UsageEvent
from parley.run_state import Approved, Provided, Rejected, RunState
from parley.tracing import attributes as a
from parley.tracing import messages as m
from parley.tracing.instrumentation import ENCLOSING

if TYPE_CHECKING:
    from parley._run_loop import RunLoop
    from parley._run_tools import ToolRunner
    from parley.agent import Agent
    from parley.backends.base import Backend, ModelRequest, ModelResponse
    from parley.result import RunResult
    from parley.tools import ToolContext

_PROPAGATOR = TraceContextTextMapPropagator()
_MAX_STATUS_CHARS = 200
_USAGE_FIELDS = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens", "reasoning_tokens")


class _UsageDelta:
    """Usage of the requests made between two ledger readings (cost None when either is unknown)."""

    def __init__(self, after: Any, before: Any) -> None:
        for name in _USAGE_FIELDS:  # cache reads may be unknown (None): the delta is then unknown too
            mine, earlier = getattr(after, name), getattr(before, name)
            setattr(self, name, None if mine is None or earlier is None else mine - earlier)
        self.requests: int = after.requests - before.requests
        self.cost = None if after.cost is None or before.cost is None else after.cost - before.cost


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("parley")
    except Exception:  # pragma: no cover
        return "0"


_CONVERSATION: ContextVar[str | None] = ContextVar("parley_conversation_id", default=None)
"""The ``gen_ai.conversation.id`` of the run in progress (its chat spans carry it too)."""


def conversation_id(loop: RunLoop) -> str:
    """The session's id when the run has a session (one conversation across its runs), else the
    run's own id (`RunState.trace_id`: the same across the resumes of one run)."""
    session = loop.session
    session_id = getattr(session, "session_id", None) if session is not None else None
    return session_id if isinstance(session_id, str) and session_id else loop.state.trace_id


def _model_of(backend: Any) -> tuple[str, str]:
    """(provider, model) a request to `backend` goes to: a `FallbackBackend` asks its first backend
    first (the one that served is on the span when it answers: ``gen_ai.response.model``)."""
    inner = getattr(backend, "backends", None)
    if inner:
        return _model_of(inner[0])
    return a.provider_and_model(backend.name)


def _first(backend: Any) -> Any:
    inner = getattr(backend, "backends", None)
    return _first(inner[0]) if inner else backend


def _served_model(backend: Any, model: str) -> str:
    """The model that answered. Backends that report parley's backend id (``local:m``, a fallback's
    ``openai:gpt-b``) rather than a server's model name are reported by their model part."""
    names = {backend.name, *(b.name for b in getattr(backend, "backends", ()) or ())}
    return a.provider_and_model(model)[1] if model in names else model


def _fail(span: Any, exc: BaseException) -> None:
    span.set_attribute(a.ERROR_TYPE, type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, str(exc)[:_MAX_STATUS_CHARS]))


class RunTracer:
    """Creates the ``invoke_agent`` / ``chat`` / ``execute_tool`` spans of runs (see `parley.tracing`)."""

    def __init__(self, settings: Any) -> None:
        provider = settings.tracer_provider
        get = provider.get_tracer if provider is not None else trace.get_tracer
        self.tracer = get("parley", _version())
        self.capture_content = bool(settings.capture_content)

    # -- invoke_agent -----------------------------------------------------------------------------
    async def run(self, agent: Agent[Any], loop: RunLoop) -> RunResult[Any]:
        state = loop.state
        provider, model = _model_of(agent.backend)
        resumed = state.trace_context is not None or state.turn > 0
        parent = None
        links: list[Link] = []
        if state.trace_context:
            parent = _PROPAGATOR.extract(state.trace_context)
            current = trace.get_current_span().get_span_context()
            if current.is_valid:  # resumed inside another trace: keep the run's, link the caller's
                links.append(Link(current))
        attributes: dict[str, Any] = {
            a.OPERATION: "invoke_agent",
            a.PROVIDER: provider,
            a.REQUEST_MODEL: model,
            a.CONVERSATION_ID: conversation_id(loop),
            a.RUN_RESUMED: resumed,
        }
        if agent.name:
            attributes[a.AGENT_NAME] = agent.name
        if getattr(agent, "description", None):
            attributes[a.AGENT_DESCRIPTION] = agent.description
        if self.capture_content and agent.system_prompt:
            attributes[a.SYSTEM_INSTRUCTIONS] = m.system_instructions(agent.system_prompt)
        name = f"invoke_agent {agent.name}" if agent.name else "invoke_agent"
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, links=links)
        if state.trace_context is None:
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
            state.trace_context = carrier
        before = state.usage
        token = otel_context.attach(trace.set_span_in_context(span))
        conversation = _CONVERSATION.set(attributes[a.CONVERSATION_ID])
        enclosing = ENCLOSING.set(self)
        status = "failed"
        try:
            result = await loop.run()
            status = "paused" if result.paused else "complete"
            if result.paused:
                span.set_attribute(a.RUN_PENDING, [f"{i.tool_name}:{i.kind}" for i in result.interruptions])
            return result
        except BaseException as exc:
            _fail(span, exc)
            if isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "CancelledError":
                status = "cancelled"
            raise
        finally:
            ENCLOSING.reset(enclosing)
            _CONVERSATION.reset(conversation)
            otel_context.detach(token)
            span.set_attribute(a.RUN_STATUS, status)
            span.set_attribute(a.RUN_TURNS, loop.state.turn)
            delta = _UsageDelta(loop.state.usage, before)
            span.set_attributes(a.usage_attributes(delta, prefix=a.AGGREGATED_USAGE))
            span.set_attribute(a.REQUESTS, delta.requests)
            span.end()

    # -- chat -------------------------------------------------------------------------------------
    async def turn(
        self, backend: Backend, request: ModelRequest, emit: EventSink | None, state: RunState,
        *, purpose: str | None = None,
    ) -> ModelResponse:
        """One model request in a ``chat`` span; `purpose` names a request the run makes for itself
        (``compaction``: the summariser's), so the run's usage is the sum of its chat spans."""
        provider, model = _model_of(backend)
        attributes: dict[str, Any] = {
            a.OPERATION: "chat",
            a.PROVIDER: provider,
            a.REQUEST_MODEL: model,
            a.CONVERSATION_ID: _CONVERSATION.get() or state.trace_id,
            a.OUTPUT_TYPE: "json" if request.output_schema is not None else "text",
        }
        if emit is not None:  # "if and only if the request is streaming" (unset: not streaming)
            attributes[a.REQUEST_STREAM] = True
        if purpose is not None:
            attributes[a.REQUEST_PURPOSE] = purpose
        sampling = request.sampling
        for key in ("max_tokens", "temperature", "top_p", "top_k", "seed"):
            value = getattr(sampling, key, None)
            if value is not None:
                attributes[f"gen_ai.request.{key}"] = value
        if getattr(sampling, "stop", ()):
            attributes["gen_ai.request.stop_sequences"] = list(sampling.stop)
        with self.tracer.start_as_current_span(
            f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes, record_exception=True
        ) as span:
            if self.capture_content:
                span.set_attribute(a.INPUT_MESSAGES, m.input_messages(request.conversation.messages))
            sink = emit
            if emit is not None:
                started = time.perf_counter()
                seen = False

                async def timed(event: Any) -> None:
                    nonlocal seen
                    if not seen and not isinstance(event, UsageEvent):
                        seen = True
                        span.set_attribute(a.TIME_TO_FIRST_CHUNK, time.perf_counter() - started)
                    await emit(event)

                sink = timed
            served: list[Any] = []
            listening = self._attempts(backend, span, served, attributes[a.CONVERSATION_ID])
            try:
                response = await take_turn(backend, request, sink)
            except BaseException as exc:
                span.set_attribute(a.ERROR_TYPE, type(exc).__qualname__)
                raise
            finally:
                if listening is not None:
                    from parley.backends.fallback import ATTEMPTS

                    ATTEMPTS.reset(listening)
            if served and served[-1] is not _first(backend):  # named by the backend that answered
                provider, model = _model_of(served[-1])
                span.update_name(f"chat {model}")
                span.set_attributes({a.PROVIDER: provider, a.REQUEST_MODEL: model})
            span.set_attributes(a.usage_attributes(response.usage))
            span.set_attribute(a.FINISH_REASONS, [response.finish_reason])
            if response.model:
                span.set_attribute(a.RESPONSE_MODEL, _served_model(backend, response.model))
            local = [r for r in response.usage.raw if isinstance(r, Mapping) and r.get("backend") == "local"]
            if local:
                span.set_attribute(a.LOCAL_PROMPT_TOKENS, sum(int(r.get("prompt_tokens", 0)) for r in local))
                span.set_attribute(a.LOCAL_CACHED_TOKENS, sum(int(r.get("cached_tokens", 0)) for r in local))
            if self.capture_content:
                span.set_attribute(a.OUTPUT_MESSAGES, m.output_messages(response.messages, response.finish_reason))
            return response

    def _attempts(self, backend: Any, span: Any, served: list[Any], conversation: str) -> Any:
        """For a `FallbackBackend`: a ``chat`` span (child of `span`, error set) for each attempt that
        failed, and the backend that served in `served`. Returns the listener's token (None: not one)."""
        if not getattr(backend, "backends", None):
            return None
        from parley.backends.fallback import ATTEMPTS

        attempt = 0

        def listen(inner: Any, started: int, error: BaseException | None) -> None:
            nonlocal attempt
            attempt += 1
            if error is None:
                served.append(inner)
                return
            provider, model = _model_of(inner)
            failed = self.tracer.start_span(
                f"chat {model}", context=trace.set_span_in_context(span), kind=SpanKind.CLIENT, start_time=started,
                attributes={a.OPERATION: "chat", a.PROVIDER: provider, a.REQUEST_MODEL: model,
                            a.CONVERSATION_ID: conversation, a.FALLBACK_ATTEMPT: attempt},
            )
            _fail(failed, error)
            failed.end()

        return ATTEMPTS.set(listen)

    # -- execute_tool -----------------------------------------------------------------------------
    def _tool_attributes(self, runner: ToolRunner | None, call: ToolCall, approval: str) -> dict[str, Any]:
        tool = runner.tools.get(call.name) if runner is not None else None
        attributes: dict[str, Any] = {
            a.OPERATION: "execute_tool",
            a.TOOL_NAME: call.name,
            a.TOOL_CALL_ID: call.id,
            a.TOOL_TYPE: "function",
            a.TOOL_APPROVAL: approval,
            a.TOOL_SOURCE: getattr(tool, "source", "local"),
        }
        description = getattr(tool, "description", "")
        if description:
            attributes[a.TOOL_DESCRIPTION] = description
        return attributes

    def _record_result(self, span: Any, result: ToolResult, *, failed: bool = True) -> None:
        if result.is_error and failed:
            span.set_attribute(a.ERROR_TYPE, "tool_error")
            span.set_status(Status(StatusCode.ERROR, result.content[:_MAX_STATUS_CHARS]))
        if self.capture_content:
            span.set_attribute(a.TOOL_RESULT, result.content)

    async def tool_call(
        self, runner: ToolRunner, state: RunState, call: ToolCall, target: ToolCall, context: ToolContext
    ) -> list[ToolResult]:
        decision = state.decisions.get(call.id)
        approval = "not_required"
        if isinstance(decision, Approved):
            approval = "approved_edited" if decision.arguments is not None else "approved"
        attributes = self._tool_attributes(runner, call, approval)
        with self.tracer.start_as_current_span(
            f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            if self.capture_content:
                span.set_attribute(a.TOOL_ARGUMENTS, target.arguments)
            results = await runner.executor.execute([target], context=context)
            self._record_result(span, results[0])
            return results

    async def agent_call(
        self, runner: ToolRunner, state: RunState, call: ToolCall, target: ToolCall, run: Callable[[], Awaitable[None]]
    ) -> None:
        """An agent-as-tool call in an ``execute_tool`` span: the child run's ``invoke_agent`` span (and
        its chat spans) nest inside it. A child that pauses leaves no result yet: the span says so."""
        decision = state.decisions.get(call.id)
        approval = "not_required"
        if isinstance(decision, Approved):
            approval = "approved_edited" if decision.arguments is not None else "approved"
        attributes = self._tool_attributes(runner, call, approval)
        attributes[a.TOOL_SOURCE] = "agent"
        with self.tracer.start_as_current_span(
            f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            if self.capture_content:
                span.set_attribute(a.TOOL_ARGUMENTS, target.arguments)
            await run()
            result = state.records.get(call.id)
            if result is not None:
                self._record_result(span, result)
            else:
                span.set_attribute(a.RUN_STATUS, "paused")

    def answered(self, state: RunState, answered: Mapping[str, ToolResult]) -> None:
        """Zero-length ``execute_tool`` spans for calls a person rejected or answered from outside."""
        calls = {c.id: c for c in state.batch}
        for call_id, result in answered.items():
            decision = state.decisions.get(call_id)
            if not isinstance(decision, Rejected | Provided) or call_id not in calls:
                continue
            approval = "rejected" if isinstance(decision, Rejected) else "provided"
            call = calls[call_id]
            attributes = self._tool_attributes(None, call, approval)
            with self.tracer.start_as_current_span(
                f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes
            ) as span:
                if self.capture_content:
                    span.set_attribute(a.TOOL_ARGUMENTS, call.arguments)
                self._record_result(span, result, failed=approval != "rejected")
