"""Session stores fail in parley's words: one typed family (`parley.sessions.errors`) for every store
and operation, files that are not databases refused by name, read-only sessions readable, a finished
turn never lost to a failed write, and text no store can hold refused before the model is called."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from parley import Agent, Message, RunState, SQLAlchemySession, SQLiteSession, tool
from parley.backends import ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import ParleyError, UnencodableTextError
from parley.sessions.errors import (
    SessionBusyError,
    SessionCorruptError,
    SessionReadOnlyError,
    SessionStoreError,
    SessionUnavailableError,
)


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


@contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """Another connection holding the database's write lock (a writer that does not finish)."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# -- the family ---------------------------------------------------------------------------------------


def test_a_locked_database_is_a_busy_error_and_reads_still_work(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    session = SQLiteSession("a", db, busy_timeout_s=0.05)
    session.add_items_sync([Message.user("before")])
    with write_locked(db):
        for write in (lambda: session.add_items_sync([Message.user("x")]), session.pop_item_sync,
                      session.clear_session_sync):
            busy = r"locked by another writer \(waited busy_timeout_s=0.05\)"
            with pytest.raises(SessionBusyError, match=busy) as info:
                write()
            error = info.value
            assert error.retryable and error.operation == "write" and error.store == str(db)
            assert error.session_id == "a" and isinstance(error.__cause__, sqlite3.OperationalError)
        assert texts(session.get_items_sync()) == ["before"]  # WAL: a reader never waits for the writer
    session.add_items_sync([Message.user("after")])
    assert texts(session.get_items_sync()) == ["before", "after"]


def test_sqlalchemy_wraps_the_same_failures(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy")
    db = tmp_path / "alchemy.db"
    session = SQLAlchemySession.from_url("a", f"sqlite:///{db}", engine_kwargs={"connect_args": {"timeout": 0.05}})
    session.add_items_sync([Message.user("before")])
    with write_locked(db), pytest.raises(SessionBusyError, match="alchemy.db") as info:
        session.add_items_sync([Message.user("x")])
    assert type(info.value.__cause__).__module__.startswith("sqlalchemy")
    session.close()
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a database, but long enough to have a header's worth of bytes")
    with pytest.raises(SessionCorruptError, match="notes.txt.*not a SQLite database"):
        SQLAlchemySession.from_url("a", f"sqlite:///{foreign}")


def test_an_unreachable_server_is_unavailable() -> None:
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("psycopg")
    with pytest.raises(SessionUnavailableError) as info:  # port 9: nothing listens (discard)
        SQLAlchemySession.from_url("a", "postgresql+psycopg://app:secret@127.0.0.1:9/chats")
    assert "secret" not in str(info.value) and "***" in info.value.store and info.value.retryable


def test_an_empty_file_is_refused_by_name_and_left_as_it_was(tmp_path: Path) -> None:
    empty = tmp_path / "chat.db"
    empty.touch()
    with pytest.raises(SessionCorruptError, match=r"chat.db: cannot open: it is an empty \(0-byte\) file") as info:
        SQLiteSession("a", empty)
    assert info.value.operation == "open" and not info.value.retryable
    assert empty.stat().st_size == 0  # not silently turned into a new database


def test_a_foreign_or_cut_file_is_corrupt(tmp_path: Path) -> None:
    foreign = tmp_path / "photo.db"
    foreign.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    with pytest.raises(SessionCorruptError, match="photo.db.*not a SQLite database"):
        SQLiteSession("a", foreign)
    cut = tmp_path / "cut.db"
    whole = SQLiteSession("a", cut)
    whole.add_items_sync([Message.user("x" * 400) for _ in range(300)])
    whole.close()
    with open(cut, "r+b") as file:  # cut mid-page, as a copy that stopped half-way
        file.truncate(cut.stat().st_size // 2 + 100)
    with pytest.raises(SessionCorruptError, match="cut.db.*malformed"):
        SQLiteSession("a", cut).get_items_sync()


def test_a_new_file_is_created_whole_even_by_many_openers_at_once(tmp_path: Path) -> None:
    db, errors = tmp_path / "new.db", []

    def open_and_write(n: int) -> None:
        try:
            SQLiteSession("a", db).add_items_sync([Message.user(str(n))])
        except Exception as exc:  # noqa: BLE001 (collected, asserted below)
            errors.append(exc)

    threads = [threading.Thread(target=open_and_write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sorted(texts(SQLiteSession("a", db).get_items_sync())) == [str(n) for n in range(8)]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".new")] == []  # nothing left aside


def test_a_read_only_session_reads_and_refuses_writes(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    SQLiteSession("a", db).add_items_sync([Message.user("kept")])
    reader = SQLiteSession("a", db, read_only=True)
    assert reader.read_only and texts(reader.get_items_sync()) == ["kept"]
    for write in (lambda: reader.add_items_sync([Message.user("x")]), reader.pop_item_sync,
                  reader.clear_session_sync):
        with pytest.raises(SessionReadOnlyError, match=r"opened read-only \(read_only=True\)"):
            write()
    assert texts(SQLiteSession("a", db).get_items_sync()) == ["kept"]
    with pytest.raises(SessionUnavailableError, match="missing.db"):
        SQLiteSession("a", tmp_path / "missing.db", read_only=True)  # read-only never creates a file


def test_every_store_error_is_a_parley_error() -> None:
    for kind in (SessionBusyError, SessionCorruptError, SessionReadOnlyError, SessionUnavailableError):
        assert issubclass(kind, SessionStoreError) and issubclass(kind, ParleyError)


# -- a failed write after a finished turn ---------------------------------------------------------------


class Saved:
    def __init__(self) -> None:
        self.state: RunState | None = None

    def __call__(self, state: RunState) -> None:
        self.state = RunState.from_json(state.to_json())


@pytest.mark.parametrize("with_checkpoint", [False, True])
async def test_a_locked_commit_keeps_the_finished_turn_and_a_rerun_writes_it_once(
    tmp_path: Path, with_checkpoint: bool
) -> None:
    db = tmp_path / "chat.db"
    session = SQLiteSession("a", db, busy_timeout_s=0.05)
    backend = ScriptedBackend(["Hello, Ada."])
    agent, saved = Agent(backend), Saved()
    with write_locked(db), pytest.raises(SessionBusyError) as info:
        await agent.run("I am Ada.", session=session, checkpoint=saved if with_checkpoint else None)
    state = info.value.state
    assert state is not None and state.status == "complete" and texts(state.messages) == ["I am Ada.", "Hello, Ada."]
    assert any("error.state" in note for note in info.value.__notes__)
    assert session.get_items_sync() == []
    retry = saved.state if with_checkpoint else state
    assert retry is not None
    for _ in range(2):  # twice: written once
        result = await agent.run(state=retry, session=session)
        assert result.output == "Hello, Ada."
    assert texts(session.get_items_sync()) == ["I am Ada.", "Hello, Ada."] and backend.remaining == 0


async def test_a_read_only_file_keeps_the_finished_turn_for_a_writable_rerun(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    SQLiteSession("a", db).close()
    agent = Agent(ScriptedBackend(["Noted."]))
    with pytest.raises(SessionReadOnlyError) as info:
        await agent.run("Remember 42.", session=SQLiteSession("a", db, read_only=True))
    writable = SQLiteSession("a", db)
    await agent.run(state=info.value.state, session=writable)
    await agent.run(state=info.value.state, session=writable)
    assert texts(writable.get_items_sync()) == ["Remember 42.", "Noted."]


class BrokenSession:
    """A `Session` of the caller's own whose writes fail with its own exception."""

    session_id = "mine"

    async def get_items(self, limit: int | None = None) -> list[Message]:
        return []

    async def add_items(self, items: Sequence[Message], *, turn_id: str | None = None) -> bool:
        raise ConnectionError("redis went away")

    async def pop_item(self) -> Message | None:
        return None

    async def clear_session(self) -> None:
        return None


async def test_another_session_types_failure_is_wrapped_with_the_state() -> None:
    with pytest.raises(SessionStoreError, match="not written to session 'mine': ConnectionError: redis") as info:
        await Agent(ScriptedBackend(["ok"])).run("hi", session=BrokenSession())
    assert isinstance(info.value.__cause__, ConnectionError) and info.value.state.status == "complete"


# -- text no store can hold -------------------------------------------------------------------------------


@tool(idempotent=True)  # (a tool with side effects is recorded in the execution ledger first: parley.ledger)
def fetch(url: str) -> str:
    """Fetch a page (this one returns half of a UTF-16 pair)."""
    return "caf\udce9"


async def test_a_lone_surrogate_in_the_input_is_refused_before_the_model_is_called(tmp_path: Path) -> None:
    session, backend = SQLiteSession("a", tmp_path / "chat.db"), ScriptedBackend(["never"])
    with pytest.raises(UnencodableTextError, match=r"the user input cannot be stored.*U\+D800") as info:
        await Agent(backend).run("what is \ud800?", session=session)
    assert info.value.where == "messages[0].parts[0].text" and info.value.position == 8
    assert backend.requests == [] and session.get_items_sync() == []


async def test_a_lone_surrogate_in_a_tool_result_is_refused_before_the_next_model_call(tmp_path: Path) -> None:
    session = SQLiteSession("a", tmp_path / "chat.db")
    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("fetch", {"url": "x"}, id="c1")]), "never"])
    with pytest.raises(UnencodableTextError, match=r"the result of tool 'fetch' \(call 'c1'\).*U\+DCE9") as info:
        await Agent(backend, tools=[fetch]).run("read x", session=session)
    assert info.value.where == "messages[2].parts[0].content" and len(backend.requests) == 1
    assert session.get_items_sync() == []


def test_the_stores_refuse_it_too_naming_the_item(tmp_path: Path) -> None:
    session = SQLiteSession("a", tmp_path / "chat.db")
    with pytest.raises(UnencodableTextError, match=r"items\[1\]\.parts\[0\]\.text"):
        session.add_items_sync([Message.user("fine"), Message.user("\udfff")])
    assert session.get_items_sync() == []


# -- PostgreSQL, when one is running here (make test starts one: scripts/postgres_for_tests.sh) ---------


def test_postgres_lock_timeouts_and_read_only_transactions_are_typed() -> None:
    import sqlalchemy

    from tests.sdk.test_sessions import PG_URL, postgres_engine_or_skip

    postgres_engine_or_skip().dispose()
    sid = f"parley-test-errors-{threading.get_ident()}"
    quick = sqlalchemy.create_engine(PG_URL, connect_args={"options": "-c lock_timeout=100"})
    session = SQLAlchemySession(sid, quick)
    session.add_items_sync([Message.user("before")])
    holder = sqlalchemy.create_engine(PG_URL)
    try:
        with holder.connect() as conn:  # another writer holds the session's row lock
            conn.execute(sqlalchemy.text("UPDATE parley_sessions SET updated_at = 0 WHERE session_id = :s"), {"s": sid})
            with pytest.raises(SessionBusyError, match="LockNotAvailable") as info:
                session.add_items_sync([Message.user("x")])
            assert info.value.retryable and "127.0.0.1" in info.value.store
            conn.rollback()
        reader = SQLAlchemySession(
            sid, sqlalchemy.create_engine(PG_URL, connect_args={"options": "-c default_transaction_read_only=on"}),
            create_tables=False,
        )
        assert texts(reader.get_items_sync()) == ["before"]
        with pytest.raises(SessionReadOnlyError, match="ReadOnlySqlTransaction"):
            reader.add_items_sync([Message.user("x")])
        reader.engine.dispose()
    finally:
        session.clear_session_sync()
        holder.dispose()
        quick.dispose()
