"""Agent as a tool: nested pauses with a path, child state inside the parent's, usage and limits added up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from parley import Agent, RunState, UsageLimits, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import UsageLimitExceeded
from parley.protocol import Usage
from tests.conftest import REPO_ROOT
from tests.sdk.teamwork_agents import CHILD_USAGE, PARENT_USAGE, counter_tool, mail_agents


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_a_call_inside_the_child_pauses_the_parent_with_a_path(tmp_path: Path) -> None:
    counter = tmp_path / "sent.log"
    assistant, parent_backend, child_backend = mail_agents(counter)
    result = await assistant.run("Tell Ada the report is late")

    assert result.paused and not lines(counter)
    [item] = result.interruptions
    assert item.path == ["ask_1", "mail_1"] and item.call_id == "ask_1/mail_1"
    assert item.tool_name == "send_email" and item.agent == "mailer" and item.kind == "approval"
    child = result.state.children["ask_1"]
    assert [i.call_id for i in child.pending] == ["mail_1"]
    assert child.usage == CHILD_USAGE
    assert result.usage == PARENT_USAGE + CHILD_USAGE  # own + child's, at the pause too
    assert len(parent_backend.requests) == 1 and len(child_backend.requests) == 1

    state = RunState.from_json(result.state.to_json())
    state.approve(item.call_id)
    assert not state.pending and state.children["ask_1"].decisions["mail_1"].kind == "approved"
    done = await assistant.run(state=state)
    assert done.output == "Done. Mailer: sent to ada@example.com" and not done.paused
    assert lines(counter) == ["main mail_1"]
    assert done.usage == PARENT_USAGE + PARENT_USAGE + CHILD_USAGE + CHILD_USAGE
    assert not done.state.children  # the child finished: its state is no longer kept
    assert len(child_backend.requests) == 2  # the child resumed where it paused: no request repeated


async def test_the_childs_own_call_id_approves_when_unambiguous_and_reject_is_routed(tmp_path: Path) -> None:
    counter = tmp_path / "sent.log"
    assistant, _, child_backend = mail_agents(counter)
    result = await assistant.run("Tell Ada the report is late")
    state = result.state
    state.reject("mail_1", "Not now.")
    done = await assistant.run(state=state)
    assert done.output == "Done. Mailer: Not now." and not lines(counter)
    assert child_backend.requests[-1].conversation.messages[-1].tool_results[0].content == "Not now."


def test_two_copies_approved_in_two_processes_send_once_in_all(tmp_path: Path) -> None:
    """The execution ledger (`parley.ledger`) is shared by the two processes: the second copy finds the
    parent's call to the mailer recorded, and uses its answer without resuming the child."""
    counter = tmp_path / "sent.log"
    assistant, _, _ = mail_agents(counter)
    paused = assistant.run_sync("Tell Ada the report is late")
    state_file = tmp_path / "state.json"
    state_file.write_text(paused.state.to_json())

    outputs = []
    for tag in ("first", "second"):
        done = subprocess.run(
            [sys.executable, "-m", "tests.sdk.teamwork_agents", "resume-mail", str(state_file), str(counter), tag],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert lines(counter) == ["first mail_1"]  # sent once, by the first copy
    for out in outputs:
        assert out["output"] == "Done. Mailer: sent to ada@example.com" and not out["paused"]
    assert outputs[0]["requests"] == 4 and outputs[0]["input_tokens"] == 2 * 100 + 2 * 7
    assert outputs[1]["requests"] == 3 and outputs[1]["input_tokens"] == 2 * 100 + 7  # the child did not run


def test_a_parent_request_limit_stops_the_child_on_its_second_request() -> None:
    @tool
    def lookup(city: str) -> str:
        """Weather.

        Args:
            city: City.
        """
        return "4 C"

    child_backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})]), "It is 4 C."])
    child = Agent(child_backend, name="weather", tools=[lookup])
    parent_backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Bergen"})]),
            ScriptedTurn(tool_calls=[call("weather", {"input": "Oslo?"})]),
            "unreachable",
        ]
    )
    parent = Agent(
        parent_backend, tools=[lookup, child.as_tool()], usage_limits=UsageLimits(request_limit=3), max_tool_rounds=None
    )
    with pytest.raises(UsageLimitExceeded) as caught:
        parent.run_sync("Weather in Bergen and Oslo?")
    assert caught.value.limit == "request_limit" and caught.value.value == 4
    assert len(parent_backend.requests) == 2 and len(child_backend.requests) == 1


