"""Deciding what happens to each call of a batch: run it, answer it from a decision, or pause.

A model turn yields a batch of tool calls. Before anything runs, every call is *planned*:

* a call whose result is already recorded is left alone (resume never re-executes it);
* a call with a decision from the `RunState` is answered by it — rejected calls get the rejection
  message as an error result, provided results are recorded as given, approved calls run (with
  the edited arguments if any);
* a call to an unknown tool gets an error result naming the tools that exist (the model can fix it);
* a `deferred` tool pauses for an outside result, a tool whose `needs_approval` says so pauses for
  a human (fail closed: a predicate that errors means "ask");
* everything else runs now, in parallel with the rest of the batch.

Calls that pause do not stop the others: the runnable calls of the batch still run (and are
recorded) before the run pauses, so a resume only has the paused calls left to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from parley.protocol import ToolCall, ToolResult
from parley.run_state import Approved, Interruption, Provided, Rejected, RunState


@dataclass
class BatchPlan:
    run: list[tuple[ToolCall, str]] = field(default_factory=list)
    """Calls to execute now, each with the argument text to execute it with."""
    answered: dict[str, ToolResult] = field(default_factory=dict)
    """Results known without running anything (decisions, unknown tools)."""
    pause: list[Interruption] = field(default_factory=list)


def plan_batch(state: RunState, tools: dict[str, Any]) -> BatchPlan:
    plan = BatchPlan()
    pending = {i.call_id: i for i in state.pending}
    for call in state.batch:
        if call.id in state.records:
            continue
        decision = state.decisions.get(call.id)
        if isinstance(decision, Rejected):
            plan.answered[call.id] = ToolResult(
                call_id=call.id, name=call.name, content=decision.message, is_error=True
            )
            continue
        if isinstance(decision, Provided):
            plan.answered[call.id] = ToolResult(
                call_id=call.id, name=call.name, content=result_text(decision.value), is_error=decision.is_error
            )
            continue
        if call.id in pending:
            plan.pause.append(pending[call.id])
            continue
        tool = tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted(tools)) or "none"
            plan.answered[call.id] = ToolResult(
                call_id=call.id,
                name=call.name,
                content=f"Unknown tool {call.name!r}. Available tools: {names}.",
                is_error=True,
            )
            continue
        if isinstance(decision, Approved):
            plan.run.append((call, decision.arguments if decision.arguments is not None else call.arguments))
            continue
        if tool.deferred:
            plan.pause.append(_interruption("deferred", call, tool))
        elif _needs_approval(tool, call.arguments):
            plan.pause.append(_interruption("approval", call, tool))
        else:
            plan.run.append((call, call.arguments))
    return plan


def _needs_approval(tool: Any, arguments: str) -> bool:
    try:
        return bool(tool.needs_approval(arguments))
    except Exception:  # fail closed: a broken predicate means "ask a human"
        return True


def _interruption(kind: str, call: ToolCall, tool: Any) -> Interruption:
    parameters = getattr(tool, "parameters", None)
    return Interruption(
        kind=kind,  # type: ignore[arg-type]
        call_id=call.id,
        tool_name=call.name,
        arguments=call.arguments,
        parameters=parameters if isinstance(parameters, dict) else None,
    )


def result_text(value: Any) -> str:
    """How an outside value becomes a tool result's content: strings as-is, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
