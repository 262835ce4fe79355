"""OpenTelemetry tracing: span tree and names, the GenAI usage arithmetic, one trace across processes.

Spans go to the OTel SDK's `InMemorySpanExporter` through a provider passed to the agent
(`Instrumentation(tracer_provider=...)`), so no global state is touched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from parley import Agent, RunState, Usage, tool  # noqa: E402
from parley.backends import FunctionBackend, ScriptedBackend, ScriptedTurn  # noqa: E402
from parley.backends.scripted import call  # noqa: E402
from parley.tracing import Instrumentation, run_tracer, usage_attributes  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHED = Usage(input_tokens=10, cache_read_tokens=1000, cache_write_tokens=200, output_tokens=7, requests=1)


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@tool
def lookup(city: str) -> str:
    """Weather for a city.

    Args:
        city: The city.
    """
    return f"{city}: 4 C"


@tool(needs_approval=True)
def send(to: str) -> str:
    """Send a report."""
    return f"sent to {to}"


def _by_name(spans: Any, prefix: str) -> list[Any]:
    return [s for s in spans if s.name.startswith(prefix)]


def test_usage_arithmetic_counts_cache_inside_input_tokens() -> None:
    attributes = usage_attributes(CACHED)
    assert attributes["gen_ai.usage.input_tokens"] == 1210
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 1000
    assert attributes["gen_ai.usage.cache_creation.input_tokens"] == 200
    assert attributes["parley.usage.uncached_input_tokens"] == 10
    assert attributes["gen_ai.usage.output_tokens"] == 7


async def test_span_tree_names_and_usage() -> None:
    provider, exporter = _provider()
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="c1")], usage=CACHED),
            ScriptedTurn(text="4 C in Oslo", usage=Usage(input_tokens=30, cache_read_tokens=1200, output_tokens=5)),
        ],
        name="anthropic:claude-test",
    )
    agent = Agent(backend, tools=[lookup], name="weather", instrument=Instrumentation(tracer_provider=provider))
    result = await agent.run("Weather in Oslo?")
    spans = exporter.get_finished_spans()
    [run] = _by_name(spans, "invoke_agent")
    chats = _by_name(spans, "chat")
    [tool_span] = _by_name(spans, "execute_tool")
    assert run.name == "invoke_agent weather" and run.parent is None
    assert [c.name for c in chats] == ["chat claude-test", "chat claude-test"]
    assert all(c.parent.span_id == run.context.span_id for c in [*chats, tool_span])
    assert {s.context.trace_id for s in spans} == {run.context.trace_id}

    first = chats[0].attributes
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.provider.name"] == "anthropic" and first["gen_ai.request.model"] == "claude-test"
    assert first["gen_ai.usage.input_tokens"] == 1210
    assert first["gen_ai.usage.cache_read.input_tokens"] == 1000
    assert first["gen_ai.usage.cache_creation.input_tokens"] == 200
    assert first["gen_ai.usage.output_tokens"] == 7
    assert tuple(first["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert first["gen_ai.conversation.id"] == result.state.trace_id

    # the run's total is the sum of its requests (and the ledger's), never counted twice
    for key in ("input_tokens", "output_tokens", "cache_read.input_tokens", "cache_creation.input_tokens"):
        total = sum(c.attributes[f"gen_ai.usage.{key}"] for c in chats)
        assert run.attributes[f"gen_ai.aggregated_usage.{key}"] == total
        assert f"gen_ai.usage.{key}" not in run.attributes
    assert run.attributes["gen_ai.aggregated_usage.input_tokens"] == result.usage.prompt_tokens == 2440
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.name"] == "weather"
    assert run.attributes["parley.run.status"] == "complete"

    tool_attributes = tool_span.attributes
    assert tool_span.name == "execute_tool lookup"
    assert tool_attributes["gen_ai.tool.name"] == "lookup" and tool_attributes["gen_ai.tool.call.id"] == "c1"
    assert tool_attributes["parley.tool.approval"] == "not_required"
    assert "gen_ai.tool.call.arguments" not in tool_attributes  # content capture is off by default
    assert "gen_ai.input.messages" not in first


async def test_content_capture_is_opt_in_and_tool_errors_are_marked() -> None:
    provider, exporter = _provider()
    backend = ScriptedBackend(
        [ScriptedTurn(tool_calls=[call("lookup", {"town": "Oslo"}, id="bad")]), ScriptedTurn(text="sorry")]
    )
    settings = Instrumentation(tracer_provider=provider, capture_content=True)
    await Agent(backend, tools=[lookup], instrument=settings).run("Weather?")
    spans = exporter.get_finished_spans()
    [tool_span] = _by_name(spans, "execute_tool")
    assert tool_span.attributes["gen_ai.tool.call.arguments"] == '{"town":"Oslo"}'
    assert tool_span.attributes["error.type"] == "tool_error"
    assert "invalid arguments" in tool_span.attributes["gen_ai.tool.call.result"]
    assert "Weather?" in _by_name(spans, "chat")[0].attributes["gen_ai.input.messages"]


async def test_pause_and_resume_share_one_trace_and_approval_is_recorded() -> None:
    provider, exporter = _provider()
    settings = Instrumentation(tracer_provider=provider)

    def model(request: Any) -> Any:
        if not any(m.tool_results for m in request.conversation):
            return ScriptedTurn(tool_calls=[call("send", {"to": "ops"}, id="s1")], usage=CACHED)
        return ScriptedTurn(text="sent", usage=CACHED)

    agent = Agent(FunctionBackend(model), tools=[send], instrument=settings)
    paused = await agent.run("send it")
    assert paused.paused and paused.state.trace_context and "traceparent" in paused.state.trace_context
    state = RunState.from_json(paused.state.to_json())
    state.approve("s1")
    await agent.run(state=state)
    runs = _by_name(exporter.get_finished_spans(), "invoke_agent")
    assert [r.attributes["parley.run.status"] for r in runs] == ["paused", "complete"]
    assert runs[0].context.trace_id == runs[1].context.trace_id
    assert runs[1].parent.span_id == runs[0].context.span_id and runs[1].attributes["parley.run.resumed"]
    [executed] = _by_name(exporter.get_finished_spans(), "execute_tool")
    assert executed.attributes["parley.tool.approval"] == "approved"


def test_pause_here_resume_in_another_process_shares_the_trace_id(tmp_path: Path) -> None:
    spans_path, state_path = tmp_path / "spans.json", tmp_path / "state.json"
    for step in ("start", "resume"):
        worker = subprocess.run(
            [sys.executable, "-m", "tests.sdk.tracing_worker", step, str(state_path), str(spans_path)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode == 0, worker.stderr
    spans = [json.loads(line) for line in spans_path.read_text().splitlines()]
    runs = [s for s in spans if s["name"].startswith("invoke_agent")]
    assert [r["status"] for r in runs] == ["paused", "complete"]
    assert len({s["trace_id"] for s in spans}) == 1
    assert len({s["pid"] for s in runs}) == 2  # two processes, one trace


async def test_off_means_no_tracer_and_no_spans() -> None:
    provider, exporter = _provider()
    assert run_tracer(False) is None
    assert run_tracer(None) is None  # no global tracer provider configured in the tests
    agent = Agent(ScriptedBackend([ScriptedTurn(text="hi")]), instrument=False)
    result = await agent.run("hello")
    assert result.state.trace_context is None
    assert exporter.get_finished_spans() == ()
