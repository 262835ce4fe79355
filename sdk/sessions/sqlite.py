"""`SQLiteSession`: the default store, a SQLite file (stdlib `sqlite3`, run in a worker thread).

    session = SQLiteSession("user-42", "chats.db")
    result = await agent.run("Hi!", session=session)

One row per message (the envelope's JSON), in four tables shared with `SQLAlchemySession`
(`SCHEMA`), so either store reads what the other wrote. The database is in WAL mode (readers never
wait for the writer) with ``synchronous=FULL`` (a committed turn survives a crash of the process or
of the machine). Every write is one ``BEGIN IMMEDIATE`` transaction that takes the write lock
before it reads anything, and waits up to `busy_timeout_s` for a writer in another thread or
process: several processes may append to the same session at once, and each append lands whole,
after the others, never interleaved with them.

``db_path=":memory:"`` (the default, as in the OpenAI Agents SDK) keeps the database in this object
only; give a file path to keep it.

Which files it opens. A path that does not exist becomes a new database: it is built aside (a
hidden ``.NAME.*.new`` file in the same directory: schema and WAL header) and put in place with a
hard link, which fails if another process got there first (then theirs is used). So a database
parley creates is never an empty file, not even for an instant, and an existing file is opened only
when it already is a SQLite database: a **0-byte file is refused** (`SessionCorruptError`; sqlite3
would silently make it a new, empty database, hiding a truncated copy or the wrong path; remove it,
or pass a path that does not exist), and so is a file that does not start with SQLite's header. A
file the process may not write (or ``read_only=True``) opens read-only: reads work, every write
raises `SessionReadOnlyError`. Every database failure is a `parley.sessions.errors` error naming
the path: "database is locked" past `busy_timeout_s` is `SessionBusyError`, a damaged file
`SessionCorruptError`, a missing directory `SessionUnavailableError`.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from parley.errors import ConfigurationError
from parley.protocol import BlobStore, Message
from parley.sessions.base import PendingCompaction, SessionStore, StoredCompaction
from parley.sessions.errors import (
    SessionBusyError,
    SessionCorruptError,
    SessionReadOnlyError,
    SessionStoreError,
    SessionUnavailableError,
)

_COMPACTION_COLUMNS = "id, head_seq, through_seq, summary_json, record_json, turn_id, created_at"

SCHEMA = """
CREATE TABLE IF NOT EXISTS parley_sessions (
    session_id VARCHAR(255) NOT NULL PRIMARY KEY,
    created_at FLOAT NOT NULL,
    updated_at FLOAT NOT NULL
);
CREATE TABLE IF NOT EXISTS parley_messages (
    session_id VARCHAR(255) NOT NULL,
    seq INTEGER NOT NULL,
    turn_id VARCHAR(255),
    message_json TEXT NOT NULL,
    created_at FLOAT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS parley_turns (
    session_id VARCHAR(255) NOT NULL,
    turn_id VARCHAR(255) NOT NULL,
    created_at FLOAT NOT NULL,
    PRIMARY KEY (session_id, turn_id)
);
CREATE TABLE IF NOT EXISTS parley_compactions (
    session_id VARCHAR(255) NOT NULL,
    id INTEGER NOT NULL,
    head_seq INTEGER NOT NULL,
    through_seq INTEGER NOT NULL,
    summary_json TEXT NOT NULL,
    record_json TEXT NOT NULL,
    turn_id VARCHAR(255),
    created_at FLOAT NOT NULL,
    PRIMARY KEY (session_id, id)
);
"""
"""The tables: sessions, messages (ordered by ``seq`` within a session; ``turn_id`` names the turn a
row was written with), the turn ids written (what makes ``add_items(turn_id=...)`` happen once), and
the compactions (rows ``head_seq < seq <= through_seq`` replaced by ``summary_json`` in the live
history; the latest id applies). A database written before compactions existed gets the fourth
table when opened."""
_TABLES = ("parley_sessions", "parley_messages", "parley_turns", "parley_compactions")
_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file (https://sqlite.org/fileformat.html)."""


class SQLiteSession(SessionStore):
    """A session in a SQLite database file (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        db_path: str | os.PathLike[str] = ":memory:",
        *,
        busy_timeout_s: float = 30.0,
        read_only: bool = False,
        blobs: BlobStore | None = None,
    ) -> None:
        super().__init__(session_id, blobs=blobs)
        if isinstance(busy_timeout_s, bool) or not isinstance(busy_timeout_s, int | float) or busy_timeout_s < 0:
            raise ConfigurationError(f"busy_timeout_s must be a non-negative number, not {busy_timeout_s!r}")
        if not isinstance(read_only, bool):
            raise ConfigurationError(f"read_only must be a bool, not {read_only!r}")
        self.db_path = str(db_path) if str(db_path) == ":memory:" else str(Path(db_path))
        self.busy_timeout_s = float(busy_timeout_s)
        self._asked_read_only = read_only
        self.read_only = read_only or (self.db_path != ":memory:" and _write_protected(Path(self.db_path)))
        """Opened read-only (asked, or the file is write-protected): reads work, writes raise."""
        self._lock = threading.Lock()  # one connection per object, used by one thread at a time
        self._conn: sqlite3.Connection | None = self._guard("open", self._open)

    @property
    def store_name(self) -> str:
        return self.db_path

    def _explain(self, kind: type[SessionStoreError]) -> str:
        if kind is SessionBusyError:
            return f"the database is locked by another writer (waited busy_timeout_s={self.busy_timeout_s:g})"
        if kind is SessionReadOnlyError and self.read_only:
            why = "read_only=True" if self._asked_read_only else "the file is write-protected"
            return f"the session was opened read-only ({why})"
        return super()._explain(kind)

    def _open(self) -> sqlite3.Connection:
        if self.db_path == ":memory:":
            conn = self._connect(":memory:", uri=False)
        else:
            path = Path(self.db_path)
            if not path.exists() and not self.read_only:
                create_database_file(path, self.busy_timeout_s)
            check_database_file(self.session_id, path)
            mode = "ro" if self.read_only else "rw"  # never "rwc": sqlite3 must not create an empty file
            conn = self._connect(f"{path.absolute().as_uri()}?mode={mode}", uri=True)
        try:
            if not self.read_only:
                conn.execute("PRAGMA journal_mode = WAL")  # persistent in the file; 'memory' for :memory:
            conn.execute("PRAGMA synchronous = FULL")
            present = conn.execute(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?, ?)", _TABLES
            ).fetchone()[0]
            if present == len(_TABLES):
                return conn  # (a reader never waits for a writer: opening does not either)
            if self.read_only:
                raise SessionReadOnlyError(
                    f"session {self.session_id!r} in {self.db_path}: cannot open: the database is read-only "
                    "and lacks parley's session tables (open it writable once to create them)",
                    session_id=self.session_id, store=self.db_path, operation="open",
                )
            _create_tables(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect(self, target: str, *, uri: bool) -> sqlite3.Connection:
        return _connect(target, self.busy_timeout_s, uri=uri)

    @property
    def journal_mode(self) -> str:
        """The database's journal mode: ``wal`` for a file (``memory`` for ``:memory:``)."""
        with self._lock:
            return str(self._guard("read", lambda: self._connection().execute("PRAGMA journal_mode").fetchone()[0]))

    def close(self) -> None:
        """Close the connection (the data stays in the file; a closed session refuses further calls)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> SQLiteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ConfigurationError(f"{self!r} is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, holding the database's write lock from its first statement."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")  # waits up to busy_timeout_s for another writer
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """One read transaction (a consistent snapshot across its statements; never waits for a writer)."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    # -- operations -------------------------------------------------------------------------------------
    def _latest(self, conn: sqlite3.Connection) -> StoredCompaction | None:
        row = conn.execute(
            f"SELECT {_COMPACTION_COLUMNS} FROM parley_compactions WHERE session_id = ? ORDER BY id DESC LIMIT 1",
            (self.session_id,),
        ).fetchone()
        return StoredCompaction(*row) if row is not None else None

    def _snapshot(self, limit: int | None) -> tuple[list[tuple[int, str]], StoredCompaction | None, int]:
        with self._reading() as conn:
            latest = self._latest(conn)
            last = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM parley_messages WHERE session_id = ?", (self.session_id,)
            ).fetchone()[0]
            if latest is not None:
                rows = conn.execute(
                    "SELECT seq, message_json FROM parley_messages WHERE session_id = ? AND (seq <= ? OR seq > ?)"
                    " ORDER BY seq",
                    (self.session_id, latest.head_seq, latest.through_seq),
                ).fetchall()
            elif limit is None:
                rows = conn.execute(
                    "SELECT seq, message_json FROM parley_messages WHERE session_id = ? ORDER BY seq",
                    (self.session_id,),
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT seq, message_json FROM (SELECT seq, message_json FROM parley_messages"
                    " WHERE session_id = ? ORDER BY seq DESC LIMIT ?) ORDER BY seq",
                    (self.session_id, limit),
                ).fetchall()
        return [(row[0], row[1]) for row in rows], latest, int(last)

    def _all_rows(self) -> list[str]:
        with self._lock:
            rows = self._connection().execute(
                "SELECT message_json FROM parley_messages WHERE session_id = ? ORDER BY seq", (self.session_id,)
            ).fetchall()
        return [row[0] for row in rows]

    def _compactions(self) -> list[StoredCompaction]:
        with self._lock:
            rows = self._connection().execute(
                f"SELECT {_COMPACTION_COLUMNS} FROM parley_compactions WHERE session_id = ? ORDER BY id",
                (self.session_id,),
            ).fetchall()
        return [StoredCompaction(*row) for row in rows]

    def _append(self, rows: list[str], turn_id: str | None, compaction: PendingCompaction | None = None) -> bool:
        now = time.time()
        with self._write() as conn:
            if turn_id is not None:
                seen = conn.execute(
                    "SELECT 1 FROM parley_turns WHERE session_id = ? AND turn_id = ?", (self.session_id, turn_id)
                ).fetchone()
                if seen is not None:
                    return False
                conn.execute(
                    "INSERT INTO parley_turns (session_id, turn_id, created_at) VALUES (?, ?, ?)",
                    (self.session_id, turn_id, now),
                )
            touched = conn.execute(
                "UPDATE parley_sessions SET updated_at = ? WHERE session_id = ?", (now, self.session_id)
            )
            if touched.rowcount == 0:
                conn.execute(
                    "INSERT INTO parley_sessions (session_id, created_at, updated_at) VALUES (?, ?, ?)",
                    (self.session_id, now, now),
                )
            last = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM parley_messages WHERE session_id = ?", (self.session_id,)
            ).fetchone()[0]
            conn.executemany(
                "INSERT INTO parley_messages (session_id, seq, turn_id, message_json, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                [(self.session_id, last + i, turn_id, row, now) for i, row in enumerate(rows, start=1)],
            )
            if compaction is not None:
                latest = self._latest(conn)
                if compaction.expect_last_seq == last and compaction.expect_compaction == (
                    latest.id if latest is not None else None
                ):
                    through = compaction.through(last)
                    conn.execute(
                        f"INSERT INTO parley_compactions (session_id, {_COMPACTION_COLUMNS})"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (self.session_id, (latest.id if latest is not None else 0) + 1, compaction.head_seq,
                         through, compaction.summary_json, compaction.record_json, turn_id, now),
                    )
        return True

    def _pop(self, load: Callable[[str], Message]) -> Message | None:
        with self._write() as conn:
            row: Any = conn.execute(
                "SELECT seq, message_json FROM parley_messages WHERE session_id = ? ORDER BY seq DESC LIMIT 1",
                (self.session_id,),
            ).fetchone()
            if row is None:
                return None
            message = load(row[1])  # a row that does not load stays where it is
            conn.execute("DELETE FROM parley_messages WHERE session_id = ? AND seq = ?", (self.session_id, row[0]))
            conn.execute(
                "DELETE FROM parley_compactions WHERE session_id = ? AND through_seq >= ?", (self.session_id, row[0])
            )
        return message

    def _clear(self) -> None:
        with self._write() as conn:
            for table in ("parley_messages", "parley_turns", "parley_compactions", "parley_sessions"):
                conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (self.session_id,))


