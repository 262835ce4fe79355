"""`Tool` and the `@tool` decorator: a typed Python function offered to a model.

    @tool
    def get_weather(city: str, units: Literal["C", "F"] = "C") -> str:
        '''Current weather for a city.

        Args:
            city: City name, e.g. "Paris".
            units: Temperature unit.
        '''

    @tool(needs_approval=lambda args: args["amount"] > 100, timeout_s=5)
    async def refund(ctx: ToolContext, order_id: str, amount: float) -> dict[str, str]: ...

The decorator returns a `Tool`; calling the tool calls the function unchanged (handy in tests). Name,
description and parameter descriptions come from the function and its docstring unless given; the
argument schema comes from the type hints (see `parley.tools.schema`).

Per-turn availability: `is_enabled` (a bool, or a sync/async predicate on the run's `RunContext`)
says whether the model is offered the tool on this turn; `prepare(ctx, spec)` may return a changed
`ToolSpec` (a narrower description or schema) or None to leave the tool out of this turn. A call to
a tool that was not offered on the turn that made it is answered with an error, never run.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from parley.protocol.tool_spec import ToolSpec
from parley.tools.arguments import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, parse_arguments
from parley.tools.context import ToolContext
from parley.tools.docstrings import parse_docstring
from parley.tools.errors import ToolDefinitionError, ToolError
from parley.tools.policy import NeedsApproval, approval_required, check_approval_option
from parley.tools.repeat import RepeatMode, check_repeat_option
from parley.tools.schema import ArgumentModel, build_argument_model, hint_target

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
MAX_RETRIES = 10
"""Upper bound on `retries` for one tool; more would hide a broken dependency behind latency."""

F = TypeVar("F", bound=Callable[..., Any])

IsEnabled = bool | Callable[[Any], "bool | Awaitable[bool]"]
"""`Tool(is_enabled=...)`: a bool, or a predicate on the run's `parley.RunContext` (sync or async)."""
PrepareTool = Callable[[Any, ToolSpec], "ToolSpec | None | Awaitable[ToolSpec | None]"]
"""`Tool(prepare=...)`: ``(RunContext, ToolSpec) -> ToolSpec | None`` per turn (None: not offered now)."""


def _is_async_callable(function: Callable[..., Any]) -> bool:
    call = getattr(function, "__call__", None)  # noqa: B004 - async __call__ on callable objects
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def _docstring_of(function: Callable[..., Any]) -> str | None:
    """The docstring a user means: the wrapped function's for a partial, `__call__`'s or the class's for an
    instance (never `functools.partial`'s own)."""
    target = hint_target(function)
    doc = inspect.getdoc(target)
    if doc is None and target is not function and not isinstance(function, functools.partial):
        doc = inspect.getdoc(type(function))
    return doc