def test_a_parent_cost_limit_counts_the_childs_cost() -> None:
    from decimal import Decimal

    priced = Usage(input_tokens=1, output_tokens=1, requests=1, cost=Decimal("0.4"))
    child_backend = ScriptedBackend([ScriptedTurn(text="child answer", usage=priced)])
    child = Agent(child_backend, name="helper")
    parent_backend = ScriptedBackend(
        [ScriptedTurn(tool_calls=[call("helper", {"input": "x"})], usage=priced), ScriptedTurn(text="x", usage=priced)]
    )
    parent = Agent(parent_backend, tools=[child.as_tool()], usage_limits=UsageLimits(cost_limit=Decimal("0.7")))
    with pytest.raises(UsageLimitExceeded) as caught:
        parent.run_sync("go")
    assert caught.value.limit == "cost_limit" and caught.value.value == Decimal("0.8")
    assert len(parent_backend.requests) == 1  # stopped inside the child, before the parent's next request


async def test_a_child_failing_on_its_own_gives_the_parent_an_error_result() -> None:
    child = Agent(
        ScriptedBackend([ScriptedTurn(tool_calls=[call("nothing", {})])] * 2), name="looper", max_turns=1
    )
    parent_backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("looper", {"input": "go"})]), "gave up"])
    result = await Agent(parent_backend, tools=[child.as_tool()]).run("go")
    assert result.output == "gave up"
    seen = parent_backend.requests[1].conversation.messages[-1].tool_results[0]
    assert seen.is_error and "looper agent could not finish" in seen.content and "max_turns=1" in seen.content


async def test_needs_approval_on_the_agent_tool_is_asked_once(tmp_path: Path) -> None:
    counter = tmp_path / "sent.log"
    child = Agent(
        FunctionBackend(lambda r: _mail_or_answer(r), name="child"), name="mailer", tools=[counter_tool(counter, "t")]
    )
    parent = Agent(
        ScriptedBackend([ScriptedTurn(tool_calls=[call("mailer", {"input": "mail Ada"}, id="ask")]), "ok"]),
        tools=[child.as_tool(needs_approval=True, output_extractor=lambda r: f"[{r.output}]")],
    )
    first = await parent.run("mail Ada")
    assert [i.call_id for i in first.interruptions] == ["ask"]  # the agent tool itself needs approval
    first.state.approve("ask")
    second = await parent.run(state=first.state)
    assert [i.call_id for i in second.interruptions] == ["ask/mail_1"]  # then the call inside it
    second.state.approve("ask/mail_1")
    third = await parent.run(state=second.state)
    assert third.output == "ok" and lines(counter) == ["t mail_1"]
    assert third.messages[-2].tool_results[0].content == "[Mailer: sent to ada@example.com]"


def _mail_or_answer(request: ModelRequest) -> Any:
    from tests.sdk.teamwork_agents import mailer_model

    return mailer_model(request)


async def test_a_crash_mid_child_resumes_from_the_parents_checkpoint_without_resending(tmp_path: Path) -> None:
    counter = tmp_path / "sent.log"
    snapshots: list[str] = []
    crash = {"armed": True}

    def flaky_mailer(request: ModelRequest) -> Any:
        from tests.sdk.teamwork_agents import mailer_model

        if crash["armed"] and any(r for m in request.conversation for r in m.tool_results):
            raise RuntimeError("process died")  # after the email went out, before the child answered
        return mailer_model(request)

    @tool(name="send_email")
    def send_email(to: str, body: str) -> str:
        """Send.

        Args:
            to: Address.
            body: Text.
        """
        with open(counter, "a", encoding="utf-8") as handle:
            handle.write("sent\n")
        return f"sent to {to}"

    def agents() -> Agent[str]:
        from tests.sdk.teamwork_agents import assistant_model

        mailer = Agent(FunctionBackend(flaky_mailer), name="mailer", tools=[send_email])
        return Agent(FunctionBackend(assistant_model), tools=[mailer.as_tool()])

    with pytest.raises(RuntimeError, match="process died"):
        await agents().run("Tell Ada", checkpoint=lambda s: snapshots.append(s.to_json()))
    last = RunState.from_json(snapshots[-1])
    assert last.children["ask_1"].records or last.children["ask_1"].messages[-1].tool_results
    crash["armed"] = False
    done = await agents().run(state=last)
    assert done.output == "Done. Mailer: sent to ada@example.com"
    assert lines(counter) == ["sent"]  # the email went out once, crash or not


