"""How `Agent.run(session=...)` uses a session (the rules are in `parley.sessions`' docstring)."""

from __future__ import annotations

from typing import Any

from parley._run_history import NOT_RUN, normalise_history, recorded_for
from parley.errors import ConfigurationError
from parley.protocol import Message, Role, ToolResult
from parley.run_state import CompactionRecord, RunState
from parley.sessions.base import LiveView, PendingCompaction, Session, SessionStore
from parley.sessions.errors import SessionStoreError


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


async def load_history(session: Session) -> tuple[list[Message], LiveView | None]:
    """The session's items as the model sees them before this run's turn (a parley store's live
    history: its latest compaction applied), and where each is stored (None when unknown: another
    `Session` implementation, or a history that needed repair; then no compaction is recorded).

    Items a person added or removed by hand may leave a call without its result; the view repairs
    that as `normalise_history` does (results next to their calls, a never-answered call gets an
    error result saying so); a call left open at the end is shown as not run, never executed.
    """
    view: LiveView | None = None
    if isinstance(session, SessionStore):
        items, view = await session.live_view()
    else:
        items = await session.get_items()
    if not items:
        return [], view
    repaired, open_batch = normalise_history(items)
    if open_batch:
        found = recorded_for(open_batch, items)
        for call in open_batch:
            result = found.get(call.id) or ToolResult(call_id=call.id, name=call.name, content=NOT_RUN, is_error=True)
            repaired.append(Message(role=Role.TOOL, parts=[result], name=result.name))
    if repaired != items:
        view = None
    return repaired, view


def stored_record(history: list[Message], view: LiveView | None) -> CompactionRecord | None:
    """The session's latest compaction as a `CompactionRecord` over the loaded history (its summary
    stands in for itself), so the run's compaction continues it: the next summary replaces the
    stored one and the turns after it, instead of stacking a second summary."""
    if view is None or view.compaction is None or None not in view.seqs:
        return None
    from parley.compaction import digest

    index = view.seqs.index(None)
    try:
        fields = CompactionRecord.model_validate_json(view.compaction.record_json)
    except ValueError:
        return None
    return fields.model_copy(update={"start": index, "through": index + 1, "digest": digest(history[: index + 1])})


def pending_compaction(
    state: RunState, view: LiveView | None, seeded: CompactionRecord | None
) -> PendingCompaction | None:
    """The run's compaction placed on the session's rows, or None when there is none to write (none
    happened, it is the one the session already holds, or it cannot be placed exactly)."""
    record = state.compaction
    if record is None or view is None or record == seeded:
        return None
    from parley.compaction import summary_message

    size = len(view.seqs)

    def seq_at(index: int) -> int | None:
        seq = view.seqs[index]
        if seq is None and view.compaction is not None:
            return view.compaction.through_seq  # the stored summary: it stands for rows up to there
        return seq

    if record.start > 0:
        if record.start - 1 >= size or view.seqs[record.start - 1] is None:
            return None  # the head would keep the stored summary (or part of the turn): not expressible
        head_seq = view.seqs[record.start - 1]
        assert head_seq is not None
    else:
        head_seq = 0
    last = record.through - 1
    through_seq, through_turn = (seq_at(last), None) if last < size else (None, last - size)
    if through_seq is None and through_turn is None:
        return None
    return PendingCompaction(
        head_seq=head_seq, through_seq=through_seq, through_turn=through_turn,
        summary_json=summary_message(record.summary).model_dump_json(), record_json=record.model_dump_json(),
        expect_last_seq=view.last_seq, expect_compaction=view.compaction.id if view.compaction is not None else None,
    )


async def commit_turn(
    session: Session | None, state: RunState, view: LiveView | None = None, seeded: CompactionRecord | None = None
) -> None:
    """Write the finished run's turn (everything in `state.messages`) in one transaction, once:
    the turn id is the run's trace id, so a resumed or repeated completion writes nothing more.
    A parley store also records the run's compaction in that transaction (`pending_compaction`).

    When the write fails, the run has still finished (the model was called and billed): the error is
    a `SessionStoreError` (the store's own, or one chaining another `Session`'s exception) whose
    `state` is the completed run, so ``agent.run(state=error.state, session=s)`` writes the turn
    later, once, with or without ``checkpoint=``."""
    if session is None or state.status != "complete":
        return
    try:
        pending = pending_compaction(state, view, seeded) if isinstance(session, SessionStore) else None
        if pending is not None and isinstance(session, SessionStore):
            await session.add_turn(list(state.messages), turn_id=state.trace_id, compaction=pending)
            return
        await session.add_items(list(state.messages), turn_id=state.trace_id)
    except SessionStoreError as exc:
        exc.state = state
        exc.add_note(_RETRY)
        raise
    except Exception as exc:
        raise SessionStoreError(
            f"the run completed but its turn was not written to session {session.session_id!r}: "
            f"{type(exc).__name__}: {exc}",
            session_id=session.session_id, store=type(session).__name__, operation="write", state=state,
        ) from exc


_RETRY = (
    "the run completed; its turn is in this error's .state: agent.run(state=error.state, session=...) "
    "writes it once the store works again"
)
