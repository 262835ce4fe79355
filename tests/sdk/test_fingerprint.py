"""A saved state is resumed only by its own agent; a deliberate upgrade must fit its open calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parley import Agent, RunState, tool
from parley.backends import ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import RunStateMismatchError
from parley.fingerprint import fingerprint_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "run_state"
ran: list[str] = []


@tool(needs_approval=True)
def delete_account(user: str) -> str:
    ran.append(f"x.delete_account({user})")
    return f"deleted {user}"


@tool
def lookup(city: str) -> str:
    return "4 C"


def agent_x(*tools: Any, name: str = "x", script: list[Any] | None = None) -> Agent[str]:
    backend = ScriptedBackend(script if script is not None else ["Done."])
    return Agent(backend, name=name, tools=list(tools) or [delete_account, lookup])


async def paused_for_delete() -> RunState:
    ran.clear()
    backend = [ScriptedTurn(tool_calls=[call("delete_account", {"user": "ada"}, id="del_1")])]
    result = await agent_x(script=backend).run("Close Ada's account")
    assert result.paused
    result.state.approve("del_1")
    return RunState.from_json(result.state.to_json())


async def test_a_different_agent_is_refused_naming_the_differences_and_runs_nothing() -> None:
    state = await paused_for_delete()

    @tool(name="delete_account", needs_approval=True)
    def y_delete_account(user: str, hard: bool = True) -> str:
        ran.append("y.delete_account")
        return "gone"

    y = Agent(ScriptedBackend(["Done."]), name="y", tools=[y_delete_account], output_type={"type": "object"})
    with pytest.raises(RunStateMismatchError) as refused:
        await y.run(state=state)
    assert refused.value.differences == [
        "agent name 'x' (saved) is 'y' now",
        "tool 'delete_account' has another argument schema",
        "tool 'lookup' is missing",
        "the output schema differs",
    ]
    assert "allow_agent_change" in str(refused.value) and ran == []
    with pytest.raises(RunStateMismatchError, match="'delete_account' with the argument schema"):
        await y.run(state=state, allow_agent_change=True)  # an upgrade that changes the pending call's tool
    assert ran == []


async def test_the_same_agent_rebuilt_in_another_process_resumes() -> None:
    state = await paused_for_delete()
    assert state.fingerprint == fingerprint_of(agent_x())
    done = await agent_x().run(state=state)
    assert done.output == "Done." and ran == ["x.delete_account(ada)"]


async def test_allow_agent_change_accepts_an_upgrade_whose_open_calls_still_fit() -> None:
    state = await paused_for_delete()

    @tool
    def forecast(city: str, days: int) -> str:
        return "sunny"

    upgraded = Agent(ScriptedBackend(["Done."]), name="x2", tools=[delete_account, lookup, forecast])
    with pytest.raises(RunStateMismatchError, match="'forecast' is new"):
        await upgraded.run(state=state)
    done = await upgraded.run(state=state, allow_agent_change=True)
    assert done.output == "Done." and ran == ["x.delete_account(ada)"]
    assert done.state.fingerprint == fingerprint_of(upgraded)  # the state now belongs to the new agent


async def test_a_migration_hook_can_rename_a_pending_call_to_its_new_tool() -> None:
    state = await paused_for_delete()

    @tool(name="close_account", needs_approval=True)
    def close_account(user: str) -> str:
        ran.append(f"close_account({user})")
        return f"closed {user}"

    seen: list[list[str]] = []

    def migrate(old: RunState, differences: list[str]) -> RunState:
        seen.append(differences)
        new = old.model_copy(deep=True)
        new.batch = [c.model_copy(update={"name": "close_account"}) for c in new.batch]
        for message in new.messages:
            message.parts = [
                p.model_copy(update={"name": "close_account"}) if getattr(p, "name", None) == "delete_account" else p
                for p in message.parts
            ]
        assert new.fingerprint is not None
        new.fingerprint.tools["close_account"] = new.fingerprint.tools.pop("delete_account")
        return new

    renamed = Agent(ScriptedBackend(["Done."]), name="x", tools=[close_account, lookup])
    done = await renamed.run(state=state, allow_agent_change=migrate)
    assert done.output == "Done." and ran == ["close_account(ada)"]
    assert seen == [["tool 'close_account' is new", "tool 'delete_account' is missing"]]


async def test_a_changed_child_agent_is_named() -> None:
    @tool(needs_approval=True)
    def send(to: str) -> str:
        return "sent"

    def parent(child_tools: list[Any]) -> Agent[str]:
        child = Agent(ScriptedBackend([]), name="mailer", tools=child_tools)
        script = [ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="l1")]), "ok"]
        return Agent(ScriptedBackend(script), name="boss", tools=[lookup, child.as_tool()])

    result = await parent([send]).run("hi")
    assert result.output == "ok" and result.state.fingerprint is not None
    state = result.state

    @tool(name="send", needs_approval=True)
    def send_v2(to: str, cc: str) -> str:
        return "sent"

    with pytest.raises(RunStateMismatchError) as refused:
        await parent([send_v2]).run(state=RunState.from_json(state.to_json()))
    assert refused.value.differences == ["child agent behind 'mailer' differs"]


async def test_an_old_state_without_a_fingerprint_is_checked_by_names() -> None:
    text = (FIXTURES / "1.1" / "resume_pending_approval_after_a_repeat.json").read_text()
    assert RunState.from_json(text).fingerprint is None

    @tool(needs_approval=True)
    def send_email(to: str, body: str) -> str:
        return "sent"

    lacking = Agent(ScriptedBackend(["Done."]), tools=[lookup])
    with pytest.raises(RunStateMismatchError, match="tool 'send_email' of an open call is missing"):
        await lacking.run(state=RunState.from_json(text))
    state = RunState.from_json(text)
    state.approve("call_email")
    done = await Agent(ScriptedBackend(["Done."]), tools=[lookup, send_email]).run(state=state)
    assert done.output == "Done." and done.state.fingerprint is not None  # bound from now on


async def test_a_toolsets_list_may_change_between_pause_and_resume_but_not_an_open_calls_tool() -> None:
    from parley.tools import Toolset

    class Listed(Toolset):  # stands in for an MCP server, whose list may change (tools/list_changed)
        name = "listed"

        def __init__(self, *tools: Any) -> None:
            super().__init__()
            self._tools = list(tools)

        def tools(self) -> list[Any]:
            return self._tools

    def agent(toolset: Toolset, *script: Any) -> Agent[str]:
        return Agent(ScriptedBackend(list(script) or ["Done."]), name="x", tools=[toolset])

    ran.clear()
    turn = ScriptedTurn(tool_calls=[call("delete_account", {"user": "ada"}, id="del_1")])
    paused = await agent(Listed(delete_account), turn).run("Close Ada's account")
    assert paused.state.fingerprint is not None and paused.state.fingerprint.toolset_tools.keys() == {"delete_account"}
    paused.state.approve("del_1")
    saved = paused.state.to_json()

    @tool(name="delete_account", needs_approval=True)
    def delete_account_v2(user: str, reason: str) -> str:
        ran.append("v2")
        return "deleted"

    with pytest.raises(RunStateMismatchError, match="open call 'del_1' needs tool 'delete_account'"):
        await agent(Listed(delete_account_v2)).run(state=RunState.from_json(saved))
    assert ran == []
    done = await agent(Listed(delete_account, lookup)).run(state=RunState.from_json(saved))  # the list grew
    assert done.output == "Done." and ran == ["x.delete_account(ada)"]