async def test_the_frozen_nested_state_fixture_resumes(tmp_path: Path) -> None:
    fixture = REPO_ROOT / "tests/fixtures/run_state/1.1/agent_tool_child_paused_for_approval.json"
    state = RunState.from_json(fixture.read_text())
    [item] = state.pending
    state.approve(item.call_id)
    counter = tmp_path / "sent.log"
    done = await mail_agents(counter)[0].run(state=state)
    assert done.output == "Done. Mailer: sent to ada@example.com" and lines(counter) == ["main mail_1"]


async def test_two_paused_children_of_one_batch_never_cross_talk(tmp_path: Path) -> None:
    """The Agents SDK's nested-resume cross-talk (#2501): two runs of the same child agent, both paused."""
    from parley.errors import UnknownCallError
    from tests.sdk.teamwork_agents import mailer_model

    counter = tmp_path / "sent.log"
    mailer = Agent(FunctionBackend(mailer_model), name="mailer", tools=[counter_tool(counter, "t")])
    parent_backend = ScriptedBackend(
        [
            ScriptedTurn(
                tool_calls=[
                    call("mailer", {"input": "mail Ada"}, id="ask_1"),
                    call("mailer", {"input": "mail Bo"}, id="ask_2"),
                ]
            ),
            "both handled",
        ]
    )
    parent = Agent(parent_backend, tools=[mailer.as_tool()])
    paused = await parent.run("mail Ada and Bo")
    assert sorted(i.call_id for i in paused.interruptions) == ["ask_1/mail_1", "ask_2/mail_1"]
    state = RunState.from_json(paused.state.to_json())
    with pytest.raises(UnknownCallError, match="more than one"):
        state.approve("mail_1")  # the child's own id names two calls here
    state.approve("ask_1/mail_1")
    state.reject("ask_2/mail_1", "Not Bo.")
    done = await parent.run(state=state)
    assert done.output == "both handled" and lines(counter) == ["t mail_1"]
    answers = {r.call_id: r.content for m in done.messages for r in m.tool_results}
    assert answers == {"ask_1": "Mailer: sent to ada@example.com", "ask_2": "Mailer: Not Bo."}


# -- a streaming parent streams its children ------------------------------------------------------------


def _assistant(parts: list[Any], usage: Usage) -> Any:
    from parley.backends import ModelResponse
    from parley.protocol import Message, Role

    message = Message(role=Role.ASSISTANT, parts=parts)
    finish = "tool_calls" if message.tool_calls else "stop"
    return ModelResponse(messages=[message], usage=usage, finish_reason=finish, model="scripted")


def _researcher() -> tuple[Agent[str], ScriptedBackend]:
    """A child that reasons, calls `lookup`, then answers in three text pieces."""
    from parley.protocol import ReasoningPart, TextPart

    @tool
    def lookup(city: str) -> str:
        """Weather.

        Args:
            city: City.
        """
        return f"4 C in {city}"

    child_backend = ScriptedBackend(
        [
            _assistant(
                [ReasoningPart(text="Need the weather."), call("lookup", {"city": "Oslo"}, id="look_1")], CHILD_USAGE
            ),
            _assistant([TextPart(text="It is "), TextPart(text="4 C "), TextPart(text="in Oslo.")], CHILD_USAGE),
        ]
    )
    return Agent(child_backend, name="researcher", tools=[lookup]), child_backend


def _researcher_agents() -> tuple[Agent[str], ScriptedBackend, ScriptedBackend]:
    """A parent asking the researcher."""
    child, child_backend = _researcher()
    parent_backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("researcher", {"input": "Oslo weather?"}, id="ask_1")], usage=PARENT_USAGE),
            ScriptedTurn(text="Researcher says 4 C.", usage=PARENT_USAGE),
        ]
    )
    return Agent(parent_backend, name="assistant", tools=[child.as_tool()]), parent_backend, child_backend


async def _streamed(agent: Agent[Any], **kwargs: Any) -> tuple[list[Any], Any]:
    from parley import RunResult

    items = [item async for item in agent.run_stream(**kwargs)]
    assert isinstance(items[-1], RunResult) and not any(isinstance(i, RunResult) for i in items[:-1])
    return items[:-1], items[-1]


