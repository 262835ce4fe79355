"""Deciding what happens to each call of a batch: run it, answer it from a decision, or pause.

A model turn yields a batch of tool calls. Before anything runs, every call is *planned*:

* a call whose result is already recorded is left alone (resume never re-executes it);
* a call with a decision from the `RunState` is answered by it — rejected calls get the rejection
  message as an error result, provided results are recorded as given, approved calls run (with
  the edited arguments if any);
* a call to an unknown tool gets an error result naming the tools that exist (the model can fix it);
* the repeat rule (`parley.tools.repeat`): a call identical (tool name + canonical arguments) to one
  already settled since the last user message is, unless its tool says ``on_repeat="allow"``, not
  run and not sent for approval again — it gets the recorded outcome marked as a repeat
  (``"reuse"``) or an error result (``"error"``); an identical call later in the *same* batch
  waits for the first one and gets its outcome the same way;
* a call to an agent used as a tool whose child run paused (`RunState.children`) runs again: the
  child resumes where it stopped (it is never asked for approval twice);
* with tool guardrails (`parley.guardrails`), their recorded verdict comes next: a call not yet
  screened is left in `BatchPlan.screen` (the run loop asks the guardrails and plans again); a
  rejected call is answered with the guardrail's message, one that needs approval pauses, one with
  replaced arguments goes on with those;
* a `deferred` tool pauses for an outside result, a tool whose `needs_approval` says so pauses for
  a human (fail closed: a predicate that errors means "ask");
* everything else runs now, in parallel with the rest of the batch.

Calls that pause do not stop the others: the runnable calls of the batch still run (and are
recorded) before the run pauses, so a resume only has the paused calls left to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parley.protocol import ToolCall, ToolResult
from parley.run_state import Approved, Interruption, Provided, Rejected, RepeatedCall, RunState, SettledCall
from parley.tools import call_key


@dataclass
class BatchPlan:
    run: list[tuple[ToolCall, str]] = field(default_factory=list)
    """Calls to execute now, each with the argument text to execute it with."""
    answered: dict[str, ToolResult] = field(default_factory=dict)
    """Results known without running anything (decisions, unknown tools, repeats)."""
    pause: list[Interruption] = field(default_factory=list)
    settled: dict[str, SettledCall] = field(default_factory=dict)
    """Entries for `RunState.call_log` from this plan's decisions (rejected / provided), by call key."""
    repeats: list[RepeatedCall] = field(default_factory=list)
    """Calls answered from `RunState.call_log` (their results are in `answered`)."""
    follow: dict[str, str] = field(default_factory=dict)
    """call id -> id of an identical call earlier in this batch, whose outcome answers it once known."""
    screen: list[ToolCall] = field(default_factory=list)
    """Calls the tool guardrails have not judged yet (only when planning with a `screen`)."""


Screen = Callable[[ToolCall], "tuple[str, str | None, str | None] | None"]
"""A call's tool-guardrail verdict: (action, message, replacement arguments), or None when not judged yet."""


def repeat_mode(tool: Any) -> str:
    """The tool's `on_repeat` option (``"reuse"`` for tool objects that do not have one)."""
    mode = getattr(tool, "on_repeat", "reuse")
    return mode if mode in ("reuse", "allow", "error") else "reuse"


