"""One step of a traced run in its own process (for tests/sdk/test_tracing.py).

    python -m tests.sdk.tracing_worker start  STATE SPANS   # runs until the approval pause, saves STATE
    python -m tests.sdk.tracing_worker resume STATE SPANS   # approves and finishes the run

Finished spans are appended to SPANS as JSON lines (name, trace id, status, pid).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from parley import Agent, RunState, tool
from parley.backends import FunctionBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.tracing import Instrumentation


@tool(needs_approval=True)
def send(to: str) -> str:
    """Send a report."""
    return f"sent to {to}"


def model(request: Any) -> Any:
    if not any(m.tool_results for m in request.conversation):
        return ScriptedTurn(tool_calls=[call("send", {"to": "ops"}, id="s1")])
    return "sent"


def main() -> None:
    step, state_path, spans_path = sys.argv[1:4]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(FunctionBackend(model), tools=[send], instrument=Instrumentation(tracer_provider=provider))
    if step == "start":
        result = agent.run_sync("send the report")
    else:
        state = RunState.load(state_path)
        state.approve("s1")
        result = agent.run_sync(state=state)
    result.state.save(state_path)
    with open(spans_path, "a", encoding="utf-8") as handle:
        for span in exporter.get_finished_spans():
            record = {
                "name": span.name,
                "trace_id": format(span.context.trace_id, "032x"),
                "status": (span.attributes or {}).get("parley.run.status"),
                "pid": os.getpid(),
            }
            handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
