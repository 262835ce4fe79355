"""Handoffs: the model passes the conversation to another agent, which answers from then on.

    billing = Agent(backend, name="billing", instructions="You settle invoices.", output_type=Refund)
    triage = Agent(backend, name="triage", instructions="Route the customer.",
                   handoffs=[billing, handoff(support, input_filter=keep_last_turns(1))])
    result = await triage.run("I was charged twice")
    result.last_agent    # "billing"; result.output is a Refund

Each handoff is offered to the model as a tool without arguments, ``transfer_to_<name>``. When the
model calls one, the call is answered ("Transferred to billing."), the rest of its batch is
resolved as usual, and then the agent handed to continues the run with its own instructions, tools,
guardrails and output type. `input_filter` decides what of the history it sees (the filtered
history becomes the run's history); its output is repaired so every tool call still has its result
right after it (an orphan result is dropped, an unanswered call gets a "never completed" result),
so no provider ever rejects it. `on_handoff(ctx)` (sync or async) runs at the switch.

The switch is recorded in the state (`RunState.handoff_to`, then `current_agent`), so a run that
pauses inside the agent handed to resumes there, in any process: resume with the agent the run
started with (``triage.run(state=...)``); it finds the current one among its handoffs by name.
Agents in a handoff graph need distinct names. `RunResult.output` is of the output type of the agent
that answered (`RunResult.last_agent`), whatever the starting agent's type parameter says.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley._run_history import NOT_RUN, normalise_history
from parley.context import RunContext
from parley.errors import ConfigurationError
from parley.protocol import Message, Role, ToolCall, ToolResult
from parley.tools import Tool

if TYPE_CHECKING:
    from parley.agent import Agent

HistoryFilter = Callable[[list[Message]], list[Message]]
"""Takes the history (without instructions, the transfer call and its result last) and returns what
the agent handed to sees."""

_UNSAFE = re.compile(r"[^a-z0-9_]+")


@dataclass(frozen=True, eq=False)
class Handoff:
    """A way for the model to pass the conversation to `agent` (see the module docstring)."""

    agent: Agent[Any, Any]
    tool_name: str
    tool_description: str
    input_filter: HistoryFilter | None = None
    on_handoff: Callable[[RunContext[Any]], Any] | None = None


def handoff(
    agent: Agent[Any, Any],
    *,
    tool_name: str | None = None,
    tool_description: str | None = None,
    input_filter: HistoryFilter | None = None,
    on_handoff: Callable[[RunContext[Any]], Any] | None = None,
) -> Handoff:
    """A handoff to `agent`, offered as the tool `tool_name` (default ``transfer_to_<agent name>``)."""
    from parley.agent import Agent

    if not isinstance(agent, Agent):
        raise ConfigurationError(f"handoff() takes an Agent, not {type(agent).__name__}")
    if not agent.name:
        raise ConfigurationError("an agent handed off to needs a name: Agent(..., name='billing')")
    if input_filter is not None and not callable(input_filter):
        raise ConfigurationError("input_filter must be a function of the history (list[Message] -> list[Message])")
    if on_handoff is not None and not callable(on_handoff):
        raise ConfigurationError("on_handoff must be a function of the run context")
    name = tool_name or f"transfer_to_{_UNSAFE.sub('_', agent.name.lower()).strip('_') or 'agent'}"[:64]
    about = agent.description or (agent.instructions if isinstance(agent.instructions, str) else None)
    description = tool_description or (
        f"Hand the conversation to the {agent.name} agent" + (f": {about}" if about else ".")
    )
    return Handoff(agent, name, description, input_filter, on_handoff)


class HandoffTool(Tool):
    """The tool a handoff is offered as; the run loop answers its calls itself (they never execute)."""

    def __init__(self, spec: Handoff) -> None:
        def transfer() -> str:
            return f"Transferred to {spec.agent.name}."

        super().__init__(transfer, name=spec.tool_name, description=spec.tool_description)
        self.handoff = spec


def handoffs_of(items: Sequence[Any]) -> list[Handoff]:
    """`Agent(handoffs=[...])` takes agents and `handoff(...)` objects; each target once."""
    from parley.agent import Agent

    out: list[Handoff] = []
    for item in items:
        if isinstance(item, Agent):
            item = handoff(item)
        if not isinstance(item, Handoff):
            raise ConfigurationError(f"handoffs take Agents or handoff(...) objects, not {type(item).__name__}")
        if any(h.tool_name == item.tool_name for h in out):
            raise ConfigurationError(f"two handoffs share the tool name {item.tool_name!r}")
        out.append(item)
    return out


def find_agent(start: Agent[Any, Any], name: str) -> Agent[Any, Any] | None:
    """The agent called `name` reachable from `start` through handoffs (breadth first), or None."""
    seen: set[int] = set()
    queue = [start]
    while queue:
        agent = queue.pop(0)
        if id(agent) in seen:
            continue
        seen.add(id(agent))
        if agent.name == name:
            return agent
        queue.extend(h.agent for h in agent.handoffs)
    return None


def transfer_result(call: ToolCall, spec: Handoff, *, already: str | None) -> ToolResult:
    if already is not None:
        return ToolResult(
            call_id=call.id,
            name=call.name,
            content=f"Not transferred: the conversation already goes to {already}.",
            is_error=True,
        )
    return ToolResult(call_id=call.id, name=call.name, content=f"Transferred to {spec.agent.name}.")


async def run_on_handoff(spec: Handoff, ctx: RunContext[Any]) -> None:
    if spec.on_handoff is None:
        return
    value = spec.on_handoff(ctx)
    if inspect.isawaitable(value):
        await value


def filtered_history(spec: Handoff, messages: list[Message]) -> list[Message]:
    """What the agent handed to sees: the filter's output, repaired for call/result adjacency."""
    if spec.input_filter is None:
        return messages
    kept = spec.input_filter(list(messages))
    if not isinstance(kept, list) or not all(isinstance(m, Message) for m in kept):
        raise ConfigurationError(f"the input_filter of {spec.tool_name} must return a list of Messages")
    return repair_history(kept)


