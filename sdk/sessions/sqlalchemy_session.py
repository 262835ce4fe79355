"""`SQLAlchemySession`: a session in any database SQLAlchemy speaks to (PostgreSQL, MySQL, SQLite...).

    session = SQLAlchemySession.from_url("user-42", "postgresql+psycopg://app@db/chats")
    result = await agent.run("Hi!", session=session)

Needs the ``sql`` extra (``pip install 'parley[sql]'``: SQLAlchemy 2) and the database's own sync
driver (psycopg, PyMySQL, ...). The tables are the ones `SQLiteSession` uses (`parley_sessions`,
`parley_messages`, `parley_turns`, `parley_compactions`; created when missing unless
``create_tables=False``), so a SQLite
file written by either store reads with the other.

Concurrent writers: every write is one transaction that first updates the session's own row in
`parley_sessions`, which takes that row's lock (PostgreSQL, MySQL/InnoDB) or the database's write
lock (SQLite), before reading anything; a second writer of the same session waits for the first to
commit, then numbers its rows after the first's. So appends from several processes land whole and
never interleave, on every backend, at the default READ COMMITTED (PostgreSQL) or REPEATABLE READ
(MySQL) isolation. Operations run in a worker thread (sync engines; an `AsyncEngine` is refused).

Errors: no `sqlalchemy.exc` (or driver) exception leaves a session; each is raised as the
`parley.sessions.errors` error it stands for (classified by SQLSTATE, MySQL error number or SQLite
result code, the original chained), naming the URL without its password. A SQLite file URL follows
`SQLiteSession`'s rule for files: a new file is created whole, an empty or foreign file is refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from parley.errors import ConfigurationError
from parley.protocol import BlobStore, Message
from parley.sessions.base import PendingCompaction, SessionStore, StoredCompaction
from parley.sessions.sqlite import check_database_file, create_database_file

if TYPE_CHECKING:
    import sqlalchemy as sa

T = TypeVar("T")

_INSTALL = "SQLAlchemySession needs SQLAlchemy 2: pip install 'parley[sql]'"
_RETRIES = 5
"""Transactions retried after an IntegrityError (two processes creating the same session's row at once)."""


def _sqlalchemy() -> Any:
    try:
        import sqlalchemy
    except ImportError:
        raise ConfigurationError(_INSTALL) from None
    if int(sqlalchemy.__version__.split(".")[0]) < 2:
        raise ConfigurationError(f"{_INSTALL} (found SQLAlchemy {sqlalchemy.__version__})")
    return sqlalchemy


class _Tables:
    """The four tables, as SQLAlchemy Core objects (built once, on first use)."""

    _built: _Tables | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        sa = _sqlalchemy()
        from sqlalchemy.dialects import mysql

        self.metadata = sa.MetaData()
        key = sa.String(255)
        text = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")  # MySQL's TEXT stops at 64 KiB
        self.sessions = sa.Table(
            "parley_sessions",
            self.metadata,
            sa.Column("session_id", key, primary_key=True),
            sa.Column("created_at", sa.Double, nullable=False),
            sa.Column("updated_at", sa.Double, nullable=False),
        )
        self.messages = sa.Table(
            "parley_messages",
            self.metadata,
            sa.Column("session_id", key, primary_key=True),
            sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("turn_id", key, nullable=True),
            sa.Column("message_json", text, nullable=False),
            sa.Column("created_at", sa.Double, nullable=False),
        )
        self.turns = sa.Table(
            "parley_turns",
            self.metadata,
            sa.Column("session_id", key, primary_key=True),
            sa.Column("turn_id", key, primary_key=True),
            sa.Column("created_at", sa.Double, nullable=False),
        )
        self.compactions = sa.Table(
            "parley_compactions",
            self.metadata,
            sa.Column("session_id", key, primary_key=True),
            sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("head_seq", sa.BigInteger, nullable=False),
            sa.Column("through_seq", sa.BigInteger, nullable=False),
            sa.Column("summary_json", text, nullable=False),
            sa.Column("record_json", text, nullable=False),
            sa.Column("turn_id", key, nullable=True),
            sa.Column("created_at", sa.Double, nullable=False),
        )

    @classmethod
    def get(cls) -> _Tables:
        with cls._lock:
            if cls._built is None:
                cls._built = cls()
            return cls._built


class SQLAlchemySession(SessionStore):
    """A session in a SQLAlchemy database (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        engine: sa.engine.Engine,
        *,
        create_tables: bool = True,
        blobs: BlobStore | None = None,
    ) -> None:
        super().__init__(session_id, blobs=blobs)
        sa = _sqlalchemy()
        if type(engine).__name__ == "AsyncEngine":
            raise ConfigurationError(
                "SQLAlchemySession takes a sync Engine (it runs its queries in a worker thread): "
                "use a sync driver URL, e.g. postgresql+psycopg:// instead of postgresql+asyncpg://"
            )
        if not isinstance(engine, sa.engine.Engine):
            raise ConfigurationError(f"engine must be a sqlalchemy Engine, not {type(engine).__name__}")
        self.engine = engine
        self._tables = _Tables.get()
        self._owns_engine = False
        if engine.dialect.name == "sqlite" and engine.url.database in (None, "", ":memory:"):
            self.threaded = False  # one in-memory database on one connection (StaticPool): keep to one thread
        if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
            self._guard("open", self._check_sqlite_file, create_tables)
        if create_tables:
            self._guard("open", self._create_tables)

    @property
    def store_name(self) -> str:
        return str(self.engine.url.render_as_string(hide_password=True))

    def _check_sqlite_file(self, create: bool) -> None:
        from pathlib import Path

        database = str(self.engine.url.database)
        if database.startswith("file:"):
            return  # a URI (uri=true): its mode decides, as the caller asked
        path = Path(database)
        if create and not path.exists():
            create_database_file(path, 30.0)
        check_database_file(self.session_id, path)

    @classmethod
    def from_url(
        cls,
        session_id: str,
        url: str,
        *,
        engine_kwargs: dict[str, Any] | None = None,
        create_tables: bool = True,
        blobs: BlobStore | None = None,
    ) -> SQLAlchemySession:
        """A session on a new engine for `url` (closed by `close`). For SQLite the file is put in WAL
        mode with a 30 s busy timeout, as `SQLiteSession` does."""
        sa = _sqlalchemy()
        kwargs = dict(engine_kwargs or {})
        try:
            parsed = sa.engine.make_url(url)
        except sa.exc.ArgumentError as exc:
            raise ConfigurationError(f"not a database URL: {url!r} ({exc})") from None
        sqlite = parsed.get_backend_name() == "sqlite"
        if sqlite:
            connect_args = dict(kwargs.get("connect_args") or {})
            connect_args.setdefault("timeout", 30.0)
            if parsed.database in (None, "", ":memory:"):
                connect_args.setdefault("check_same_thread", False)
                kwargs.setdefault("poolclass", sa.pool.StaticPool)
            kwargs["connect_args"] = connect_args
        try:
            engine = sa.create_engine(parsed, **kwargs)
        except (ImportError, sa.exc.ArgumentError) as exc:
            raise ConfigurationError(f"cannot make an engine for {parsed!r}: {exc}") from None
        if sqlite:
            sa.event.listen(engine, "connect", _sqlite_pragmas)
        session = cls(session_id, engine, create_tables=create_tables, blobs=blobs)
        session._owns_engine = True
        return session

    def close(self) -> None:
        """Dispose of the engine when `from_url` made it (an engine you passed in is left alone)."""
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> SQLAlchemySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create_tables(self) -> None:
        create_tables_racing(self._tables.metadata, self.engine)

    def _write(self, fn: Callable[[Any, float], T]) -> T:
        """Run `fn(connection, now)` in one transaction holding this session's lock."""
        sa = _sqlalchemy()
        sessions = self._tables.sessions
        mine = sessions.c.session_id == self.session_id
        for attempt in range(_RETRIES):
            now = time.time()
            try:
                with self.engine.begin() as conn:
                    # the lock: the session row's (or SQLite's write lock), taken before anything is read
                    touched = conn.execute(sa.update(sessions).where(mine).values(updated_at=now))
                    if touched.rowcount == 0:
                        conn.execute(
                            sa.insert(sessions).values(session_id=self.session_id, created_at=now, updated_at=now)
                        )
                    return fn(conn, now)
            except sa.exc.IntegrityError:
                if attempt == _RETRIES - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    # -- operations ---------------------------------------------------------------------------------
    def _latest(self, conn: Any) -> StoredCompaction | None:
        sa = _sqlalchemy()
        table = self._tables.compactions
        row = conn.execute(
            sa.select(*_compaction_columns(table)).where(table.c.session_id == self.session_id)
            .order_by(table.c.id.desc()).limit(1)
        ).first()
        return StoredCompaction(*row) if row is not None else None

    def _snapshot(self, limit: int | None) -> tuple[list[tuple[int, str]], StoredCompaction | None, int]:
        sa = _sqlalchemy()
        messages = self._tables.messages
        mine = messages.c.session_id == self.session_id
        query = sa.select(messages.c.seq, messages.c.message_json).where(mine)
        with self.engine.connect() as conn, conn.begin():  # one transaction: one snapshot where the database gives it
            latest = self._latest(conn)
            last = conn.execute(sa.select(sa.func.coalesce(sa.func.max(messages.c.seq), 0)).where(mine)).scalar_one()
            if latest is not None:
                query = query.where(sa.or_(messages.c.seq <= latest.head_seq, messages.c.seq > latest.through_seq))
                rows = [(row[0], row[1]) for row in conn.execute(query.order_by(messages.c.seq))]
            elif limit is None:
                rows = [(row[0], row[1]) for row in conn.execute(query.order_by(messages.c.seq))]
            else:
                newest = conn.execute(query.order_by(messages.c.seq.desc()).limit(limit))
                rows = [(row[0], row[1]) for row in newest][::-1]
        return rows, latest, int(last)

    def _all_rows(self) -> list[str]:
        sa = _sqlalchemy()
        messages = self._tables.messages
        query = sa.select(messages.c.message_json).where(messages.c.session_id == self.session_id)
        with self.engine.connect() as conn:
            return [row[0] for row in conn.execute(query.order_by(messages.c.seq))]

    def _compactions(self) -> list[StoredCompaction]:
        sa = _sqlalchemy()
        table = self._tables.compactions
        query = sa.select(*_compaction_columns(table)).where(table.c.session_id == self.session_id)
        with self.engine.connect() as conn:
            return [StoredCompaction(*row) for row in conn.execute(query.order_by(table.c.id))]

    def _append(self, rows: list[str], turn_id: str | None, compaction: PendingCompaction | None = None) -> bool:
        sa = _sqlalchemy()
        messages, turns, compactions = self._tables.messages, self._tables.turns, self._tables.compactions

        def append(conn: Any, now: float) -> bool:
            if turn_id is not None:
                seen = conn.execute(
                    sa.select(turns.c.turn_id).where(turns.c.session_id == self.session_id, turns.c.turn_id == turn_id)
                ).first()
                if seen is not None:
                    return False
                conn.execute(sa.insert(turns).values(session_id=self.session_id, turn_id=turn_id, created_at=now))
            last = conn.execute(
                sa.select(sa.func.coalesce(sa.func.max(messages.c.seq), 0)).where(
                    messages.c.session_id == self.session_id
                )
            ).scalar_one()
            if rows:
                conn.execute(
                    sa.insert(messages),
                    [
                        {"session_id": self.session_id, "seq": last + i, "turn_id": turn_id, "message_json": row,
                         "created_at": now}
                        for i, row in enumerate(rows, start=1)
                    ],
                )
            if compaction is not None:
                latest = self._latest(conn)
                latest_id = latest.id if latest is not None else None
                if compaction.expect_last_seq == last and compaction.expect_compaction == latest_id:
                    through = compaction.through(last)
                    conn.execute(sa.insert(compactions).values(
                        session_id=self.session_id, id=(latest_id or 0) + 1, head_seq=compaction.head_seq,
                        through_seq=through, summary_json=compaction.summary_json,
                        record_json=compaction.record_json, turn_id=turn_id, created_at=now,
                    ))
            return True

        return self._write(append)

    def _pop(self, load: Callable[[str], Message]) -> Message | None:
        sa = _sqlalchemy()
        messages = self._tables.messages

        def pop(conn: Any, now: float) -> Message | None:
            row = conn.execute(
                sa.select(messages.c.seq, messages.c.message_json)
                .where(messages.c.session_id == self.session_id)
                .order_by(messages.c.seq.desc())
                .limit(1)
            ).first()
            if row is None:
                return None
            message = load(row[1])  # a row that does not load stays where it is (the transaction rolls back)
            conn.execute(sa.delete(messages).where(messages.c.session_id == self.session_id, messages.c.seq == row[0]))
            compactions = self._tables.compactions
            conn.execute(sa.delete(compactions).where(
                compactions.c.session_id == self.session_id, compactions.c.through_seq >= row[0]
            ))
            return message

        return self._write(pop)

    def _clear(self) -> None:
        sa = _sqlalchemy()
        tables = self._tables

        def clear(conn: Any, now: float) -> None:
            conn.execute(sa.delete(tables.messages).where(tables.messages.c.session_id == self.session_id))
            conn.execute(sa.delete(tables.turns).where(tables.turns.c.session_id == self.session_id))
            conn.execute(sa.delete(tables.compactions).where(tables.compactions.c.session_id == self.session_id))
            conn.execute(sa.delete(tables.sessions).where(tables.sessions.c.session_id == self.session_id))

        self._write(clear)


def _compaction_columns(table: Any) -> tuple[Any, ...]:
    c = table.c
    return c.id, c.head_seq, c.through_seq, c.summary_json, c.record_json, c.turn_id, c.created_at


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = FULL")
    finally:
        cursor.close()


def create_tables_racing(metadata: Any, engine: Any) -> None:
    """`metadata.create_all` where other processes may create the same tables at the same moment: a CREATE
    that loses the race ("already exists") looks again instead of failing (sessions and the ledger)."""
    sa = _sqlalchemy()
    for attempt in range(_RETRIES):
        try:
            metadata.create_all(engine, checkfirst=True)
            return
        except (sa.exc.ProgrammingError, sa.exc.IntegrityError, sa.exc.OperationalError):
            # another process created them between our check and our CREATE: look again
            if attempt == _RETRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
