"""Approval and deferred interruptions: pause, resolve (fully or partly), persist, resume."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from parley import Agent, RunResult, RunState, ToolContext, tool
from parley.backends import ModelRequest, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import ApprovalArgumentsError, ConfigurationError, RunStateError, UnknownCallError
from parley.protocol import Role

executed: list[tuple[str, dict[str, Any]]] = []


@tool(needs_approval=True)
def send_email(to: str, body: str) -> str:
    """Send an email (side effect: needs a human).

    Args:
        to: Recipient address.
        body: Message text.
    """
    executed.append(("send_email", {"to": to, "body": body}))
    return f"sent to {to}"


def over_100(arguments: Mapping[str, Any]) -> bool:
    return bool(arguments["amount"] > 100)


@tool(needs_approval=over_100)
def refund(ctx: ToolContext, order: str, amount: int) -> str:
    executed.append(("refund", {"order": order, "amount": amount, "call_id": ctx.call_id}))
    return f"refunded {amount} on {order}"


@tool(deferred=True)
def ask_manager(question: str) -> str:
    raise AssertionError("deferred tools are answered from outside, never run")


@pytest.fixture(autouse=True)
def _clear() -> None:
    executed.clear()


def results_of(result: RunResult[object]) -> list[tuple[str, str, bool]]:
    return [(r.call_id, r.content, r.is_error) for m in result.messages for r in m.tool_results]


def agent_for(turns: list[Any]) -> tuple[Agent[str], ScriptedBackend]:
    backend = ScriptedBackend(turns)
    return Agent(backend, tools=[send_email, refund, ask_manager]), backend


def roundtrip(state: RunState) -> RunState:
    return RunState.from_json(state.to_json())


async def test_approval_pauses_persists_and_resumes_in_a_fresh_agent() -> None:
    turns: list[Any] = [ScriptedTurn(tool_calls=[call("send_email", {"to": "ada", "body": "hi"}, id="m1")]), "Sent."]
    agent, backend = agent_for(turns)
    paused = await agent.run("email ada")
    assert paused.paused and paused.output is None and executed == []
    assert [(i.kind, i.call_id, i.tool_name) for i in paused.interruptions] == [("approval", "m1", "send_email")]
    assert paused.state.pending == paused.interruptions
    assert paused.state.status == "paused"

    stored = paused.state.to_json()  # "another process": a new agent over the rest of the script
    state = RunState.from_json(stored)
    state.approve("m1")
    fresh = Agent(ScriptedBackend(turns[1:]), tools=[send_email, refund, ask_manager])
    done = await fresh.run(state=roundtrip(state))
    assert done.output == "Sent." and not done.paused
    assert executed == [("send_email", {"to": "ada", "body": "hi"})]
    assert results_of(done) == [("m1", "sent to ada", False)]
    assert done.usage.requests == 2 and done.state.status == "complete"


async def test_predicate_gates_only_some_calls() -> None:
    calls = [
        call("refund", {"order": "A", "amount": 20}, id="small"),
        call("refund", {"order": "B", "amount": 500}, id="big"),
    ]
    agent, _ = agent_for([ScriptedTurn(tool_calls=calls), "ok"])
    paused = await agent.run("refund")
    assert [i.call_id for i in paused.interruptions] == ["big"]
    # the ungated call ran before the pause and is recorded
    assert [e[1]["call_id"] for e in executed] == ["small"]
    assert set(paused.state.records) == {"small"}


async def test_reject_message_reaches_the_model_as_an_error_result() -> None:
    def sees_rejection(req: ModelRequest) -> bool:
        last = req.conversation.messages[-1].tool_results[0]
        return last.is_error and last.content == "Not to the CEO."

    turns: list[Any] = [
        ScriptedTurn(tool_calls=[call("send_email", {"to": "ceo", "body": "x"}, id="m")]),
        ScriptedTurn(text="Understood.", expect=sees_rejection),
    ]
    agent, _ = agent_for(turns)
    state = (await agent.run("go")).state
    state.reject("m", message="Not to the CEO.")
    done = await agent.run(state=roundtrip(state))
    assert done.output == "Understood." and executed == []


async def test_two_parallel_calls_one_approved_one_rejected() -> None:
    calls = [
        call("send_email", {"to": "a", "body": "1"}, id="ok"),
        call("send_email", {"to": "b", "body": "2"}, id="no"),
    ]
    agent, _ = agent_for([ScriptedTurn(tool_calls=calls), "done"])
    state = (await agent.run("go")).state
    assert [i.call_id for i in state.pending] == ["ok", "no"]
    state.approve("ok")
    state.reject("no", message="b is on holiday")
    done = await agent.run(state=roundtrip(state))
    assert results_of(done) == [("ok", "sent to a", False), ("no", "b is on holiday", True)]
    assert executed == [("send_email", {"to": "a", "body": "1"})]


async def test_deferred_and_approval_in_one_batch_with_partial_resolution() -> None:
    calls = [
        call("ask_manager", {"question": "refund 500?"}, id="d"),
        call("refund", {"order": "B", "amount": 500}, id="r"),
    ]
    agent, _ = agent_for([ScriptedTurn(tool_calls=calls), "all done"])
    first = await agent.run("go")
    assert [(i.kind, i.call_id) for i in first.interruptions] == [("deferred", "d"), ("approval", "r")]

    state = roundtrip(first.state)
    state.approve("r")  # only one of the two: the run must pause again on the other
    second = await agent.run(state=state)
    assert second.paused and [(i.kind, i.call_id) for i in second.interruptions] == [("deferred", "d")]
    assert [e[0] for e in executed] == ["refund"] and set(second.state.records) == {"r"}

    state = roundtrip(second.state)
    state.provide_result("d", {"answer": "yes"})
    done = await agent.run(state=state)
    assert done.output == "all done"
    assert results_of(done) == [("d", '{"answer": "yes"}', False), ("r", "refunded 500 on B", False)]
    assert len(executed) == 1  # the recorded refund never ran again


async def test_resume_with_results_provided_in_a_different_order() -> None:
    calls = [call("ask_manager", {"question": q}, id=q) for q in ("first", "second", "third")]
    agent, _ = agent_for([ScriptedTurn(tool_calls=calls), "thanks"])
    state = (await agent.run("go")).state
    for call_id in ("third", "first", "second"):
        state.provide_result(call_id, f"answer to {call_id}")
        state = roundtrip(state)
    done = await agent.run(state=state)
    # results sit right after the calls, in the order the model made them
    tool_messages = [m for m in done.messages if m.role is Role.TOOL]
    assert [m.tool_results[0].call_id for m in tool_messages] == ["first", "second", "third"]
    index = next(i for i, m in enumerate(done.messages) if m.tool_calls)
    assert all(m.role is Role.TOOL for m in done.messages[index + 1 : index + 4])


async def test_approve_with_edited_arguments_runs_the_edit() -> None:
    agent, _ = agent_for([ScriptedTurn(tool_calls=[call("send_email", {"to": "ceo", "body": "x"}, id="m")]), "ok"])
    state = (await agent.run("go")).state
    state.approve("m", arguments={"to": "team", "body": "x"})
    await agent.run(state=roundtrip(state))
    assert executed == [("send_email", {"to": "team", "body": "x"})]


@pytest.mark.parametrize(
    "edited",
    [{"to": 5, "body": "x"}, {"body": "missing to"}, {"to": "a", "body": "b", "extra": 1}, "not json", "[1, 2]"],
)
async def test_edited_arguments_that_fail_validation_are_refused_and_stay_pending(edited: Any) -> None:
    agent, _ = agent_for([ScriptedTurn(tool_calls=[call("send_email", {"to": "a", "body": "b"}, id="m")])])
    state = (await agent.run("go")).state
    with pytest.raises(ApprovalArgumentsError):
        state.approve("m", arguments=edited)
    assert [i.call_id for i in state.pending] == ["m"] and not state.decisions


async def test_resolving_an_unknown_or_wrong_kind_of_call_is_a_typed_error() -> None:
    agent, _ = agent_for([ScriptedTurn(tool_calls=[call("ask_manager", {"question": "?"}, id="d")])])
    state = (await agent.run("go")).state
    with pytest.raises(UnknownCallError, match="not pending"):
        state.approve("nope")
    with pytest.raises(UnknownCallError, match="provide_result"):
        state.approve("d")
    with pytest.raises(RunStateError, match="JSON-serialisable"):
        state.provide_result("d", object())
    state.reject("d")
    with pytest.raises(UnknownCallError):
        state.reject("d")  # already resolved


async def test_resuming_without_decisions_pauses_again_without_a_model_call() -> None:
    agent, backend = agent_for([ScriptedTurn(tool_calls=[call("send_email", {"to": "a", "body": "b"}, id="m")])])
    state = (await agent.run("go")).state
    again = await agent.run(state=roundtrip(state))
    assert again.paused and [i.call_id for i in again.interruptions] == ["m"]
    assert len(backend.requests) == 1


async def test_input_given_while_paused_lands_after_the_results() -> None:
    turns: list[Any] = [ScriptedTurn(tool_calls=[call("send_email", {"to": "a", "body": "b"}, id="m")]), "fine"]
    agent, backend = agent_for(turns)
    state = (await agent.run("go")).state
    state.approve("m")
    await agent.run("and cc bob", state=roundtrip(state))
    sent = backend.requests[1].conversation.messages
    assert [m.role for m in sent[-3:]] == [Role.ASSISTANT, Role.TOOL, Role.USER]
    assert sent[-1].text == "and cc bob"


async def test_a_state_keeps_its_tenant() -> None:
    agent, _ = agent_for([ScriptedTurn(tool_calls=[call("send_email", {"to": "a", "body": "b"}, id="m")])])
    state = (await agent.run("go", tenant="acme")).state
    assert roundtrip(state).tenant == "acme"
    with pytest.raises(ConfigurationError, match="tenant"):
        await agent.run(state=state, tenant="other")


async def test_resuming_leaves_the_callers_state_untouched() -> None:
    agent, _ = agent_for([ScriptedTurn(tool_calls=[call("send_email", {"to": "a", "body": "b"}, id="m")]), "ok"])
    state = (await agent.run("go")).state
    state.approve("m")
    before = state.to_json()
    done = await agent.run(state=state)
    assert state.to_json() == before and done.state is not state


async def test_a_completed_state_resumed_without_input_returns_its_answer() -> None:
    agent, backend = agent_for(["the answer"])
    state = (await agent.run("q")).state
    again = await agent.run(state=roundtrip(state))
    assert again.output == "the answer" and len(backend.requests) == 1
