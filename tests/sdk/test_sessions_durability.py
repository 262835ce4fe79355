"""Sessions under crashes and concurrency (worker: session_worker.py).

* SIGKILL at random points during approval-gated ``run(session=...)`` turns (SQLite, SQLAlchemy on
  SQLite, and PostgreSQL when one runs here, as under ``make test``), each run resuming the
  last saved state in a new process: after every kill the session holds only whole turns, in order,
  none twice; at the end every turn is there once.
* SIGKILL during large ``add_items`` transactions: a turn is all there or not at all.
* Two processes appending turns to one session at once: no turn lost, none duplicated, none
  interleaved with another, each process's turns in its own order.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from parley import Message
from parley._run_history import normalise_history
from tests.sdk.session_worker import CALLS, ROUNDS, SESSION_ID, TURN_LENGTH, TURNS

pytest.importorskip("sqlalchemy")

WORKER = Path(__file__).with_name("session_worker.py")
STORES = ["sqlite", "sqlalchemy"]


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"worker did not start ({line!r}):\n{err}")
    return proc


PG_SESSION = f"parley-test-{os.getpid()}-sigkill"
"""The session the PostgreSQL SIGKILL test's workers write (the server outlives the test: its rows are removed)."""


def postgres_rows(session_id: str, *, remove: bool = False) -> list[Any]:
    import sqlalchemy

    from tests.sdk.test_sessions import PG_URL

    engine = sqlalchemy.create_engine(PG_URL)
    try:
        with engine.connect() as conn:
            try:
                rows = conn.execute(
                    sqlalchemy.text(
                        "SELECT seq, turn_id, message_json FROM parley_messages WHERE session_id = :sid ORDER BY seq"
                    ),
                    {"sid": session_id},
                ).fetchall()
            except sqlalchemy.exc.ProgrammingError:  # killed before the tables were made
                return []
            if remove:
                for table in ("parley_messages", "parley_turns", "parley_compactions", "parley_sessions"):
                    conn.execute(sqlalchemy.text(f"DELETE FROM {table} WHERE session_id = :sid"), {"sid": session_id})
                conn.commit()
        return list(rows)
    finally:
        engine.dispose()


def stored_turns(db: Path, store: str = "sqlite") -> list[tuple[str, list[Message]]]:
    """The session's rows grouped by turn id, in order; fails if a turn's rows are not contiguous."""
    if store == "postgres":
        return grouped(postgres_rows(PG_SESSION))
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        try:
            rows = conn.execute(
                "SELECT seq, turn_id, message_json FROM parley_messages WHERE session_id = ? ORDER BY seq",
                (SESSION_ID,),
            ).fetchall()
        except sqlite3.OperationalError:  # killed before the tables were made
            return []
    return grouped(rows)


def grouped(rows: list[Any]) -> list[tuple[str, list[Message]]]:
    assert [seq for seq, _, _ in rows] == list(range(1, len(rows) + 1)), "gaps or reordering in seq"
    groups: list[tuple[str, list[Message]]] = []
    for _, turn_id, text in rows:
        message = Message.model_validate_json(text)
        if groups and groups[-1][0] == turn_id:
            groups[-1][1].append(message)
        else:
            groups.append((turn_id, [message]))
    ids = [turn_id for turn_id, _ in groups]
    assert len(ids) == len(set(ids)), f"a turn is split or written twice: {ids}"
    return groups


def check_agent_turns(db: Path, store: str = "sqlite") -> int:
    """Every stored turn is a whole "turn K" ... "done K" turn, K = 0, 1, 2, ...; returns how many."""
    groups = stored_turns(db, store)
    for k, (_, messages) in enumerate(groups):
        assert len(messages) == TURN_LENGTH, f"turn {k} has {len(messages)} messages, not {TURN_LENGTH}"
        assert messages[0].text == f"turn {k}" and messages[-1].text == f"done {k}"
        calls = [c.id for m in messages for c in m.tool_calls]
        results = [r.call_id for m in messages for r in m.tool_results]
        assert calls == results == [f"k{k}r{r}c{i}" for r in range(ROUNDS) for i in range(CALLS)]
        repaired, open_batch = normalise_history(messages)
        assert repaired == messages and not open_batch  # every call next to its result
    return len(groups)


@pytest.mark.parametrize("store", [*STORES, "postgres"])
def test_sigkill_during_session_runs_leaves_whole_turns(store: str, tmp_path: Path) -> None:
    db, state = tmp_path / "chat.db", tmp_path / "state.json"
    env: dict[str, str] = {}
    if store == "postgres":
        from tests.sdk.test_sessions import PG_URL, postgres_engine_or_skip

        postgres_engine_or_skip().dispose()
        env = {"PARLEY_TEST_POSTGRES_URL": PG_URL, "PARLEY_TEST_SESSION_ID": PG_SESSION}
        postgres_rows(PG_SESSION, remove=True)
    try:
        sigkill_session_runs(store, db, state, env)
    finally:
        if store == "postgres":
            postgres_rows(PG_SESSION, remove=True)


