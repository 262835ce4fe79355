"""How `Agent.run(session=...)` uses a session (the rules are in `parley.sessions`' docstring)."""

from __future__ import annotations

from typing import Any

from parley._run_history import NOT_RUN, normalise_history, recorded_for
from parley.errors import ConfigurationError
from parley.protocol import Message, Role, ToolResult
from parley.run_state import RunState
from parley.sessions.base import Session


def check_session_run(session: Any, state: RunState | None, input: Any) -> None:
    """Refuse what a session cannot mean: a non-session, or a finished run continued with new input
    (its turn is already in the session; the next turn is a new run)."""
    if session is None:
        return
    if not isinstance(session, Session):
        raise ConfigurationError(
            f"session must implement parley.sessions.Session (get_items, add_items, pop_item, clear_session), "
            f"not {type(session).__name__}"
        )
    if isinstance(state, RunState) and state.status == "complete" and input is not None:
        raise ConfigurationError(
            "this run state is complete and its turn belongs to the session: start the next turn with "
            "agent.run(input, session=...) and no state"
        )


async def load_history(session: Session) -> list[Message]:
    """The session's items as the model sees them before this run's turn.

    Items a person added or removed by hand may leave a call without its result; the view repairs
    that as `normalise_history` does (results next to their calls, a never-answered call gets an
    error result saying so); a call left open at the end is shown as not run, never executed.
    """
    items = await session.get_items()
    if not items:
        return []
    repaired, open_batch = normalise_history(items)
    if open_batch:
        found = recorded_for(open_batch, items)
        for call in open_batch:
            result = found.get(call.id) or ToolResult(call_id=call.id, name=call.name, content=NOT_RUN, is_error=True)
            repaired.append(Message(role=Role.TOOL, parts=[result], name=result.name))
    return repaired


async def commit_turn(session: Session | None, state: RunState) -> None:
    """Write the finished run's turn (everything in `state.messages`) in one transaction, once:
    the turn id is the run's trace id, so a resumed or repeated completion writes nothing more."""
    if session is None or state.status != "complete":
        return
    await session.add_items(list(state.messages), turn_id=state.trace_id)