def _same_result(streamed: Any, plain: Any) -> None:
    assert streamed.output == plain.output and streamed.paused == plain.paused
    assert streamed.usage == plain.usage
    assert streamed.messages == plain.messages
    assert streamed.interruptions == plain.interruptions
    assert _untraced(streamed.state.model_dump()) == _untraced(plain.state.model_dump())


def _untraced(value: Any) -> Any:
    """A dumped state without its trace ids (fresh per run, children's too)."""
    if isinstance(value, dict):
        return {k: _untraced(v) for k, v in value.items() if k != "trace_id"}
    if isinstance(value, list):
        return [_untraced(v) for v in value]
    return value


async def test_a_streamed_parent_yields_the_childs_events_tagged_with_path_and_name() -> None:
    from parley.protocol import (
        AgentToolEvent,
        MessageEnd,
        ReasoningDelta,
        Role,
        TextDelta,
        ToolCallEnd,
        UsageEvent,
    )

    parent, _, child_backend = _researcher_agents()
    events, result = await _streamed(parent, input="Oslo weather?")

    tagged = [e for e in events if isinstance(e, AgentToolEvent)]
    assert tagged and all(e.path == ["ask_1"] and e.agent == "researcher" for e in tagged)
    inner = [e.event for e in tagged]
    assert [e.kind for e in inner] == [
        "reasoning_delta", "tool_call_start", "tool_call_delta", "tool_call_end", "message_end", "usage",
        "message_end",  # lookup's result
        "text_delta", "text_delta", "text_delta", "message_end", "usage",
    ]  # fmt: skip
    assert [e.text for e in inner if isinstance(e, TextDelta)] == ["It is ", "4 C ", "in Oslo."]
    assert [e.text for e in inner if isinstance(e, ReasoningDelta)] == ["Need the weather."]
    assert [e.call.name for e in inner if isinstance(e, ToolCallEnd)] == ["lookup"]
    tool_results = [e for e in inner if isinstance(e, MessageEnd) and e.message.role is Role.TOOL]
    assert [r.message.tool_results[0].content for r in tool_results] == ["4 C in Oslo"]
    assert [e.usage for e in inner if isinstance(e, UsageEvent)] == [CHILD_USAGE, CHILD_USAGE]

    # the child's events come after the parent's call of it, before the parent sees the child's answer
    at = [i for i, e in enumerate(events) if isinstance(e, AgentToolEvent)]
    first, last = at[0], at[-1]
    assert at == list(range(first, last + 1))  # one uninterrupted run of the child's events
    before, after = events[:first], events[last + 1 :]
    assert [e.kind for e in before[-3:]] == ["tool_call_end", "message_end", "usage"]  # the parent's turn
    assert isinstance(before[-3], ToolCallEnd) and before[-3].call.id == "ask_1"
    answer = next(e for e in after if isinstance(e, MessageEnd))
    assert answer.message.role is Role.TOOL and answer.message.tool_results[0].content == "It is 4 C in Oslo."
    # top-level usage events are the parent's own; the result adds the child's, counted once
    assert [e.usage for e in events if isinstance(e, UsageEvent)] == [PARENT_USAGE, PARENT_USAGE]
    assert result.usage == PARENT_USAGE + PARENT_USAGE + CHILD_USAGE + CHILD_USAGE
    assert len(child_backend.requests) == 2

    again, _ = await _streamed(_researcher_agents()[0], input="Oslo weather?")
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events]  # deterministic order
    _same_result(result, await _researcher_agents()[0].run("Oslo weather?"))


def test_the_agent_tool_event_is_an_event_that_round_trips() -> None:
    from pydantic import TypeAdapter

    from parley.protocol import AgentToolEvent, Event, TextDelta

    tagged = AgentToolEvent(path=["ask_1", "call_3"], agent="helper", event=TextDelta(text="hi"))
    adapter: TypeAdapter[Any] = TypeAdapter(Event)
    assert adapter.validate_json(adapter.dump_json(tagged)) == tagged