async def run_in_daemon_thread(function: Callable[[], Any]) -> Any:
    """Run a blocking callable in its own daemon thread and await its result.

    Unlike the loop's default executor, a thread left running by a timed-out or cancelled call does
    not make `asyncio.run` wait for it at shutdown; it is abandoned (Python cannot stop a thread).
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            result = function()
        except BaseException as exc:  # delivered to the awaiting task, not lost in the thread
            outcome: tuple[bool, Any] = (False, exc)
        else:
            outcome = (True, result)
        try:
            loop.call_soon_threadsafe(deliver, *outcome)
        except RuntimeError:  # the loop closed while we ran: nobody is waiting any more
            pass

    threading.Thread(target=target, name="parley-tool", daemon=True).start()
    return await future


class Tool:
    """A function a model may call, with its schema, policy and execution options.

    Options: `needs_approval` (bool or predicate on the validated arguments, failing closed),
    `deferred` (the caller executes it; the executor never does), `timeout_s` (per attempt; `None`
    uses the executor's default), `retries` (extra attempts on retryable errors, idempotent tools only),
    `idempotent`, `on_repeat` (a second call with the same arguments in one run: ``"reuse"`` the recorded
    result without running or asking again, ``"allow"`` it, or answer it with an ``"error"``; the default is
    ``"allow"`` for idempotent tools and ``"reuse"`` for the rest, see `parley.tools.repeat`),
    `max_argument_bytes`/`max_argument_depth` (argument JSON limits), `max_result_chars` (result cap;
    `None` uses the executor's default), `strict` (forwarded to `ToolSpec.strict`), `is_enabled` and
    `prepare` (per-turn availability, see the module docstring).
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        needs_approval: NeedsApproval = False,
        deferred: bool = False,
        timeout_s: float | None = None,
        retries: int = 0,
        idempotent: bool = False,
        on_repeat: RepeatMode | None = None,
        max_argument_bytes: int = DEFAULT_MAX_BYTES,
        max_argument_depth: int = DEFAULT_MAX_DEPTH,
        max_result_chars: int | None = None,
        strict: bool = False,
        is_enabled: IsEnabled = True,
        prepare: PrepareTool | None = None,
    ) -> None:
        if not callable(function):
            raise ToolDefinitionError(f"a tool needs a callable, not {type(function).__name__}")
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            raise ToolDefinitionError(f"{function!r} is a generator; a tool must return (or await to) one value")
        tool_name = name if name is not None else getattr(function, "__name__", None)
        if tool_name is None:
            raise ToolDefinitionError(f"cannot infer a tool name from {function!r}; pass name=...")
        if not isinstance(tool_name, str) or not _NAME.match(tool_name):
            raise ToolDefinitionError(
                f"tool name {tool_name!r} is invalid: use 1-64 letters, digits, '_' or '-', "
                "starting with a letter or '_'"
            )
        if timeout_s is not None and not timeout_s > 0:
            raise ToolDefinitionError(f"tool {tool_name!r}: timeout_s must be positive, got {timeout_s!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: retries must be an int in 0..{MAX_RETRIES}, got {retries!r}"
            )
        if retries and not idempotent:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: retries={retries} needs idempotent=True (a retried call may run twice)"
            )
        if max_result_chars is not None and max_result_chars < 64:
            raise ToolDefinitionError(f"tool {tool_name!r}: max_result_chars must be at least 64")
        docstring = parse_docstring(_docstring_of(function))
        self.function = function
        self.name: str = tool_name
        self.description: str = description if description is not None else docstring.description
        self.approval: NeedsApproval = check_approval_option(needs_approval, tool=tool_name)
        self.deferred = bool(deferred)
        self.timeout_s = timeout_s
        self.retries = retries
        self.idempotent = bool(idempotent)
        self.on_repeat: RepeatMode = check_repeat_option(on_repeat, idempotent=self.idempotent, tool=tool_name)
        self.max_argument_bytes = max_argument_bytes
        self.max_argument_depth = max_argument_depth
        self.max_result_chars = max_result_chars
        self.strict = strict
        if not (isinstance(is_enabled, bool) or callable(is_enabled)):
            raise ToolDefinitionError(f"tool {tool_name!r}: is_enabled must be a bool or a predicate on the run")
        if prepare is not None and not callable(prepare):
            raise ToolDefinitionError(f"tool {tool_name!r}: prepare must be a callable (ctx, spec) -> ToolSpec | None")
        self.is_enabled: IsEnabled = is_enabled
        self.prepare = prepare
        self.is_async = _is_async_callable(function)
        self.arguments: ArgumentModel = build_argument_model(function, name=tool_name, docstring=docstring)

    def __repr__(self) -> str:
        flags = [f for f, on in (("deferred", self.deferred), ("idempotent", self.idempotent)) if on]
        return f"Tool({self.name!r}{''.join(', ' + f for f in flags)})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (no validation, no executor)."""
        return self.function(*args, **kwargs)

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of the arguments (the context parameter excluded)."""
        return self.arguments.json_schema

    @property
    def spec(self) -> ToolSpec:
        """The tool as offered to a model."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters, strict=self.strict)

    @property
    def takes_context(self) -> bool:
        return self.arguments.context_param is not None

    def validate_arguments(self, arguments_json: str | bytes) -> dict[str, Any]:
        """Parse and validate a call's argument text; keyword arguments by parameter name.

        Raises `ToolArgumentError` (see `parley.tools.arguments` and `parley.tools.schema`).
        """
        parsed = parse_arguments(
            arguments_json, max_bytes=self.max_argument_bytes, max_depth=self.max_argument_depth, tool=self.name
        )
        return self.arguments.validate(parsed, tool=self.name)

    def needs_approval(self, arguments_json: str | bytes) -> bool:
        """Whether a call with these arguments must be approved first; fails closed."""
        return approval_required(self, arguments_json)

    async def invoke(self, arguments: dict[str, Any], context: ToolContext | None = None) -> Any:
        """Run the function once with validated `arguments` (no timeout or retry: the executor adds those).

        Async functions run on the loop; sync functions run in a daemon thread so they cannot block it.
        """
        args, kwargs = self.arguments.bind(arguments, context)
        try:
            if self.is_async:
                return await self.function(*args, **kwargs)
            result = await run_in_daemon_thread(lambda: self.function(*args, **kwargs))
            if inspect.isawaitable(result):
                result = await result
            return result
        except SystemExit as exc:  # inside a task it would escape the event loop and end the program
            raise ToolError(f"the tool tried to exit the process (SystemExit {exc.code!r})") from None


@overload
def tool(function: F, /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: NeedsApproval = False,
    deferred: bool = False,
    timeout_s: float | None = None,
    retries: int = 0,
    idempotent: bool = False,
    on_repeat: RepeatMode | None = None,
    max_argument_bytes: int = DEFAULT_MAX_BYTES,
    max_argument_depth: int = DEFAULT_MAX_DEPTH,
    max_result_chars: int | None = None,
    strict: bool = False,
    is_enabled: IsEnabled = True,
    prepare: PrepareTool | None = None,
) -> Callable[[F], Tool]: ...


def tool(function: Callable[..., Any] | None = None, /, **options: Any) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a sync or async function into a `Tool`; usable bare (`@tool`) or with options (`@tool(...)`)."""
    if function is not None:
        if options:
            raise ToolDefinitionError("use @tool(...) with keyword options, or bare @tool")
        return Tool(function)

    def decorate(fn: Callable[..., Any]) -> Tool:
        return Tool(fn, **options)

    return decorate
