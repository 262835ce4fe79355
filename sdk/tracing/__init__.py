"""`parley.tracing`: OpenTelemetry spans for agent runs, following the GenAI semantic conventions.

    from opentelemetry.sdk.trace import TracerProvider
    agent = Agent(backend, tools=[...], instrument=Instrumentation(tracer_provider=provider))
    # or: configure a global tracer provider and leave `instrument` at None (auto)

Spans (names and attributes: `parley.tracing.attributes`):

* ``invoke_agent {agent}`` — one per `Agent.run` call (a resume is another, in the same trace);
  ``gen_ai.aggregated_usage.*`` holds the sum of this call's model requests;
* ``chat {model}`` — one per model request: model, provider, request parameters, finish reasons,
  ``gen_ai.usage.*``; where the request ran on the local engine, its prompt/cached token figures and
  (when streaming) the time to the first chunk;
* ``execute_tool {tool}`` — one per executed tool call (and a zero-length one per rejected or
  provided call): name, call id, approval outcome, duration, error.

Token accounting: the conventions count cache reads and writes *inside*
``gen_ai.usage.input_tokens``, while `Usage.input_tokens` is the uncached part. So
``gen_ai.usage.input_tokens = input + cache_read + cache_write``, with
``gen_ai.usage.cache_read.input_tokens`` and ``gen_ai.usage.cache_creation.input_tokens`` beside it
(and ``parley.usage.uncached_input_tokens`` for the remainder): never double counted, never negative.

A paused run stores its first ``invoke_agent`` span's W3C context in `RunState.trace_context`; the
resume (in any process) starts its ``invoke_agent`` span as that span's child, so the whole run is
one trace. Prompt, completion, tool-argument and tool-result content is recorded only with
``Instrumentation(capture_content=True)``.

Cost when off: `Agent(instrument=False)`, or the default with no tracer provider configured, runs
no tracing code beyond one check per run, and never imports OpenTelemetry. Without the
``opentelemetry`` packages (extra ``[otel]``) every setting is a no-op.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from parley.errors import ConfigurationError
from parley.tracing.attributes import usage_attributes


@dataclass(frozen=True)
class Instrumentation:
    """How to trace: `tracer_provider` (None: the global one) and `capture_content` (off by default:
    prompts, completions, tool arguments and results are recorded only when True)."""

    tracer_provider: Any = None
    capture_content: bool = False


def check_instrument(value: Any) -> bool | Instrumentation | None:
    """Validate `Agent(instrument=...)`."""
    if value is None or isinstance(value, bool | Instrumentation):
        return value
    raise ConfigurationError(f"instrument must be None, a bool or parley.tracing.Instrumentation, not {value!r}")


_TRACERS: dict[Any, Any] = {}


def _otel_available() -> bool:
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def run_tracer(setting: bool | Instrumentation | None) -> Any:
    """The tracer for one run, or None when this run is not traced (see the module docstring)."""
    if setting is False:
        return None
    if setting is None:
        trace = sys.modules.get("opentelemetry.trace")
        if trace is None:  # nobody imported OpenTelemetry, so nobody configured it
            return None
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return None  # nothing configured: spans would go nowhere
        setting = Instrumentation()
    elif setting is True:
        setting = Instrumentation()
    tracer = _TRACERS.get(setting)
    if tracer is None:
        if not _otel_available():
            return None
        from parley.tracing._otel import RunTracer

        tracer = _TRACERS[setting] = RunTracer(setting)
    return tracer


__all__ = ["Instrumentation", "check_instrument", "run_tracer", "usage_attributes"]