def create_database_file(path: Path, timeout_s: float) -> None:
    """Make a new database at `path` atomically (see the module docstring): never an empty file."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.new")
    try:
        conn = _connect(str(aside), timeout_s, uri=False)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            _create_tables(conn)
        finally:
            conn.close()
        try:
            os.link(aside, path)
        except FileExistsError:
            pass  # another process created it first: open theirs
        except OSError:  # no hard links on this file system: sqlite3 creates it in place
            conn = _connect(f"{path.absolute().as_uri()}?mode=rwc", timeout_s, uri=True)
            try:
                conn.execute("PRAGMA journal_mode = WAL")  # (writes the header: the file is empty no more)
            finally:
                conn.close()
    finally:
        for leftover in (aside, Path(f"{aside}-wal"), Path(f"{aside}-shm")):
            leftover.unlink(missing_ok=True)


def _connect(target: str, timeout_s: float, *, uri: bool) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every write opens its own BEGIN IMMEDIATE
    conn = sqlite3.connect(target, timeout=timeout_s, isolation_level=None, check_same_thread=False, uri=uri)
    conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
    return conn


def _create_tables(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _write_protected(path: Path) -> bool:
    """True when `path` exists and this process may not write it (root may write anything)."""
    return path.exists() and not os.access(path, os.W_OK)


def check_database_file(session_id: str, path: Path) -> None:
    """Refuse, by name, a file that is not a SQLite database: an empty one, or another format."""
    def refuse(kind: type[SessionStoreError], why: str) -> SessionStoreError:
        return kind(
            f"session {session_id!r} in {path}: cannot open: {why}",
            session_id=session_id, store=str(path), operation="open",
        )

    try:
        with open(path, "rb") as file:
            head = file.read(len(_HEADER))
    except IsADirectoryError:
        raise refuse(SessionUnavailableError, "it is a directory, not a database file") from None
    except OSError as exc:
        raise refuse(SessionUnavailableError, f"the file cannot be read ({exc.strerror or exc})") from None
    if not head:
        raise refuse(
            SessionCorruptError,
            "it is an empty (0-byte) file, not a database parley made (parley never leaves one: a new database "
            "is built aside and linked in place); remove it, or pass a path that does not exist, to start anew",
        )
    if head != _HEADER:
        raise refuse(SessionCorruptError, "it is not a SQLite database (the file does not start with SQLite's header)")
