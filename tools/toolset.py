"""`Toolset`: tools that are known only once something is opened (an MCP server's, for one).

An `Agent` takes toolsets beside plain tools (``Agent(backend, tools=[lookup, MCPServerStdio(...)])``).
A toolset is *opened* before a run uses it and *closed* after: ``async with agent:`` holds every
toolset open across runs; otherwise each run opens what is not open and closes it when the run
ends. Opening is reference counted, so concurrent runs share one connection, and the last user
closes it. `tools()` is the current list; `version` grows whenever that list changes (a server said
its tools changed), and the run loop re-reads the list before its next model request.

A subclass implements `_open` / `_close` / `tools`; `acquire` / `release` do the counting. An open
toolset that has `broken` (its server died) is re-opened by the next `acquire`.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parley.tools.tool import Tool


class Toolset:
    """Base class of run-time tool groups (see the module docstring)."""

    name: str = "toolset"

    def __init__(self) -> None:
        self._users = 0
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.version = 0
        """Grows whenever `tools()` may have changed."""

    # -- for subclasses --------------------------------------------------------------------------
    async def _open(self) -> None:
        """Connect and list the tools (called by the first `acquire`)."""

    async def _close(self) -> None:
        """Disconnect (called by the last `release`); must not raise on a connection already gone."""

    def tools(self) -> list[Tool]:
        """The tools as they are now (only meaningful while open)."""
        return []

    @property
    def broken(self) -> bool:
        """Whether the connection is gone although the toolset is open (the next `acquire` re-opens)."""
        return False

    # -- reference counting -----------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self._users > 0 and self._loop is asyncio.get_running_loop()

    def _guard(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (the old one's tasks are gone)
            self._loop, self._users, self._lock = loop, 0, asyncio.Lock()
        assert self._lock is not None
        return self._lock

    async def acquire(self) -> None:
        """Open the toolset if nobody holds it (or it broke), and hold it."""
        async with self._guard():
            if self._users > 0 and self.broken:
                await self._close()
                await self._open()
            elif self._users == 0:
                await self._open()
            self._users += 1

    async def release(self) -> None:
        """Stop holding the toolset; the last holder closes it."""
        async with self._guard():
            if self._users == 0:
                return
            self._users -= 1
            if self._users == 0:
                await self._close()

    async def __aenter__(self) -> Toolset:
        await self.acquire()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()
