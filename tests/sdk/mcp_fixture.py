"""What the MCP tests share with their worker subprocesses: the fixture server, the agent, helpers.

The server is `examples/mcp_notes_server.py` (the mcp SDK's `MCPServer`); with ``--count-file`` it
appends one line per tool execution, so a test counts real executions whatever the client thinks.

    python -m tests.sdk.mcp_fixture resume STATE COUNT_FILE [--url URL]   # approve + resume a paused run
    python -m tests.sdk.mcp_fixture leave-open COUNT_FILE                 # open, never close, exit
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER = REPO_ROOT / "examples" / "mcp_notes_server.py"


def server_args(count_file: str | os.PathLike[str], *extra: str) -> list[str]:
    return [str(SERVER), "--count-file", str(count_file), *extra]


def stdio_toolset(count_file: str | os.PathLike[str], *extra: str, **options: Any) -> Any:
    from parley.mcp import MCPServerStdio

    options.setdefault("prefix", "notes")
    options.setdefault("name", "notes")
    return MCPServerStdio(sys.executable, server_args(count_file, *extra), **options)


def http_toolset(url: str, **options: Any) -> Any:
    from parley.mcp import MCPServerHTTP

    options.setdefault("prefix", "notes")
    options.setdefault("name", "notes")
    return MCPServerHTTP(url, **options)


def counted(count_file: str | os.PathLike[str]) -> list[str]:
    """The tool names the server executed, in order."""
    path = Path(count_file)
    if not path.exists():
        return []
    return [line.split(" ", 1)[0] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def model(request: Any) -> Any:
    """A stand-in model: add a note and delete it (one batch), then report the results."""
    from parley.backends import ScriptedTurn
    from parley.backends.scripted import call

    results = [r for m in request.conversation for r in m.tool_results]
    if not results:
        return ScriptedTurn(
            tool_calls=[
                call("notes_add_note", {"title": "draft", "text": "hello"}, id="add"),
                call("notes_delete_note", {"title": "draft"}, id="delete"),
            ]
        )
    return "done: " + "; ".join(f"{r.name}={r.content}" for r in results)


def notes_agent(toolset: Any, **options: Any) -> Any:
    from parley import Agent
    from parley.backends import FunctionBackend

    return Agent(FunctionBackend(model), tools=[toolset], name="notes-agent", **options)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_http_server(count_file: str | os.PathLike[str], *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """The fixture server on Streamable HTTP at 127.0.0.1 (a free port); returns (process, URL)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, *server_args(count_file, "--http", "--port", str(port), *extra)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the HTTP fixture server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the HTTP fixture server did not start listening")


def server_pids(marker: str) -> list[int]:
    """Live processes whose command line contains `marker` (zombies excluded)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if marker in cmdline and status != "Z":
            pids.append(int(entry.name))
    return pids


async def _resume(state_path: str, count_file: str, url: str | None) -> None:
    from parley import RunState

    approval = {"delete_note"}
    toolset = http_toolset(url, needs_approval=approval) if url else stdio_toolset(count_file, needs_approval=approval)
    agent = notes_agent(toolset)
    state = RunState.load(state_path)
    for item in state.pending:
        state.approve(item.call_id)
    result = await agent.run(state=state)
    print(result.output)


async def _leave_open(count_file: str) -> None:
    agent = notes_agent(stdio_toolset(count_file))
    await agent.__aenter__()  # never closed: asyncio.run's cleanup and interpreter exit must cope
    print("open:", [t.name for t in agent.toolsets[0].tools()])


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    resume = sub.add_parser("resume")
    resume.add_argument("state")
    resume.add_argument("count_file")
    resume.add_argument("--url")
    leave = sub.add_parser("leave-open")
    leave.add_argument("count_file")
    args = parser.parse_args()
    if args.command == "resume":
        asyncio.run(_resume(args.state, args.count_file, args.url))
    else:
        asyncio.run(_leave_open(args.count_file))


if __name__ == "__main__":
    main()
