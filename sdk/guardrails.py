"""Guardrails: checks on a run's input, its final answer, and each tool call before and after it runs.

    @input_guardrail
    def no_secrets(ctx: RunContext, input: list[Message]) -> GuardrailResult:
        found = "password" in " ".join(m.text for m in input).lower()
        return GuardrailResult(tripwire=found, output={"secret": found})

    @tool_input_guardrail(tools=["send_email"])
    def outside_mail(ctx: RunContext, call: ToolCall) -> ToolDecision:
        to = call.parsed_arguments().get("to", "")
        return ToolDecision.allow() if to.endswith("@example.com") else ToolDecision.require_approval("external")

    agent = Agent(backend, tools=[send_email], guardrails=[no_secrets, outside_mail])

Kinds and when they run:

* `InputGuardrail` — on the user input (the trailing user messages), *before any model request*:
  a tripped one means not one token was spent. ``run_in_parallel=True`` runs it beside the first
  model request instead, to save its latency; the cost: that request's tokens may be spent (and
  billed) before it trips. parley still never lets such a turn act: the turn's tool calls wait for
  the guardrail, its answer is not returned, and a request still in flight when it trips is
  cancelled. Only the agent a run starts with has its input guardrails run.
* `OutputGuardrail` — on the final answer (the validated `output_type` value), before the run
  completes; of the agent that answered (after a handoff, the specialist's).
* `ToolInputGuardrail` — before a call runs (and before its tool's own approval check): it may
  `allow`, `reject` with a message the model reads, `replace_arguments`, `require_approval` (the run
  pauses with an `Interruption` whose `reason` is the guardrail's; once approved, the call runs
  without the guardrail being asked again) or `stop` the run.
* `ToolOutputGuardrail` — after a call ran: `allow`, `replace_output` (the model reads the new text)
  or `stop` the run (the result is recorded first: what the tool did is not undone or repeated).

A tripped guardrail (or ``stop``) raises `parley.errors.GuardrailTripped` carrying the guardrail's
name, kind and output. Every result is recorded in `RunState.guardrails`; a resumed run never asks
a guardrail again about what it already decided, and the `usage` a guardrail reports (it may call
a model) is added to the run's usage once. Guardrails fail closed: a guardrail that raises trips
(input and output), asks for approval (before a call) or stops the run (after a call).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeAlias, overload

from pydantic_core import to_jsonable_python
from typing_extensions import TypeVar

from parley.context import RunContext
from parley.errors import ConfigurationError, GuardrailTripped
from parley.protocol import Message, Role, ToolCall, ToolResult, Usage
from parley.run_state import GuardrailRecord

if TYPE_CHECKING:
    from parley._run_loop import RunLoop

DepsT = TypeVar("DepsT", default=Any)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardrailResult:
    """What an input or output guardrail found: `tripwire` stops the run."""

    tripwire: bool = False
    output: Any = None
    """What the guardrail found (JSON-able); recorded in the state and carried by `GuardrailTripped`."""
    message: str | None = None
    usage: Usage | None = None
    """What the guardrail spent (e.g. a classifier model's request): added to the run's usage, once."""

    @classmethod
    def ok(cls, output: Any = None, *, usage: Usage | None = None) -> GuardrailResult:
        return cls(output=output, usage=usage)

    @classmethod
    def trip(cls, output: Any = None, *, message: str | None = None, usage: Usage | None = None) -> GuardrailResult:
        return cls(tripwire=True, output=output, message=message, usage=usage)


ToolAction = Literal["allow", "reject", "replace", "approval", "stop"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolDecision:
    """What a tool guardrail decided (build one with the class methods)."""

    action: ToolAction = "allow"
    message: str | None = None
    arguments: dict[str, Any] | None = None
    """``replace`` before a call: the arguments to run it with instead."""
    content: str | None = None
    """``replace`` after a call: the result text the model reads instead."""
    output: Any = None
    """What the guardrail found (JSON-able), recorded in the state."""
    usage: Usage | None = None

    @classmethod
    def allow(cls, output: Any = None) -> ToolDecision:
        return cls(output=output)

    @classmethod
    def reject(cls, message: str, *, output: Any = None) -> ToolDecision:
        """Before a call: do not run it; the model reads `message` as the call's (error) result."""
        return cls(action="reject", message=message, output=output)

    @classmethod
    def replace_arguments(cls, arguments: dict[str, Any], *, output: Any = None) -> ToolDecision:
        """Before a call: run it with `arguments` instead (the tool's approval check sees the new ones)."""
        return cls(action="replace", arguments=dict(arguments), output=output)

    @classmethod
    def require_approval(cls, reason: str | None = None, *, output: Any = None) -> ToolDecision:
        """Before a call: pause the run until a person approves or rejects it."""
        return cls(action="approval", message=reason, output=output)

    @classmethod
    def replace_output(cls, content: str, *, output: Any = None) -> ToolDecision:
        """After a call: the model reads `content` instead of the tool's result."""
        return cls(action="replace", content=content, output=output)

    @classmethod
    def stop(cls, message: str | None = None, *, output: Any = None) -> ToolDecision:
        """Stop the run (`GuardrailTripped`)."""
        return cls(action="stop", message=message, output=output)


InputCheck: TypeAlias = Callable[[RunContext[Any], list[Message]], Any]
OutputCheck: TypeAlias = Callable[[RunContext[Any], Any], Any]
ToolInputCheck: TypeAlias = Callable[[RunContext[Any], ToolCall], Any]
ToolOutputCheck: TypeAlias = Callable[[RunContext[Any], ToolCall, ToolResult], Any]


@dataclass(frozen=True, kw_only=True)
class InputGuardrail(Generic[DepsT]):
    """``function(ctx, input_messages) -> GuardrailResult | None`` (sync or async; None passes)."""

    function: Callable[[RunContext[DepsT], list[Message]], Any]
    name: str
    run_in_parallel: bool = False
    """Run beside the first model request instead of before it (see the module docstring for the cost)."""


@dataclass(frozen=True, kw_only=True)
class OutputGuardrail(Generic[DepsT]):
    """``function(ctx, output) -> GuardrailResult | None`` on the validated final answer."""

    function: Callable[[RunContext[DepsT], Any], Any]
    name: str


@dataclass(frozen=True, kw_only=True)
class ToolInputGuardrail(Generic[DepsT]):
    """``function(ctx, call) -> ToolDecision | None`` before a call of one of `tools` (None: every tool)."""

    function: Callable[[RunContext[DepsT], ToolCall], Any]
    name: str
    tools: frozenset[str] | None = None

    def applies(self, tool_name: str) -> bool:
        return self.tools is None or tool_name in self.tools


@dataclass(frozen=True, kw_only=True)
class ToolOutputGuardrail(Generic[DepsT]):
    """``function(ctx, call, result) -> ToolDecision | None`` after a call of one of `tools` (None: every tool)."""

    function: Callable[[RunContext[DepsT], ToolCall, ToolResult], Any]
    name: str
    tools: frozenset[str] | None = None

    def applies(self, tool_name: str) -> bool:
        return self.tools is None or tool_name in self.tools


Guardrail: TypeAlias = InputGuardrail[Any] | OutputGuardrail[Any] | ToolInputGuardrail[Any] | ToolOutputGuardrail[Any]


def _name_of(function: Callable[..., Any], name: str | None) -> str:
    return name or getattr(function, "__name__", None) or type(function).__name__


def _tools(tools: Collection[str] | str | None) -> frozenset[str] | None:
    if tools is None:
        return None
    return frozenset([tools] if isinstance(tools, str) else tools)


# -- decorators: bare (@input_guardrail) or with options (@input_guardrail(name=...)) ------------------
@overload
def input_guardrail(function: InputCheck, /) -> InputGuardrail[Any]: ...
@overload
def input_guardrail(
    *, name: str | None = None, run_in_parallel: bool = False
) -> Callable[[InputCheck], InputGuardrail[Any]]: ...
def input_guardrail(
    function: InputCheck | None = None, /, *, name: str | None = None, run_in_parallel: bool = False
) -> InputGuardrail[Any] | Callable[[InputCheck], InputGuardrail[Any]]:
    """Make an `InputGuardrail` of ``fn(ctx, input_messages)``."""

    def make(fn: InputCheck) -> InputGuardrail[Any]:
        return InputGuardrail(function=fn, name=_name_of(fn, name), run_in_parallel=run_in_parallel)

    return make(function) if function is not None else make


@overload
def output_guardrail(function: OutputCheck, /) -> OutputGuardrail[Any]: ...
@overload
def output_guardrail(*, name: str | None = None) -> Callable[[OutputCheck], OutputGuardrail[Any]]: ...
def output_guardrail(
    function: OutputCheck | None = None, /, *, name: str | None = None
) -> OutputGuardrail[Any] | Callable[[OutputCheck], OutputGuardrail[Any]]:
    """Make an `OutputGuardrail` of ``fn(ctx, output)``."""

    def make(fn: OutputCheck) -> OutputGuardrail[Any]:
        return OutputGuardrail(function=fn, name=_name_of(fn, name))

    return make(function) if function is not None else make


@overload
def tool_input_guardrail(function: ToolInputCheck, /) -> ToolInputGuardrail[Any]: ...
@overload
def tool_input_guardrail(
    *, name: str | None = None, tools: Collection[str] | str | None = None
) -> Callable[[ToolInputCheck], ToolInputGuardrail[Any]]: ...
def tool_input_guardrail(
    function: ToolInputCheck | None = None, /, *, name: str | None = None, tools: Collection[str] | str | None = None
) -> ToolInputGuardrail[Any] | Callable[[ToolInputCheck], ToolInputGuardrail[Any]]:
    """Make a `ToolInputGuardrail` of ``fn(ctx, call)`` (for `tools`, or every tool)."""

    def make(fn: ToolInputCheck) -> ToolInputGuardrail[Any]:
        return ToolInputGuardrail(function=fn, name=_name_of(fn, name), tools=_tools(tools))

    return make(function) if function is not None else make


@overload
def tool_output_guardrail(function: ToolOutputCheck, /) -> ToolOutputGuardrail[Any]: ...
@overload
def tool_output_guardrail(
    *, name: str | None = None, tools: Collection[str] | str | None = None
) -> Callable[[ToolOutputCheck], ToolOutputGuardrail[Any]]: ...
def tool_output_guardrail(
    function: ToolOutputCheck | None = None, /, *, name: str | None = None, tools: Collection[str] | str | None = None
) -> ToolOutputGuardrail[Any] | Callable[[ToolOutputCheck], ToolOutputGuardrail[Any]]:
    """Make a `ToolOutputGuardrail` of ``fn(ctx, call, result)`` (for `tools`, or every tool)."""

    def make(fn: ToolOutputCheck) -> ToolOutputGuardrail[Any]:
        return ToolOutputGuardrail(function=fn, name=_name_of(fn, name), tools=_tools(tools))

    return make(function) if function is not None else make


@dataclass(frozen=True)
class GuardrailSet:
    """An agent's guardrails, sorted by kind (`Agent(guardrails=[...])` takes them mixed)."""

    input: tuple[InputGuardrail[Any], ...] = ()
    output: tuple[OutputGuardrail[Any], ...] = ()
    tool_input: tuple[ToolInputGuardrail[Any], ...] = ()
    tool_output: tuple[ToolOutputGuardrail[Any], ...] = ()
    names: frozenset[str] = field(default=frozenset())

    @classmethod
    def of(cls, guardrails: Sequence[Any]) -> GuardrailSet:
        kinds: dict[type, list[Any]] = {
            InputGuardrail: [],
            OutputGuardrail: [],
            ToolInputGuardrail: [],
            ToolOutputGuardrail: [],
        }
        for item in guardrails:
            bucket = kinds.get(type(item))
            if bucket is None:
                raise ConfigurationError(
                    f"guardrails must be InputGuardrail, OutputGuardrail, ToolInputGuardrail or ToolOutputGuardrail "
                    f"(use the @input_guardrail, @output_guardrail, @tool_input_guardrail, @tool_output_guardrail "
                    f"decorators), not {type(item).__name__}"
                )
            if any(g.name == item.name for g in bucket):
                raise ConfigurationError(f"two {type(item).__name__}s share the name {item.name!r}")
            bucket.append(item)
        return cls(
            input=tuple(kinds[InputGuardrail]),
            output=tuple(kinds[OutputGuardrail]),
            tool_input=tuple(kinds[ToolInputGuardrail]),
            tool_output=tuple(kinds[ToolOutputGuardrail]),
        )

    def __bool__(self) -> bool:
        return bool(self.input or self.output or self.tool_input or self.tool_output)


# -- running them (the run loop's side; `parley._run_controls` calls these) ----------------------------
async def _call(function: Callable[..., Any], *args: Any) -> Any:
    value = function(*args)
    if inspect.isawaitable(value):
        value = await value
    return value


def jsonable(value: Any) -> Any:
    """A guardrail's output as JSON for the state (what cannot be serialised is kept as its repr text)."""
    try:
        data = to_jsonable_python(value)
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        return repr(value)


def user_input(loop: RunLoop) -> list[Message]:
    """The input an input guardrail judges: the trailing user messages (queued input while a batch is open)."""
    state = loop.state
    if state.queued_input:
        return list(state.queued_input)
    tail: list[Message] = []
    for message in reversed(state.messages):
        if message.role is not Role.USER:
            break
        tail.append(message)
    return tail[::-1]


def _tripped(kind: str, guard: Any, result: GuardrailResult, loop: RunLoop) -> GuardrailTripped:
    why = result.message or (json.dumps(jsonable(result.output)) if result.output is not None else "tripwire")
    label = kind.replace("_", " ")
    return GuardrailTripped(
        f"{label} guardrail {guard.name!r} tripped: {why}",
        guardrail=guard.name,
        kind=kind,
        output=result.output,
        state=loop.state,
    )


async def judge(kind: str, guard: Any, ctx: RunContext[Any], *args: Any) -> GuardrailResult:
    """Run one input/output guardrail; an error inside it trips it (fail closed)."""
    try:
        value = await _call(guard.function, ctx, *args)
    except Exception as exc:
        return GuardrailResult(tripwire=True, message=f"the guardrail raised {type(exc).__name__}: {exc}")
    if value is None:
        return GuardrailResult()
    if not isinstance(value, GuardrailResult):
        return GuardrailResult(
            tripwire=True, message=f"the guardrail returned {type(value).__name__}, not a GuardrailResult"
        )
    return value


def record(loop: RunLoop, kind: Any, guard: Any, result: GuardrailResult) -> None:
    """Keep the result in the state, and bill what the guardrail spent (once: it is never re-run)."""
    loop.state.guardrails.append(
        GuardrailRecord(
            kind=kind,
            name=guard.name,
            verdict="trip" if result.tripwire else "allow",
            turn=loop.state.turn,
            output=jsonable(result.output),
            message=result.message,
        )
    )
    if result.usage is not None and loop.controls is not None:
        loop.controls.add_usage(result.usage)


async def check_all(kind: str, guards: Sequence[Any], loop: RunLoop, ctx: RunContext[Any], *args: Any) -> None:
    """Run `guards` concurrently, record each, raise `GuardrailTripped` for the first (in order) that tripped."""
    if not guards:
        return
    if len(guards) == 1:
        results = [await judge(kind, guards[0], ctx, *args)]
    else:
        results = list(await asyncio.gather(*(judge(kind, g, ctx, *args) for g in guards)))
    for guard, result in zip(guards, results, strict=True):
        record(loop, kind, guard, result)
    for guard, result in zip(guards, results, strict=True):
        if result.tripwire:
            raise _tripped(kind, guard, result, loop)


async def decide(guard: Any, ctx: RunContext[Any], *args: Any, after: bool) -> ToolDecision:
    """Run one tool guardrail; an error inside it asks for approval (before) or stops the run (after)."""
    try:
        value = await _call(guard.function, ctx, *args)
    except Exception as exc:
        why = f"the guardrail {guard.name!r} raised {type(exc).__name__}: {exc}"
        return ToolDecision.stop(why) if after else ToolDecision.require_approval(why)
    if value is None:
        return ToolDecision.allow()
    allowed = ("allow", "replace", "stop") if after else ("allow", "reject", "replace", "approval", "stop")
    if not isinstance(value, ToolDecision) or value.action not in allowed:
        why = f"the guardrail {guard.name!r} returned {value!r}, not a ToolDecision with one of {allowed}"
        return ToolDecision.stop(why) if after else ToolDecision.require_approval(why)
    if value.action == "replace" and (value.content is None if after else value.arguments is None):
        what = "replace_output(content)" if after else "replace_arguments(arguments)"
        why = f"the guardrail {guard.name!r} asked to replace without saying with what (use ToolDecision.{what})"
        return ToolDecision.stop(why) if after else ToolDecision.require_approval(why)
    return value


def tool_record(loop: RunLoop, kind: Any, guard: Any, call: ToolCall, decision: ToolDecision) -> GuardrailRecord:
    entry = GuardrailRecord(
        kind=kind,
        name=guard.name,
        verdict=decision.action,
        turn=loop.state.turn,
        call_id=call.id,
        output=jsonable(decision.output),
        message=decision.message,
        arguments=(
            json.dumps(decision.arguments, separators=(",", ":"), ensure_ascii=False)
            if kind == "tool_input" and decision.arguments is not None
            else None
        ),
        content=decision.content if kind == "tool_output" else None,
    )
    loop.state.guardrails.append(entry)
    if decision.usage is not None and loop.controls is not None:
        loop.controls.add_usage(decision.usage)
    return entry


def stopped(kind: str, entry: GuardrailRecord, loop: RunLoop) -> GuardrailTripped:
    label = kind.replace("_", " ")
    return GuardrailTripped(
        f"{label} guardrail {entry.name!r} stopped the run at call {entry.call_id!r}: {entry.message or 'stop'}",
        guardrail=entry.name,
        kind=kind,
        output=entry.output,
        call_id=entry.call_id,
        state=loop.state,
    )


async def screen_call(loop: RunLoop, guards: Sequence[ToolInputGuardrail[Any]], call: ToolCall) -> None:
    """Ask the applicable guardrails about `call`, in order, recording each answer.

    A replacement feeds the next guardrail; a reject, approval or stop ends the screening. `stop`
    raises once recorded.
    """
    gate = loop.gate
    if gate is None:
        await _screen(loop, guards, call)
        return
    # copies of one state act on the same verdicts, judged (and billed) once: parley._run_ledger
    start = len(loop.state.guardrails)

    async def judged() -> str:
        await _screen(loop, guards, call, raise_stop=False)
        return json.dumps([e.model_dump(mode="json") for e in loop.state.guardrails[start:]])

    text = await gate.shared(f"guardrails:tool_input:{call.id}", call.name, judged)
    entries = [GuardrailRecord.model_validate(e) for e in json.loads(text)]
    loop.state.guardrails[start:] = entries
    for entry in entries:
        if entry.verdict == "stop":
            raise stopped("tool_input", entry, loop)


async def _screen(
    loop: RunLoop, guards: Sequence[ToolInputGuardrail[Any]], call: ToolCall, *, raise_stop: bool = True
) -> None:
    assert loop.controls is not None
    ctx = loop.controls.ctx
    current = call
    for guard in guards:
        if not guard.applies(call.name):
            continue
        decision = await decide(guard, ctx, current, after=False)
        entry = tool_record(loop, "tool_input", guard, call, decision)
        if decision.action == "stop":
            if raise_stop:
                raise stopped("tool_input", entry, loop)
            return
        if decision.action in ("reject", "approval"):
            return
        if entry.arguments is not None:
            current = current.model_copy(update={"arguments": entry.arguments})


def verdict_of(records: Sequence[GuardrailRecord]) -> tuple[str, str | None, str | None]:
    """(action, message, replacement arguments) from one call's tool_input records, in order."""
    arguments: str | None = None
    for entry in records:
        if entry.verdict in ("reject", "approval", "stop"):
            return entry.verdict, entry.message, arguments
        if entry.arguments is not None:
            arguments = entry.arguments
    return ("replace" if arguments is not None else "allow"), None, arguments


async def check_tool_output(loop: RunLoop, guards: Sequence[ToolOutputGuardrail[Any]], call: ToolCall,
                            result: ToolResult) -> tuple[ToolResult, GuardrailTripped | None]:
    """The result the model reads after the applicable guardrails, and the stop to raise once it is recorded."""
    assert loop.controls is not None
    ctx = loop.controls.ctx
    for guard in guards:
        if not guard.applies(call.name):
            continue
        decision = await decide(guard, ctx, call, result, after=True)
        entry = tool_record(loop, "tool_output", guard, call, decision)
        if decision.action == "stop":
            return result, stopped("tool_output", entry, loop)
        if decision.content is not None:
            result = result.model_copy(update={"content": decision.content, "attachments": []})
    return result, None

