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

Compaction (`parley.compaction`) is recorded by parley's stores: when a run with ``session=`` compacts,
the turn is written together with a compaction row (one transaction: both or neither) saying which
stored messages the summary stands in for. The messages themselves stay in the store (nothing is
deleted: `get_all_items` returns them, `compactions` the records), but `get_items` returns the
*live* history the next run starts from: the kept head (the pinned prefix, byte-identical), the
summary message, then the messages after the replaced range. Only the latest compaction applies
(a later one summarises the earlier summary together with the next turns). A compaction is written
only when the session is exactly as the run read it; when another run committed a turn meanwhile,
the turn is still written and the compaction is left for a later run to redo. Removing a replaced
message (`pop_item`) drops the compactions that covered it.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import ValidationError

from parley.errors import ConfigurationError
from parley.protocol import BlobStore, Message
from parley.protocol.blobs import blob_context
from parley.protocol.errors import ParseError
from parley.sessions._driver_errors import EXPLAIN, classify
from parley.sessions._storable import first_unstorable, refuse_unstorable
from parley.sessions.errors import SessionStoreError

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


@dataclass(frozen=True)
class StoredCompaction:
    """A compaction held by a store: the stored messages with ``head_seq < seq <= through_seq`` are
    replaced, in the live history, by `summary_json` (a `Message`'s JSON, the one the run sent)."""

    id: int
    head_seq: int
    through_seq: int
    summary_json: str
    record_json: str
    """The run's `CompactionRecord` as JSON (summary, tokens before and after, backend, count...)."""
    turn_id: str | None
    created_at: float

    @property
    def record(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.record_json)
        return value


@dataclass(frozen=True)
class LiveView:
    """The live history as a run read it: each item's row ``seq`` (None for the summary) and the
    store's state then (its last seq and latest compaction id), so a compaction written with the
    turn can be placed on rows, and refused when the session changed meanwhile."""

    seqs: tuple[int | None, ...]
    last_seq: int
    compaction: StoredCompaction | None


@dataclass(frozen=True)
class PendingCompaction:
    """A compaction to write with a turn. `through_seq` names a stored row, or `through_turn` the
    index of one of the turn's own items (its seq is known only inside the transaction)."""

    head_seq: int
    through_seq: int | None
    through_turn: int | None
    summary_json: str
    record_json: str
    expect_last_seq: int
    expect_compaction: int | None

    def through(self, last_seq: int) -> int:
        """The last replaced row's seq, when the turn's rows are numbered after `last_seq`."""
        if self.through_turn is not None:
            return last_seq + 1 + self.through_turn
        assert self.through_seq is not None
        return self.through_seq


def live_rows(rows: Sequence[tuple[int, str]], latest: StoredCompaction | None) -> list[tuple[int | None, str]]:
    """Rows (oldest first) with the latest compaction applied: head, summary, then the rest."""
    if latest is None:
        return list(rows)
    head: list[tuple[int | None, str]] = [(seq, row) for seq, row in rows if seq <= latest.head_seq]
    tail = [(seq, row) for seq, row in rows if seq > latest.through_seq]
    return [*head, (None, latest.summary_json), *tail]