def _nested_agents() -> Agent[str]:
    """parent -> planner (agent tool) -> researcher (agent tool of the planner)."""
    researcher, _ = _researcher()
    planner_backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("researcher", {"input": "Oslo?"}, id="plan_1")], usage=CHILD_USAGE),
            ScriptedTurn(text="Plan: pack a coat.", usage=CHILD_USAGE),
        ]
    )
    planner = Agent(planner_backend, name="planner", tools=[researcher.as_tool()])
    parent_backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("planner", {"input": "Trip to Oslo"}, id="ask_1")], usage=PARENT_USAGE),
            ScriptedTurn(text="Pack a coat.", usage=PARENT_USAGE),
        ]
    )
    return Agent(parent_backend, name="assistant", tools=[planner.as_tool()])


async def test_a_grandchilds_events_carry_the_two_level_path() -> None:
    from parley.protocol import AgentToolEvent, MessageEnd, Role, TextDelta

    events, result = await _streamed(_nested_agents(), input="Trip to Oslo")
    tagged = [e for e in events if isinstance(e, AgentToolEvent)]
    by_agent = {name: [e for e in tagged if e.agent == name] for name in ("planner", "researcher")}
    assert len(tagged) == len(by_agent["planner"]) + len(by_agent["researcher"])
    assert all(e.path == ["ask_1"] for e in by_agent["planner"])
    assert all(e.path == ["ask_1", "plan_1"] for e in by_agent["researcher"])
    assert all(not isinstance(e.event, AgentToolEvent) for e in tagged)  # one wrapper, the full path
    texts = [(e.agent, e.event.text) for e in tagged if isinstance(e.event, TextDelta)]
    assert texts == [
        ("researcher", "It is "), ("researcher", "4 C "), ("researcher", "in Oslo."), ("planner", "Plan: pack a coat.")
    ]  # fmt: skip
    # the researcher's events sit between the planner's call of it and the planner's record of its answer
    planner_results = [
        i for i, e in enumerate(tagged)
        if e.agent == "planner" and isinstance(e.event, MessageEnd) and e.event.message.role is Role.TOOL
    ]  # fmt: skip
    researcher_at = [i for i, e in enumerate(tagged) if e.agent == "researcher"]
    assert planner_results == [researcher_at[-1] + 1]
    assert result.output == "Pack a coat."
    assert result.usage == PARENT_USAGE + PARENT_USAGE + CHILD_USAGE + CHILD_USAGE + CHILD_USAGE + CHILD_USAGE
    _same_result(result, await _nested_agents().run("Trip to Oslo"))


async def test_a_child_pausing_inside_a_streamed_parent_surfaces_and_resumes(tmp_path: Path) -> None:
    from parley.protocol import AgentToolEvent, MessageEnd, Role, TextDelta, ToolCallEnd

    counter = tmp_path / "sent.log"
    events, paused = await _streamed(mail_agents(counter)[0], input="Tell Ada the report is late")
    assert paused.paused and not lines(counter)
    [item] = paused.interruptions
    assert item.path == ["ask_1", "mail_1"] and item.agent == "mailer"
    tagged = [e for e in events if isinstance(e, AgentToolEvent)]
    assert all(e.path == ["ask_1"] and e.agent == "mailer" for e in tagged)
    assert [e.event.call.id for e in tagged if isinstance(e.event, ToolCallEnd)] == ["mail_1"]
    plain = await mail_agents(tmp_path / "plain.log")[0].run("Tell Ada the report is late")
    _same_result(paused, plain)

    state = RunState.from_json(paused.state.to_json())
    state.approve(item.call_id)
    events, done = await _streamed(mail_agents(counter)[0], state=state)
    assert done.output == "Done. Mailer: sent to ada@example.com" and not done.paused
    assert lines(counter) == ["main mail_1"]
    tagged = [e for e in events if isinstance(e, AgentToolEvent)]
    assert all(e.path == ["ask_1"] and e.agent == "mailer" for e in tagged)
    sent = [e.event for e in tagged if isinstance(e.event, MessageEnd) and e.event.message.role is Role.TOOL]
    assert [m.message.tool_results[0].content for m in sent] == ["sent to ada@example.com"]
    assert [e.event.text for e in tagged if isinstance(e.event, TextDelta)] == ["Mailer: sent to ada@example.com"]
    assert done.usage == PARENT_USAGE + PARENT_USAGE + CHILD_USAGE + CHILD_USAGE

    plain_state = RunState.from_json(plain.state.to_json())
    plain_state.approve(item.call_id)
    _same_result(done, await mail_agents(tmp_path / "plain.log")[0].run(state=plain_state))
