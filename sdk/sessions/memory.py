"""`MemorySession`: a session in a Python list (tests, or a history that never leaves the process).

Items are kept as the JSON rows a database would hold, so a `MemorySession` behaves like the
database stores: what you get back is a fresh copy, and a message that does not survive the JSON
round trip fails here too. Compactions are kept as rows beside the messages, as in the databases.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from parley.protocol import BlobStore, Message
from parley.sessions.base import PendingCompaction, SessionStore, StoredCompaction


class MemorySession(SessionStore):
    """A session held in memory by this object; every call is atomic (no awaits inside)."""

    threaded = False

    def __init__(self, session_id: str = "default", *, blobs: BlobStore | None = None) -> None:
        super().__init__(session_id, blobs=blobs)
        self._rows: list[tuple[int, str]] = []
        self._turns: set[str] = set()
        self._compacted: list[StoredCompaction] = []
        self._next_seq = 1

    def _snapshot(self, limit: int | None) -> tuple[list[tuple[int, str]], StoredCompaction | None, int]:
        latest = self._compacted[-1] if self._compacted else None
        last = self._rows[-1][0] if self._rows else 0
        if latest is None and limit is not None:
            return (self._rows[len(self._rows) - limit :] if limit else []), None, last
        return list(self._rows), latest, last

    def _all_rows(self) -> list[str]:
        return [row for _, row in self._rows]

    def _compactions(self) -> list[StoredCompaction]:
        return list(self._compacted)

    def _append(self, rows: list[str], turn_id: str | None, compaction: PendingCompaction | None = None) -> bool:
        if turn_id is not None:
            if turn_id in self._turns:
                return False
        last = self._rows[-1][0] if self._rows else 0
        latest = self._compacted[-1].id if self._compacted else None
        new = [(last + i, row) for i, row in enumerate(rows, start=1)]
        stored = None
        if compaction is not None and compaction.expect_last_seq == last and compaction.expect_compaction == latest:
            through = compaction.through(last)
            stored = StoredCompaction(
                id=(latest or 0) + 1, head_seq=compaction.head_seq, through_seq=through,
                summary_json=compaction.summary_json, record_json=compaction.record_json, turn_id=turn_id,
                created_at=time.time(),
            )
        # every change below is made together (nothing in between can fail)
        if turn_id is not None:
            self._turns.add(turn_id)
        self._rows.extend(new)
        if stored is not None:
            self._compacted.append(stored)
        return True

    def _pop(self, load: Callable[[str], Message]) -> Message | None:
        if not self._rows:
            return None
        seq, row = self._rows[-1]
        message = load(row)
        self._rows.pop()
        self._compacted = [c for c in self._compacted if c.through_seq < seq]
        return message

    def _clear(self) -> None:
        self._rows.clear()
        self._turns.clear()
        self._compacted.clear()
