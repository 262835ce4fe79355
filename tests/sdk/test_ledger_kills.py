"""SIGKILL at random points while a run executes side effects (at least 50 kills): no call ever runs
twice, and every call whose outcome a kill made unknown comes back to a person as ``uncertain``.

Each attempt is a forked copy of this process (cheap: parley is imported already) that resumes the
latest saved state with the ledger on one SQLite file; the test kills it at a random moment, then
acts as the person: an uncertain call whose effect is in the log is skipped (`reject`), one whose
effect is not is run again (`approve`). Finished runs are checked call by call, and a new run starts.
"""

from __future__ import annotations

import asyncio
import os
import random
import select
import signal
import sqlite3
import time
import traceback
from pathlib import Path

from parley import Agent, RunState, ToolContext, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedTurn
from parley.backends.scripted import call
from parley.ledger_stores import SQLiteLedger
from parley.protocol import Role

TURNS, CALLS = 2, 2
EXPECTED = {f"t{turn}c{i}" for turn in range(TURNS) for i in range(CALLS)}


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _effects(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [(run, call_id) for run, call_id in (line.split() for line in lines)]


def _attempt(state_path: Path, ledger_path: Path, effects_path: Path, seed: int, started_fd: int) -> None:
    """One process's go at the run: resume the saved state (or start), save every checkpoint; each call
    writes a byte to `started_fd` as it starts (so the test can aim its kill at the call)."""
    rng = random.Random(seed)

    @tool  # not idempotent: every call is claimed in the ledger before it runs
    async def effect(ctx: ToolContext, n: int) -> str:
        """A side effect: one line in the effects log.

        Args:
            n: Which one.
        """
        os.write(started_fd, b"x")
        await asyncio.sleep(rng.uniform(0.0, 0.01))
        _append(effects_path, f"{ctx.run_id} {ctx.call_id}")
        await asyncio.sleep(rng.uniform(0.0, 0.01))
        return f"effect {n} done"

    def model(request: ModelRequest) -> ScriptedTurn | str:
        turn = sum(1 for m in request.conversation if m.role is Role.ASSISTANT)
        if turn >= TURNS:
            return "all done"
        return ScriptedTurn(
            tool_calls=[call("effect", {"n": turn * CALLS + i}, id=f"t{turn}c{i}") for i in range(CALLS)]
        )

    agent = Agent(FunctionBackend(model), tools=[effect], name="effects", max_turns=TURNS + 1, max_tool_rounds=None)
    state = RunState.load(state_path) if state_path.exists() else None
    result = agent.run_sync(
        None if state else "go", state=state, checkpoint=lambda s: s.save(state_path), ledger=SQLiteLedger(ledger_path)
    )
    result.state.save(state_path)


def _unrecorded_claims(ledger_path: Path, pid: int) -> int:
    """Claims the (dead) process `pid` left without a record: kills that landed between claim and record."""
    if not ledger_path.exists():
        return 0
    with sqlite3.connect(ledger_path) as conn:
        query = "SELECT COUNT(*) FROM parley_ledger WHERE result_json IS NULL AND pid = ?"
        return int(conn.execute(query, (pid,)).fetchone()[0])


def test_random_sigkills_never_run_a_call_twice_and_surface_every_unknown_outcome(tmp_path: Path) -> None:
    state_path, ledger_path, effects_path = tmp_path / "state.json", tmp_path / "ledger.db", tmp_path / "effects.log"
    rng = random.Random(20261203)
    kills = kills_mid_call = left_open = uncertain = finished = attempts = 0
    decided: set[str] = set()  # uncertain claims already decided (a claim is asked about once)
    started = time.monotonic()
    while kills < 50 or state_path.exists() or not finished:
        attempts += 1
        assert attempts < 400, "the runs do not converge"
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one attempt, then leave without running the parent's cleanup
            code = 0
            try:
                os.close(read_end)
                _attempt(state_path, ledger_path, effects_path, attempts, write_end)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(write_end)
        if kills < 50:  # aim at a call: a random moment in the first 25 ms after one starts
            if select.select([read_end], [], [], 5.0)[0]:
                time.sleep(rng.uniform(0.0, 0.025))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
        os.close(read_end)
        if os.WIFSIGNALED(status):
            kills += 1
            open_claims = _unrecorded_claims(ledger_path, pid)
            kills_mid_call += open_claims > 0
            left_open += open_claims
        else:
            assert os.WEXITSTATUS(status) == 0, "an attempt failed (its traceback is above)"
        if not state_path.exists():
            continue
        state = RunState.load(state_path)
        effects = _effects(effects_path)
        assert len(effects) == len(set(effects)), f"a call ran twice: {sorted(effects)}"
        if state.status == "complete":
            mine = sorted(c for run, c in effects if run == state.trace_id)
            assert mine == sorted(EXPECTED)  # every call exactly once: none twice, none lost
            assert state.output == "all done"
            finished += 1
            state_path.unlink()
            continue
        for item in list(state.pending):  # the person decides each unknown outcome
            assert item.kind == "uncertain" and item.claim is not None and item.claim not in decided
            decided.add(item.claim)
            uncertain += 1
            if (state.trace_id, item.call_id) in effects:
                state.reject(item.call_id, message="It ran before the crash.")
            else:
                state.approve(item.call_id)
        state.save(state_path)
    elapsed = time.monotonic() - started
    print(
        f"kills={kills} (mid-call {kills_mid_call}, claims left open {left_open}) uncertain={uncertain} "
        f"finished runs={finished} "
        f"attempts={attempts} in {elapsed:.1f} s"
    )
    assert kills >= 50 and finished >= 1
    assert kills_mid_call >= 25 and uncertain == left_open  # each claim left open came back to a person, once
