"""`ResponseStore`: stored responses for `store` / `previous_response_id`, in one SQLite file.

Off unless the server is given a path (`ServerConfig.responses_store`): a stored response holds
the client's conversation, which a stateless server otherwise never keeps. Each row belongs to the
tenant that created it; every lookup is scoped to the caller's tenant, so another tenant's id is
indistinguishable from an unknown one (404), never a leak.

A row keeps the response object as sent and the conversation *context* after it: the input items
of the whole chain so far, then this response's output items. A follow-up's input is that context
plus its own new items, which is what OpenAI documents for `previous_response_id` (the earlier
`instructions` are not carried over). SQLite serialises writers; the server's event loop calls it
from one thread, and the connection is opened with `check_same_thread=False` for uvicorn's.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ResponseStore", "StoredResponse"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    created_at REAL NOT NULL,
    response TEXT NOT NULL,
    context TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
)
"""


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    context: list[dict[str, Any]]
    """Input items of the chain up to this response, then its output items."""


class ResponseStore:
    """Responses by (tenant, id). `path` is a file, or ``":memory:"`` for one process's lifetime."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL" if self.path != ":memory:" else "PRAGMA journal_mode=MEMORY")
        self._db.execute(_SCHEMA)

    def put(self, tenant: str, response: dict[str, Any], context: list[dict[str, Any]]) -> None:
        row = (str(response["id"]), tenant, time.time(), _dumps(response), _dumps(context))
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)", row)

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        with self._lock:
            found = self._db.execute(
                "SELECT response, context FROM responses WHERE tenant = ? AND id = ?", (tenant, response_id)
            ).fetchone()
        if found is None:
            return None
        return StoredResponse(response=json.loads(found[0]), context=json.loads(found[1]))

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._lock:
            cursor = self._db.execute("DELETE FROM responses WHERE tenant = ? AND id = ?", (tenant, response_id))
        return cursor.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
