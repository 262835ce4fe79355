"""`RunContext`: what instructions, guardrails, hooks and tool availability see of a run.

    @dataclass
    class Deps:
        db: Database

    def instructions(ctx: RunContext[Deps]) -> str:
        return f"You help {ctx.deps.db.user_name()}. Today is {date.today()}."

    agent = Agent(backend, deps_type=Deps, instructions=instructions)
    await agent.run("hi", deps=Deps(db))

The context is a live view: `messages`, `usage` and `turn` are read from the run's state when asked,
and `agent` is the agent answering now (a handoff changes it). Tools get the narrower
`ToolContext[Deps]` (the call being served, the same `deps`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from parley.protocol import Message, Usage

if TYPE_CHECKING:
    from parley._run_loop import RunLoop
    from parley.agent import Agent
    from parley.run_state import RunState

DepsT = TypeVar("DepsT", default=Any)


class RunContext(Generic[DepsT]):
    """The run as user callbacks see it: the caller's `deps`, the agent answering now, the state so far."""

    __slots__ = ("_loop",)

    def __init__(self, loop: RunLoop) -> None:
        self._loop = loop

    @property
    def deps(self) -> DepsT:
        """The dependency object passed to `Agent.run(deps=...)`, untouched."""
        deps: DepsT = self._loop.context.deps
        return deps

    @property
    def agent(self) -> Agent[Any, DepsT]:
        """The agent answering now (after a handoff, the agent handed to)."""
        return self._loop.agent

    @property
    def state(self) -> RunState:
        """The run's state (read it; the run loop owns it)."""
        return self._loop.state

    @property
    def messages(self) -> list[Message]:
        """The conversation so far, without the instructions."""
        return self._loop.state.messages

    @property
    def usage(self) -> Usage:
        """Usage of the whole run so far (agent tools' runs included)."""
        return self._loop.state.usage

    @property
    def turn(self) -> int:
        """Model requests this agent's run has made so far."""
        return self._loop.state.turn

    @property
    def tenant(self) -> str | None:
        return self._loop.state.tenant

    @property
    def run_id(self) -> str:
        """The run's trace id (stable across pause and resume)."""
        return self._loop.state.trace_id

    def __repr__(self) -> str:
        return f"RunContext(agent={self.agent.name!r}, turn={self.turn}, run_id={self.run_id!r})"
