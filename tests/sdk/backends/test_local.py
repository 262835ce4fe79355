"""LocalBackend on the real embedded SmolLM2: constrained tool calls, structured answers, reasoning budgets,
tenant-salted prefix caching, and `parley demo` end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel

from parley import Agent, Reasoning, tool
from parley.backends import ModelRequest, NamedToolChoice, SamplingSettings
from parley.protocol import Conversation, Message
from parley.run_state import SCHEMA_VERSION

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def backend():  # type: ignore[no-untyped-def]
    from parley.backends.local import LocalBackend

    return LocalBackend()


@tool
def lookup(city: Literal["Oslo", "Lima", "Tokyo"], days: int = 1) -> str:
    """Weather forecast.

    Args:
        city: The city.
        days: How many days ahead.
    """
    return f"{city}: sunny for {days} day(s)"


class Forecast(BaseModel):
    city: str
    temp_c: int


def request(text: str, **kwargs: object) -> ModelRequest:
    conversation = Conversation(messages=[Message.user(text)])
    return ModelRequest(conversation=conversation, **kwargs)  # type: ignore[arg-type]


async def test_a_tool_call_has_schema_valid_arguments(backend) -> None:  # type: ignore[no-untyped-def]
    response = await backend.generate(
        request(
            "What's the weather in Lima for the next 3 days?",
            tools=[lookup.spec],
            tool_choice=NamedToolChoice("lookup"),
            sampling=SamplingSettings(max_tokens=48),
        )
    )
    calls = [c for m in response.messages for c in m.tool_calls]
    assert len(calls) == 1 and calls[0].name == "lookup"
    jsonschema.validate(calls[0].parsed_arguments(), lookup.parameters)
    assert response.usage.requests == 1 and response.usage.output_tokens > 0


async def test_a_structured_final_answer(backend) -> None:  # type: ignore[no-untyped-def]
    agent = Agent(backend, output_type=Forecast, sampling=SamplingSettings(max_tokens=40), output_retries=0)
    result = await agent.run("Oslo is at 4 degrees. Reply with JSON: city and temp_c.")
    assert isinstance(result.output, Forecast)


@pytest.mark.parametrize("budget", [7])
async def test_reasoning_budget_is_honoured_to_the_token(backend, budget: int) -> None:  # type: ignore[no-untyped-def]
    agent = Agent(
        backend,
        reasoning=Reasoning(budget_tokens=budget),
        output_type=Forecast,
        sampling=SamplingSettings(max_tokens=budget + 40),
        output_retries=0,
    )
    result = await agent.run("Oslo is at 4 degrees. Think, then reply with JSON: city and temp_c.")
    assert result.usage.reasoning_tokens == budget
    hook = backend.last_reasoning_hook
    assert hook is not None and hook.forced_by_budget and hook.reasoning_tokens == budget
    answer = result.messages[-1]
    assert answer.reasoning.strip()  # the reasoning came back as a reasoning part, not as the answer
    assert isinstance(result.output, Forecast)  # the answer after the forced end is still constrained


async def test_prefix_cache_reads_are_salted_by_tenant(backend) -> None:  # type: ignore[no-untyped-def]
    text = "Summarise in one word: " + "the quick brown fox jumps over the lazy dog. " * 6
    settings = SamplingSettings(max_tokens=2)
    first = await backend.generate(request(text, tenant="acme", sampling=settings))
    again = await backend.generate(request(text, tenant="acme", sampling=settings))
    other = await backend.generate(request(text, tenant="globex", sampling=settings))
    assert first.usage.prompt_tokens == again.usage.prompt_tokens == other.usage.prompt_tokens
    assert again.usage.cache_read_tokens >= 16 and again.usage.input_tokens < first.usage.input_tokens
    assert other.usage.cache_read_tokens == 0


def test_parley_demo_runs_end_to_end(backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from parley.cli import main

    assert main(["demo", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "PAUSED: send_report" in out and "approved" in out
    assert "final answer (WeatherReport)" in out
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["schema_version"] == SCHEMA_VERSION
    assert (tmp_path / "outbox.txt").read_text().startswith("to=")
    ledger = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(ledger) >= 3
    assert all(int(row[2]) > 0 for row in ledger[1:])  # turns 2+ read their prefix from the cache


def test_parley_chat_streams_replies(
    backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    from parley.cli import main

    lines = iter(["Say hello.", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert main(["chat", "--max-tokens", "8"]) == 0
    out = capsys.readouterr().out
    reply = out.split("bot> ", 1)[1].splitlines()[0]
    assert reply.strip()
