"""MCP servers as toolsets: `MCPServerStdio` (a subprocess) and `MCPServerHTTP` (Streamable HTTP).

    notes = MCPServerStdio("python", ["notes_server.py"], prefix="notes",
                           needs_approval={"delete_note"}, deny={"slow"})
    agent = Agent(backend, tools=[lookup, notes])
    async with agent:                      # optional: keeps the server up across runs
        result = await agent.run("Delete the note 'draft'")   # pauses: notes_delete_note needs approval

Each server's tools become parley tools (`SchemaTool`): the server's input schema is the tool's
schema, and the usual policy applies — `needs_approval` (bool, predicate on the arguments, or a set
of tool names; per tool via `tool_options`), `deferred`, `timeout_s`, `retries` (idempotent tools
only), the repeat rule, at-most-once per call id through `RunState`. A run paused on an MCP tool can
be resumed from its JSON in another process: the run opens the toolset there (starts or connects to
the server, lists the tools again) and runs the approved call once.

Lifecycle: one asyncio task per connection owns the transport and the `ClientSession` — it enters
and leaves them itself, so anyio's cancel scopes never cross tasks (the "exit cancel scope in a
different task" class of teardown errors). Calls are made from the run's tasks over that session.
The owner task ends on `release` by the last holder, on cancellation (``asyncio.run`` cancels it at
exit) or when its event loop closes; stdio servers are stopped the MCP way (stdin closed, then
SIGTERM, then SIGKILL, each wait bounded). Teardown errors are logged at debug level, never raised.

A server that dies or drops the connection mid-call gives that call an error result naming the
server (`MCPConnectionError`), never a hang; with ``on_server_error="raise"`` the run stops with that
error instead. The next run (or `acquire`) reconnects. Stdio servers' stderr goes to a temporary
file (`stderr_text()`), not into the user's terminal.

Tool lists are re-read when the server sends ``notifications/tools/list_changed`` (and on `refresh()`);
the run loop picks the new list up before its next model request.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from parley.errors import ConfigurationError
from parley.mcp._results import result_value
from parley.mcp.errors import MCPConnectionError
from parley.tools import SchemaTool, Tool, ToolContext, ToolDefinitionError, ToolError, Toolset
from parley.tools.policy import NeedsApproval

logger = logging.getLogger("parley.mcp")

_NAME_OK = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_TOOL_OPTIONS = frozenset(
    {"needs_approval", "deferred", "timeout_s", "retries", "idempotent", "on_repeat", "max_result_chars", "description"}
)
_MAX_PAGES = 100
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_STOP_TIMEOUT_S = 10.0
_STDERR_TAIL = 64 * 1024
CALL_ID_META_KEY = "dev.parley/call_id"
"""`_meta` key carrying parley's call id with each ``tools/call``: an idempotency key for the server."""

_GROUP: Any = getattr(builtins, "BaseExceptionGroup", None)  # Python 3.11+; anyio's backport before

OnServerError = Literal["result", "raise"]
NameFilter = Collection[str] | Callable[[str], bool] | None


def _missing_mcp() -> ConfigurationError:
    return ConfigurationError("MCP toolsets need the `mcp` package: pip install 'parley[mcp]'")


def _matches(names: NameFilter, name: str) -> bool:
    if names is None:
        return False
    if callable(names):
        return bool(names(name))
    return name in names


