"""Where the execution ledger (`parley.ledger`) is kept: a SQLite file, or a SQLAlchemy database.

Both write one table, ``parley_ledger`` (`SCHEMA`), keyed by (run id, call id). A run with a
session on disk keeps it in the session's own database (`session_ledger`): one place to back up,
and copies of a state resumed against that session see each other's calls. Every operation is a
single statement (an insert that fails on the key, or an update conditioned on the claim's token
and on there being no result yet), so it is atomic on its own on every database; SQLite runs in WAL
mode with ``synchronous=FULL``, so a recorded result survives a crash of the machine too.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from parley.errors import ConfigurationError
from parley.ledger import Ledger, LedgerEntry, _shared

SCHEMA = """
CREATE TABLE IF NOT EXISTS parley_ledger (
    run_id VARCHAR(255) NOT NULL,
    call_id VARCHAR(255) NOT NULL,
    token VARCHAR(64) NOT NULL,
    host VARCHAR(255) NOT NULL,
    pid INTEGER NOT NULL,
    claimed_at FLOAT NOT NULL,
    heartbeat_at FLOAT NOT NULL,
    tool VARCHAR(255) NOT NULL,
    result_json TEXT,
    recorded_at FLOAT,
    PRIMARY KEY (run_id, call_id)
)
"""
_COLUMNS = "run_id, call_id, token, host, pid, claimed_at, heartbeat_at, tool, result_json, recorded_at"
_UNRECORDED = "run_id = ? AND call_id = ? AND token = ? AND result_json IS NULL"


class SQLiteLedger(Ledger):
    """The ledger in a SQLite file (opened on first use; `create_folder` makes its folder then)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_s: float = 30.0,
        create_folder: bool = False,
        **policy: Any,
    ) -> None:
        super().__init__(**policy)
        self.path = Path(path)
        self.busy_timeout_s = float(busy_timeout_s)
        self.create_folder = create_folder
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            if self.create_folder:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._open()
        except sqlite3.Error as exc:  # a foreign or damaged file, a locked one: the sessions' typed family
            error = self._store_error(self._connection, exc)
            if error is None:
                raise
            raise type(error)(
                f"{error} (name another file with Agent.run(..., ledger=PATH) or the PARLEY_LEDGER environment "
                "variable)", store=str(self.path), operation="open",
            ) from exc
        except OSError as exc:
            raise ConfigurationError(
                f"cannot open the execution ledger {str(self.path)!r}: {exc} (name another file with "
                "Agent.run(..., ledger=PATH) or the PARLEY_LEDGER environment variable)"
            ) from None
        self._conn = conn
        return conn

    def _open(self) -> sqlite3.Connection:
        """Connect and set the file up. Switching to WAL can report "locked" at once, without waiting out the
        busy timeout, while another process or thread sets up the same new file: look again, up to the timeout."""
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            conn = sqlite3.connect(
                str(self.path), timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
                conn.execute(SCHEMA)
                return conn
            except sqlite3.OperationalError as exc:
                conn.close()
                busy = getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
            except BaseException:
                conn.close()
                raise

    def _run(self, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor:
        with self._lock:
            return self._connection().execute(sql, args)

    def _insert(self, entry: LedgerEntry) -> bool:
        cursor = self._run(
            f"INSERT OR IGNORE INTO parley_ledger ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
            (
                entry.run_id,
                entry.call_id,
                entry.token,
                entry.host,
                entry.pid,
                entry.claimed_at,
                entry.heartbeat_at,
                entry.tool,
            ),
        )
        return cursor.rowcount == 1

    def _get(self, run_id: str, call_id: str) -> LedgerEntry | None:
        with self._lock:
            row = (
                self._connection()
                .execute(f"SELECT {_COLUMNS} FROM parley_ledger WHERE run_id = ? AND call_id = ?", (run_id, call_id))
                .fetchone()
            )
        return None if row is None else LedgerEntry(*row)

    def _swap(self, entry: LedgerEntry, old_token: str) -> bool:
        cursor = self._run(
            "UPDATE parley_ledger SET token = ?, host = ?, pid = ?, claimed_at = ?, heartbeat_at = ? "
            f"WHERE {_UNRECORDED}",
            (
                entry.token,
                entry.host,
                entry.pid,
                entry.claimed_at,
                entry.heartbeat_at,
                entry.run_id,
                entry.call_id,
                old_token,
            ),
        )
        return cursor.rowcount == 1

    def _record(self, run_id: str, call_id: str, token: str, result_json: str, now: float) -> bool:
        cursor = self._run(
            f"UPDATE parley_ledger SET result_json = ?, recorded_at = ? WHERE {_UNRECORDED}",
            (result_json, now, run_id, call_id, token),
        )
        return cursor.rowcount == 1

    def _touch(self, run_id: str, call_id: str, token: str, now: float) -> None:
        self._run(f"UPDATE parley_ledger SET heartbeat_at = ? WHERE {_UNRECORDED}", (now, run_id, call_id, token))

    def _delete(self, run_id: str, call_id: str, token: str) -> None:
        self._run(f"DELETE FROM parley_ledger WHERE {_UNRECORDED}", (run_id, call_id, token))

    def _prune(self, before: float) -> int:
        return self._run("DELETE FROM parley_ledger WHERE recorded_at < ?", (before,)).rowcount

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class SQLAlchemyLedger(Ledger):
    """The ledger in a SQLAlchemy database (the ``sql`` extra; PostgreSQL, MySQL, SQLite...)."""

    def __init__(self, engine: Any, *, create_tables: bool = True, **policy: Any) -> None:
        super().__init__(**policy)
        import sqlalchemy as sa

        self.engine = engine
        self._sa = sa
        metadata = sa.MetaData()
        key = sa.String(255)
        self.table = sa.Table(
            "parley_ledger",
            metadata,
            sa.Column("run_id", key, primary_key=True),
            sa.Column("call_id", key, primary_key=True),
            sa.Column("token", sa.String(64), nullable=False),
            sa.Column("host", key, nullable=False),
            sa.Column("pid", sa.BigInteger, nullable=False),
            sa.Column("claimed_at", sa.Double, nullable=False),
            sa.Column("heartbeat_at", sa.Double, nullable=False),
            sa.Column("tool", key, nullable=False),
            sa.Column("result_json", sa.Text, nullable=True),
            sa.Column("recorded_at", sa.Double, nullable=True),
        )
        self._metadata = metadata
        self._create = create_tables
        self._ready = False
        self._lock = threading.Lock()

    def _begin(self) -> Any:
        if not self._ready:
            with self._lock:
                if not self._ready and self._create:
                    from parley.sessions.sqlalchemy_session import create_tables_racing

                    create_tables_racing(self._metadata, self.engine)  # two processes may create it at once
                self._ready = True
        return self.engine.begin()

    def _unrecorded(self, run_id: str, call_id: str, token: str) -> Any:
        t = self.table
        return self._sa.and_(
            t.c.run_id == run_id, t.c.call_id == call_id, t.c.token == token, t.c.result_json.is_(None)
        )

    def _insert(self, entry: LedgerEntry) -> bool:
        values = {name: getattr(entry, name) for name in _COLUMNS.split(", ")}
        try:
            with self._begin() as conn:
                conn.execute(self.table.insert().values(**values))
        except self._sa.exc.IntegrityError:
            return False
        return True

    def _get(self, run_id: str, call_id: str) -> LedgerEntry | None:
        t = self.table
        columns = [t.c[name] for name in _COLUMNS.split(", ")]
        with self._begin() as conn:
            row = conn.execute(self._sa.select(*columns).where(t.c.run_id == run_id, t.c.call_id == call_id)).first()
        return None if row is None else LedgerEntry(*row)

    def _update(self, held: tuple[str, str, str], **values: Any) -> bool:
        """Set `values` on the unrecorded row held by (run id, call id, token)."""
        with self._begin() as conn:
            done = conn.execute(self.table.update().where(self._unrecorded(*held)).values(**values))
        return bool(done.rowcount == 1)

    def _swap(self, entry: LedgerEntry, old_token: str) -> bool:
        return self._update(
            (entry.run_id, entry.call_id, old_token),
            token=entry.token,
            host=entry.host,
            pid=entry.pid,
            claimed_at=entry.claimed_at,
            heartbeat_at=entry.heartbeat_at,
        )

    def _record(self, run_id: str, call_id: str, token: str, result_json: str, now: float) -> bool:
        return self._update((run_id, call_id, token), result_json=result_json, recorded_at=now)

    def _touch(self, run_id: str, call_id: str, token: str, now: float) -> None:
        self._update((run_id, call_id, token), heartbeat_at=now)

    def _delete(self, run_id: str, call_id: str, token: str) -> None:
        with self._begin() as conn:
            conn.execute(self.table.delete().where(self._unrecorded(run_id, call_id, token)))

    def _prune(self, before: float) -> int:
        with self._begin() as conn:
            done = conn.execute(self.table.delete().where(self.table.c.recorded_at < before))
        return int(done.rowcount)


def session_ledger(session: Any) -> Ledger | None:
    """The ledger in `session`'s own database, when it has one on disk (else None).

    Recognised by what parley's stores expose (a `SQLiteSession`'s ``db_path``, a
    `SQLAlchemySession`'s ``engine``), so the session classes need not know about the ledger.
    """
    if session is None:
        return None
    from parley.sessions import SQLAlchemySession, SQLiteSession

    if isinstance(session, SQLiteSession) and session.db_path != ":memory:":
        path = Path(session.db_path)
        timeout = session.busy_timeout_s
        return _shared(("sqlite", str(path.absolute())), lambda: SQLiteLedger(path, busy_timeout_s=timeout))
    if isinstance(session, SQLAlchemySession):
        engine = session.engine
        return _shared(("sqlalchemy", id(engine)), lambda: SQLAlchemyLedger(engine))
    return None
