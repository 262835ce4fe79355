"""The `Session` protocol and the base class of parley's stores.

A session is a conversation's history, kept between runs: ``agent.run(input, session=s)`` reads it
before the run and appends the run's turn to it when the run completes (`parley.sessions` says
exactly when). Items are parley `Message` envelopes, stored one per row as the JSON the envelope
writes (`Message.model_dump_json`; media parts keep their ``sha256``).

The protocol is the OpenAI Agents SDK's (`get_items`, `add_items`, `pop_item`, `clear_session`),
async, plus one addition the agent relies on: ``add_items(items, turn_id=...)`` writes all the items
in one transaction, or nothing, and at most once per turn id (a second call with the same id writes
nothing and returns False). Every parley store also has thin sync twins (`get_items_sync`, ...), which
work inside or outside an event loop.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import ValidationError

from parley.errors import ConfigurationError
from parley.protocol import BlobStore, Message
from parley.protocol.blobs import blob_context
from parley.protocol.errors import ParseError

T = TypeVar("T")


@runtime_checkable
class Session(Protocol):
    """A conversation history that outlives a run (see the module docstring)."""

    session_id: str

    async def get_items(self, limit: int | None = None) -> list[Message]:
        """The history, oldest first; with `limit`, only the latest `limit` items (still oldest first)."""
        ...

    async def add_items(self, items: Sequence[Message], *, turn_id: str | None = None) -> bool:
        """Append `items` in one transaction (all or nothing). With `turn_id`, at most once per id:
        False (and nothing written) when that turn is already in the session; True when written."""
        ...

    async def pop_item(self) -> Message | None:
        """Remove and return the latest item (None when the session is empty)."""
        ...

    async def clear_session(self) -> None:
        """Remove every item (and the record of turns written) of this session."""
        ...


class SessionStore(ABC):
    """Base of parley's stores: each implements the sync operations; the async API runs them
    (in a worker thread when `threaded`, so a database never blocks the event loop)."""

    threaded = True
    """Run the sync operations in a thread (`asyncio.to_thread`) from the async methods."""

    def __init__(self, session_id: str, *, blobs: BlobStore | None = None) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ConfigurationError(f"session_id must be a non-empty str, not {session_id!r}")
        self.session_id = session_id
        self.blobs = blobs
        """Where media bytes over the store's inline limit go (None: inline base64 in the row)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(session_id={self.session_id!r})"

    # -- the sync operations each store implements --------------------------------------------------
    @abstractmethod
    def _read(self, limit: int | None) -> list[str]:
        """The rows' JSON, oldest first (the latest `limit` when given)."""

    @abstractmethod
    def _append(self, rows: list[str], turn_id: str | None) -> bool:
        """Append the rows in one transaction; False when `turn_id` is already recorded."""

    @abstractmethod
    def _pop(self, load: Callable[[str], Message]) -> Message | None:
        """Delete the latest row and return it loaded (`load` raising leaves the row in place)."""

    @abstractmethod
    def _clear(self) -> None: ...

    # -- sync API -------------------------------------------------------------------------------------
    def get_items_sync(self, limit: int | None = None) -> list[Message]:
        return [self._load(row) for row in self._read(_limit(limit))]

    def add_items_sync(self, items: Sequence[Message], *, turn_id: str | None = None) -> bool:
        rows = self._dump(items)
        if turn_id is not None and (not isinstance(turn_id, str) or not turn_id):
            raise ConfigurationError(f"turn_id must be a non-empty str or None, not {turn_id!r}")
        if not rows and turn_id is None:
            return True
        return self._append(rows, turn_id)

    def pop_item_sync(self) -> Message | None:
        return self._pop(self._load)

    def clear_session_sync(self) -> None:
        self._clear()

    # -- async API (the `Session` protocol) -----------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[Message]:
        return await self._run(self.get_items_sync, limit)

    async def add_items(self, items: Sequence[Message], *, turn_id: str | None = None) -> bool:
        rows = self._dump(items)  # validated and serialised here, before the thread and the transaction
        if turn_id is not None and (not isinstance(turn_id, str) or not turn_id):
            raise ConfigurationError(f"turn_id must be a non-empty str or None, not {turn_id!r}")
        if not rows and turn_id is None:
            return True
        return await self._run(self._append, rows, turn_id)

    async def pop_item(self) -> Message | None:
        return await self._run(self.pop_item_sync)

    async def clear_session(self) -> None:
        await self._run(self._clear)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self.threaded:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    # -- rows -------------------------------------------------------------------------------------------
    def _dump(self, items: Sequence[Message]) -> list[str]:
        if isinstance(items, Message | str | bytes) or not isinstance(items, Sequence):
            raise ConfigurationError(f"items must be a sequence of parley Messages, not {type(items).__name__}")
        rows = []
        for index, item in enumerate(items):
            if not isinstance(item, Message):
                raise ConfigurationError(f"items[{index}] must be a parley Message, not {type(item).__name__}")
            rows.append(item.model_dump_json(context=blob_context(self.blobs)))
        return rows

    def _load(self, row: str) -> Message:
        try:
            return Message.model_validate_json(row, context=blob_context(self.blobs))
        except ValidationError as exc:
            raise ParseError(
                f"session {self.session_id!r}: a stored item is not a valid parley Message: {exc}"
            ) from None


def _limit(limit: int | None) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigurationError(f"limit must be a non-negative int or None, not {limit!r}")
    return limit
