"""An agent whose tools come from an MCP server: a call that needs approval pauses, then resumes.

    python examples/mcp_agent.py

Starts `examples/mcp_notes_server.py` over stdio (needs ``pip install 'parley[mcp]'``), offers its
tools with the prefix ``notes_`` and ``delete_note`` behind approval, and runs a stand-in model
(`FunctionBackend`, no weights) that adds a note and deletes it. The run pauses on the delete; the
`RunState` goes through JSON (it could go to another process: the toolset reconnects there), the
call is approved and the run finishes. Swap in `LocalBackend()` or a hosted backend unchanged.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from parley import Agent, RunState
from parley.backends import FunctionBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.mcp import MCPServerStdio

SERVER = Path(__file__).with_name("mcp_notes_server.py")


def model(request: Any) -> Any:
    """A stand-in model: add a note and delete it in one batch, then report."""
    results = [r for m in request.conversation for r in m.tool_results]
    if not results:
        return ScriptedTurn(
            tool_calls=[
                call("notes_add_note", {"title": "draft", "text": "hello"}, id="add"),
                call("notes_delete_note", {"title": "draft"}, id="delete"),
            ]
        )
    return "; ".join(f"{r.name}: {r.content}" for r in results)


async def main() -> None:
    notes = MCPServerStdio(sys.executable, [str(SERVER)], name="notes", prefix="notes", needs_approval={"delete_note"})
    agent = Agent(FunctionBackend(model), tools=[notes])
    async with agent:  # one server process for both runs (without it, each run starts and stops one)
        print("tools:", ", ".join(t.name for t in notes.tools()))
        result = await agent.run("Add a draft note, then delete it.")
        for item in result.interruptions:
            print(f"paused: {item.tool_name}({item.arguments}) needs {item.kind}")
        state = RunState.from_json(result.state.to_json())
        state.approve(result.interruptions[0].call_id)
        final = await agent.run(state=state)
    print("answer:", final.output)
    print("model requests:", final.usage.requests)


if __name__ == "__main__":
    asyncio.run(main())
