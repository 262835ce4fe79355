"""Sessions: the stores' contract (memory, SQLite, SQLAlchemy on SQLite, PostgreSQL when one is
running on 127.0.0.1:5432) and how `Agent.run(session=...)` reads and writes them.

Crash and concurrency tests are in test_sessions_durability.py.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from parley import Agent, MemorySession, Message, RunState, Session, SQLAlchemySession, SQLiteSession, tool
from parley.backends import ModelRequest, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import ConfigurationError, MaxTurnsExceeded, ScriptExhaustedError
from parley.protocol import ImagePart, MemoryBlobStore, Role
from parley.protocol.errors import ParseError
from parley.sessions import SessionStore
from parley.sessions.errors import SessionUnavailableError

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4

Factory = Callable[[str], SessionStore]


def _sqlalchemy_file(tmp_path: Path) -> Factory:
    pytest.importorskip("sqlalchemy")
    return lambda sid: SQLAlchemySession.from_url(sid, f"sqlite:///{tmp_path / 'alchemy.db'}")


def _sqlalchemy_memory(tmp_path: Path) -> Factory:
    pytest.importorskip("sqlalchemy")
    import sqlalchemy

    engine = sqlalchemy.create_engine(
        "sqlite://", poolclass=sqlalchemy.pool.StaticPool, connect_args={"check_same_thread": False}
    )
    return lambda sid: SQLAlchemySession(sid, engine)


def _sqlite_memory(tmp_path: Path) -> Factory:
    # ":memory:" lives in one connection, i.e. one SQLiteSession object: share it between ids by file
    return lambda sid: SQLiteSession(sid, tmp_path / "mem.db") if sid != "a" else SQLiteSession(sid)


STORES: dict[str, Callable[[Path], Factory]] = {
    "memory": lambda tmp_path: lambda sid: MemorySession(sid),
    "sqlite": lambda tmp_path: lambda sid: SQLiteSession(sid, tmp_path / "chat.db"),
    "sqlite-memory": _sqlite_memory,
    "sqlalchemy": _sqlalchemy_file,
    "sqlalchemy-memory": _sqlalchemy_memory,
}


@pytest.fixture(params=sorted(STORES))
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    return STORES[request.param](tmp_path)


def texts(messages: list[Message]) -> list[str]:
    """Each message's text (a tool message's result content)."""
    return [m.text or "".join(r.content for r in m.tool_results) for m in messages]


def another_handle(make: Factory, session: SessionStore) -> SessionStore:
    """A second object on the same session (for a database: another connection), where there can be one."""
    if isinstance(session, MemorySession) or getattr(session, "db_path", None) == ":memory:":
        return session
    return make(session.session_id)


async def check_contract(make: Factory) -> None:
    """The `Session` protocol, as every store must keep it."""
    a, b = make("a"), make("b")
    assert isinstance(a, Session)
    assert await a.get_items() == [] and await a.pop_item() is None
    assert await a.add_items([Message.user("one"), Message.assistant("two")]) is True
    assert await a.add_items([]) is True
    await b.add_items([Message.user("other session")])
    assert await a.add_items([Message.user("three"), Message.assistant("four")], turn_id="t1") is True
    assert await a.add_items([Message.user("three again")], turn_id="t1") is False  # once per turn id
    assert await b.add_items([Message.user("same id, other session")], turn_id="t1") is True
    assert texts(await a.get_items()) == ["one", "two", "three", "four"]
    assert texts(await a.get_items(limit=3)) == ["two", "three", "four"]
    assert texts(await a.get_items(limit=10)) == ["one", "two", "three", "four"]
    assert await a.get_items(limit=0) == []
    popped = await a.pop_item()
    assert popped is not None and popped.role is Role.ASSISTANT and popped.text == "four"
    assert texts(await a.get_items()) == ["one", "two", "three"]
    assert await a.add_items([Message.assistant("four'")], turn_id="t1") is False  # popping keeps the record
    # the sync twins
    assert a.add_items_sync([Message.assistant("five")]) is True
    assert texts(a.get_items_sync(limit=2)) == ["three", "five"]
    assert a.pop_item_sync() == Message.assistant("five")
    await a.clear_session()
    assert await a.get_items() == []
    assert await a.add_items([Message.user("after clear")], turn_id="t1") is True  # clear forgets turns too
    a.clear_session_sync()
    assert a.get_items_sync() == []
    assert texts(await b.get_items()) == ["other session", "same id, other session"]


async def test_store_contract(make: Factory) -> None:
    await check_contract(make)


async def test_items_come_back_equal_and_fresh(make: Factory) -> None:
    session = make("a")
    image = ImagePart.from_bytes(PNG)
    original = [
        Message.user("what is this?", image),
        Message.assistant(reasoning="look", tool_calls=[call("zoom", {"x": 1}, id="c1")]),
        Message.tool("c1", "zoom", "zoomed", attachments=[image]),
        Message.assistant("a test pattern"),
    ]
    await session.add_items(original)
    loaded = await session.get_items()
    assert loaded == original
    assert loaded[0].media[0].sha256 == image.sha256 and loaded[2].tool_results[0].attachments[0].data == PNG
    loaded[3].parts.clear()  # a copy: changing it changes nothing stored
    assert (await session.get_items())[3].text == "a test pattern"


def test_sqlite_rows_hold_the_envelope_json_and_use_wal(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    session = SQLiteSession("a", db)
    assert session.journal_mode == "wal"
    message = Message.user("see", ImagePart.from_bytes(PNG))
    session.add_items_sync([message], turn_id="t")
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT seq, turn_id, message_json FROM parley_messages").fetchall()
    assert rows == [(1, "t", message.model_dump_json())]  # one row per message, the envelope's own JSON
    assert message.media[0].sha256 in rows[0][2]
    session.close()
    with pytest.raises(ConfigurationError, match="closed"):
        session.get_items_sync()
    with SQLiteSession("a", db) as again:  # it is all in the file
        assert again.get_items_sync() == [message]


def test_a_blob_store_keeps_large_bytes_out_of_the_rows(tmp_path: Path) -> None:
    blobs = MemoryBlobStore(inline_limit=16)
    session = SQLiteSession("a", tmp_path / "chat.db", blobs=blobs)
    message = Message.user("see", ImagePart.from_bytes(PNG))
    session.add_items_sync([message])
    with sqlite3.connect(tmp_path / "chat.db") as conn:
        (row,) = conn.execute("SELECT message_json FROM parley_messages").fetchone()
    assert len(row) < 300 and message.media[0].sha256 in row and set(blobs.blobs) == {message.media[0].sha256}
    assert session.get_items_sync() == [message]


def test_sqlite_and_sqlalchemy_read_each_other(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy")
    db = tmp_path / "shared.db"
    SQLiteSession("a", db).add_items_sync([Message.user("from sqlite")], turn_id="t1")
    alchemy = SQLAlchemySession.from_url("a", f"sqlite:///{db}")
    assert texts(alchemy.get_items_sync()) == ["from sqlite"]
    assert alchemy.add_items_sync([Message.user("again")], turn_id="t1") is False
    alchemy.add_items_sync([Message.assistant("from sqlalchemy")])
    alchemy.close()
    assert texts(SQLiteSession("a", db).get_items_sync()) == ["from sqlite", "from sqlalchemy"]


def test_bad_input_is_a_typed_error(tmp_path: Path) -> None:
    session = SQLiteSession("a", tmp_path / "chat.db")
    for bad in ("hello", Message.user("not in a list"), [Message.user("ok"), {"role": "user"}], None):
        with pytest.raises(ConfigurationError, match="items"):
            session.add_items_sync(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="limit"):
        session.get_items_sync(limit=-1)
    with pytest.raises(ConfigurationError, match="turn_id"):
        session.add_items_sync([Message.user("x")], turn_id="")
    for bad_id in ("", None, 3):
        with pytest.raises(ConfigurationError, match="session_id"):
            MemorySession(bad_id)  # type: ignore[arg-type]
    with pytest.raises(SessionUnavailableError, match="cannot open"):
        SQLiteSession("a", tmp_path / "no such folder" / "chat.db")
    assert session.get_items_sync() == []  # nothing half-written by the refused calls


def test_a_corrupt_row_is_a_typed_error_and_stays(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    session = SQLiteSession("a", db)
    session.add_items_sync([Message.user("fine")])
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO parley_messages VALUES ('a', 2, NULL, '{\"role\": \"nobody\"}', 0)")
    with pytest.raises(ParseError, match="session 'a'"):
        session.get_items_sync()
    with pytest.raises(ParseError):
        session.pop_item_sync()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM parley_messages").fetchone() == (2,)


def test_sqlalchemy_needs_a_sync_engine() -> None:
    pytest.importorskip("sqlalchemy")
    with pytest.raises(ConfigurationError, match="Engine"):
        SQLAlchemySession("a", "sqlite://")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not a database URL"):
        SQLAlchemySession.from_url("a", "no url at all")


# -- the agent ---------------------------------------------------------------------------------------


@tool
def lookup(city: str) -> str:
    """Look up the weather."""
    return f"4 °C in {city}"


sent: list[str] = []


@tool(needs_approval=True)
def send(to: str) -> str:
    """Send a report."""
    sent.append(to)
    return f"sent to {to}"


def roles(request: ModelRequest) -> list[str]:
    return [m.role.value for m in request.conversation]


async def test_a_run_sees_the_history_and_appends_its_whole_turn(make: Factory) -> None:
    session = make("a")
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="c1")]),
            "It is 4 °C in Oslo.",
            ScriptedTurn(text="You asked about Oslo.", expect=lambda r: roles(r) == [
                "system", "user", "assistant", "tool", "assistant", "user"]),
        ]
    )
    agent = Agent(backend, instructions="Be brief.", tools=[lookup])
    first = await agent.run("Weather in Oslo?", session=session)
    stored = await session.get_items()
    assert [m.role.value for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored == first.messages[1:]  # the instructions are the agent's, not the session's
    second = await agent.run("What did I ask?", session=session)
    assert second.output == "You asked about Oslo." and backend.remaining == 0
    assert texts((await session.get_items())[-2:]) == ["What did I ask?", "You asked about Oslo."]
    # the state holds only the turn in flight: the history is the session's
    assert [m.text for m in second.state.messages] == ["What did I ask?", "You asked about Oslo."]
    assert "Weather in Oslo" not in second.state.to_json()
    assert second.messages[0].role is Role.SYSTEM and len(second.messages) == 7


def test_run_sync_and_run_stream_use_the_session(tmp_path: Path) -> None:
    session = SQLiteSession("a", tmp_path / "chat.db")
    agent = Agent(ScriptedBackend(["Hello Ada.", "Your name is Ada."]))
    agent.run_sync("My name is Ada.", session=session)

    async def stream() -> Any:
        items = [item async for item in agent.run_stream("What is my name?", session=session)]
        return items[-1]

    import asyncio

    result = asyncio.run(stream())
    assert result.output == "Your name is Ada."
    assert texts(session.get_items_sync()) == ["My name is Ada.", "Hello Ada.", "What is my name?", "Your name is Ada."]


async def test_a_failed_run_writes_nothing(make: Factory) -> None:
    session = make("a")
    await session.add_items([Message.user("earlier"), Message.assistant("kept")])
    failing = Agent(ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})])]), tools=[lookup])
    with pytest.raises(ScriptExhaustedError):  # the model fails after a tool already ran
        await failing.run("Weather?", session=session)
    looping = Agent(
        ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": str(i)})]) for i in range(2)]),
        tools=[lookup],
        max_turns=2,
        max_tool_rounds=None,
    )
    with pytest.raises(MaxTurnsExceeded):
        await looping.run("Weather?", session=session)
    assert texts(await session.get_items()) == ["earlier", "kept"]


async def test_a_paused_run_writes_nothing_and_its_resume_writes_the_turn_once(make: Factory) -> None:
    session = make("a")
    other = another_handle(make, session)
    sent.clear()

    def model(request: ModelRequest) -> ScriptedTurn | str:
        if request.conversation.messages[-1].role is Role.TOOL:
            return "Report sent."
        if request.conversation.messages[-1].text == "Hi":
            return "Hello."
        return ScriptedTurn(tool_calls=[call("send", {"to": "ada@example.com"}, id="s1")])

    from parley.backends import FunctionBackend

    backend = FunctionBackend(model)
    agent = Agent(backend, tools=[send])
    paused = await agent.run("Send the report", session=session)
    assert paused.paused and await session.get_items() == []  # nothing at a pause
    saved = paused.state.to_json()
    # meanwhile another run on the same session completes its turn
    await agent.run("Hi", session=other)
    state = RunState.from_json(saved)
    state.approve("s1")
    done = await agent.run(state=state, session=session)
    assert done.output == "Report sent." and sent == ["ada@example.com"]
    # the resumed run saw the turn committed meanwhile, before its own
    expected = ["Hi", "Hello.", "Send the report", "", "sent to ada@example.com", "Report sent."]
    assert texts(backend.requests[-1].conversation.messages) == expected[:-1]
    assert texts(await session.get_items()) == expected
    # a second resume of the same state (another process, a retry) and a rerun of the finished state write nothing more
    again = RunState.from_json(saved)
    again.approve("s1")
    await agent.run(state=again, session=other)
    await agent.run(state=done.state, session=session)
    assert texts(await session.get_items()) == expected


async def test_a_finished_state_written_late_is_written_by_a_rerun(make: Factory) -> None:
    """A crash between the final checkpoint and the session write: running the saved state again writes it."""
    session = make("a")
    agent = Agent(ScriptedBackend(["Hello."]))
    checkpoints: list[str] = []
    result = await agent.run("Hi", checkpoint=lambda s: checkpoints.append(s.to_json()))  # no session: not written
    assert await session.get_items() == []
    final = RunState.from_json(checkpoints[-1])
    assert final.status == "complete"
    rerun = await agent.run(state=final, session=session)
    assert rerun.output == result.output == "Hello."
    assert texts(await session.get_items()) == ["Hi", "Hello."]


async def test_a_finished_state_cannot_take_new_input_with_a_session() -> None:
    session = MemorySession()
    agent = Agent(ScriptedBackend(["Hello."]))
    result = await agent.run("Hi", session=session)
    with pytest.raises(ConfigurationError, match="start the next turn"):
        await agent.run("More", state=result.state, session=session)
    with pytest.raises(ConfigurationError, match="parley.sessions.Session"):
        await agent.run("Hi", session=[])  # type: ignore[arg-type]


async def test_a_hand_edited_history_is_shown_repaired_and_never_run(make: Factory) -> None:
    session = make("a")
    sent.clear()
    # a call left without its result (added by hand, or its result popped)
    unanswered = Message.assistant(tool_calls=[call("send", {"to": "x@y.z"}, id="c1")])
    await session.add_items([Message.user("Send it"), unanswered])
    backend = ScriptedBackend(
        [
            ScriptedTurn(
                tool_calls=[call("lookup", {"city": "Oslo"}, id="c1")],  # reuses the history's call id
                expect=lambda r: r.conversation.messages[-2].tool_results[0].is_error,
            ),
            "Done.",
        ]
    )
    agent = Agent(backend, tools=[send, lookup])
    result = await agent.run("Weather?", session=session)
    assert result.output == "Done." and sent == []  # the old call is shown as not run, never executed
    new_call = result.state.messages[1].tool_calls[0]
    assert new_call.id != "c1"  # call ids stay unique across the history
    stored = await session.get_items()
    assert len(stored) == 2 + 4 and stored[3].tool_calls[0].id == new_call.id


# -- PostgreSQL, when one is running here --------------------------------------------------------------

PG_URL = os.environ.get("PARLEY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def postgres_engine_or_skip() -> Any:
    """An engine on `PG_URL`, or a skip naming what is missing (the server or its driver)."""
    pytest.importorskip("sqlalchemy")
    import sqlalchemy

    url = sqlalchemy.engine.make_url(PG_URL)
    where = f"{url.host or '127.0.0.1'}:{url.port or 5432}"
    try:
        with socket.create_connection((url.host or "127.0.0.1", url.port or 5432), timeout=0.5):
            pass
    except OSError:
        pytest.skip(f"no PostgreSQL server on {where} (PARLEY_TEST_POSTGRES_URL names another)")
    try:
        engine = sqlalchemy.create_engine(PG_URL)
        with engine.connect():
            pass
    except ImportError as exc:
        pytest.skip(f"PostgreSQL on {where}, but its driver for {PG_URL} is not installed: {exc}")
    except sqlalchemy.exc.OperationalError as exc:
        pytest.skip(f"PostgreSQL on {where} refused {PG_URL}: {exc}")
    return engine


@pytest.fixture
def postgres() -> Iterator[Factory]:
    engine = postgres_engine_or_skip()
    prefix = f"parley-test-{os.getpid()}-"
    made: list[SessionStore] = []

    def make(sid: str) -> SessionStore:
        session = SQLAlchemySession(prefix + sid, engine)
        made.append(session)
        return session

    yield make
    for session in made:
        session.clear_session_sync()
    engine.dispose()


async def test_postgres_session(postgres: Factory) -> None:
    await check_contract(postgres)
    await test_a_run_sees_the_history_and_appends_its_whole_turn(postgres)
    # concurrent writers on one session: every append whole and after the others
    import asyncio

    writers = [postgres("shared") for _ in range(4)]
    await asyncio.gather(
        *(w.add_items([Message.user(f"{n} {i}") for i in range(20)], turn_id=f"w{n}") for n, w in enumerate(writers))
    )
    items = texts(await writers[0].get_items())
    blocks = [items[i : i + 20] for i in range(0, 80, 20)]
    assert sorted(b[0].split()[0] for b in blocks) == ["0", "1", "2", "3"]
    assert all(b == [f"{b[0].split()[0]} {i}" for i in range(20)] for b in blocks)
