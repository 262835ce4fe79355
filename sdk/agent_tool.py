"""An agent used as a tool of another: `Agent.as_tool(...)`.

    mailer = Agent(local_backend, name="mailer", tools=[send_email])          # send_email needs approval
    assistant = Agent(hosted_backend, tools=[mailer.as_tool(description="Writes and sends email.")])
    result = await assistant.run("Tell Ada the report is late")
    result.interruptions[0].path      # ["call_7", "call_2"]: the parent's call, then the mailer's
    result.state.approve(result.interruptions[0].call_id)                     # routed to the mailer's state
    result = await assistant.run(state=result.state)                         # the mailer resumes, sends once

The tool takes one argument, ``input`` (the request, in words), and runs the child agent on its own
backend with the parent's `deps` and tenant. What ties the two runs together:

* **usage and limits** — every model request of the child is added to the parent's usage as it
  happens (so `RunResult.usage` of the parent is its own plus its children's, resumes included),
  and before each child request the parent's `UsageLimits` are checked too: a parent's request or
  cost limit stops a child mid-run (the error propagates; nothing is passed by hand). Token limits
  count the children's tokens too; `tool_calls_limit` and `max_turns` stay per agent;
* **pauses** — a call inside the child that needs approval or an outside result pauses the parent:
  the child's `RunState` is kept in the parent's (`RunState.children`, under the parent's call id),
  its pending calls surface on the parent with a `path` (parent call id, then the child's), and
  decisions taken on the parent state are routed to the child's. Resuming the parent — in any
  process — resumes the child exactly where it stopped; what already ran is never run again;
* **durability** — with a `checkpoint`, the child's progress is checkpointed as part of the parent's
  state, so a crash mid-child resumes the child from its last checkpoint;
* **exactly once across copies** — the parent's call is claimed in the execution ledger
  (`parley.ledger`) like any call with side effects, and the child run uses the parent's ledger for
  its own calls: copies of the parent state resumed twice, or at once, run the child's effects once
  (a second copy uses the recorded answer). A paused child gives the claim back; a child left
  mid-run by a crash is resumed from its kept state (its own calls are in the ledger too).

A child that fails on its own (its `max_turns`, its own limits, an answer that never validates)
gives the parent's model an error result naming the failure; a parent's limit, a guardrail or a
hook error stops the whole run. `output_extractor(result)` (sync or async) turns the child's
`RunResult` into the text the parent's model reads; by default a str answer as is, anything else as
JSON. Each run of an agent as a tool is a new conversation for the child (it sees only ``input``).
A streaming parent (`run_stream`) streams the child too: while the child runs, the parent's stream
yields each of the child's events (text and reasoning deltas, tool calls, tool results, usage ...)
unchanged inside an `AgentToolEvent` tagged with the child agent's name and the path of call ids
leading to it (``["ask_1"]``; a grandchild's ``["ask_1", "call_3"]``, the prefix of its
interruptions' paths), then the child's answer as the tool's result. Resumes stream the same way;
a non-streamed `run` is unchanged, and the `RunResult` and usage are the same either way.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley.errors import AgentError, GuardrailTripped, HookError, UsageLimitExceeded
from parley.protocol import AgentToolEvent, ToolCall, ToolResult
from parley.run_state import Interruption, RunState
from parley.tools import Tool, ToolArgumentError, ToolContext, ToolError
from parley.tools.policy import NeedsApproval

if TYPE_CHECKING:
    from parley._run_controls import RunControls
    from parley._run_loop import RunLoop
    from parley._run_tools import Checkpoint, ToolRunner
    from parley._run_turn import EventSink
    from parley.agent import Agent
    from parley.result import RunResult

OutputExtractor = Callable[["RunResult[Any]"], Any]
"""``(child RunResult) -> str`` (or an awaitable of it): what the parent's model reads."""


@dataclass
class RunLink:
    """Handed from a parent's call to the child run it starts (taken once, by the child's run loop)."""

    parent: RunLoop
    call_id: str
    name: str
    """The agent tool's name (the child's name where the agent has none)."""
    taken: bool = False


_LINK: ContextVar[RunLink | None] = ContextVar("parley_parent_run", default=None)


def take_link() -> RunLink | None:
    """The link to the parent run, for the first run loop made inside an agent tool's call (else None)."""
    link = _LINK.get()
    if link is None or link.taken:
        return None
    link.taken = True
    return link


def forward_events(link: RunLink, child: RunLoop) -> EventSink | None:
    """The child run's event sink when its parent streams (else None): each event goes up tagged.

    An event that is already an `AgentToolEvent` (a grandchild's) gets this call's id in front of
    its path; any other is the child's own and is wrapped with ``[call_id]`` and the child's name
    (the agent running now: a handoff inside the child changes it).
    """
    parent_emit = link.parent.emit
    if parent_emit is None:
        return None

    async def emit(event: Any) -> None:
        if isinstance(event, AgentToolEvent):
            tagged = AgentToolEvent(path=[link.call_id, *event.path], agent=event.agent, event=event.event)
        else:
            tagged = AgentToolEvent(path=[link.call_id], agent=child.agent.name or link.name, event=event)
        await parent_emit(tagged)

    return emit


