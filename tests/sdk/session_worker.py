"""Worker for test_sessions_durability.py: agents appending turns to one session, SIGKILLed at random points
or run two at a time.

Usage:
  python session_worker.py turns  STORE DB STATE SEED   approval-gated turns, resumed across processes
  python session_worker.py append STORE DB NAME COUNT   COUNT quick turns, started when DB + ".go" exists
  python session_worker.py bulk   STORE DB ROWS SEED    turns of ROWS messages written straight to the session

STORE is ``sqlite`` (`SQLiteSession`), ``sqlalchemy`` (`SQLAlchemySession` on the same SQLite file) or
``postgres`` (`SQLAlchemySession` on $PARLEY_TEST_POSTGRES_URL, session $PARLEY_TEST_SESSION_ID; DB unused).

``turns``: `TURNS` turns, each "turn K" -> `ROUNDS` rounds of `CALLS` approval-gated calls -> "done K"
(`TURN_LENGTH` messages). Every run starts from the saved state if there is one (approving what is
pending, resuming with the session), else starts the next turn after the ones the session holds; the
state is saved at every checkpoint and removed once the run completed (its turn is then in the session).
Prints what it found at start: ``fresh K``, ``resume paused|running|complete``, then ``DONE``.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from pathlib import Path

from parley import Agent, Message, RunState, ToolContext, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedTurn
from parley.backends.scripted import call
from parley.protocol import Role
from parley.sessions import SessionStore, SQLAlchemySession, SQLiteSession

TURNS = 8
ROUNDS = 2
CALLS = 2
TURN_LENGTH = 1 + ROUNDS * (1 + CALLS) + 1
SESSION_ID = os.environ.get("PARLEY_TEST_SESSION_ID", "chat")


def open_session(store: str, db: Path) -> SessionStore:
    if store == "sqlite":
        return SQLiteSession(SESSION_ID, db)
    if store == "sqlalchemy":
        return SQLAlchemySession.from_url(SESSION_ID, f"sqlite:///{db}")
    if store == "postgres":
        return SQLAlchemySession.from_url(SESSION_ID, os.environ["PARLEY_TEST_POSTGRES_URL"])
    raise SystemExit(f"unknown store {store!r}")


def since_last_user(request: ModelRequest) -> tuple[str, list[Message]]:
    messages = list(request.conversation)
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role is Role.USER:
            return messages[index].text, messages[index + 1 :]
    raise AssertionError("no user message in the request")


def turns(store: str, db: Path, state_path: Path, seed: int) -> None:
    rng = random.Random(seed)

    @tool(needs_approval=True)
    async def step(ctx: ToolContext, k: int, r: int, i: int) -> str:
        """One step of turn k."""
        await asyncio.sleep(rng.uniform(0.0, 0.02))
        return f"step {k}.{r}.{i} ok"

    async def model(request: ModelRequest) -> ScriptedTurn | str:
        await asyncio.sleep(rng.uniform(0.0, 0.03))
        text, after = since_last_user(request)
        k = int(text.split()[1])
        rounds = sum(1 for m in after if m.role is Role.ASSISTANT)
        if rounds >= ROUNDS:
            return f"done {k}"
        return ScriptedTurn(
            tool_calls=[call("step", {"k": k, "r": rounds, "i": i}, id=f"k{k}r{rounds}c{i}") for i in range(CALLS)]
        )

    agent = Agent(FunctionBackend(model), tools=[step], max_tool_rounds=None, max_turns=ROUNDS + 1)
    session = open_session(store, db)

    def save(state: RunState) -> None:
        state.save(state_path)

    async def run() -> None:
        print("ready", flush=True)
        while True:
            if state_path.exists():
                state = RunState.load(state_path)
                print(f"resume {state.status}", flush=True)
                for item in state.pending:
                    state.approve(item.call_id)
                result = await agent.run(state=state, session=session, checkpoint=save)
            else:
                done = sum(1 for m in await session.get_items() if m.role is Role.USER)
                if done >= TURNS:
                    break
                print(f"fresh {done}", flush=True)
                result = await agent.run(f"turn {done}", session=session, checkpoint=save)
            while result.paused:
                for item in result.interruptions:
                    result.state.approve(item.call_id)
                save(result.state)
                result = await agent.run(state=result.state, session=session, checkpoint=save)
            assert result.output == f"done {result.state.messages[0].text.split()[1]}", result.output
            state_path.unlink()  # the turn is in the session
        print("DONE", flush=True)

    asyncio.run(run())


def append(store: str, db: Path, name: str, count: int) -> None:
    @tool
    async def note(k: int) -> str:
        """Note turn k."""
        return f"{name} noted {k}"

    async def model(request: ModelRequest) -> ScriptedTurn | str:
        await asyncio.sleep(random.uniform(0.0, 0.01))
        text, after = since_last_user(request)
        k = int(text.split()[1])
        if any(m.role is Role.TOOL for m in after):
            return f"ok {name} {k}"
        return ScriptedTurn(tool_calls=[call("note", {"k": k}, id=f"{name}{k}")])

    agent = Agent(FunctionBackend(model), tools=[note])
    session = open_session(store, db)
    go = Path(f"{db}.go")
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.005)
    for k in range(count):
        result = agent.run_sync(f"{name} {k}", session=session)
        assert result.output == f"ok {name} {k}", result.output
    print("DONE", flush=True)


def bulk(store: str, db: Path, rows: int, seed: int) -> None:
    session = open_session(store, db)
    prefix = f"{seed}-"
    print("ready", flush=True)
    for t in range(1_000_000):
        turn = f"{prefix}{t}"
        items = [Message.user(f"{turn} row {i} " + "x" * 200) for i in range(rows)]
        print(f"begin {turn}", flush=True)
        session.add_items_sync(items, turn_id=turn)
        print(f"end {turn}", flush=True)


def main() -> None:
    mode, store, db = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if mode == "turns":
        turns(store, db, Path(sys.argv[4]), int(sys.argv[5]))
    elif mode == "append":
        append(store, db, sys.argv[4], int(sys.argv[5]))
    elif mode == "bulk":
        bulk(store, db, int(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
