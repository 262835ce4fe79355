"""OpenTelemetry spans of an agent run, printed from the SDK's in-memory exporter.

    python examples/tracing_spans.py

Needs ``pip install 'parley[otel]'``. A stand-in model (`ScriptedBackend`) reports usage the way a
hosted provider with prompt caching would (10 uncached, 1000 read from the cache, 200 written to
it); the ``chat`` span counts all 1210 in ``gen_ai.usage.input_tokens``, as the GenAI conventions
ask, with the cache split beside it. In an application, give the provider an OTLP exporter instead.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from parley import Agent, Usage, tool
from parley.backends import ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.tracing import Instrumentation

CACHED = Usage(input_tokens=10, cache_read_tokens=1000, cache_write_tokens=200, output_tokens=12, requests=1)


@tool
def lookup(city: str) -> str:
    """Weather for a city.

    Args:
        city: The city.
    """
    return f"{city}: 4 C, light snow"


def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="c1")], usage=CACHED),
            ScriptedTurn(text="4 C and light snow in Oslo.", usage=CACHED),
        ],
        name="anthropic:claude-example",
    )
    agent = Agent(backend, tools=[lookup], name="weather", instrument=Instrumentation(tracer_provider=provider))
    result = agent.run_sync("Weather in Oslo?")
    spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    for span in spans:
        depth = 0 if span.parent is None else 1
        print("  " * depth + span.name)
    chat = next(s for s in spans if s.name.startswith("chat")).attributes or {}
    run = next(s for s in spans if s.name.startswith("invoke_agent")).attributes or {}
    print("chat gen_ai.usage.input_tokens:", chat["gen_ai.usage.input_tokens"])
    print("chat gen_ai.usage.cache_read.input_tokens:", chat["gen_ai.usage.cache_read.input_tokens"])
    print("chat gen_ai.usage.cache_creation.input_tokens:", chat["gen_ai.usage.cache_creation.input_tokens"])
    print("run gen_ai.aggregated_usage.input_tokens:", run["gen_ai.aggregated_usage.input_tokens"])
    print("answer:", result.output)


if __name__ == "__main__":
    main()
