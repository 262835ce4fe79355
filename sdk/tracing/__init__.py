"""`parley.tracing`: OpenTelemetry spans for agent runs, following the GenAI semantic conventions.

    from opentelemetry.sdk.trace import TracerProvider
    agent = Agent(backend, tools=[...], instrument=Instrumentation(tracer_provider=provider))
    # or: configure a global tracer provider and leave `instrument` at None (auto)

Spans (names and attributes: `parley.tracing.attributes`):

* ``invoke_agent {agent}`` — one per `Agent.run` call (a resume is another, in the same trace);
  ``gen_ai.aggregated_usage.*`` holds the sum of this call's model requests;
* ``chat {model}`` — one per model request: model, provider, request parameters, finish reasons,
  ``gen_ai.usage.*``; where the request ran on the local engine, its prompt/cached token figures and
  (when streaming) the time to the first chunk. The compaction summariser's request has one too
  (``parley.request.purpose=compaction``), so a run's usage is the sum of its chat spans; behind a
  `FallbackBackend` the span is named by the backend that answered, and every attempt that failed
  has its own chat span inside it (its error, no usage);
* ``execute_tool {tool}`` — one per executed tool call (and a zero-length one per rejected or
  provided call): name, call id, approval outcome, duration, error. An agent used as a tool has
  one as well, with the child run's spans inside it (traced by the parent's tracer).

``gen_ai.conversation.id`` is the session's id when the run has a session (every run of one
conversation shares it), else the run's id. Captured content follows the conventions' message
schema (`parley.tracing.messages`).

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

from parley.tracing.attributes import usage_attributes
from parley.tracing.instrumentation import Instrumentation, check_instrument, run_tracer

__all__ = ["Instrumentation", "check_instrument", "run_tracer", "usage_attributes"]
