"""Tracing follows the GenAI semantic conventions point by point (open-telemetry/semantic-conventions-genai,
docs/gen-ai/gen-ai-spans.md): captured content in the conventions' message schema, ``gen_ai.request.stream``
only when streaming, the served model as ``gen_ai.response.model``, a fallback named by the backend it asks,
the session's id as ``gen_ai.conversation.id``, the agent's description. Spans go to the SDK's in-memory
exporter."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from parley import Agent, MemorySession, tool  # noqa: E402
from parley.backends import FallbackBackend, FunctionBackend, ScriptedBackend, ScriptedTurn  # noqa: E402
from parley.backends.errors import OverloadedError  # noqa: E402
from parley.backends.scripted import call  # noqa: E402
from parley.tracing import Instrumentation  # noqa: E402


def traced(**settings: Any) -> tuple[Instrumentation, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Instrumentation(tracer_provider=provider, **settings), exporter


def spans(exporter: InMemorySpanExporter, prefix: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


@tool
def lookup(city: str) -> str:
    """Weather for a city."""
    return f"{city}: 4 C"


async def test_captured_content_is_in_the_conventions_message_schema() -> None:
    instrument, exporter = traced(capture_content=True)
    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="c1")]), "4 C."])
    await Agent(backend, instructions="Be brief.", tools=[lookup], instrument=instrument).run("Weather?")
    first, second = spans(exporter, "chat")
    sent = json.loads(second.attributes["gen_ai.input.messages"])
    assert sent == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Weather?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "lookup",
                                         "arguments": {"city": "Oslo"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "Oslo: 4 C"}]},
    ]
    assert json.loads(first.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "finish_reason": "tool_call",
         "parts": [{"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {"city": "Oslo"}}]},
    ]
    assert json.loads(second.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "finish_reason": "stop", "parts": [{"type": "text", "content": "4 C."}]},
    ]
    [run] = spans(exporter, "invoke_agent")
    assert json.loads(run.attributes["gen_ai.system_instructions"]) == [{"type": "text", "content": "Be brief."}]


async def test_stream_is_set_only_when_streaming() -> None:
    instrument, exporter = traced()
    agent = Agent(ScriptedBackend(["one", "two"]), instrument=instrument)
    await agent.run("hi")
    async for _ in agent.run_stream("hi again"):
        pass
    plain, streamed = spans(exporter, "chat")
    assert "gen_ai.request.stream" not in plain.attributes  # unset means not streaming
    assert streamed.attributes["gen_ai.request.stream"] is True


async def test_the_session_id_is_the_conversation_id_of_every_run() -> None:
    instrument, exporter = traced()
    agent = Agent(ScriptedBackend(["one", "two"]), name="helper", description="Answers briefly.",
                  instrument=instrument)
    session = MemorySession("user-42")
    first = await agent.run("hi", session=session)
    second = await agent.run("again", session=session)
    assert first.state.trace_id != second.state.trace_id
    for span in exporter.get_finished_spans():
        assert span.attributes["gen_ai.conversation.id"] == "user-42", span.name
    for run in spans(exporter, "invoke_agent"):
        assert run.attributes["gen_ai.agent.description"] == "Answers briefly."


async def test_without_a_session_the_run_id_is_the_conversation_id() -> None:
    instrument, exporter = traced()
    result = await Agent(ScriptedBackend(["one"]), instrument=instrument).run("hi")
    assert {s.attributes["gen_ai.conversation.id"] for s in exporter.get_finished_spans()} == {result.state.trace_id}


async def test_the_response_model_is_the_served_model_and_a_fallback_is_named_by_what_it_asks() -> None:
    instrument, exporter = traced()

    def down(request: Any) -> Any:
        raise OverloadedError("overloaded", status_code=529)

    fallback = FallbackBackend([FunctionBackend(down, name="anthropic:claude-a"),
                                ScriptedBackend(["served"], name="openai:gpt-b")])
    await Agent(fallback, instrument=instrument).run("hi")
    [chat] = spans(exporter, "chat")
    assert chat.name == "chat claude-a"
    assert chat.attributes["gen_ai.provider.name"] == "anthropic"
    assert chat.attributes["gen_ai.request.model"] == "claude-a"
    assert chat.attributes["gen_ai.response.model"] == "gpt-b"  # not parley's "openai:gpt-b"
    [run] = spans(exporter, "invoke_agent")
    assert run.attributes["gen_ai.provider.name"] == "anthropic"
