"""`parley mcp serve`, driven by the mcp SDK's own client over stdio and Streamable HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from tests.sdk.mcp_fixture import REPO_ROOT, free_port  # noqa: E402

SERVE = [sys.executable, "-m", "parley.cli", "mcp", "serve", "tests.sdk.mcp_serve_tools:TOOLS", "--name", "shop"]


async def _exercise(session: ClientSession) -> None:
    init = await session.initialize()
    assert init.server_info.name == "shop"
    listed = {t.name: t for t in (await session.list_tools()).tools}
    assert sorted(listed) == ["badge", "convert", "explode", "refund"]  # the deferred tool is not offered
    assert listed["convert"].input_schema["properties"]["unit"]["enum"] == ["km", "mi"]
    assert listed["convert"].description.startswith("Convert a distance")

    ok = await session.call_tool("convert", {"amount": 10, "unit": "km"})
    assert not ok.is_error and ok.content[0].text == "6.21 mi"

    invalid = await session.call_tool("convert", {"amount": "ten", "unit": "parsec"})
    assert invalid.is_error  # a tool execution error (MCP 2025-11-25): the model can read and fix it
    assert "amount" in invalid.content[0].text and "unit" in invalid.content[0].text

    failed = await session.call_tool("explode", {})
    assert failed.is_error and "kaboom" in failed.content[0].text

    small = await session.call_tool("refund", {"order_id": "A1", "amount": 5})
    assert small.content[0].text == "refunded 5 on A1"
    big = await session.call_tool("refund", {"order_id": "A1", "amount": 500})
    assert big.is_error and "approval" in big.content[0].text

    picture = await session.call_tool("badge", {})
    assert [b.type for b in picture.content] == ["text", "image"] and picture.content[1].mime_type == "image/png"

    with pytest.raises(MCPError) as unknown:
        await session.call_tool("nope", {})
    assert "unknown tool 'nope'" in unknown.value.message


async def test_serve_over_stdio(tmp_path: Path) -> None:
    errors = (tmp_path / "stderr.txt").open("w+")
    params = StdioServerParameters(command=SERVE[0], args=SERVE[1:], cwd=str(REPO_ROOT))
    async with stdio_client(params, errlog=errors) as (read, write), ClientSession(read, write) as session:
        await _exercise(session)
    errors.seek(0)
    assert "Traceback" not in errors.read()


async def test_serve_over_streamable_http() -> None:
    port = free_port()
    server = subprocess.Popen(
        [*SERVE, "--http", "--port", str(port)], cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "parley mcp serve --http did not start listening"
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
            await _exercise(session)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_bad_targets_are_clear_errors() -> None:
    for target, expected in [("nothing", "MODULE:ATTRIBUTE"), ("tests.sdk.no_such:TOOLS", "cannot import")]:
        done = subprocess.run(
            [sys.executable, "-m", "parley.cli", "mcp", "serve", target],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 2 and expected in done.stderr


def test_the_toolset_of_a_parley_server_round_trips(tmp_path: Path) -> None:
    """parley as client of parley as server: the same typed tools, through MCP."""
    from parley import Agent
    from parley.backends import ScriptedBackend, ScriptedTurn
    from parley.backends.scripted import call
    from parley.mcp import MCPServerStdio

    turns = [
        ScriptedTurn(tool_calls=[call("shop_convert", {"amount": 5, "unit": "mi"}, id="c")]),
        ScriptedTurn(text="done"),
    ]
    toolset = MCPServerStdio(SERVE[0], SERVE[1:], cwd=REPO_ROOT, prefix="shop", inherit_env=True)
    agent: Any = Agent(ScriptedBackend(turns), tools=[toolset])
    result = agent.run_sync("convert")
    [converted] = [r for m in result.messages for r in m.tool_results]
    assert converted.content == "8.05 km"
    spec = next(t for t in agent.backend.requests[0].tools if t.name == "shop_convert")
    assert spec.parameters["properties"]["unit"]["enum"] == ["km", "mi"]
