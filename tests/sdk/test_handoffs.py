"""Handoffs: transfer_to_<name> tools, history filters, the specialist's output type, pause and resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from parley import Agent, RunHooks, RunState, handoff
from parley.backends import ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import ConfigurationError, RunStateMismatchError
from parley.handoffs import keep_last_turns, remove_tool_calls, repair_history
from parley.protocol import Message, Role, ToolResult
from tests.conftest import REPO_ROOT
from tests.sdk.teamwork_agents import Refund, refund_agents


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_a_triage_agent_hands_off_to_a_specialist_with_an_output_type(tmp_path: Path) -> None:
    counter = tmp_path / "refunds.log"
    triage, triage_backend, billing_backend = refund_agents(counter)
    first = await triage.run("I was charged twice for order A17")

    [offered] = [r.tools for r in triage_backend.requests]
    assert [t.name for t in offered] == ["transfer_to_billing"]
    assert first.paused and first.last_agent == "billing"  # paused inside the specialist
    [item] = first.interruptions
    assert item.tool_name == "refund" and item.agent is None and first.state.current_agent == "billing"

    specialist_first = billing_backend.requests[0]
    system, *history = specialist_first.conversation.messages
    assert system.role is Role.SYSTEM and system.text.startswith("You settle refunds.")
    assert [t.name for t in specialist_first.tools] == ["refund"]
    # the input filter dropped the transfer call and its result: only the user's words remain
    assert [(m.role, m.text) for m in history] == [(Role.USER, "I was charged twice for order A17")]
    assert specialist_first.output_schema is not None

    first.state.approve(item.call_id)
    done = await triage.run(state=first.state)
    assert done.output == Refund(order="A17", amount=30) and done.last_agent == "billing"
    assert lines(counter) == ["main refund_1"]
    assert len(triage_backend.requests) == 1  # triage spoke once; billing answered from then on


def test_a_pause_inside_the_specialist_resumes_in_another_process(tmp_path: Path) -> None:
    counter = tmp_path / "refunds.log"
    triage, _, _ = refund_agents(counter)
    paused = triage.run_sync("I was charged twice for order A17")
    state_file = tmp_path / "state.json"
    state_file.write_text(paused.state.to_json())
    done = subprocess.run(
        [sys.executable, "-m", "tests.sdk.teamwork_agents", "resume-refund", str(state_file), str(counter), "other"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["output"] == {"order": "A17", "amount": 30} and out["last_agent"] == "billing"
    assert lines(counter) == ["other refund_1"]


async def test_on_handoff_and_the_hook_run_at_the_switch_and_only_the_first_transfer_counts() -> None:
    seen: list[str] = []

    class Hooks(RunHooks):
        def on_handoff(self, ctx: Any, source: Any, target: Any) -> None:
            seen.append(f"hook:{source.name}->{target.name}:{ctx.agent.name}")

    async def note(ctx: Any) -> None:
        seen.append(f"on_handoff:{ctx.agent.name}")

    sales_backend = ScriptedBackend(["Sales here."])
    sales = Agent(sales_backend, name="sales", instructions="You sell.")
    support = Agent(ScriptedBackend([]), name="support")
    triage_backend = ScriptedBackend(
        [ScriptedTurn(tool_calls=[call("transfer_to_sales", {}, id="h1"), call("transfer_to_support", {}, id="h2")])]
    )
    triage = Agent(triage_backend, name="triage", handoffs=[handoff(sales, on_handoff=note), support], hooks=Hooks())
    result = await triage.run("I want to buy")
    assert result.output == "Sales here." and result.last_agent == "sales"
    assert seen == ["on_handoff:sales", "hook:triage->sales:sales"]
    results = {r.call_id: r for m in sales_backend.requests[0].conversation for r in m.tool_results}
    assert results["h1"].content == "Transferred to sales." and not results["h1"].is_error
    assert results["h2"].is_error and "already goes to sales" in results["h2"].content


def test_history_filters() -> None:
    history = [
        Message.user("one"),
        Message.assistant("ok"),
        Message.user("two"),
        Message.assistant(tool_calls=[call("lookup", {"city": "Oslo"}, id="c1")]),
        Message(role=Role.TOOL, parts=[ToolResult(call_id="c1", name="lookup", content="4 C")], name="lookup"),
        Message.assistant("It is 4 C."),
    ]
    assert [m.text for m in remove_tool_calls(history)] == ["one", "ok", "two", "It is 4 C."]
    assert [m.role for m in keep_last_turns(1)(history)] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    # a custom filter that cuts between a call and its result is repaired, never sent broken
    cut = repair_history(history[4:])
    assert [m.role for m in cut] == [Role.ASSISTANT]
    open_call = repair_history(history[:4])
    assert open_call[-1].tool_results[0].is_error and open_call[-1].tool_results[0].call_id == "c1"
    with pytest.raises(ConfigurationError):
        keep_last_turns(0)


def test_handoff_targets_need_a_name() -> None:
    with pytest.raises(ConfigurationError, match="needs a name"):
        Agent(ScriptedBackend([]), handoffs=[Agent(ScriptedBackend([]))])


async def test_resuming_with_an_agent_that_cannot_reach_the_current_one_is_refused(tmp_path: Path) -> None:
    triage, _, _ = refund_agents(tmp_path / "log")
    paused = await triage.run("refund please")
    stranger = Agent(ScriptedBackend([]), name="stranger")
    with pytest.raises(RunStateMismatchError, match="'stranger'") as refused:  # bound to triage (parley.fingerprint)
        await stranger.run(state=RunState.from_json(paused.state.to_json()))
    assert "agent name 'triage' (saved) is 'stranger' now" in refused.value.differences
    with pytest.raises(RunStateMismatchError, match="missing"):  # an upgrade must still have the open calls' tools
        await stranger.run(state=RunState.from_json(paused.state.to_json()), allow_agent_change=True)


async def test_the_frozen_handoff_state_fixture_resumes(tmp_path: Path) -> None:
    fixture = REPO_ROOT / "tests/fixtures/run_state/1.1/handoff_paused_in_specialist.json"
    state = RunState.from_json(fixture.read_text())
    state.approve(state.pending[0].call_id)
    counter = tmp_path / "refunds.log"
    done = await refund_agents(counter)[0].run(state=state)
    assert done.output == Refund(order="A17", amount=30) and lines(counter) == ["main refund_1"]


async def test_the_toolsets_of_the_agent_handed_to_are_opened_for_it_and_closed_after() -> None:
    from parley import tool
    from parley.tools import Toolset

    @tool
    def stock(item: str) -> str:
        """Stock level.

        Args:
            item: Item.
        """
        return "3 left"

    class Counting(Toolset):
        def __init__(self) -> None:
            super().__init__()
            self.opened = self.closed = 0

        async def _open(self) -> None:
            self.opened += 1

        async def _close(self) -> None:
            self.closed += 1

        def tools(self) -> list[Any]:
            return [stock] if self._users else []

    toolset = Counting()
    sales_backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("stock", {"item": "tea"})]), "3 left."])
    sales = Agent(sales_backend, name="sales", tools=[toolset])
    triage = Agent(ScriptedBackend([ScriptedTurn(tool_calls=[call("transfer_to_sales", {})])]), handoffs=[sales])
    result = await triage.run("tea?")
    assert result.output == "3 left." and [t.name for t in sales_backend.requests[0].tools] == ["stock"]
    assert (toolset.opened, toolset.closed) == (1, 1)
