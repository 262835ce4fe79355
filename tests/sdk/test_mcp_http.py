"""MCP toolsets over Streamable HTTP on 127.0.0.1: the same approval + resume guarantees as stdio."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from parley.backends import ScriptedBackend, ScriptedTurn  # noqa: E402
from parley.backends.scripted import call  # noqa: E402
from parley.mcp import MCPConnectionError  # noqa: E402
from tests.sdk.mcp_fixture import REPO_ROOT, counted, http_toolset, notes_agent, start_http_server  # noqa: E402


@pytest.fixture
def http_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    count = tmp_path / "count.txt"
    process, url = start_http_server(count)
    try:
        yield url, count, process
    finally:
        process.kill()
        process.wait(timeout=10)


async def test_pause_then_resume_in_another_process_runs_the_call_once(http_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, count, _ = http_server
    agent = notes_agent(http_toolset(url, needs_approval={"delete_note"}))
    result = await agent.run("tidy up")
    assert result.paused and [i.tool_name for i in result.interruptions] == ["notes_delete_note"]
    assert counted(count) == ["add_note"]
    state_path = tmp_path / "state.json"
    result.state.save(state_path)
    worker = subprocess.run(
        [sys.executable, "-m", "tests.sdk.mcp_fixture", "resume", str(state_path), str(count), "--url", url],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stderr
    assert worker.stderr == ""
    # the same server process (HTTP): the note added before the pause is there to delete
    assert "notes_delete_note=deleted 'draft'" in worker.stdout
    assert counted(count) == ["add_note", "delete_note"]
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not others


async def test_http_server_killed_mid_call_gives_an_error_result(http_server) -> None:  # type: ignore[no-untyped-def]
    url, count, process = http_server
    from parley import Agent

    turns = [ScriptedTurn(tool_calls=[call("notes_slow", {"seconds": 60}, id="slow")]), ScriptedTurn(text="gone")]
    agent = Agent(ScriptedBackend(turns), tools=[http_toolset(url)])

    async def kill_when_called() -> None:
        while "slow" not in counted(count):
            await asyncio.sleep(0.05)
        process.kill()

    killer = asyncio.ensure_future(kill_when_called())
    started = time.monotonic()
    result = await asyncio.wait_for(agent.run("go"), 40)
    await killer
    assert time.monotonic() - started < 30
    slow = next(r for m in result.messages for r in m.tool_results)
    assert slow.is_error and "MCP server 'notes'" in slow.content
    assert result.output == "gone"
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not others


async def test_nothing_listening_is_a_connection_error(tmp_path: Path) -> None:
    from parley import Agent
    from tests.sdk.mcp_fixture import free_port

    toolset = http_toolset(f"http://127.0.0.1:{free_port()}/mcp", connect_timeout_s=10)
    with pytest.raises(MCPConnectionError):
        await Agent(ScriptedBackend([ScriptedTurn(text="never")]), tools=[toolset]).run("go")


def test_eight_resumes_of_one_approved_state_at_once_run_the_call_once(http_server) -> None:  # type: ignore[no-untyped-def]
    """Eight threads (each its own event loop and connection) resume one saved state at the same moment:
    the server executes the approved call once (the execution ledger, `parley.ledger`)."""
    import threading

    from parley import RunState

    url, count, _ = http_server
    paused = notes_agent(http_toolset(url, needs_approval={"delete_note"})).run_sync("tidy up")
    paused.state.approve(paused.interruptions[0].call_id)
    saved = paused.state.to_json()
    together = threading.Barrier(8)
    outputs: list[object] = []

    def resume() -> None:
        agent = notes_agent(http_toolset(url, needs_approval={"delete_note"}))
        together.wait(timeout=60)
        outputs.append(agent.run_sync(state=RunState.from_json(saved)).output)

    threads = [threading.Thread(target=resume) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert counted(count) == ["add_note", "delete_note"]
    assert outputs == ["done: notes_add_note=stored 'draft'; notes_delete_note=deleted 'draft'"] * 8
