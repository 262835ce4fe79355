"""The errors a session store raises: one family, whatever the database underneath.

A store never lets a driver's exception (`sqlite3.OperationalError`, `sqlalchemy.exc.*`, psycopg's)
escape: each becomes one of these, with the driver's error chained as ``__cause__``, so a caller
handles "locked", "corrupt", "read-only" and "unreachable" once for SQLite, PostgreSQL and MySQL::

    SessionStoreError          any store failure (store, operation, retryable, state)
    ├── SessionBusyError        another writer held the lock past the timeout (retryable)
    ├── SessionCorruptError     the file or its pages are not a database parley can read
    ├── SessionReadOnlyError    a write on a read-only file, connection or server
    └── SessionUnavailableError the database cannot be opened or reached (retryable)

When the failed operation is the write of a finished turn, `state` holds the completed `RunState`:
the model was called and paid for, so nothing is lost; ``agent.run(state=error.state, session=s)``
writes the turn (once, whatever the number of retries) when the store works again.
"""

from __future__ import annotations

from typing import Any

from parley._root import ParleyError


class SessionStoreError(ParleyError):
    """A session store could not do what was asked. `store` names the database (a path, or a URL
    without its password), `operation` what was being done (``open``, ``read``, ``write``),
    `retryable` whether the same call may work later unchanged, `state` the completed run whose turn
    was not written (None for other operations)."""

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        store: str = "",
        operation: str = "",
        state: Any = None,
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.store = store
        self.operation = operation
        self.state = state


class SessionBusyError(SessionStoreError):
    """Another connection kept the database (or the session's row) locked for longer than the
    store waits (SQLite's ``busy_timeout_s``, a server's lock or statement timeout); retry later."""

    retryable = True


class SessionCorruptError(SessionStoreError):
    """The database cannot be read as one: a file that is not SQLite, an empty (0-byte) file, pages
    cut short or damaged. Retrying does not help; the file needs repair or replacing."""


class SessionReadOnlyError(SessionStoreError):
    """A write was refused: the file, the connection (``read_only=True``) or the server is read-only.
    Reads still work where the database format allows them."""


class SessionUnavailableError(SessionStoreError):
    """The database cannot be opened or reached: a missing directory, no permission, a server that
    is down or refused the connection, a full disk."""

    retryable = True


__all__ = [
    "SessionBusyError",
    "SessionCorruptError",
    "SessionReadOnlyError",
    "SessionStoreError",
    "SessionUnavailableError",
]
