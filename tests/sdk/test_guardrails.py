"""Guardrails: input (blocking and parallel), output, and tool guardrails before and after a call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from parley import Agent, RunState, ToolContext, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import AgentError, GuardrailTripped
from parley.guardrails import (
    GuardrailResult,
    ToolDecision,
    input_guardrail,
    output_guardrail,
    tool_input_guardrail,
    tool_output_guardrail,
)
from parley.protocol import Message, ToolCall, ToolResult, Usage

ran: list[str] = []


@tool
def lookup(ctx: ToolContext, city: str) -> str:
    """Weather.

    Args:
        city: City.
    """
    ran.append(ctx.call_id)
    return f"4 C in {city}"


@tool
def send_email(ctx: ToolContext, to: str, body: str) -> str:
    """Send.

    Args:
        to: Address.
        body: Text.
    """
    ran.append(f"{ctx.call_id}:{to}")
    return f"sent to {to}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


@input_guardrail
def no_passwords(ctx: Any, input: list[Message]) -> GuardrailResult:
    found = "password" in " ".join(m.text for m in input).lower()
    return GuardrailResult(tripwire=found, output={"password": found})


def test_guardrailtripped_is_an_agent_error() -> None:
    assert issubclass(GuardrailTripped, AgentError)


async def test_a_tripped_input_guardrail_means_zero_backend_requests() -> None:
    backend = ScriptedBackend(["never"])
    agent = Agent(backend, guardrails=[no_passwords])
    with pytest.raises(GuardrailTripped) as caught:
        await agent.run("my password is hunter2")
    assert backend.requests == [] and backend.remaining == 1
    assert caught.value.guardrail == "no_passwords" and caught.value.kind == "input"
    assert caught.value.output == {"password": True}
    assert caught.value.state.guardrails[0].verdict == "trip"


async def test_input_guardrails_are_recorded_and_not_rerun_or_rebilled_on_resume() -> None:
    asked: list[int] = []

    @input_guardrail(name="classifier")
    async def classify(ctx: Any, input: list[Message]) -> GuardrailResult:
        asked.append(1)
        return GuardrailResult.ok({"topic": "weather"}, usage=Usage(input_tokens=50, requests=1))

    @tool(needs_approval=True)
    def approve_me(x: int) -> str:
        """Needs a human.

        Args:
            x: X.
        """
        return "ok"

    turns = [
        ScriptedTurn(tool_calls=[call("approve_me", {"x": 1})], usage=Usage(requests=1)),
        ScriptedTurn(text="done", usage=Usage(requests=1)),
    ]
    agent = Agent(ScriptedBackend(turns), tools=[approve_me], guardrails=[classify])
    first = await agent.run("weather?")
    assert first.paused and asked == [1]
    assert first.usage.requests == 2 and first.usage.input_tokens == 50  # the guardrail's request, billed once
    [record] = first.state.guardrails
    assert record.kind == "input" and record.output == {"topic": "weather"} and record.verdict == "allow"
    state = RunState.from_json(first.state.to_json())
    state.approve(first.interruptions[0].call_id)
    agent2 = Agent(ScriptedBackend(turns[1:]), tools=[approve_me], guardrails=[classify])
    done = await agent2.run(state=state)
    assert done.output == "done" and asked == [1]  # not asked again
    assert done.usage.input_tokens == 50 and done.usage.requests == 3  # nor billed again
    assert len(done.state.guardrails) == 1


async def test_new_user_input_is_checked_again() -> None:
    backend = ScriptedBackend(["fine", "never"])
    agent = Agent(backend, guardrails=[no_passwords])
    first = await agent.run("hello")
    with pytest.raises(GuardrailTripped):
        await agent.run("the password is x", state=first.state)
    assert len(backend.requests) == 1


async def test_a_parallel_input_guardrail_cancels_the_request_in_flight() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow_model(request: ModelRequest) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "too late"

    @input_guardrail(run_in_parallel=True)
    async def slow_check(ctx: Any, input: list[Message]) -> GuardrailResult:
        await started.wait()
        return GuardrailResult.trip("off topic", message="not about weather")

    agent = Agent(FunctionBackend(slow_model), guardrails=[slow_check])
    with pytest.raises(GuardrailTripped, match="not about weather"):
        await asyncio.wait_for(agent.run("tell me a joke"), 10)
    assert cancelled.is_set()


async def test_a_parallel_input_guardrail_that_trips_late_never_lets_the_turns_tools_run() -> None:
    @input_guardrail(run_in_parallel=True)
    async def late(ctx: Any, input: list[Message]) -> GuardrailResult:
        await asyncio.sleep(0.05)
        return GuardrailResult.trip("late")

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})])])
    with pytest.raises(GuardrailTripped) as caught:
        await Agent(backend, tools=[lookup], guardrails=[late]).run("weather")
    assert ran == [] and len(backend.requests) == 1  # the request was made (its cost), its tools never ran
    assert caught.value.state.usage.requests == 1


async def test_a_parallel_input_guardrail_that_passes_runs_beside_the_request() -> None:
    @input_guardrail(run_in_parallel=True)
    async def fine(ctx: Any, input: list[Message]) -> None:
        return None

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})]), "4 C"])
    result = await Agent(backend, tools=[lookup], guardrails=[fine]).run("weather")
    assert result.output == "4 C" and len(ran) == 1 and result.state.input_guarded


async def test_a_tool_guardrail_asking_for_approval_pauses_and_is_not_rerun_after_approval() -> None:
    asked: list[str] = []

    @tool_input_guardrail(tools=["send_email"])
    def outside_mail(ctx: Any, call: ToolCall) -> ToolDecision:
        asked.append(call.id)
        to = call.parsed_arguments()["to"]
        return ToolDecision.allow() if to.endswith("@example.com") else ToolDecision.require_approval("external")

    def agent(turns: list[Any]) -> Agent[str]:
        return Agent(ScriptedBackend(turns), tools=[send_email, lookup], guardrails=[outside_mail])

    mail = call("send_email", {"to": "eve@evil.test", "body": "hi"}, id="m1")
    first = await agent([ScriptedTurn(tool_calls=[mail, call("lookup", {"city": "Oslo"}, id="l1")])]).run("go")
    assert first.paused and asked == ["m1"] and ran == ["l1"]  # the guardrail only judges send_email
    [item] = first.interruptions
    assert item.call_id == "m1" and item.kind == "approval" and item.reason == "external"
    state = RunState.from_json(first.state.to_json())
    state.approve("m1")
    done = await agent(["sent"]).run(state=state)
    assert done.output == "sent"
    assert asked == ["m1"] and ran == ["l1", "m1:eve@evil.test"]  # not re-asked; ran once


async def test_a_tool_guardrail_rejects_with_a_message_the_model_reads() -> None:
    @tool_input_guardrail
    def no_evil(ctx: Any, call: ToolCall) -> ToolDecision | None:
        if "evil" in call.arguments:
            return ToolDecision.reject("Refused: that address is blocked.")
        return None

    backend = ScriptedBackend(
        [ScriptedTurn(tool_calls=[call("send_email", {"to": "eve@evil.test", "body": "x"})]), "ok"]
    )
    result = await Agent(backend, tools=[send_email], guardrails=[no_evil]).run("go")
    seen = backend.requests[1].conversation.messages[-1].tool_results[0]
    assert seen.is_error and seen.content == "Refused: that address is blocked." and ran == []
    assert result.state.guardrails[0].verdict == "reject"


async def test_a_tool_guardrail_replaces_arguments_before_the_tools_own_approval_check() -> None:
    @tool(needs_approval=lambda args: not args["to"].endswith("@example.com"))
    def mail(ctx: ToolContext, to: str) -> str:
        """Mail.

        Args:
            to: Address.
        """
        ran.append(to)
        return "sent"

    @tool_input_guardrail
    def redirect(ctx: Any, call: ToolCall) -> ToolDecision:
        return ToolDecision.replace_arguments({"to": "safe@example.com"})

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("mail", {"to": "eve@evil.test"})]), "ok"])
    result = await Agent(backend, tools=[mail], guardrails=[redirect]).run("go")
    assert not result.paused and ran == ["safe@example.com"]  # no approval: the new address is internal


async def test_a_tool_output_guardrail_replaces_the_output_or_stops_after_recording() -> None:
    @tool_output_guardrail(tools=["lookup"])
    def redact(ctx: Any, call: ToolCall, result: ToolResult) -> ToolDecision:
        return ToolDecision.replace_output(result.content.replace("Oslo", "[city]"))

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})]), "ok"])
    await Agent(backend, tools=[lookup], guardrails=[redact]).run("go")
    assert backend.requests[1].conversation.messages[-1].tool_results[0].content == "4 C in [city]"

    @tool_output_guardrail
    def halt(ctx: Any, call: ToolCall, result: ToolResult) -> ToolDecision:
        return ToolDecision.stop("leaked a secret")

    snapshots: list[RunState] = []
    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="l9")]), "never"])
    with pytest.raises(GuardrailTripped, match="leaked a secret") as caught:
        await Agent(backend, tools=[lookup], guardrails=[halt]).run("go", checkpoint=snapshots.append)
    assert caught.value.kind == "tool_output" and caught.value.call_id == "l9"
    assert "l9" in caught.value.state.records and ran.count("l9") == 1  # recorded: a resume will not rerun it


async def test_an_output_guardrail_rejecting_the_answer_raises() -> None:
    @output_guardrail
    def no_shouting(ctx: Any, output: str) -> GuardrailResult:
        return GuardrailResult(tripwire=output.isupper(), output={"shouting": output.isupper()})

    agent = Agent(ScriptedBackend(["IT IS COLD"]), guardrails=[no_shouting])
    with pytest.raises(GuardrailTripped) as caught:
        await agent.run("weather?")
    assert caught.value.kind == "output" and caught.value.output == {"shouting": True}
    assert caught.value.state.status != "complete"
    ok = await Agent(ScriptedBackend(["It is cold"]), guardrails=[no_shouting]).run("weather?")
    assert ok.output == "It is cold" and ok.state.guardrails[-1].kind == "output"


async def test_guardrails_fail_closed() -> None:
    @input_guardrail
    def broken(ctx: Any, input: list[Message]) -> GuardrailResult:
        raise ValueError("oops")

    with pytest.raises(GuardrailTripped, match="raised ValueError: oops"):
        await Agent(ScriptedBackend(["x"]), guardrails=[broken]).run("hi")

    @tool_input_guardrail
    def broken_tool(ctx: Any, call: ToolCall) -> ToolDecision:
        raise ValueError("oops")

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})])])
    result = await Agent(backend, tools=[lookup], guardrails=[broken_tool]).run("go")
    assert result.paused and "raised ValueError" in (result.interruptions[0].reason or "") and ran == []


def test_guardrails_must_be_guardrail_objects() -> None:
    from parley.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="input_guardrail"):
        Agent(ScriptedBackend([]), guardrails=[lambda ctx, x: None])  # type: ignore[list-item]