class SessionStore(ABC):
    """Base of parley's stores: each implements the sync operations; the async API runs them
    (in a worker thread when `threaded`, so a database never blocks the event loop). Every
    operation's database error leaves as a `parley.sessions.errors.SessionStoreError` (`_guard`)."""

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

    @property
    def store_name(self) -> str:
        """The database, as errors name it (a path, or a URL without its password)."""
        return type(self).__name__

    # -- database errors ------------------------------------------------------------------------------
    def _guard(self, operation: str, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`, with a driver's exception raised as the `SessionStoreError` it stands for."""
        try:
            return fn(*args)
        except Exception as exc:
            error = self._store_error(operation, exc)
            if error is None:
                raise
            raise error from exc

    def _store_error(self, operation: str, exc: BaseException) -> SessionStoreError | None:
        """The typed error for a driver's `exc` (None: not a database error, raise it as it is)."""
        if isinstance(exc, SessionStoreError):
            return exc
        kind = classify(exc)
        if kind is None:
            return None
        detail = getattr(exc, "orig", None) or exc
        return kind(
            f"session {self.session_id!r} in {self.store_name}: cannot {operation}: {self._explain(kind)} "
            f"({type(detail).__name__}: {str(detail).strip()})",
            session_id=self.session_id, store=self.store_name, operation=operation,
        )

    def _explain(self, kind: type[SessionStoreError]) -> str:
        return EXPLAIN[kind]

    # -- the sync operations each store implements --------------------------------------------------
    @abstractmethod
    def _snapshot(self, limit: int | None) -> tuple[list[tuple[int, str]], StoredCompaction | None, int]:
        """One consistent read: the live rows ``(seq, json)`` oldest first (rows replaced by the latest
        compaction may be left out; without a compaction, only the latest `limit` when given), the
        latest compaction, and the last seq written."""

    @abstractmethod
    def _all_rows(self) -> list[str]:
        """Every stored row's JSON, oldest first, compactions ignored."""

    @abstractmethod
    def _compactions(self) -> list[StoredCompaction]:
        """Every compaction recorded, oldest first."""

    @abstractmethod
    def _append(self, rows: list[str], turn_id: str | None, compaction: PendingCompaction | None = None) -> bool:
        """Append the rows in one transaction; False when `turn_id` is already recorded. With
        `compaction`, also record it in the same transaction when the session is still as expected."""

    @abstractmethod
    def _pop(self, load: Callable[[str], Message]) -> Message | None:
        """Delete the latest row and return it loaded (`load` raising leaves the row in place); drop
        the compactions that covered it."""

    @abstractmethod
    def _clear(self) -> None: ...

    # -- sync API -------------------------------------------------------------------------------------
    def get_items_sync(self, limit: int | None = None) -> list[Message]:
        """The live history (the latest compaction applied), oldest first."""
        return [self._load(row) for _, row in self._live(_limit(limit))]

    def get_all_items_sync(self) -> list[Message]:
        """Every stored message, oldest first, including those a compaction replaced."""
        return [self._load(row) for row in self._guard("read", self._all_rows)]

    def compactions_sync(self) -> list[StoredCompaction]:
        """The compactions recorded, oldest first (the last one is what `get_items` applies)."""
        return self._guard("read", self._compactions)

    def live_view_sync(self) -> tuple[list[Message], LiveView]:
        """The live history and where each item is stored (what a run reads before its turn)."""
        rows, latest, last = self._guard("read", self._snapshot, None)
        live = live_rows(rows, latest)
        return [self._load(row) for _, row in live], LiveView(
            seqs=tuple(seq for seq, _ in live), last_seq=last, compaction=latest
        )

    def _live(self, limit: int | None) -> list[tuple[int | None, str]]:
        rows, latest, _ = self._guard("read", self._snapshot, limit)
        live = live_rows(rows, latest)
        if limit is not None:
            live = live[len(live) - limit :] if limit else []
        return live

    def add_items_sync(self, items: Sequence[Message], *, turn_id: str | None = None) -> bool:
        rows = self._dump(items)
        if turn_id is not None and (not isinstance(turn_id, str) or not turn_id):
            raise ConfigurationError(f"turn_id must be a non-empty str or None, not {turn_id!r}")
        if not rows and turn_id is None:
            return True
        return self._guard("write", self._append, rows, turn_id)

    def add_turn_sync(self, items: Sequence[Message], *, turn_id: str, compaction: PendingCompaction | None) -> bool:
        """`add_items_sync` with a compaction recorded in the same transaction (see the module docstring)."""
        rows = self._dump(items)
        if not isinstance(turn_id, str) or not turn_id:
            raise ConfigurationError(f"turn_id must be a non-empty str, not {turn_id!r}")
        return self._guard("write", self._append, rows, turn_id, compaction)

    def pop_item_sync(self) -> Message | None:
        return self._guard("write", self._pop, self._load)

    def clear_session_sync(self) -> None:
        self._guard("write", self._clear)

    # -- async API (the `Session` protocol) -----------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[Message]:
        return await self._run(self.get_items_sync, limit)

    async def add_items(self, items: Sequence[Message], *, turn_id: str | None = None) -> bool:
        rows = self._dump(items)  # validated and serialised here, before the thread and the transaction
        if turn_id is not None and (not isinstance(turn_id, str) or not turn_id):
            raise ConfigurationError(f"turn_id must be a non-empty str or None, not {turn_id!r}")
        if not rows and turn_id is None:
            return True
        return await self._run(self._guard, "write", self._append, rows, turn_id)

    async def add_turn(self, items: Sequence[Message], *, turn_id: str, compaction: PendingCompaction | None) -> bool:
        rows = self._dump(items)
        if not isinstance(turn_id, str) or not turn_id:
            raise ConfigurationError(f"turn_id must be a non-empty str, not {turn_id!r}")
        return await self._run(self._guard, "write", self._append, rows, turn_id, compaction)

    async def get_all_items(self) -> list[Message]:
        return await self._run(self.get_all_items_sync)

    async def compactions(self) -> list[StoredCompaction]:
        return await self._run(self.compactions_sync)

    async def live_view(self) -> tuple[list[Message], LiveView]:
        return await self._run(self.live_view_sync)

    async def pop_item(self) -> Message | None:
        return await self._run(self.pop_item_sync)

    async def clear_session(self) -> None:
        await self._run(self.clear_session_sync)

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
            if first_unstorable(item) is not None:  # no UTF-8 form: refused here, named, before any write
                refuse_unstorable(items, index, prefix="items")
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
