"""Sessions record compaction: the next run starts from the compacted history, and the record stays.

When a run with ``session=`` compacts, its turn is written together with a compaction row (one
transaction). The next `agent.run(session=...)` then sends the pinned prefix byte-identical, the
summary, and the kept tail: not the full old history, and without asking for a summary again.
Every stored message stays readable (`get_all_items`), with the record of what each summary
replaced (`compactions`). Tested on the three stores; a failure or a SIGKILL inside the commit
leaves neither half (no turn without its compaction, no compaction without its turn).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from parley import Agent, CachePolicy, Compaction, MemorySession, SQLAlchemySession, SQLiteSession
from parley.backends.scripted import FunctionBackend
from parley.compaction import SUMMARY_HEADER
from parley.context_window import estimate_tokens
from parley.protocol import Message, Role, SummaryPart
from parley.sessions.base import SessionStore
from parley.sessions.errors import SessionStoreError
from tests.sdk.test_compaction import SYSTEM, Model, is_summary_request, prefix
from tests.sdk.test_history_processors import history, lookup

WORKER = Path(__file__).with_name("session_compaction_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _json(messages: list[Message]) -> list[str]:
    return [m.model_dump_json() for m in messages]


@pytest.fixture(params=["memory", "sqlite", "sqlalchemy"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "memory":
        yield MemorySession("chat")
    elif request.param == "sqlite":
        with SQLiteSession("chat", tmp_path / "chats.db") as session:
            yield session
    else:
        pytest.importorskip("sqlalchemy")
        with SQLAlchemySession.from_url("chat", f"sqlite:///{tmp_path / 'chats.db'}") as alchemy:
            yield alchemy


def _agent(model: Callable[[Any], Any] | None = None) -> tuple[FunctionBackend, Agent[str]]:
    backend = FunctionBackend(model or Model())
    backend.context_window = 10**6  # type: ignore[attr-defined]
    agent = Agent(backend, instructions=SYSTEM, tools=[lookup], compaction=Compaction(at=0.5, keep_last_turns=2),
                  cache=CachePolicy())
    return backend, agent


def _shrink(backend: FunctionBackend) -> None:
    """A window small enough that the next request is well over `at`."""
    last = backend.requests[-1]
    size = estimate_tokens(last.conversation.messages, last.tools)
    backend.context_window = int(size * 1.2)  # type: ignore[attr-defined]


def _summaries(messages: list[Message]) -> list[str]:
    return [m.text for m in messages if any(isinstance(p, SummaryPart) for p in m.parts)]


class _Saved:
    """A checkpoint callback keeping the last state."""

    def __init__(self) -> None:
        self.state: Any = None

    def __call__(self, state: Any) -> None:
        self.state = state


async def test_the_next_run_starts_from_the_compacted_history_and_the_record_is_kept(store: SessionStore) -> None:
    old = [*prefix(), *history(12)]
    await store.add_items(old, turn_id="imported")
    backend, agent = _agent()
    await agent.run("now?", session=store)  # a big window: nothing compacted
    assert store.compactions_sync() == []
    first_request = backend.requests[-1].conversation.messages

    _shrink(backend)
    compacting = await agent.run("and Rome?", session=store)
    assert compacting.state.compaction is not None and compacting.state.compaction.summary == "SUMMARY-1"

    # the record: one compaction row, naming the run's turn and the rows it replaced
    (row,) = store.compactions_sync()
    assert row.turn_id == compacting.state.trace_id and row.record["summary"] == "SUMMARY-1"
    assert row.record["count"] == 1 and row.record["tokens_after"] < row.record["tokens_before"]
    assert row.head_seq == 3  # the developer message, the cached handbook, its acknowledgement
    # nothing is deleted: every message is still stored
    everything = store.get_all_items_sync()
    assert len(everything) == len(old) + 2 + 2 and _json(everything[: len(old)]) == _json(old)

    # the live history: the pinned prefix byte-identical, the summary, the last two turns
    live = store.get_items_sync()
    assert _json(live[:3]) == _json(prefix())
    assert live[3].role is Role.USER and live[3].text == f"{SUMMARY_HEADER}\n\nSUMMARY-1"
    assert [m.text for m in live[4:] if m.role is Role.USER] == ["now?", "and Rome?"]
    assert _json(live[4:]) == _json(everything[-4:])
    assert _json(store.get_items_sync(limit=2)) == _json(live[-2:])

    # the next run sends exactly that (no second summary request), the cached prefix unchanged
    backend.context_window = 10**6  # type: ignore[attr-defined]
    requests = len(backend.requests)
    third = await agent.run("and Paris?", session=store)
    assert len(backend.requests) == requests + 1 and not is_summary_request(backend.requests[-1])
    sent = backend.requests[-1].conversation.messages
    assert sent[0].text == SYSTEM and _json(sent[:4]) == _json(first_request[:4])
    assert _json(sent[1:-1]) == _json(live)
    assert third.state.compaction is not None and third.state.compaction.summary == "SUMMARY-1"
    assert len(store.compactions_sync()) == 1  # the stored compaction is not written again

    # compacting again replaces the stored summary and the turns after it: one summary, count 2
    _shrink(backend)
    await agent.run("and Oslo?", session=store)
    summary_request = next(r for r in reversed(backend.requests) if is_summary_request(r))
    assert "SUMMARY-1" in str(summary_request.conversation.messages)
    first_row, second_row = store.compactions_sync()
    assert first_row == row and second_row.record["count"] == 2 and second_row.head_seq == row.head_seq
    live = store.get_items_sync()
    assert _summaries(live) == [f"{SUMMARY_HEADER}\n\nSUMMARY-2"] and _json(live[:3]) == _json(prefix())
    assert [m.text for m in live if m.role is Role.USER][2:] == ["and Paris?", "and Oslo?"]
    assert len(store.get_all_items_sync()) == len(old) + 4 * 2


async def test_an_agent_without_compaction_also_starts_from_the_compacted_history(store: SessionStore) -> None:
    await store.add_items([*prefix(), *history(12)], turn_id="imported")
    backend, agent = _agent()
    await agent.run("now?", session=store)
    _shrink(backend)
    await agent.run("and Rome?", session=store)
    plain_backend = FunctionBackend(Model())
    plain = Agent(plain_backend, instructions=SYSTEM, tools=[lookup])
    await plain.run("and Paris?", session=store)
    sent = plain_backend.requests[-1].conversation.messages
    assert _summaries(sent) == [f"{SUMMARY_HEADER}\n\nSUMMARY-1"]
    assert "question 0" not in str(sent)


async def test_a_turn_committed_meanwhile_keeps_both_turns_and_leaves_the_compaction_to_a_later_run(
    store: SessionStore,
) -> None:
    await store.add_items([*prefix(), *history(12)], turn_id="imported")
    model = Model()

    def meanwhile(request: Any) -> Any:
        if is_summary_request(request):  # another process finishes a turn while this run compacts
            store.add_items_sync([Message.user("from elsewhere"), Message.assistant("ok")], turn_id="other")
        return model(request)

    backend, agent = _agent(meanwhile)
    await agent.run("now?", session=store)
    _shrink(backend)
    result = await agent.run("and Rome?", session=store)
    assert result.state.compaction is not None  # the run compacted what it sent
    assert store.compactions_sync() == []  # but the session changed: the rows would not fit it
    users = [m.text for m in store.get_items_sync() if m.role is Role.USER]
    assert users[-3:] == ["now?", "from elsewhere", "and Rome?"]  # both turns whole, in commit order


def _block_compactions(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TRIGGER broken BEFORE INSERT ON parley_compactions "
                     "BEGIN SELECT RAISE(ABORT, 'the disk died'); END")


async def test_a_failed_commit_writes_neither_the_turn_nor_the_compaction(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    with SQLiteSession("chat", path) as store:
        store.add_items_sync([*prefix(), *history(12)], turn_id="imported")
        backend, agent = _agent()
        await agent.run("now?", session=store)
        before = _json(store.get_all_items_sync())
        _shrink(backend)
        _block_compactions(path)
        saved = _Saved()
        with pytest.raises(SessionStoreError, match="the disk died") as failed:
            await agent.run("and Rome?", session=store, checkpoint=saved)
        assert isinstance(failed.value.__cause__, sqlite3.IntegrityError) and failed.value.state is saved.state
        assert _json(store.get_all_items_sync()) == before and store.compactions_sync() == []
        assert _json(store.get_items_sync()) == before

        # the documented retry: run the completed state again with the session
        with sqlite3.connect(path) as conn:
            conn.execute("DROP TRIGGER broken")
        assert saved.state is not None and saved.state.status == "complete"
        requests = len(backend.requests)
        await agent.run(state=saved.state, session=store)
        assert len(backend.requests) == requests  # nothing asked again
        (row,) = store.compactions_sync()
        assert row.record["summary"] == "SUMMARY-1"
        assert len(store.get_all_items_sync()) == len(before) + 2


async def test_the_memory_store_changes_nothing_when_the_commit_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemorySession("chat")
    await store.add_items([*prefix(), *history(12)], turn_id="imported")
    backend, agent = _agent()
    await agent.run("now?", session=store)
    before = _json(store.get_all_items_sync())
    _shrink(backend)
    import parley.sessions.memory as memory

    def dead() -> float:
        raise OSError("the clock died")

    monkeypatch.setattr(memory.time, "time", dead)
    with pytest.raises(SessionStoreError, match="the clock died") as failed:
        await agent.run("and Rome?", session=store)
    assert isinstance(failed.value.__cause__, OSError) and failed.value.state.status == "complete"
    assert _json(store.get_all_items_sync()) == before and store.compactions_sync() == []


def test_sigkill_inside_the_commit_leaves_no_half_compaction(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    with SQLiteSession("chat", path) as store:
        store.add_items_sync([*prefix(), *history(12)], turn_id="imported")
        before = _json(store.get_all_items_sync())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(WORKER), str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the worker stalls inside the commit, after every insert
        assert line.strip() == "inside the commit", proc.stderr.read() if proc.stderr else line
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with SQLiteSession("chat", path) as store:
        assert store.compactions_sync() == []
        after = store.get_all_items_sync()  # the worker's first (uncompacted) turn, and nothing of the second
        assert _json(after[: len(before)]) == before and [m.text for m in after[len(before) :]] == ["now?", "Done."]
        with sqlite3.connect(path) as conn:
            turns = [row[0] for row in conn.execute("SELECT turn_id FROM parley_turns")]
        assert len(turns) == 2 and turns[0] == "imported"


def test_a_database_written_before_compactions_gets_the_table_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with SQLiteSession("chat", path) as store:
        store.add_items_sync([Message.user("hi"), Message.assistant("hello")], turn_id="t")
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE parley_compactions")  # the three tables of an older parley
    with SQLiteSession("chat", path) as store:
        assert [m.text for m in store.get_items_sync()] == ["hi", "hello"] and store.compactions_sync() == []
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "parley_compactions" in tables