def _without_titles(schema: Any) -> Any:
    """The schema without its generated ``title`` keywords (noise in a prompt); properties named
    ``title`` stay."""
    if isinstance(schema, list):
        return [_without_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _without_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _without_titles(value)
    return out


def _tool_name(prefix: str | None, name: str) -> str:
    """The parley name of a server's tool: prefixed, and made valid (letters, digits, ``_``, ``-``; 64 max)."""
    full = f"{prefix}_{name}" if prefix else name
    if _NAME_OK.match(full):
        return full
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", full)
    if not re.match(r"^[A-Za-z_]", cleaned):
        cleaned = "_" + cleaned
    return cleaned[:64]


class MCPToolset(Toolset):
    """The common part of the MCP toolsets: options, the owner task, tool conversion and calls.

    Options: `name` (used in error messages and traces; default from the command or URL), `prefix`
    (``prefix="fs"`` offers ``delete`` as ``fs_delete``), `allow` / `deny` (tool names as the server
    spells them, or a predicate on the name; deny wins), `needs_approval` (bool, predicate on the
    validated arguments, or a collection of tool names), `timeout_s` (per call attempt), `retries`
    and `idempotent` (retries need idempotent tools), `deferred`, `tool_options` (per tool name:
    any of needs_approval, deferred, timeout_s, retries, idempotent, on_repeat, max_result_chars,
    description), `connect_timeout_s` (start + handshake + first listing), `on_server_error`
    (``"result"``: a dead server gives the call an error result and the run goes on; ``"raise"``:
    the run stops with `MCPConnectionError`).
    """

    def __init__(
        self,
        *,
        name: str,
        prefix: str | None = None,
        allow: NameFilter = None,
        deny: NameFilter = None,
        needs_approval: NeedsApproval | Collection[str] = False,
        deferred: bool = False,
        timeout_s: float | None = 60.0,
        retries: int = 0,
        idempotent: bool = False,
        tool_options: Mapping[str, Mapping[str, Any]] | None = None,
        connect_timeout_s: float = 30.0,
        on_server_error: OnServerError = "result",
        max_result_chars: int | None = None,
    ) -> None:
        super().__init__()
        if prefix is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_-]{0,40}$", prefix):
            raise ConfigurationError(f"MCP toolset prefix {prefix!r} must be 1-41 letters, digits, '_' or '-'")
        if on_server_error not in ("result", "raise"):
            raise ConfigurationError(f"on_server_error must be 'result' or 'raise', not {on_server_error!r}")
        if not connect_timeout_s > 0:
            raise ConfigurationError("connect_timeout_s must be positive")
        if not (isinstance(needs_approval, bool) or callable(needs_approval) or isinstance(needs_approval, Collection)):
            raise ConfigurationError("needs_approval must be a bool, a predicate or a collection of tool names")
        options = {str(k): dict(v) for k, v in (tool_options or {}).items()}
        for tool_name, values in options.items():
            unknown = sorted(set(values) - _TOOL_OPTIONS)
            if unknown:
                raise ConfigurationError(
                    f"tool_options[{tool_name!r}]: unknown option(s) {unknown}; use {sorted(_TOOL_OPTIONS)}"
                )
        self.name = name
        self.prefix = prefix
        self.allow = allow
        self.deny = deny
        self.needs_approval = needs_approval
        self.deferred = deferred
        self.timeout_s = timeout_s
        self.retries = retries
        self.idempotent = idempotent
        self.tool_options = options
        self.connect_timeout_s = connect_timeout_s
        self.on_server_error: OnServerError = on_server_error
        self.max_result_chars = max_result_chars
        self.server_info: Any = None
        """The server's `Implementation` (name, version) from the last handshake."""
        self.skipped: dict[str, str] = {}
        """Server tools not offered, with why (filtered, invalid schema, name clash)."""
        self._tools: list[Tool] = []
        self._session: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._relist: asyncio.Event | None = None
        self._broken: asyncio.Event | None = None
        self._why_broken = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, prefix={self.prefix!r})"

    # -- transport (subclasses) -------------------------------------------------------------------
    def _transport(self) -> contextlib.AbstractAsyncContextManager[tuple[Any, Any]]:
        raise NotImplementedError

    def _describe_failure(self) -> str:
        """Extra detail for connection errors (e.g. a stdio server's exit status)."""
        return ""

    def stderr_text(self) -> str:
        """What the server wrote to its stderr (stdio servers; the last connection's, at most 64 KB)."""
        return ""

    # -- Toolset ----------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        return list(self._tools)

    @property
    def broken(self) -> bool:
        return self._broken is not None and self._broken.is_set()

    async def _open(self) -> None:
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise _missing_mcp() from None
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "exception never retrieved"
        self._stop, self._relist, self._broken = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._why_broken = ""
        self._task = loop.create_task(self._own(ready), name=f"parley-mcp:{self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout_s)
        except asyncio.TimeoutError:
            await self._close()
            raise MCPConnectionError(
                f"MCP server {self.name!r} did not start and answer within {self.connect_timeout_s:g} s",
                server=self.name,
                stderr=self.stderr_text(),
            ) from None
        except BaseException:
            await self._close()
            raise

    async def _close(self) -> None:
        task, self._task = self._task, None
        if self._stop is not None:
            self._stop.set()
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=_STOP_TIMEOUT_S)
            if not done:  # a transport that will not wind down: cancel it (its own shutdown is shielded)
                task.cancel()
                await asyncio.wait({task}, timeout=_STOP_TIMEOUT_S)
        self._session = None

    async def refresh(self) -> list[Tool]:
        """Read the server's tool list now (normally done on ``notifications/tools/list_changed``)."""
        session = self._session
        if session is None:
            raise MCPConnectionError(f"MCP server {self.name!r} is not connected", server=self.name)
        await self._list(session)
        return self.tools()

    # -- the owner task ---------------------------------------------------------------------------
    async def _own(self, ready: asyncio.Future[None]) -> None:
        """Owns the connection from start to end: enters and leaves the transport and session itself."""
        from mcp.client.session import ClientSession
        from mcp_types import Implementation

        assert self._stop is not None and self._relist is not None and self._broken is not None
        stop, relist, broken = self._stop, self._relist, self._broken
        try:
            async with self._transport() as (read, write):
                session = ClientSession(
                    read,
                    write,
                    message_handler=self._on_message,
                    client_info=Implementation(name="parley", version=_parley_version()),
                )
                async with session:
                    await session.initialize()
                    self.server_info = session.server_info
                    await self._list(session)
                    self._session = session
                    if not ready.done():
                        ready.set_result(None)
                    while not stop.is_set():
                        waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(relist.wait())}
                        try:
                            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                        finally:
                            for waiter in waiters:
                                waiter.cancel()
                        if relist.is_set() and not stop.is_set():
                            relist.clear()
                            try:
                                await self._list(session)
                            except Exception as exc:  # the next call will say what is wrong
                                logger.debug("MCP server %r: re-listing tools failed: %r", self.name, exc)
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(MCPConnectionError(f"connecting to MCP server {self.name!r} was cancelled"))
            raise
        except BaseException as exc:  # start-up failures, and teardown noise of a dead server
            if not ready.done():
                ready.set_exception(self._connection_error("could not be started or reached", exc))
            else:
                logger.debug("MCP server %r: connection ended with %r", self.name, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._session = None
            self._why_broken = self._why_broken or "the connection ended"
            broken.set()
            if not ready.done():
                ready.set_exception(MCPConnectionError(f"MCP server {self.name!r} closed the connection"))

    def _connection_error(self, what: str, exc: BaseException | None = None) -> MCPConnectionError:
        detail = self._describe_failure()
        why = f" ({_short(exc)})" if exc is not None else ""
        return MCPConnectionError(
            f"MCP server {self.name!r} {what}{why}{detail}",
            server=self.name,
            stderr=self.stderr_text(),
            abort_run=self.on_server_error == "raise",
        )

    async def _on_message(self, message: Any) -> None:
        """Notifications from the server (and transport faults), delivered by the session."""
        from mcp_types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            if self._relist is not None:
                self._relist.set()
        elif isinstance(message, Exception):
            logger.debug("MCP server %r: transport fault %r", self.name, message)
            if _is_fatal(message) and self._broken is not None:
                self._why_broken = f"the connection failed ({_short(message)})"
                self._broken.set()

    # -- tools ------------------------------------------------------------------------------------
    async def _list(self, session: Any) -> None:
        from mcp_types import PaginatedRequestParams

        listed: list[Any] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        tools: list[Tool] = []
        names: set[str] = set()
        skipped: dict[str, str] = {}
        for item in listed:
            if self.allow is not None and not _matches(self.allow, item.name):
                skipped[item.name] = "not allowed"
                continue
            if _matches(self.deny, item.name):
                skipped[item.name] = "denied"
                continue
            try:
                tool = self._make_tool(item)
            except (ToolDefinitionError, ConfigurationError) as exc:
                skipped[item.name] = str(exc)
                logger.warning("MCP server %r: tool %r is not offered: %s", self.name, item.name, exc)
                continue
            if tool.name in names:
                skipped[item.name] = f"its name {tool.name!r} clashes with another tool of this server"
                continue
            names.add(tool.name)
            tools.append(tool)
        self._tools, self.skipped = tools, skipped
        self.version += 1

    def _make_tool(self, item: Any) -> Tool:
        options = dict(self.tool_options.get(item.name, {}))
        approval: Any = options.pop("needs_approval", None)
        if approval is None:
            approval = self.needs_approval
            if not isinstance(approval, bool) and not callable(approval):
                approval = item.name in approval
        description = options.pop("description", None)
        if description is None:
            description = item.description or getattr(item, "title", None) or ""
        remote = item.name

        async def handler(arguments: dict[str, Any], context: ToolContext | None) -> Any:
            return await self.call_tool(remote, arguments, call_id=context.call_id if context else "")

        tool = SchemaTool(
            _tool_name(self.prefix, item.name),
            handler,
            parameters=_without_titles(item.input_schema),
            description=description,
            needs_approval=approval,
            deferred=options.pop("deferred", self.deferred),
            timeout_s=options.pop("timeout_s", self.timeout_s),
            retries=options.pop("retries", self.retries),
            idempotent=options.pop("idempotent", self.idempotent),
            on_repeat=options.pop("on_repeat", None),
            max_result_chars=options.pop("max_result_chars", self.max_result_chars),
        )
        tool.source = f"mcp:{self.name}"  # type: ignore[attr-defined]  # read by parley.tracing
        tool.mcp_name = remote  # type: ignore[attr-defined]
        return tool

    async def call_tool(self, name: str, arguments: dict[str, Any], *, call_id: str = "") -> Any:
        """Call the server's tool `name` (its own name, not prefixed); the parts of its result.

        Raises `ToolError` for an ``isError`` result or a refusal, `MCPConnectionError` when the server is
        gone or goes away during the call.
        """
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        session, broken = self._session, self._broken
        if session is None or broken is None or broken.is_set():
            why = self._why_broken or "it is not connected"
            raise self._connection_error(f"cannot take the call: {why}")
        meta: Any = {CALL_ID_META_KEY: call_id} if call_id else None
        call = asyncio.ensure_future(session.call_tool(name, arguments, meta=meta))
        gone = asyncio.ensure_future(broken.wait())
        try:
            await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            call.cancel()
            raise
        finally:
            gone.cancel()
        if not call.done():
            call.cancel()
            raise self._connection_error(f"stopped during the call ({self._why_broken}); it may or may not have run")
        try:
            result = call.result()
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._why_broken = "the connection closed"
                broken.set()
                raise self._connection_error(
                    "closed the connection during the call; it may or may not have run"
                ) from None
            raise ToolError(f"the MCP server refused the call: {_short_text(exc.message)}") from None
        except ToolError:
            raise
        except Exception as exc:
            if _is_fatal(exc):
                self._why_broken = f"the connection failed ({_short(exc)})"
                broken.set()
                raise self._connection_error("failed during the call; it may or may not have run", exc) from None
            raise ToolError(f"the MCP call failed: {_short(exc)}") from None
        parts = result_value(result)
        if all(isinstance(p, str) for p in parts):
            return "\n".join(parts)
        return parts


def _short_text(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short(exc: BaseException) -> str:
    """One line about an exception (the first of an exception group's leaves)."""
    while _GROUP is not None and isinstance(exc, _GROUP) and exc.exceptions:
        exc = exc.exceptions[0]
    message = _short_text(str(exc), 200)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _is_fatal(exc: BaseException) -> bool:
    """Transport faults after which the session cannot be trusted to answer (the peer is gone)."""
    import anyio

    fatal: tuple[type[BaseException], ...] = (
        anyio.ClosedResourceError,
        anyio.BrokenResourceError,
        anyio.EndOfStream,
        OSError,
        EOFError,
    )
    try:
        import httpx2

        fatal = (*fatal, httpx2.TransportError)
    except ImportError:  # pragma: no cover - mcp depends on it
        pass
    return isinstance(exc, fatal)


def _parley_version() -> str:
    try:
        from importlib.metadata import version

        return version("parley")
    except Exception:  # pragma: no cover - running from a source tree without metadata
        return "0"


class MCPServerStdio(MCPToolset):
    """An MCP server run as a subprocess, spoken to over its stdin/stdout.

    `command` and `args` start it, `env` is added to a small inherited environment (the mcp SDK's
    safe default: HOME, PATH, ...; pass ``inherit_env=True`` for all of ours), `cwd` is its working
    folder. Its stderr goes to a temporary file (`stderr_text()`), or to `stderr` when given.
    Every other option: `MCPToolset`.
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        inherit_env: bool = False,
        stderr: IO[str] | None = None,
        name: str | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(command, str) or not command:
            raise ConfigurationError("MCPServerStdio needs a command")
        if isinstance(args, str):
            raise ConfigurationError("args must be a sequence of strings, not one string")
        self.command = command
        self.args = [str(a) for a in args]
        self.env = dict(env or {})
        self.cwd = cwd
        self.inherit_env = inherit_env
        self._stderr_target = stderr
        self._stderr_file: IO[str] | None = None
        super().__init__(name=name or Path(self.args[-1] if self.args else command).stem, **options)

    def stderr_text(self) -> str:
        handle = self._stderr_file
        if handle is None or handle.closed:
            return ""
        try:
            size = os.fstat(handle.fileno()).st_size
            with open(handle.fileno(), encoding="utf-8", errors="replace", closefd=False) as reader:
                reader.seek(max(0, size - _STDERR_TAIL))
                return reader.read()
        except (OSError, ValueError):
            return ""

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        if self._stderr_target is None:
            if self._stderr_file is not None:
                self._stderr_file.close()
            self._stderr_file = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        errlog = self._stderr_target or self._stderr_file
        env = {**os.environ, **self.env} if self.inherit_env else (self.env or None)
        cwd = os.fspath(self.cwd) if self.cwd is not None else None
        params = StdioServerParameters(command=self.command, args=self.args, env=env, cwd=cwd)
        async with stdio_client(params, errlog=errlog or sys.stderr) as streams:  # type: ignore[arg-type]
            yield streams

    def _describe_failure(self) -> str:
        tail = self.stderr_text().strip().splitlines()
        return f"; its stderr ends: {_short_text(tail[-1], 160)!r}" if tail else ""


class MCPServerHTTP(MCPToolset):
    """An MCP server reached over Streamable HTTP at `url` (e.g. ``http://127.0.0.1:8000/mcp``).

    `headers` go with every request (e.g. ``{"Authorization": "Bearer ..."}``); `http_timeout_s` is the
    connect/write timeout, `read_timeout_s` how long a response stream may stay silent.
    Every other option: `MCPToolset`.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        http_timeout_s: float = 30.0,
        read_timeout_s: float = 300.0,
        name: str | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"MCPServerHTTP needs an http(s) URL, not {url!r}")
        self.url = url
        self.headers = dict(headers or {})
        self.http_timeout_s = http_timeout_s
        self.read_timeout_s = read_timeout_s
        host = url.split("://", 1)[1].split("/", 1)[0]
        super().__init__(name=name or host, **options)

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        timeout = httpx2.Timeout(self.http_timeout_s, read=self.read_timeout_s)
        client = create_mcp_http_client(headers=self.headers or None, timeout=timeout)
        async with client, streamable_http_client(self.url, http_client=client) as streams:
            yield streams