def sigkill_session_runs(store: str, db: Path, state: Path, env: dict[str, str]) -> None:
    rng = random.Random(20261201)
    max_kills = {"sqlite": 20, "sqlalchemy": 10}.get(store, 5)  # (PostgreSQL: fewer, its workers start slower)
    kills, committed_at_kill, starts = 0, [], Counter[str]()
    def resumed() -> bool:
        return starts["resume paused"] + starts["resume running"] > 0

    for run in range(200):
        proc = start("turns", store, str(db), str(state), str(run), env=env)
        # Until a kill has landed mid-turn (seen as a resume), keep killing, a little later each time: how
        # long a start takes depends on the machine, and a kill during start-up exercises nothing.
        if kills < max_kills or (not resumed() and kills < 3 * max_kills):
            time.sleep(rng.uniform(0.0, 0.1 + 0.02 * max(0, kills - max_kills)))
            if not resumed() and kills >= max_kills // 2:
                # random kills so far all fell between turns (seen on PostgreSQL, whose turns are quick once
                # connected): wait until a turn has checkpointed, so this one lands mid-turn
                deadline = time.monotonic() + 2.0
                while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.002)
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        starts.update(line.rsplit(" ", 1)[0] if line.startswith("fresh") else line for line in out.splitlines())
        if proc.returncode == -signal.SIGKILL:
            kills += 1
            committed_at_kill.append(check_agent_turns(db, store))  # only whole turns, after every kill
            continue
        assert proc.returncode == 0, err
        assert "DONE" in out
        break
    assert check_agent_turns(db, store) == TURNS  # every turn once, none lost
    assert not state.exists()
    print(
        f"store={store} kills={kills} turns committed at each kill={committed_at_kill} "
        f"starts={dict(sorted(starts.items()))}"
    )
    assert kills >= max_kills // 3
    assert resumed()  # kills landed mid-turn and were resumed


@pytest.mark.parametrize("store", STORES)
def test_sigkill_during_large_writes_leaves_all_or_nothing(store: str, tmp_path: Path) -> None:
    db, rows = tmp_path / "bulk.db", 400
    rng = random.Random(7)
    in_write = {"absent": 0, "whole": 0}
    for run in range(12):
        proc = start("bulk", store, str(db), str(rows), str(run))
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        groups = dict(stored_turns(db))
        assert all(len(messages) == rows for messages in groups.values()), "a turn was written in part"
        last = out.splitlines()[-1] if out.strip() else ""
        if last.startswith("begin "):  # killed inside add_items: the turn is whole or absent
            in_write["whole" if last.split()[1] in groups else "absent"] += 1
    total = len(stored_turns(db))
    print(f"store={store} kills=12 inside add_items={sum(in_write.values())} {in_write} turns stored={total}")
    assert sum(in_write.values()) >= 3 and total > 0


def check_appends(groups: list[tuple[str, list[Message]]], count: int, store: str) -> None:
    seen: dict[str, list[int]] = {"A": [], "B": []}
    for _, messages in groups:
        name, k = messages[0].text.split()
        assert [m.role.value for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[1].tool_calls[0].id == messages[2].tool_results[0].call_id == f"{name}{k}"
        assert messages[-1].text == f"ok {name} {k}"
        seen[name].append(int(k))
    assert seen == {"A": list(range(count)), "B": list(range(count))}  # none lost, none twice, in order
    order = [messages[0].text.split()[0] for _, messages in groups]
    switches = sum(1 for a, b in zip(order, order[1:], strict=False) if a != b)
    print(f"store={store} turns={len(groups)} (2 x {count}) switches between writers={switches}")
    assert switches >= 1  # the two really ran at the same time


def run_two_appenders(store: str, db: Path, count: int, env: dict[str, str] | None = None) -> None:
    procs = {name: start("append", store, str(db), name, str(count), env=env) for name in ("A", "B")}
    Path(f"{db}.go").touch()
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0 and "DONE" in out, f"worker {name}: {err}"


@pytest.mark.parametrize("store", STORES)
def test_two_processes_append_concurrently(store: str, tmp_path: Path) -> None:
    db, count = tmp_path / "shared.db", 15
    run_two_appenders(store, db, count)
    check_appends(stored_turns(db), count, store)


def test_two_processes_append_concurrently_on_postgres(tmp_path: Path) -> None:
    from tests.sdk.test_sessions import PG_URL, postgres_engine_or_skip

    engine = postgres_engine_or_skip()
    session_id, count = f"parley-test-{os.getpid()}-appenders", 15
    env = {"PARLEY_TEST_POSTGRES_URL": PG_URL, "PARLEY_TEST_SESSION_ID": session_id}
    run_two_appenders("postgres", tmp_path / "unused", count, env=env)
    import sqlalchemy

    with engine.connect() as conn:
        rows = conn.execute(
            sqlalchemy.text(
                "SELECT seq, turn_id, message_json FROM parley_messages WHERE session_id = :sid ORDER BY seq"
            ),
            {"sid": session_id},
        ).fetchall()
        for table in ("parley_messages", "parley_turns", "parley_sessions"):
            conn.execute(sqlalchemy.text(f"DELETE FROM {table} WHERE session_id = :sid"), {"sid": session_id})
        conn.commit()
    engine.dispose()
    check_appends(grouped(list(rows)), count, "postgres")
