"""MCP toolsets over stdio: approval + resume in another process exactly once, results, policy, lifecycle.

The fixture server (`examples/mcp_notes_server.py`, written with the mcp SDK) counts its executions
in a file; the model is a `FunctionBackend`/`ScriptedBackend`, so no weights are needed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from parley import RunState  # noqa: E402
from parley.backends import ScriptedBackend, ScriptedTurn  # noqa: E402
from parley.backends.scripted import call  # noqa: E402
from parley.errors import ConfigurationError  # noqa: E402
from parley.mcp import MCPConnectionError, MCPServerStdio  # noqa: E402
from tests.sdk.mcp_fixture import REPO_ROOT, counted, notes_agent, server_pids, stdio_toolset  # noqa: E402


def _agent(turns: list[ScriptedTurn], toolset: object, **options: object) -> object:
    from parley import Agent

    return Agent(ScriptedBackend(turns), tools=[toolset], max_tool_rounds=None, **options)


def _results(result: object) -> dict[str, object]:
    return {r.call_id: r for m in result.messages for r in m.tool_results}  # type: ignore[attr-defined]


def _no_other_tasks() -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not others, f"tasks left running: {others}"


async def test_prefixed_tool_needing_approval_pauses_and_resumes_in_another_process_once(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    agent = notes_agent(stdio_toolset(count, needs_approval={"delete_note"}))
    result = await agent.run("tidy up my notes")
    assert result.paused
    assert [(i.tool_name, i.kind) for i in result.interruptions] == [("notes_delete_note", "approval")]
    assert counted(count) == ["add_note"]  # the runnable call of the batch ran; the paused one did not
    _no_other_tasks()
    assert server_pids(str(count)) == []  # the run opened the server and closed it

    state_path = tmp_path / "state.json"
    result.state.save(state_path)
    for _ in range(2):  # the same saved state approved and resumed in two processes (one ledger: parley.ledger)
        worker = subprocess.run(
            [sys.executable, "-m", "tests.sdk.mcp_fixture", "resume", str(state_path), str(count)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode == 0, worker.stderr
        assert worker.stderr == ""  # no teardown noise, no server log lines in the user's stderr
        assert "notes_delete_note=no note 'draft'" in worker.stdout  # a new server process: fresh memory
        assert counted(count) == ["add_note", "delete_note"]  # exactly one execution of the approved call

    # The same (old) state resumed here, still waiting for the approval: it finds the call recorded
    # in the ledger, so it neither runs it again nor asks for the approval again.
    again = await agent.run(state=RunState.load(state_path))
    assert not again.paused and "notes_delete_note=no note 'draft'" in again.output
    assert counted(count) == ["add_note", "delete_note"]


async def test_results_images_errors_and_validation(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    toolset = stdio_toolset(count, "--image", "--fail")
    turns = [
        ScriptedTurn(
            tool_calls=[
                call("notes_chart", {}, id="chart"),
                call("notes_broken", {}, id="broken"),
                call("notes_add_note", {"title": 3}, id="invalid"),
                call("notes_list_notes", {}, id="list"),
            ]
        ),
        ScriptedTurn(text="ok"),
    ]
    result = await _agent(turns, toolset).run("go")  # type: ignore[attr-defined]
    results = _results(result)
    chart = results["chart"]
    assert not chart.is_error and chart.content == "0 notes"
    assert [a.media_type for a in chart.attachments] == ["image/png"]
    broken = results["broken"]
    assert broken.is_error and "Error executing tool broken" in broken.content
    invalid = results["invalid"]
    assert invalid.is_error and "title" in invalid.content and "text" in invalid.content
    # no text blocks for an empty list: the structured content is what the model reads
    assert results["list"].content == '{"result":[]}' and not results["list"].is_error
    assert "add_note" not in counted(count)  # refused by the schema here: never sent to the server
    assert "broken" in counted(count)
    assert "Tool 'broken' raised" in toolset.stderr_text()  # the server's log went to the capture file


async def test_filters_prefix_and_tool_options(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    toolset = stdio_toolset(
        count,
        allow=lambda name: name != "add_tool_later",
        deny={"slow"},
        tool_options={"list_notes": {"idempotent": True, "retries": 2, "description": "All titles."}},
    )
    async with toolset:
        names = sorted(t.name for t in toolset.tools())
        assert names == ["notes_add_note", "notes_delete_note", "notes_list_notes"]
        assert toolset.skipped == {"slow": "denied", "add_tool_later": "not allowed"}
        listed = next(t for t in toolset.tools() if t.name == "notes_list_notes")
        assert listed.idempotent and listed.retries == 2 and listed.description == "All titles."
        add = next(t for t in toolset.tools() if t.name == "notes_add_note")
        assert add.parameters["required"] == ["title", "text"] and "title" not in add.parameters
    with pytest.raises(ConfigurationError):
        stdio_toolset(count, tool_options={"x": {"colour": "red"}})


async def test_timeout_gives_an_error_result_and_the_session_survives(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    toolset = stdio_toolset(count, tool_options={"slow": {"timeout_s": 0.5}})
    turns = [
        ScriptedTurn(tool_calls=[call("notes_slow", {"seconds": 5}, id="slow")]),
        ScriptedTurn(tool_calls=[call("notes_list_notes", {}, id="list")]),
        ScriptedTurn(text="ok"),
    ]
    started = time.monotonic()
    result = await _agent(turns, toolset).run("go")  # type: ignore[attr-defined]
    assert time.monotonic() - started < 5
    results = _results(result)
    assert results["slow"].is_error and "timed out after 0.5 s" in results["slow"].content
    assert results["list"].content == '{"result":[]}'


async def test_server_killed_mid_call_gives_a_typed_error_result_and_nothing_leaks(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    toolset = stdio_toolset(count)
    turns = [
        ScriptedTurn(tool_calls=[call("notes_slow", {"seconds": 60}, id="slow")]),
        ScriptedTurn(text="the server went away"),
    ]
    agent = _agent(turns, toolset)

    async def kill_when_called() -> None:
        while "slow" not in counted(count):
            await asyncio.sleep(0.05)
        for pid in server_pids(str(count)):
            os.kill(pid, 9)

    killer = asyncio.ensure_future(kill_when_called())
    started = time.monotonic()
    result = await asyncio.wait_for(agent.run("go"), 30)  # type: ignore[attr-defined]
    await killer
    assert time.monotonic() - started < 15
    slow = _results(result)["slow"]
    assert slow.is_error
    assert "MCP server 'notes'" in slow.content and "may or may not have run" in slow.content
    assert result.output == "the server went away"  # the run went on
    assert server_pids(str(count)) == []
    _no_other_tasks()


async def test_server_death_can_stop_the_run_instead(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    toolset = stdio_toolset(count, on_server_error="raise")
    agent = _agent([ScriptedTurn(tool_calls=[call("notes_slow", {"seconds": 60}, id="slow")])], toolset)

    async def kill_when_called() -> None:
        while "slow" not in counted(count):
            await asyncio.sleep(0.05)
        for pid in server_pids(str(count)):
            os.kill(pid, 9)

    killer = asyncio.ensure_future(kill_when_called())
    with pytest.raises(MCPConnectionError) as caught:
        await asyncio.wait_for(agent.run("go"), 30)  # type: ignore[attr-defined]
    await killer
    assert caught.value.server == "notes"
    assert server_pids(str(count)) == []
    _no_other_tasks()


async def test_a_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    broken = MCPServerStdio(sys.executable, ["-c", "import sys; sys.stderr.write('no config here\\n')"], name="bad")
    agent = _agent([ScriptedTurn(text="never")], broken)
    with pytest.raises(MCPConnectionError) as caught:
        await agent.run("go")  # type: ignore[attr-defined]
    assert "bad" in str(caught.value) and "no config here" in caught.value.stderr
    missing = MCPServerStdio(str(tmp_path / "no-such-binary"), name="missing")
    with pytest.raises(MCPConnectionError):
        await _agent([ScriptedTurn(text="never")], missing).run("go")  # type: ignore[attr-defined]
    _no_other_tasks()


async def test_tools_list_changed_is_picked_up_before_the_next_request(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    toolset = stdio_toolset(count)
    turns = [
        ScriptedTurn(tool_calls=[call("notes_add_tool_later", {"name": "echo"}, id="add")]),
        ScriptedTurn(tool_calls=[call("notes_echo", {"text": "hi"}, id="echo")]),
        ScriptedTurn(text="ok"),
    ]
    agent = _agent(turns, toolset)
    backend = agent.backend  # type: ignore[attr-defined]

    async def slow_model_turn(request: object) -> object:
        await asyncio.sleep(0.3)  # the notification arrives while the model "thinks"
        return await ScriptedBackend.generate(backend, request)  # type: ignore[arg-type]

    backend.generate = slow_model_turn  # type: ignore[method-assign]
    result = await agent.run("go")  # type: ignore[attr-defined]
    assert _results(result)["echo"].content == "hi"
    assert "notes_echo" in [t.name for t in backend.requests[-1].tools]
    assert "notes_echo" not in [t.name for t in backend.requests[0].tools]


async def test_async_with_agent_keeps_one_server_for_several_runs(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    toolset = stdio_toolset(count)
    turns = [
        ScriptedTurn(tool_calls=[call("notes_add_note", {"title": "a", "text": "b"}, id="add")]),
        ScriptedTurn(text="stored"),
        ScriptedTurn(tool_calls=[call("notes_list_notes", {}, id="list")]),
        ScriptedTurn(text="listed"),
    ]
    agent = _agent(turns, toolset)
    async with agent:  # type: ignore[attr-defined]
        assert len(server_pids(str(count))) == 1
        await agent.run("add")  # type: ignore[attr-defined]
        second = await agent.run("list")  # type: ignore[attr-defined]
        assert _results(second)["list"].content == "a"  # same server process: it remembers
        assert len(server_pids(str(count))) == 1
    assert server_pids(str(count)) == []
    _no_other_tasks()


async def test_cancelling_a_run_mid_call_shuts_the_server_down(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    agent = _agent([ScriptedTurn(tool_calls=[call("notes_slow", {"seconds": 60}, id="slow")])], stdio_toolset(count))
    task = asyncio.ensure_future(agent.run("go"))  # type: ignore[attr-defined]
    while "slow" not in counted(count):
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 10
    while server_pids(str(count)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert server_pids(str(count)) == []


def test_a_toolset_left_open_is_closed_cleanly_at_interpreter_exit(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    worker = subprocess.run(
        [sys.executable, "-m", "tests.sdk.mcp_fixture", "leave-open", str(count)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr
    assert "notes_add_note" in worker.stdout
    assert worker.stderr == ""
    assert server_pids(str(count)) == []


def test_run_sync_twice_reconnects_in_each_event_loop(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    turns = [
        ScriptedTurn(tool_calls=[call("notes_list_notes", {}, id="a")]),
        ScriptedTurn(text="one"),
        ScriptedTurn(tool_calls=[call("notes_list_notes", {}, id="b")]),
        ScriptedTurn(text="two"),
    ]
    agent = _agent(turns, stdio_toolset(count))
    assert agent.run_sync("first").output == "one"  # type: ignore[attr-defined]
    assert agent.run_sync("second").output == "two"  # type: ignore[attr-defined]
    assert counted(count) == ["list_notes", "list_notes"]
    assert server_pids(str(count)) == []
