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
    failed, served = spans(exporter, "chat")  # (the failed attempt's span ends first)
    assert served.name == "chat gpt-b" and served.attributes["gen_ai.provider.name"] == "openai"
    assert served.attributes["gen_ai.request.model"] == "gpt-b"
    assert served.attributes["gen_ai.response.model"] == "gpt-b"  # not parley's "openai:gpt-b"
    assert served.attributes["gen_ai.usage.output_tokens"] > 0
    # the attempt that failed has its own span, inside the request's, with its error and no usage
    assert failed.name == "chat claude-a" and failed.attributes["gen_ai.provider.name"] == "anthropic"
    assert failed.attributes["error.type"] == "OverloadedError" and failed.attributes["parley.fallback.attempt"] == 1
    assert failed.parent.span_id == served.context.span_id and "gen_ai.usage.input_tokens" not in failed.attributes
    assert failed.start_time <= failed.end_time <= served.end_time
    [run] = spans(exporter, "invoke_agent")
    assert run.attributes["gen_ai.provider.name"] == "anthropic"  # (what the agent asks first)


async def test_a_streamed_fallback_attempt_that_fails_has_its_span_too() -> None:
    instrument, exporter = traced()

    def down(request: Any) -> Any:
        raise OverloadedError("overloaded", status_code=529)

    fallback = FallbackBackend([FunctionBackend(down, name="anthropic:claude-a"),
                                ScriptedBackend(["served"], name="openai:gpt-b")])
    async for _ in Agent(fallback, instrument=instrument).run_stream("hi"):
        pass
    failed, served = spans(exporter, "chat")
    assert (failed.name, served.name) == ("chat claude-a", "chat gpt-b")
    assert served.attributes["gen_ai.request.stream"] is True and failed.attributes["error.type"] == "OverloadedError"


async def test_an_agent_tool_call_has_an_execute_tool_span_holding_the_child_run() -> None:
    instrument, exporter = traced()
    child = Agent(ScriptedBackend(["Paris."]), name="geographer", description="Knows capitals.")
    parent = Agent(
        ScriptedBackend([ScriptedTurn(tool_calls=[call("geographer", {"input": "capital of France?"}, id="g1")]),
                         "It is Paris."]),
        name="lead", tools=[child.as_tool()], instrument=instrument,
    )
    await parent.run("Capital of France?")
    [tool_span] = spans(exporter, "execute_tool")
    runs = {s.name: s for s in spans(exporter, "invoke_agent")}
    assert tool_span.name == "execute_tool geographer" and tool_span.attributes["gen_ai.tool.call.id"] == "g1"
    assert tool_span.attributes["parley.tool.source"] == "agent"
    assert tool_span.parent.span_id == runs["invoke_agent lead"].context.span_id
    assert runs["invoke_agent geographer"].parent.span_id == tool_span.context.span_id
    child_run = runs["invoke_agent geographer"]  # traced by its parent's tracer: instrument left at None
    [child_chat] = [s for s in spans(exporter, "chat") if s.parent.span_id == child_run.context.span_id]
    assert child_run.attributes["gen_ai.agent.description"] == "Knows capitals."
    assert child_chat.attributes["gen_ai.provider.name"] == "parley"


async def test_the_compaction_summariser_has_its_chat_span_and_the_usage_adds_up() -> None:
    from parley import Compaction
    from parley.context_window import estimate_tokens
    from parley.protocol import Message, Usage
    from tests.sdk.test_compaction import SYSTEM, Model, is_summary_request, prefix
    from tests.sdk.test_history_processors import history

    instrument, exporter = traced()
    backend = FunctionBackend(Model())
    backend.context_window = 10**6  # type: ignore[attr-defined]
    agent = Agent(backend, instructions=SYSTEM, compaction=Compaction(at=0.5, keep_last_turns=2), instrument=instrument)
    first = await agent.run([*prefix(), *history(12), Message.user("now?")])
    size = estimate_tokens(backend.requests[0].conversation.messages, backend.requests[0].tools)
    backend.context_window = int(size * 1.2)  # type: ignore[attr-defined]
    exporter.clear()
    second = await agent.run("and Rome?", state=first.state)
    assert any(is_summary_request(r) for r in backend.requests)
    chats = spans(exporter, "chat")
    assert [c.attributes.get("parley.request.purpose") for c in chats] == ["compaction", None]
    [run] = spans(exporter, "invoke_agent")
    total = sum(c.attributes["gen_ai.usage.output_tokens"] for c in chats)
    assert run.attributes["gen_ai.aggregated_usage.output_tokens"] == total == 7 + 2
    assert second.usage.output_tokens - first.usage.output_tokens == total and isinstance(second.usage, Usage)


async def test_spans_reach_a_collector_over_otlp_http() -> None:
    """The SDK's OTLP/HTTP exporter against a receiver on 127.0.0.1: the spans arrive as protobuf, with
    the conventions' attributes."""
    import http.server
    import threading

    otlp = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[ExportTraceServiceRequest] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.append(request)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider = TracerProvider()
        exporter = otlp.OTLPSpanExporter(endpoint=f"http://127.0.0.1:{server.server_port}/v1/traces", timeout=5)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        agent = Agent(ScriptedBackend(["hello"], name="openai:gpt-x"), name="greeter",
                      instrument=Instrumentation(tracer_provider=provider))
        await agent.run("hi", session=MemorySession("s-1"))
        provider.shutdown()
    finally:
        server.shutdown()
    got = {
        span.name: {kv.key: kv.value for kv in span.attributes}
        for request in received for resource in request.resource_spans
        for scope in resource.scope_spans for span in scope.spans
    }
    assert set(got) == {"chat gpt-x", "invoke_agent greeter"}
    assert got["chat gpt-x"]["gen_ai.provider.name"].string_value == "openai"
    assert got["chat gpt-x"]["gen_ai.conversation.id"].string_value == "s-1"
    assert got["invoke_agent greeter"]["gen_ai.operation.name"].string_value == "invoke_agent"


def test_every_gen_ai_name_parley_uses_is_one_the_conventions_package_defines() -> None:
    """parley's ``gen_ai.*`` attribute names against opentelemetry-semantic-conventions' own constants
    (the usage names are composed: prefix + field, checked whole)."""
    semconv = pytest.importorskip("opentelemetry.semconv._incubating.attributes.gen_ai_attributes")
    from parley.tracing import attributes as a

    defined = {value for name, value in vars(semconv).items() if name.startswith("GEN_AI_") and isinstance(value, str)}
    ours = {value for name, value in vars(a).items() if isinstance(value, str) and value.startswith("gen_ai.")}
    ours -= {a.USAGE, a.AGGREGATED_USAGE}  # prefixes
    ours |= {f"{a.USAGE}.{field}" for field in (a.INPUT_TOKENS, a.OUTPUT_TOKENS, a.CACHE_READ, a.CACHE_CREATION,
                                                a.REASONING)}
    assert sorted(ours - defined) == []