def mark_outer(error: UsageLimitExceeded) -> UsageLimitExceeded:
    """Mark a limit error as a parent's: it stops every run up to the one whose limit it is."""
    error.outer = True  # type: ignore[attr-defined]
    return error


class AgentTool(Tool):
    """A `Tool` that runs `agent` (made by `Agent.as_tool`; see the module docstring)."""

    def __init__(
        self,
        agent: Agent[Any, Any],
        *,
        name: str,
        description: str,
        needs_approval: NeedsApproval = False,
        output_extractor: OutputExtractor | None = None,
        timeout_s: float | None = None,
    ) -> None:
        async def run_agent(context: ToolContext, input: str) -> str:
            """Ask the agent.

            Args:
                input: The request for the agent, complete in itself (it sees nothing else of this conversation).
            """
            # Used outside an agent run (a bare ToolExecutor): no parent to pause or to add usage to.
            result = await agent.run(input, tenant=context.tenant, deps=context.deps)
            if result.paused:
                raise ToolError(f"the {agent.name or 'child'} agent paused; run it as a tool of an Agent to resume it")
            return await extract(self, result)

        super().__init__(
            run_agent, name=name, description=description, needs_approval=needs_approval, timeout_s=timeout_s
        )
        self.agent = agent
        self.output_extractor = output_extractor


async def extract(tool: AgentTool, result: RunResult[Any]) -> str:
    if tool.output_extractor is not None:
        value = tool.output_extractor(result)
        if inspect.isawaitable(value):
            value = await value
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    output = result.state.output if result.state.output is not None else result.output
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)


def surfaced(call_id: str, child: Agent[Any, Any], items: list[Interruption]) -> list[Interruption]:
    """A child's pending calls as the parent shows them: path-prefixed by the parent's call id."""
    return [
        item.model_copy(
            update={
                "call_id": f"{call_id}/{item.call_id}",
                "path": [call_id, *(item.path or [item.call_id])],
                "agent": item.agent or child.name,
            }
        )
        for item in items
    ]


async def run_agent_call(
    controls: RunControls,
    runner: ToolRunner,
    state: RunState,
    call: ToolCall,
    target: ToolCall,
    context: ToolContext,
    checkpoint: Checkpoint | None,
    on_result: Callable[[ToolResult], Any] | None,
) -> None:
    """Start or resume the child run behind `call`; record its answer, or keep its state and surface its pause."""
    from parley._run_controls import finish_call

    tool = runner.tools[call.name]
    assert isinstance(tool, AgentTool)
    child_state = state.children.get(call.id)

    async def child_checkpoint(live: RunState) -> None:
        state.children[call.id] = live  # the parent's checkpoint holds the child's progress
        if checkpoint is not None:
            await checkpoint()

    if child_state is None:
        try:
            arguments = tool.validate_arguments(target.arguments)
        except ToolArgumentError as exc:
            error = ToolResult(call_id=call.id, name=call.name, content=f"tool {tool.name!r}: {exc}", is_error=True)
            await finish_call(runner, state, call, target.arguments, error, checkpoint, on_result)
            return
        await controls.hook("before_tool_call", target)
        start: dict[str, Any] = {"input": arguments["input"], "tenant": state.tenant}
    else:
        start = {"state": child_state}
    token = _LINK.set(RunLink(parent=controls.loop, call_id=call.id, name=tool.name))
    try:
        parent = controls.loop
        running = tool.agent.run(
            **start,
            deps=context.deps,
            checkpoint=child_checkpoint if checkpoint is not None else None,
            ledger=parent.ledger if parent.ledger is not None else False,  # the child's calls: the same ledger
            allow_agent_change=parent.allow_agent_change,
        )
        result = await (running if tool.timeout_s is None else asyncio.wait_for(running, tool.timeout_s))
    except (GuardrailTripped, HookError):
        raise
    except UsageLimitExceeded as exc:
        if getattr(exc, "outer", False):
            raise
        content = f"the {tool.agent.name or tool.name} agent stopped: {exc}"
    except AgentError as exc:
        content = f"the {tool.agent.name or tool.name} agent could not finish: {exc}"
    except asyncio.TimeoutError:
        content = f"the {tool.agent.name or tool.name} agent did not finish within {tool.timeout_s:g} s"
    else:
        if result.paused:
            state.children[call.id] = result.state
            state.started = [c for c in state.started if c != call.id]  # its progress is the child state now
            if runner.gate is not None:  # not finished: the next resume claims the call again
                await runner.gate.release(call.id)
            controls.pause_later(surfaced(call.id, tool.agent, result.interruptions))
            return
        answer = ToolResult(call_id=call.id, name=call.name, content=await extract(tool, result))
        state.children.pop(call.id, None)
        await controls.settle(runner, state, call, target.arguments, answer, checkpoint, on_result)
        return
    finally:
        _LINK.reset(token)
    state.children.pop(call.id, None)
    failed = ToolResult(call_id=call.id, name=call.name, content=content, is_error=True)
    await controls.settle(runner, state, call, target.arguments, failed, checkpoint, on_result)