def repair_history(messages: list[Message]) -> list[Message]:
    """Drop results that answer no call, then `normalise_history`; calls left open get a "never completed" result."""
    calls = {c.id for m in messages for c in m.tool_calls}
    kept: list[Message] = []
    for message in messages:
        if message.tool_results and any(r.call_id not in calls for r in message.tool_results):
            parts = [p for p in message.parts if not (isinstance(p, ToolResult) and p.call_id not in calls)]
            if not parts:
                continue
            message = message.model_copy(update={"parts": parts})
        kept.append(message)
    repaired, batch = normalise_history(kept)
    for call in batch:
        result = ToolResult(call_id=call.id, name=call.name, content=NOT_RUN, is_error=True)
        repaired.append(Message(role=Role.TOOL, parts=[result], name=result.name))
    return repaired


# -- history filters ----------------------------------------------------------------------------------
def remove_tool_calls(messages: list[Message]) -> list[Message]:
    """The history without tool calls and results (and without assistant turns left empty by that)."""
    out: list[Message] = []
    for message in messages:
        if message.role is Role.TOOL:
            continue
        if message.tool_calls or message.tool_results:
            parts = [p for p in message.parts if not isinstance(p, ToolCall | ToolResult)]
            if not any(getattr(p, "kind", "") != "reasoning" for p in parts):
                continue
            message = message.model_copy(update={"parts": parts})
        out.append(message)
    return out


def keep_last_turns(n: int) -> HistoryFilter:
    """A filter keeping the last `n` user turns (each from a user message to the next one)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigurationError(f"keep_last_turns needs a positive int, not {n!r}")

    def keep(messages: list[Message]) -> list[Message]:
        starts = [i for i, m in enumerate(messages) if m.role is Role.USER]
        if len(starts) <= n:
            return messages
        return messages[starts[-n] :]

    keep.__name__ = f"keep_last_turns_{n}"
    return keep
