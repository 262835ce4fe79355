"""Worker for test_durability.py: an approval-gated agent that a test SIGKILLs at random points.

Usage: python sigkill_worker.py STATE EFFECTS ATTEMPTS SEED

Every run starts from the last saved state (if any), approves whatever is pending, and runs on,
saving the state at every checkpoint. The model is a deterministic function of the conversation:
`TURNS` turns of `CALLS` parallel calls each, then a final answer. The `effect` tool appends its
call id to EFFECTS, using the id as idempotency key (the documented contract for side effects), and
logs every execution to ATTEMPTS, flagging any execution of a call whose result the saved state had
already recorded (a violation of "resume never re-executes a recorded call").
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path

from parley import Agent, RunState, ToolContext, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedTurn
from parley.backends.scripted import call
from parley.protocol import Role

TURNS = 6
CALLS = 3


def main() -> None:
    state_path, effects_path, attempts_path = (Path(a) for a in sys.argv[1:4])
    rng = random.Random(int(sys.argv[4]))

    def append(path: Path, line: str) -> None:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    @tool(needs_approval=True, idempotent=True)
    async def effect(ctx: ToolContext, n: int) -> str:
        """A side effect: append the call id to a file."""
        if state_path.exists() and ctx.call_id in RunState.load(state_path).records:
            append(attempts_path, f"VIOLATION {ctx.call_id}")
        append(attempts_path, ctx.call_id)
        await asyncio.sleep(rng.uniform(0.01, 0.04))
        done = effects_path.read_text().split() if effects_path.exists() else []
        if ctx.call_id not in done:
            append(effects_path, ctx.call_id)
        await asyncio.sleep(rng.uniform(0.01, 0.04))
        return f"effect {n} done"

    async def model(request: ModelRequest) -> ScriptedTurn | str:
        await asyncio.sleep(0.04)
        turn = sum(1 for m in request.conversation if m.role is Role.ASSISTANT)
        if turn >= TURNS:
            return "all effects done"
        return ScriptedTurn(tool_calls=[call("effect", {"n": i}, id=f"t{turn}c{i}") for i in range(CALLS)])

    # TURNS rounds of tool calls by design: no round limit (the default would turn tools off after 3)
    agent = Agent(FunctionBackend(model), tools=[effect], max_turns=TURNS + 1, max_tool_rounds=None)

    async def run() -> None:
        state = RunState.load(state_path) if state_path.exists() else None
        print("ready", flush=True)
        result = await agent.run(None if state else "go", state=state, checkpoint=lambda s: s.save(state_path))
        while result.paused:
            for item in result.interruptions:
                result.state.approve(item.call_id)
            result.state.save(state_path)
            result = await agent.run(state=result.state, checkpoint=lambda s: s.save(state_path))
        print("DONE", result.output, flush=True)

    asyncio.run(run())


if __name__ == "__main__":
    main()
