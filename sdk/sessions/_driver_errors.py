"""Which `SessionStoreError` a database driver's exception is.

Drivers report the same failure in different words: SQLite by result code (``SQLITE_BUSY``...),
PostgreSQL by SQLSTATE (``55P03``...), MySQL by error number (1205...), SQLAlchemy by wrapping
whichever of those in `sqlalchemy.exc.DBAPIError` (``.orig``). `classify` reads the code, never the
message text, so a translated server message classifies the same. Exceptions that are not a
database's (a `ParleyError`, a bug) are left alone: `classify` returns None.
"""

from __future__ import annotations

import sqlite3

from parley.sessions.errors import (
    SessionBusyError,
    SessionCorruptError,
    SessionReadOnlyError,
    SessionStoreError,
    SessionUnavailableError,
)

Kind = type[SessionStoreError]

_SQLITE = {
    "SQLITE_BUSY": SessionBusyError,
    "SQLITE_LOCKED": SessionBusyError,
    "SQLITE_READONLY": SessionReadOnlyError,
    "SQLITE_CORRUPT": SessionCorruptError,
    "SQLITE_NOTADB": SessionCorruptError,
    "SQLITE_CANTOPEN": SessionUnavailableError,
    "SQLITE_IOERR": SessionUnavailableError,
    "SQLITE_FULL": SessionUnavailableError,
    "SQLITE_PERM": SessionUnavailableError,
    "SQLITE_AUTH": SessionUnavailableError,
    "SQLITE_NOMEM": SessionUnavailableError,
    "SQLITE_PROTOCOL": SessionBusyError,
}
"""SQLite primary result codes (https://sqlite.org/rescode.html; extended codes share the prefix)."""

_POSTGRES_CLASSES = {
    "08": SessionUnavailableError,  # connection exception
    "53": SessionUnavailableError,  # insufficient resources (disk full, too many connections)
    "57": SessionUnavailableError,  # operator intervention (shutdown, crash recovery); 57014 below
    "XX": SessionCorruptError,  # internal error: data_corrupted, index_corrupted
}
_POSTGRES = {
    "40001": SessionBusyError,  # serialization_failure
    "40P01": SessionBusyError,  # deadlock_detected
    "55P03": SessionBusyError,  # lock_not_available (lock_timeout)
    "57014": SessionBusyError,  # query_canceled (statement_timeout)
    "25006": SessionReadOnlyError,  # read_only_sql_transaction (a standby, default_transaction_read_only)
    "42501": SessionUnavailableError,  # insufficient_privilege
    "28000": SessionUnavailableError,  # invalid_authorization_specification
    "28P01": SessionUnavailableError,  # invalid_password
    "3D000": SessionUnavailableError,  # invalid_catalog_name (no such database)
    "XX000": SessionStoreError,  # internal_error: not known to be corruption
}
_MYSQL = {
    1205: SessionBusyError,  # ER_LOCK_WAIT_TIMEOUT
    1213: SessionBusyError,  # ER_LOCK_DEADLOCK
    1290: SessionReadOnlyError,  # ER_OPTION_PREVENTS_STATEMENT (--read-only)
    1792: SessionReadOnlyError,  # ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
    1836: SessionReadOnlyError,  # ER_READ_ONLY_MODE
    1044: SessionUnavailableError,  # ER_DBACCESS_DENIED_ERROR
    1045: SessionUnavailableError,  # ER_ACCESS_DENIED_ERROR
    1049: SessionUnavailableError,  # ER_BAD_DB_ERROR
    2002: SessionUnavailableError,  # CR_CONNECTION_ERROR
    2003: SessionUnavailableError,  # CR_CONN_HOST_ERROR
    2006: SessionUnavailableError,  # CR_SERVER_GONE_ERROR
    2013: SessionUnavailableError,  # CR_SERVER_LOST
}


def classify(exc: BaseException) -> Kind | None:
    """The store error `exc` stands for, or None when it is not a database driver's error."""
    if isinstance(exc, sqlite3.Error):
        return _sqlite(exc)
    module = type(exc).__module__.split(".")[0]
    if module == "sqlalchemy":
        return _sqlalchemy(exc)
    if module in ("psycopg", "psycopg2"):
        return _postgres(exc)
    if module in ("pymysql", "MySQLdb", "mysql"):
        return _mysql(exc)
    return None


def _sqlite(exc: sqlite3.Error) -> Kind:
    name = getattr(exc, "sqlite_errorname", None) or ""
    for prefix, kind in _SQLITE.items():
        if name == prefix or name.startswith(prefix + "_"):
            return kind
    if isinstance(exc, sqlite3.OperationalError) and not name:
        return SessionUnavailableError  # raised by the module itself (e.g. a closed database)
    return SessionStoreError


def _sqlalchemy(exc: BaseException) -> Kind:
    from sqlalchemy import exc as sa_exc

    if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None:
        found = classify(exc.orig)
        if found is not None and found is not SessionStoreError:
            return found
        if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
            return SessionUnavailableError
        return found or SessionStoreError
    if isinstance(exc, sa_exc.TimeoutError):  # the pool had no connection free in time
        return SessionBusyError
    if isinstance(exc, sa_exc.DisconnectionError):
        return SessionUnavailableError
    return SessionStoreError


EXPLAIN = {
    SessionBusyError: "another connection holds the lock (retry later)",
    SessionCorruptError: "the database is damaged or not a database",
    SessionReadOnlyError: "the database is read-only",
    SessionUnavailableError: "the database cannot be opened or reached",
    SessionStoreError: "the database refused the operation",
}
"""What each kind means, for the error's message (a store may say more, e.g. its timeout)."""


def _postgres(exc: BaseException) -> Kind:
    state = str(getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None) or "")
    if state in _POSTGRES:
        return _POSTGRES[state]
    if state[:2] in _POSTGRES_CLASSES:
        return _POSTGRES_CLASSES[state[:2]]
    if not state and type(exc).__name__ in ("OperationalError", "InterfaceError"):
        return SessionUnavailableError  # no SQLSTATE: the client could not talk to a server
    return SessionStoreError


def _mysql(exc: BaseException) -> Kind:
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    return _MYSQL.get(code, SessionStoreError) if code is not None else SessionStoreError
