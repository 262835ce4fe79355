"""`ToolExecutor`: runs a model's tool calls safely, in parallel, at most once per call id.

For each call of a batch, in order of the checks:

1. a call id repeated within the batch → an error result for the repeats (the first one runs);
2. a call id already in `records` → the recorded result, *without running anything*: a resumed run
   (RunState) never executes a call twice (without `records` there is no memory between batches);
3. an unknown tool name (exact match, no normalisation) → an error naming the available tools;
4. a deferred tool → an error result, not recorded: the caller executes deferred tools, never us;
5. argument validation (strict JSON, then the strict schema) → an error result on failure;
6. the call, with a per-attempt timeout; idempotent tools are retried on *retryable* errors only,
   with exponential backoff, at most `tool.retries` times;
7. the value rendered to text and capped (the cut marked); images and documents it holds become
   the result's attachments.

Independent calls run concurrently (`asyncio.gather`, bounded by `max_concurrency`); sync functions
run in daemon threads. Every produced result is written into `records` as soon as its call finishes,
so a write-through mapping persists progress even if a later call of the batch hangs or the batch is
cancelled. Failures become `is_error` results with short safe messages; `execute` itself raises only
on cancellation, or for an exception whose `abort_run` attribute is true (the tool asks the run to
stop). Approval is the caller's decision: ask `needs_approval(call)` before executing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from parley.protocol.envelope import ToolCall, ToolResult
from parley.protocol.tool_spec import ToolSpec
from parley.tools.context import ToolContext
from parley.tools.errors import ToolArgumentError, ToolDefinitionError, ToolError, is_retryable
from parley.tools.redaction import safe_error_text, safe_text
from parley.tools.results import (
    DEFAULT_MAX_RESULT_CHARS,
    UnserializableResult,
    render_result,
    split_attachments,
    truncate,
)
from parley.tools.tool import Tool

_CANCEL_GRACE_S = 0.5
_MAX_LISTED_TOOLS = 50


def _error(call: ToolCall, content: str) -> ToolResult:
    return ToolResult(call_id=call.id, name=call.name, content=content, is_error=True)


class ToolExecutor:
    """Executes batches of `ToolCall`s against a registry of tools (see the module docstring)."""

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]] | Mapping[str, Tool] = (),
        *,
        default_timeout_s: float | None = 60.0,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        max_concurrency: int = 8,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        jitter: bool = True,
    ) -> None:
        if max_concurrency < 1:
            raise ToolDefinitionError("max_concurrency must be at least 1")
        if max_result_chars < 64:
            raise ToolDefinitionError("max_result_chars must be at least 64")
        items = tools.values() if isinstance(tools, Mapping) else tools
        self._tools: dict[str, Tool] = {}
        for item in items:
            tool = item if isinstance(item, Tool) else Tool(item)
            if tool.name in self._tools:
                raise ToolDefinitionError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool
        self.default_timeout_s = default_timeout_s
        self.max_result_chars = max_result_chars
        self.max_concurrency = max_concurrency
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.jitter = jitter
        self._inflight: dict[str, asyncio.Future[ToolResult]] = {}

    # -- registry -------------------------------------------------------------------------------
    @property
    def tools(self) -> Mapping[str, Tool]:
        return dict(self._tools)

    @property
    def specs(self) -> list[ToolSpec]:
        """The tools as offered to a model, in registration order."""
        return [tool.spec for tool in self._tools.values()]

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def needs_approval(self, call: ToolCall) -> bool:
        """Whether `call` must be approved before it runs (fails closed; unknown tools need none: they fail)."""
        tool = self._tools.get(call.name)
        return tool is not None and tool.needs_approval(call.arguments)

    def is_deferred(self, call: ToolCall) -> bool:
        """Whether `call` names a deferred tool, whose result the caller must provide."""
        tool = self._tools.get(call.name)
        return tool is not None and tool.deferred

    # -- execution ------------------------------------------------------------------------------
    async def execute(
        self,
        calls: Sequence[ToolCall],
        *,
        context: ToolContext | None = None,
        records: MutableMapping[str, ToolResult] | None = None,
    ) -> list[ToolResult]:
        """Execute `calls` concurrently; one result per call, in the calls' order."""
        results: list[ToolResult | None] = [None] * len(calls)
        pending: list[tuple[int, ToolCall]] = []
        seen: set[str] = set()
        for index, call in enumerate(calls):
            if call.id in seen:
                results[index] = _error(call, f"duplicate tool call id {safe_text(call.id, max_chars=80)!r}; not run")
                continue
            seen.add(call.id)
            if records is not None and call.id in records:
                results[index] = records[call.id]
                continue
            pending.append((index, call))

        semaphore = asyncio.Semaphore(self.max_concurrency)

        async def bounded(call: ToolCall) -> ToolResult:
            async with semaphore:
                return await self._execute_once(call, context, records)

        outcomes = await asyncio.gather(*(bounded(call) for _, call in pending))
        for (index, _), outcome in zip(pending, outcomes, strict=True):
            results[index] = outcome
        return [r for r in results if r is not None]

    def execute_sync(
        self,
        calls: Sequence[ToolCall],
        *,
        context: ToolContext | None = None,
        records: MutableMapping[str, ToolResult] | None = None,
    ) -> list[ToolResult]:
        """Blocking `execute` for code without an event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.execute(calls, context=context, records=records))
        raise ToolError("execute_sync() was called inside a running event loop; use `await executor.execute(...)`")

    async def _execute_once(
        self, call: ToolCall, context: ToolContext | None, records: MutableMapping[str, ToolResult] | None
    ) -> ToolResult:
        """Run one call, sharing the outcome with a concurrent `execute` of the same id on this executor."""
        if records is not None and call.id in records:  # recorded by a concurrent batch while we queued
            return records[call.id]
        running = self._inflight.get(call.id)
        if running is not None:
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                if running.cancelled():  # the other execution was cancelled, not this one
                    return _error(call, "a concurrent execution of this call id was cancelled; not run")
                raise
        future: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        self._inflight[call.id] = future
        try:
            result = await self._run(call, context, records)
        except BaseException:
            future.cancel()
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._inflight[call.id]

    async def _run(
        self, call: ToolCall, context: ToolContext | None, records: MutableMapping[str, ToolResult] | None
    ) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            names = sorted(self._tools)
            listed = ", ".join(names[:_MAX_LISTED_TOOLS]) + (", …" if len(names) > _MAX_LISTED_TOOLS else "")
            unknown = safe_text(call.name, max_chars=80)
            result = _error(call, f"unknown tool {unknown!r}; available tools: {listed or '(none)'}")
        elif tool.deferred:
            return _error(call, f"tool {tool.name!r} is deferred: its result must be provided by the caller")
        else:
            try:
                arguments = tool.validate_arguments(call.arguments)
            except ToolArgumentError as exc:
                result = _error(call, f"tool {tool.name!r}: {exc}")
            else:
                result = await self._attempts(tool, call, arguments, context)
        if records is not None:
            records[call.id] = result
        return result

    def _delay(self, attempt: int, error: BaseException) -> float:
        delay = min(self.max_backoff_s, self.backoff_s * 2.0 ** (attempt - 1))
        if self.jitter:
            delay = delay / 2 + random.uniform(0, delay / 2)
        hint = getattr(error, "retry_after_s", None)
        if isinstance(hint, int | float) and hint > 0:
            delay = max(delay, min(float(hint), self.max_backoff_s))
        return delay

    async def _attempts(
        self, tool: Tool, call: ToolCall, arguments: dict[str, Any], context: ToolContext | None
    ) -> ToolResult:
        attempts = 1 + (tool.retries if tool.idempotent else 0)
        timeout = tool.timeout_s if tool.timeout_s is not None else self.default_timeout_s
        base = context if context is not None else ToolContext()
        for attempt in range(1, attempts + 1):
            task = asyncio.ensure_future(tool.invoke(arguments, base.for_call(call.id, tool.name, attempt=attempt)))
            try:
                done, _ = await asyncio.wait({task}, timeout=timeout)
            except asyncio.CancelledError:
                task.cancel()
                raise
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=_CANCEL_GRACE_S)
                return _error(call, f"tool {tool.name!r} timed out after {timeout:g} s")
            if task.cancelled():
                return _error(call, f"tool {tool.name!r} was cancelled")
            error = task.exception()
            if error is None:
                return self._success(tool, call, task.result())
            if isinstance(error, asyncio.CancelledError | KeyboardInterrupt) or getattr(error, "abort_run", False):
                raise error  # `abort_run`: the tool asks for the run to stop (e.g. an MCP server set to "raise")
            if attempt < attempts and is_retryable(error):
                await asyncio.sleep(self._delay(attempt, error))
                continue
            text = safe_text(str(error)) if isinstance(error, ToolError) else safe_error_text(error)
            suffix = f" (after {attempt} attempts)" if attempt > 1 else ""
            return _error(call, f"tool {tool.name!r} failed{suffix}: {text}")
        raise AssertionError("unreachable: the last attempt always returns")  # pragma: no cover

    def _success(self, tool: Tool, call: ToolCall, value: Any) -> ToolResult:
        value, attachments = split_attachments(value)  # images/documents the tool returned
        try:
            text = render_result(value)
        except UnserializableResult as exc:
            return _error(call, f"tool {tool.name!r} returned {exc}")
        limit = tool.max_result_chars if tool.max_result_chars is not None else self.max_result_chars
        text, _ = truncate(text, limit)
        return ToolResult(call_id=call.id, name=call.name, content=text, attachments=attachments)
