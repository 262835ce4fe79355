"""The OpenAI Agents SDK's default model class (`OpenAIResponsesModel`) against `parley serve`: its tool loop
and its streamed run, over the scripted fake engine on 127.0.0.1 (the typed-output case needs a grammar, so it
runs on the real model in test_real_model.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

agents = pytest.importorskip("agents", reason="the openai-agents package (dev extra) is not installed")

from openai import AsyncOpenAI  # noqa: E402

from parley.local_engine.testing import FakeEngine  # noqa: E402
from parley.server import BackgroundServer  # noqa: E402
from tests.sdk.server.conftest import serve  # noqa: E402

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

agents.set_tracing_disabled(True)  # the SDK would otherwise export traces to api.openai.com


@pytest.fixture
def weather_server(fake_engine: FakeEngine) -> Iterator[BackgroundServer]:
    fake_engine.replies = [CALL, "It is sunny in Paris."]
    with serve(fake_engine) as server:
        yield server


def weather_agent(server: BackgroundServer, seen: list[str]) -> agents.Agent:
    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        seen.append(city)
        return f"sunny in {city}"

    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=20)
    model = agents.OpenAIResponsesModel(model="test-model", openai_client=client)
    return agents.Agent(name="forecaster", instructions="Be brief.", tools=[get_weather], model=model)


def test_the_tool_loop_runs_the_call_and_returns_the_answer(
    weather_server: BackgroundServer, fake_engine: FakeEngine
) -> None:
    seen: list[str] = []
    result = asyncio.run(agents.Runner.run(weather_agent(weather_server, seen), "Weather in Paris?"))
    assert result.final_output == "It is sunny in Paris." and seen == ["Paris"]
    prompt = fake_engine.tokenizer.decode(fake_engine.last.prompt_ids)
    assert "sunny in Paris" in prompt and "Be brief." in prompt  # the tool's output went back as an item


def test_a_streamed_run_sees_the_documented_events(weather_server: BackgroundServer) -> None:
    seen: list[str] = []

    async def run() -> tuple[list[str], object]:
        streamed = agents.Runner.run_streamed(weather_agent(weather_server, seen), "Weather in Paris?")
        kinds = [e.data.type async for e in streamed.stream_events() if e.type == "raw_response_event"]
        return kinds, streamed.final_output

    kinds, final = asyncio.run(run())
    assert final == "It is sunny in Paris." and seen == ["Paris"]
    assert kinds.count("response.created") == 2 and kinds.count("response.completed") == 2  # two model turns
    assert "response.function_call_arguments.delta" in kinds and "response.output_text.delta" in kinds
