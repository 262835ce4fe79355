"""`MemorySession`: a session in a Python list (tests, or a history that never leaves the process).

Items are kept as the JSON rows a database would hold, so a `MemorySession` behaves like the
database stores: what you get back is a fresh copy, and a message that does not survive the JSON
round trip fails here too.
"""

from __future__ import annotations

from collections.abc import Callable

from parley.protocol import BlobStore, Message
from parley.sessions.base import SessionStore


class MemorySession(SessionStore):
    """A session held in memory by this object; every call is atomic (no awaits inside)."""

    threaded = False

    def __init__(self, session_id: str = "default", *, blobs: BlobStore | None = None) -> None:
        super().__init__(session_id, blobs=blobs)
        self._rows: list[str] = []
        self._turns: set[str] = set()

    def _read(self, limit: int | None) -> list[str]:
        if limit is None:
            return list(self._rows)
        return self._rows[len(self._rows) - limit :] if limit else []

    def _append(self, rows: list[str], turn_id: str | None) -> bool:
        if turn_id is not None:
            if turn_id in self._turns:
                return False
            self._turns.add(turn_id)
        self._rows.extend(rows)
        return True

    def _pop(self, load: Callable[[str], Message]) -> Message | None:
        if not self._rows:
            return None
        message = load(self._rows[-1])
        self._rows.pop()
        return message

    def _clear(self) -> None:
        self._rows.clear()
        self._turns.clear()
