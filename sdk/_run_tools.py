"""The tool phase of a run: execute a batch's runnable calls in parallel, durably.

Before any call starts, the state marks the calls as *started* and is checkpointed; each result is
recorded in the state (and checkpointed) the moment it arrives, before the next model call. A
process that dies mid-batch therefore resumes with exactly the unrecorded calls left: recorded
calls are never re-executed. With an execution ledger (`parley.ledger`, the default) guarded calls
are also claimed there before they run and recorded there first (`parley._run_ledger`): another
copy of the state uses that result, and an in-flight call of a dead process is re-run only for
idempotent tools (else a person decides). Without one (``ledger=False``) in-flight calls re-run with
the same call id (their idempotency key, available to the tool as `ToolContext.call_id`).

A call that ran successfully is also entered in the state's `call_log` (under its call key, and
under the edited arguments' key when a person changed them), in the same step as its record, so the
repeat rule (`parley.interruptions`) knows it even after a crash and resume.

Execution itself (argument validation, timeouts, retries of idempotent tools, result formatting,
errors turned into error results for the model) is `parley.tools.ToolExecutor`'s job.

The agent's tools are its plain tools plus those of its toolsets (`parley.tools.Toolset`, e.g. MCP
servers), whose lists may change while a run goes on: `ToolRunner.refresh` re-reads them when a
toolset's `version` moved (before planning a batch and before each model request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from parley._run_ledger import CallGate
from parley.errors import ConfigurationError
from parley.interruptions import repeat_mode, settled_call
from parley.protocol import ToolCall, ToolResult, ToolSpec
from parley.run_state import RunState
from parley.tools import Tool, ToolContext, ToolExecutor, Toolset, call_key

Checkpoint = Callable[[], Awaitable[None]]


class ToolRunner:
    """The agent's tools (plain ones and its toolsets' current ones), by name, and the executor that runs them."""

    controls: Any = None
    """The run's `parley._run_controls.RunControls` (hooks, guardrails, agent tools), or None."""
    gate: CallGate | None = None
    """The run's view of the execution ledger (`parley._run_ledger`), or None (no ledger)."""

    def __init__(self, tools: Sequence[Tool], toolsets: Sequence[Toolset] = (), tracer: Any = None) -> None:
        self.local = list(tools)
        self.toolsets = list(toolsets)
        self.tracer = tracer
        """A `parley.tracing` run tracer (None: not traced), for the execute_tool spans."""
        self._versions: tuple[int, ...] | None = None
        self.tools: dict[str, Tool] = {}
        self.specs: list[ToolSpec] = []
        self.executor = ToolExecutor(self.local)
        self.refresh()

    def refresh(self) -> bool:
        """Re-read the toolsets' tools if any list changed; True when it did (never during a batch)."""
        versions = tuple(ts.version for ts in self.toolsets)
        if versions == self._versions:
            return False
        tools = [*self.local, *(t for ts in self.toolsets for t in ts.tools())]
        names = [t.name for t in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigurationError(
                f"two tools share the name(s) {duplicates} (give a toolset a prefix, or filter its tools)"
            )
        self.executor = ToolExecutor(tools) if self.toolsets else self.executor
        self.tools = {t.name: t for t in tools}
        self.specs = [t.spec for t in tools]
        self._versions = versions
        return True

    async def run_batch(
        self,
        state: RunState,
        calls: list[tuple[ToolCall, str]],
        context: ToolContext,
        checkpoint: Checkpoint | None,
        on_result: Callable[[ToolResult], Awaitable[None]] | None = None,
    ) -> None:
        if not calls:
            return
        started = set(state.started)
        state.started = [*state.started, *(c.id for c, _ in calls if c.id not in started)]
        if checkpoint is not None:
            await checkpoint()

        async def one(call: ToolCall, arguments: str) -> None:
            target = call if arguments == call.arguments else call.model_copy(update={"arguments": arguments})
            gate = self.gate
            if gate is not None and gate.guards(state, call, self.tools.get(call.name)):
                entered = await gate.enter(state, call, self.tools.get(call.name), arguments)
                if isinstance(entered, ToolResult):  # another copy of the state ran it: its result
                    await self.finish(state, call, arguments, entered, checkpoint, on_result)
                    return
                if not entered:  # may or may not have run: a person decides (the batch pauses)
                    state.started = [c for c in state.started if c != call.id]
                    return
                async with gate.holding(call.id):
                    await self._execute(state, call, target, context, checkpoint, on_result)
                return
            await self._execute(state, call, target, context, checkpoint, on_result)

        if len(calls) == 1:
            await one(*calls[0])
        else:
            await asyncio.gather(*(one(call, arguments) for call, arguments in calls))

    async def _execute(
        self,
        state: RunState,
        call: ToolCall,
        target: ToolCall,
        context: ToolContext,
        checkpoint: Checkpoint | None,
        on_result: Callable[[ToolResult], Awaitable[None]] | None,
    ) -> None:
        if self.controls is not None:  # hooks, guardrails and agent tools around the call
            await self.controls.run_call(self, state, call, target, context, checkpoint, on_result)
            return
        if self.tracer is None:
            results = await self.executor.execute([target], context=context)
        else:
            results = await self.tracer.tool_call(self, state, call, target, context)
        await self.finish(state, call, target.arguments, results[0], checkpoint, on_result)

    async def finish(
        self,
        state: RunState,
        call: ToolCall,
        arguments: str,
        result: ToolResult,
        checkpoint: Checkpoint | None,
        on_result: Callable[[ToolResult], Any] | None,
    ) -> None:
        """Record a call's result: in the ledger first (when claimed), then in the state; log, checkpoint, emit."""
        if self.gate is not None:
            result = await self.gate.record(call.id, result)
        state.records[call.id] = result
        state.started = [c for c in state.started if c != call.id]
        self.log(state, call, arguments, result)
        if checkpoint is not None:
            await checkpoint()
        if on_result is not None:
            await on_result(result)

    def log(self, state: RunState, call: ToolCall, arguments: str, result: ToolResult) -> None:
        """Remember a successful run for the repeat rule (failures are not: the model may retry them)."""
        tool = self.tools.get(call.name)
        if result.is_error or tool is None or repeat_mode(tool) == "allow":
            return
        entry = settled_call(result, "ran")
        for text in {call.arguments, arguments}:
            state.call_log.setdefault(call_key(call.name, text), entry)


def tool_objects(tools: Sequence[Any]) -> list[Tool]:
    """Accept `Tool`s or plain functions (wrapped with the default options); toolsets are left out."""
    from parley.tools import tool as make_tool

    return [t if isinstance(t, Tool) else make_tool(t) for t in tools if not isinstance(t, Toolset)]


def toolsets_of(tools: Sequence[Any]) -> list[Toolset]:
    """The toolsets among an agent's `tools` (MCP servers and other run-time tool groups)."""
    return [t for t in tools if isinstance(t, Toolset)]
