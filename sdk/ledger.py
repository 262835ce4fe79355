"""The execution ledger: a tool call with a side effect runs once per run, across copies of its state.

A `RunState` is plain JSON, so it gets copied: a web app's double click, a retried job, two workers
picking up the same saved state, an old copy resumed after a newer one finished. The state alone
cannot tell that another copy already ran a call, so parley keeps a durable ledger beside it, keyed
by (run id, call id)::

    claim (run id, call id)  ->  run the tool  ->  record the result

* **Before a call runs** it is claimed: every call of a tool that is not ``idempotent``, and every
  call a person approved. The claim is one atomic insert; exactly one resume wins it.
* **When it finishes** its result is recorded (before the state is checkpointed). A resume of the
  same or an older copy of the state finds the record and uses that result: nothing runs again and
  no approval is asked again (an older copy still waiting for approval of the call catches up).
* **Concurrent resumes**: the others wait (polling, at most `wait_s` seconds) for the record and use
  it, or with ``on_busy="error"`` get `parley.errors.CallInProgressError` at once (also what a wait
  that runs out raises).
* **A claim without a record** whose holder is gone (the process died mid-call) means the call *may
  or may not have run*. An idempotent tool is simply run again; any other call becomes an
  interruption of kind ``"uncertain"`` for a person: `RunState.approve` runs it again,
  `RunState.reject(call_id, message=...)` skips it (the model reads the message); the answer is
  recorded on the claim, so other copies get the same one. It is never run again silently.

A holder is gone when its process no longer exists (same machine: by pid, with the boot id so a
reboot's reused pids do not count), or when it stopped refreshing its claim: a running call
touches its claim every ``lease_s / 3`` seconds, and a claim older than `lease_s` counts as
abandoned (the only test that works across machines). A process frozen for longer than `lease_s`
mid-call can therefore lose its claim to another resume: raise `lease_s` where that can happen.

Where the ledger lives (``Agent.run(..., ledger=...)``):

* ``None`` (the default): the session's database when the run has one on disk (a `SQLiteSession`
  file or a `SQLAlchemySession`: a ``parley_ledger`` table beside the session's tables); otherwise
  the SQLite file named by the ``PARLEY_LEDGER`` environment variable, else `default_path`:
  ``$XDG_STATE_HOME/parley/ledger.sqlite3`` (``~/.local/state/parley/ledger.sqlite3``), one file per
  user shared by every process of that user, created on first use;
* a path: a SQLite file there (`parley.ledger_stores.SQLiteLedger`); a `Ledger`: that one;
* ``False``: no ledger (each process dedups only its own calls; two processes may run a call twice).

`MemoryLedger` keeps everything in this process: for tests. The guarantee covers what goes through
a run's tools: plain tools, MCP tools (the call id still goes to the server as its idempotency key,
so a server that honours it is safe even across ledgers) and agents used as tools (the parent's
call is claimed, and the child run shares the parent's ledger for its own calls). Limits: the
ledger knows calls, not the world; a tool that is killed mid-effect leaves an uncertain call for a
person; and copies of a state must share one ledger (the same file or database) to be seen. The
ledger grows by one row per guarded call: `Ledger.prune` forgets results older than the states you
keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from parley.errors import CallInProgressError, ConfigurationError
from parley.protocol import ToolResult
from parley.sessions.errors import SessionStoreError

OnBusy = Literal["wait", "error"]
ENV_VAR = "PARLEY_LEDGER"


def _host() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


HOST = _host()
"""This machine as claims name it: host name and boot id (pids are compared only on the same one)."""

_LIVE: set[str] = set()
"""Tokens of the claims this process holds right now (a claim of our own pid not in here is a dead one)."""
_LIVE_LOCK = threading.Lock()


@dataclass(frozen=True)
class LedgerEntry:
    """One row of the ledger: who claimed the call, and its result once recorded."""

    run_id: str
    call_id: str
    token: str
    """Unique per claim: what a takeover and a record are checked against."""
    host: str
    pid: int
    claimed_at: float
    heartbeat_at: float
    tool: str
    result_json: str | None = None
    recorded_at: float | None = None

    @property
    def result(self) -> ToolResult | None:
        return None if self.result_json is None else ToolResult.model_validate(json.loads(self.result_json))


def result_json(result: ToolResult) -> str:
    """A result as the ledger stores it: ASCII JSON, so text the run may still refuse to store elsewhere
    (a lone surrogate from a tool) is recorded as faithfully as the rest: the call did run."""
    return json.dumps(result.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":"))


@dataclass(frozen=True)
class Claim:
    """What `Ledger.claim` found: ``claimed`` (run it, then `Ledger.record`), ``recorded`` (use
    `result`) or ``orphaned`` (its holder is gone without a record: may or may not have run)."""

    status: Literal["claimed", "recorded", "orphaned"]
    run_id: str
    call_id: str
    token: str
    result: ToolResult | None = None


def default_path() -> Path:
    """The ledger file of runs without a session or ``ledger=`` (see the module docstring)."""
    named = os.environ.get(ENV_VAR)
    if named:
        return Path(named).expanduser()
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "parley" / "ledger.sqlite3"


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # someone else's process: it exists
    return True


class Ledger(ABC):
    """A durable record of claimed and finished tool calls (see the module docstring).

    Subclasses store rows (`_insert`, `_get`, `_swap`, `_record`, `_touch`, `_delete`: each one
    atomic on its own); the policy (who may run a call, waiting, dead holders) is here.
    """

    def __init__(
        self, *, on_busy: OnBusy = "wait", wait_s: float = 30.0, lease_s: float = 60.0, poll_s: float = 0.05
    ) -> None:
        if on_busy not in ("wait", "error"):
            raise ConfigurationError(f"on_busy must be 'wait' or 'error', not {on_busy!r}")
        for name, value in (("wait_s", wait_s), ("lease_s", lease_s), ("poll_s", poll_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"{name} must be a non-negative number, not {value!r}")
        if lease_s <= 0 or poll_s <= 0:
            raise ConfigurationError("lease_s and poll_s must be positive")
        self.on_busy: OnBusy = on_busy
        self.wait_s = float(wait_s)
        self.lease_s = float(lease_s)
        self.poll_s = float(poll_s)

    # -- rows (subclasses) ---------------------------------------------------------------------------
    @abstractmethod
    def _insert(self, entry: LedgerEntry) -> bool:
        """Add `entry` unless the call has a row already; True when added."""

    @abstractmethod
    def _get(self, run_id: str, call_id: str) -> LedgerEntry | None: ...

    @abstractmethod
    def _swap(self, entry: LedgerEntry, old_token: str) -> bool:
        """Replace the call's unrecorded row held by `old_token` with `entry`; True when replaced."""

    @abstractmethod
    def _record(self, run_id: str, call_id: str, token: str, result_json: str, now: float) -> bool:
        """Set the result of the call's unrecorded row held by `token`; True when set."""

    @abstractmethod
    def _touch(self, run_id: str, call_id: str, token: str, now: float) -> None: ...

    @abstractmethod
    def _delete(self, run_id: str, call_id: str, token: str) -> None:
        """Remove the call's unrecorded row held by `token` (a claim given back)."""

    @abstractmethod
    def _prune(self, before: float) -> int:
        """Remove the rows recorded before `before`; how many."""

    async def _io(self, fn: Any, *args: Any) -> Any:
        """Row operations may wait on a database lock: never on the event loop's thread. A database's own
        error comes out as the sessions' typed family (`SessionBusyError`, `SessionCorruptError`, ...)."""
        try:
            return await asyncio.to_thread(fn, *args)
        except Exception as exc:
            error = self._store_error(fn, exc)
            if error is None:
                raise
            raise error from exc

    def _store_error(self, fn: Any, exc: Exception) -> SessionStoreError | None:
        from parley.sessions._driver_errors import classify

        kind = classify(exc)
        if kind is None or isinstance(exc, SessionStoreError):
            return None
        where = str(getattr(self, "path", "") or getattr(self, "engine", "") or type(self).__name__)
        operation = getattr(fn, "__name__", "use").lstrip("_")
        detail = getattr(exc, "orig", None) or exc
        return kind(f"the execution ledger {where}: cannot {operation}: {type(detail).__name__}: {detail}",
                    store=where, operation=operation)

    # -- the policy ----------------------------------------------------------------------------------
    def alive(self, entry: LedgerEntry, now: float | None = None) -> bool:
        """Whether the claim's holder may still be running the call."""
        now = time.time() if now is None else now
        if now - entry.heartbeat_at > self.lease_s:
            return False
        if entry.host != HOST:
            return True
        if entry.pid == os.getpid():
            with _LIVE_LOCK:
                return entry.token in _LIVE
        return _pid_running(entry.pid)

    async def lookup(self, run_id: str, call_id: str) -> ToolResult | None:
        """The recorded result of the call, if any."""
        entry: LedgerEntry | None = await self._io(self._get, run_id, call_id)
        return None if entry is None else entry.result

    async def claim(
        self, run_id: str, call_id: str, *, tool: str, retry: bool = False, take_over: str | None = None
    ) -> Claim:
        """Claim the call before running it (see the module docstring).

        An orphaned claim is taken over when `retry` (an idempotent tool) or when `take_over` names
        its token (a person chose to run it again); otherwise it is reported as ``orphaned``.
        """
        deadline = time.monotonic() + self.wait_s
        while True:
            now = time.time()
            mine = LedgerEntry(run_id, call_id, uuid.uuid4().hex, HOST, os.getpid(), now, now, tool)
            with _LIVE_LOCK:
                _LIVE.add(mine.token)
            won = False
            try:
                if await self._io(self._insert, mine):
                    won = True
                    return Claim("claimed", run_id, call_id, mine.token)
                entry: LedgerEntry | None = await self._io(self._get, run_id, call_id)
                if entry is None:
                    continue  # given back meanwhile: try again
                if entry.result_json is not None:
                    return Claim("recorded", run_id, call_id, entry.token, entry.result)
                if entry.token == take_over or not self.alive(entry):
                    if not retry and entry.token != take_over:
                        return Claim("orphaned", run_id, call_id, entry.token)
                    if await self._io(self._swap, mine, entry.token):
                        won = True
                        return Claim("claimed", run_id, call_id, mine.token)
                    continue  # someone else took it over first
            finally:
                if not won:
                    with _LIVE_LOCK:
                        _LIVE.discard(mine.token)
            if self.on_busy == "error" or time.monotonic() >= deadline:
                waited = "" if self.on_busy == "error" else f" after waiting {self.wait_s:g} s"
                raise CallInProgressError(
                    f"tool call {call_id!r} ({tool}) of run {run_id!r} is being run by another resume "
                    f"(pid {entry.pid} on {entry.host.split('/')[0]}){waited}; resume again later to use its result",
                    run_id=run_id,
                    call_id=call_id,
                )
            await asyncio.sleep(self.poll_s)

    async def record(self, claim: Claim, result: ToolResult) -> ToolResult:
        """Record the result of a call we claimed; returns the result the ledger holds for it.

        (Ours; only if our claim was taken over meanwhile, after `lease_s` without a heartbeat, and
        the other holder recorded first, is it theirs.)"""
        try:
            done = await self._io(
                self._record, claim.run_id, claim.call_id, claim.token, result_json(result), time.time()
            )
            if done:
                return result
            entry: LedgerEntry | None = await self._io(self._get, claim.run_id, claim.call_id)
            recorded = None if entry is None else entry.result
            return recorded if recorded is not None else result
        finally:
            self.abandon(claim)

    async def release(self, claim: Claim) -> None:
        """Give a claim back without a result (the call did not run: e.g. an agent tool's child paused)."""
        try:
            await self._io(self._delete, claim.run_id, claim.call_id, claim.token)
        finally:
            self.abandon(claim)

    async def prune(self, *, older_than_s: float) -> int:
        """Forget the results recorded more than `older_than_s` seconds ago; returns how many.

        The ledger otherwise grows by a row per call with side effects. Claims without a record stay
        (their outcome is unknown). A copy of a state older than that, with those calls still open,
        would run them again: prune only past the time you keep saved states for.
        """
        if isinstance(older_than_s, bool) or not isinstance(older_than_s, int | float) or older_than_s < 0:
            raise ConfigurationError(f"older_than_s must be a non-negative number, not {older_than_s!r}")
        removed: int = await self._io(self._prune, time.time() - older_than_s)
        return removed

    def abandon(self, claim: Claim) -> None:
        """Stop holding a claim and leave its row as it is: without a result, it reads as orphaned."""
        with _LIVE_LOCK:
            _LIVE.discard(claim.token)

    @contextlib.asynccontextmanager
    async def holding(self, claim: Claim) -> AsyncIterator[None]:
        """Keep the claim fresh while the call runs (a heartbeat every ``lease_s / 3`` seconds)."""

        async def beat() -> None:
            while True:
                await asyncio.sleep(self.lease_s / 3)
                with contextlib.suppress(Exception):  # a missed beat is not worth failing the call
                    await self._io(self._touch, claim.run_id, claim.call_id, claim.token, time.time())

        task = asyncio.ensure_future(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class MemoryLedger(Ledger):
    """A ledger in this process's memory (tests; one process, so no cross-process guarantee)."""

    def __init__(self, **policy: Any) -> None:
        super().__init__(**policy)
        self._rows: dict[tuple[str, str], LedgerEntry] = {}
        self._lock = threading.Lock()

    async def _io(self, fn: Any, *args: Any) -> Any:
        return fn(*args)  # nothing blocks: no thread hop

    def _insert(self, entry: LedgerEntry) -> bool:
        with self._lock:
            return self._rows.setdefault((entry.run_id, entry.call_id), entry) is entry

    def _get(self, run_id: str, call_id: str) -> LedgerEntry | None:
        with self._lock:
            return self._rows.get((run_id, call_id))

    def _change(self, run_id: str, call_id: str, token: str, new: Any) -> bool:
        with self._lock:
            row = self._rows.get((run_id, call_id))
            if row is None or row.token != token or row.result_json is not None:
                return False
            if new is None:
                del self._rows[(run_id, call_id)]
            else:
                self._rows[(run_id, call_id)] = new(row)
            return True

    def _swap(self, entry: LedgerEntry, old_token: str) -> bool:
        return self._change(entry.run_id, entry.call_id, old_token, lambda _row: entry)

    def _record(self, run_id: str, call_id: str, token: str, result_json: str, now: float) -> bool:
        return self._change(run_id, call_id, token, lambda row: replace(row, result_json=result_json, recorded_at=now))

    def _touch(self, run_id: str, call_id: str, token: str, now: float) -> None:
        self._change(run_id, call_id, token, lambda row: replace(row, heartbeat_at=now))

    def _delete(self, run_id: str, call_id: str, token: str) -> None:
        self._change(run_id, call_id, token, None)

    def _prune(self, before: float) -> int:
        with self._lock:
            old = [k for k, row in self._rows.items() if row.recorded_at is not None and row.recorded_at < before]
            for key in old:
                del self._rows[key]
            return len(old)

    def entries(self) -> list[LedgerEntry]:
        """Every row (for tests and inspection)."""
        with self._lock:
            return list(self._rows.values())


LedgerOption = Ledger | str | os.PathLike[str] | Literal[False] | None
"""What ``Agent.run(..., ledger=...)`` takes (see the module docstring)."""

_SHARED: dict[Any, Ledger] = {}
_SHARED_LOCK = threading.Lock()


def resolve_ledger(option: Any, session: Any = None) -> Ledger | None:
    """The ledger a run uses for ``ledger=option`` and its `session` (see the module docstring).

    Nothing is opened here: SQLite files are opened (and the default one created) on first use.
    """
    if option is False:
        return None
    if isinstance(option, Ledger):
        return option
    from parley import ledger_stores

    if option is None:
        found = ledger_stores.session_ledger(session)
        if found is not None:
            return found
        target = default_path()
        return _shared(("sqlite", str(target)), lambda: ledger_stores.SQLiteLedger(target, create_folder=True))
    if isinstance(option, str | os.PathLike) and not isinstance(option, bool):
        target = Path(option)
        return _shared(("sqlite", str(target.absolute())), lambda: ledger_stores.SQLiteLedger(target))
    raise ConfigurationError(
        f"ledger must be a parley.ledger.Ledger, a file path, None (the default) or False, not {type(option).__name__}"
    )


def close_shared() -> None:
    """Close and forget the ledgers opened for paths and sessions (tests; a later run opens them again)."""
    with _SHARED_LOCK:
        ledgers = list(_SHARED.values())
        _SHARED.clear()
    for item in ledgers:
        close = getattr(item, "close", None)
        if close is not None:
            close()


def _shared(key: Any, make: Any) -> Ledger:
    """One ledger object (so one connection) per file per process."""
    with _SHARED_LOCK:
        found = _SHARED.get(key)
        if found is None:
            found = _SHARED[key] = make()
        return found
