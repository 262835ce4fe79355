"""`Instrumentation` and the per-run choice of tracer (see `parley.tracing`)."""

from __future__ import annotations

import sys
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from parley.errors import ConfigurationError


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

ENCLOSING: ContextVar[Any] = ContextVar("parley_enclosing_tracer", default=None)
"""The tracer of the traced run this code runs inside (an agent tool's child run is inside its
parent's ``execute_tool`` span): a run left at ``instrument=None`` is traced by it, so a child's
spans are in its parent's trace without configuring the child."""


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
        enclosing = ENCLOSING.get()
        if enclosing is not None:
            return enclosing
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