def plan_batch(state: RunState, tools: dict[str, Any], screen: Screen | None = None) -> BatchPlan:
    plan = BatchPlan()
    pending = {i.call_id: i for i in state.pending}
    leaders: dict[str, str] = {}  # call key -> first call of this batch with it
    for call in state.batch:
        tool = tools.get(call.name)
        key = call_key(call.name, call.arguments) if tool is not None and repeat_mode(tool) != "allow" else None
        leader = None
        if key is not None and key not in state.call_log:
            leader = leaders.setdefault(key, call.id)
            leader = None if leader == call.id else leader
        if call.id in state.records:
            continue
        decision = state.decisions.get(call.id)
        if isinstance(decision, Rejected):
            result = ToolResult(call_id=call.id, name=call.name, content=decision.message, is_error=True)
            plan.answered[call.id] = result
            if key is not None:
                plan.settled[key] = settled_call(result, "rejected")
            continue
        if isinstance(decision, Provided):
            result = ToolResult(
                call_id=call.id, name=call.name, content=result_text(decision.value), is_error=decision.is_error
            )
            plan.answered[call.id] = result
            if key is not None:
                plan.settled[key] = settled_call(result, "provided")
            continue
        if call.id in pending:
            plan.pause.append(pending[call.id])
            continue
        if leader is not None:
            plan.follow[call.id] = leader
            continue
        if key is not None and key in state.call_log:
            result, repeat = repeat_outcome(call, state.call_log[key], repeat_mode(tool), turn=state.turn)
            plan.answered[call.id] = result
            plan.repeats.append(repeat)
            continue
        if tool is None:
            names = ", ".join(sorted(tools)) or "none"
            plan.answered[call.id] = ToolResult(
                call_id=call.id,
                name=call.name,
                content=f"Unknown tool {call.name!r}. Available tools: {names}.",
                is_error=True,
            )
            continue
        verdict = screen(call) if screen is not None else None
        arguments = verdict[2] if verdict is not None and verdict[2] is not None else call.arguments
        if isinstance(decision, Approved):
            plan.run.append((call, decision.arguments if decision.arguments is not None else arguments))
            continue
        if state.children and call.id in state.children:  # a paused agent tool: resume the child
            plan.run.append((call, arguments))
            continue
        if screen is not None:
            if verdict is None:
                plan.screen.append(call)
                continue
            if verdict[0] == "reject":
                text = verdict[1] or "A guardrail rejected this call."
                plan.answered[call.id] = ToolResult(call_id=call.id, name=call.name, content=text, is_error=True)
                continue
            if verdict[0] == "approval":
                plan.pause.append(_interruption("approval", call, tool, arguments=arguments, reason=verdict[1]))
                continue
        if tool.deferred:
            plan.pause.append(_interruption("deferred", call, tool, arguments=arguments))
        elif _needs_approval(tool, arguments):
            plan.pause.append(_interruption("approval", call, tool, arguments=arguments))
        else:
            plan.run.append((call, arguments))
    return plan


REPEAT_NOTES = {
    "ran": "[already done: an identical call ran earlier; not run again]",
    "rejected": "[already rejected: an identical call was rejected earlier; not run again]",
    "provided": "[already answered: an identical call was answered earlier; not run again]",
}
"""What starts a reused result, by the earlier call's outcome; the recorded content follows."""


def settled_call(result: ToolResult, outcome: str) -> SettledCall:
    return SettledCall(
        call_id=result.call_id,
        tool_name=result.name,
        outcome=outcome,  # type: ignore[arg-type]
        content=result.content,
        is_error=result.is_error,
    )


def repeat_outcome(call: ToolCall, earlier: SettledCall, mode: str, *, turn: int) -> tuple[ToolResult, RepeatedCall]:
    """The result a repeated call gets, and the record of it (see the module docstring)."""
    # The text names no call id: ids are random, and the model's prompt (so a greedy run) must not be.
    if mode == "error":
        content = (
            f"Not run: {call.name} was already called with exactly these arguments in this run, and it does "
            "not run twice. Use the earlier result, or change the arguments."
        )
        result = ToolResult(call_id=call.id, name=call.name, content=content, is_error=True)
        action = "error"
    else:
        note = REPEAT_NOTES[earlier.outcome]
        content = f"{note} {earlier.content}" if earlier.content else note
        result = ToolResult(call_id=call.id, name=call.name, content=content, is_error=earlier.is_error)
        action = "reused"
    repeat = RepeatedCall(
        call_id=call.id,
        tool_name=call.name,
        arguments=call.arguments,
        original_call_id=earlier.call_id,
        action=action,  # type: ignore[arg-type]
        turn=turn,
    )
    return result, repeat


def _needs_approval(tool: Any, arguments: str) -> bool:
    try:
        return bool(tool.needs_approval(arguments))
    except Exception:  # fail closed: a broken predicate means "ask a human"
        return True


def _interruption(
    kind: str, call: ToolCall, tool: Any, *, arguments: str | None = None, reason: str | None = None
) -> Interruption:
    parameters = getattr(tool, "parameters", None)
    return Interruption(
        kind=kind,  # type: ignore[arg-type]
        call_id=call.id,
        tool_name=call.name,
        arguments=call.arguments if arguments is None else arguments,
        parameters=parameters if isinstance(parameters, dict) else None,
        reason=reason,
    )


def result_text(value: Any) -> str:
    """How an outside value becomes a tool result's content: strings as-is, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
