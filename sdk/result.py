"""`RunResult`: what `Agent.run` returns, finished or paused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from parley.protocol import Message, Usage
from parley.run_state import Interruption, RepeatedCall, RunState

OutputT = TypeVar("OutputT")


@dataclass(kw_only=True)
class RunResult(Generic[OutputT]):
    """The outcome of one `Agent.run`.

    When `paused` is true the run is waiting on `interruptions` (approvals or outside results) and
    `output` is None; resolve them on `state` and pass it back to `agent.run(state=...)`.
    """

    output: OutputT | None
    """The final answer: a str, or an instance of the agent's `output_type` (None while paused)."""
    messages: list[Message]
    """The whole conversation, instructions first."""
    usage: Usage
    """Usage of the whole run (resumes included)."""
    state: RunState
    interruptions: list[Interruption] = field(default_factory=list)
    paused: bool = False

    @property
    def turns(self) -> int:
        """Model requests made by the run so far."""
        return self.state.turn

    @property
    def repeats(self) -> list[RepeatedCall]:
        """Calls the repeat rule answered from an identical earlier call instead of running them (whole run)."""
        return list(self.state.repeats)

    @property
    def tool_calls(self) -> int:
        """Tool calls the model made in this run (repeats included; `repeats` says which were not run)."""
        return self.state.tool_calls

    @property
    def last_agent(self) -> str | None:
        """The name of the agent that answered (paused: that is answering); after a handoff, the one handed to."""
        return self.state.current_agent or self.state.agent_name

    def new_messages(self, since: int = 0) -> list[Message]:
        return self.messages[since:]
