"""Turning a user-supplied history into one every provider accepts.

Providers insist that each assistant tool call is answered by a tool result *immediately after*
the assistant message (Anthropic: "Each `tool_use` block must have a corresponding `tool_result`
block in the next message"). Histories that users hand back (stored transcripts, UI reloads,
hand-edited lists) often break that: results after an intervening user message, results in a
different order, a call that was never answered. `normalise_history` repairs what can be repaired
without inventing meaning and refuses the rest:

* results are moved directly after the assistant message that made the calls, in call order;
* an unanswered call in the middle of the history gets an error result saying so (the model sees
  that the call never ran; nothing is silently dropped);
* unanswered calls of the *last* assistant message become the run's open batch (they will run);
* a result that answers no call raises `OrphanToolResultError`; a duplicate result for the same
  call keeps the first one.
"""

from __future__ import annotations

from parley.protocol import Message, Role, ToolCall, ToolResult
from parley.protocol.errors import OrphanToolResultError

NOT_RUN = "This tool call was never completed, so there is no result."


def normalise_history(messages: list[Message]) -> tuple[list[Message], list[ToolCall]]:
    """Return (repaired messages, open batch of calls awaiting execution)."""
    calls: dict[str, ToolCall] = {}
    results: dict[str, ToolResult] = {}
    for message in messages:
        for call in message.tool_calls:
            calls.setdefault(call.id, call)
        for result in message.tool_results:
            if result.call_id not in calls:
                raise OrphanToolResultError(
                    f"tool result for call id {result.call_id!r} ({result.name}) has no earlier matching tool call"
                )
            results.setdefault(result.call_id, result)

    last_caller = _last_assistant_with_calls(messages)
    repaired: list[Message] = []
    open_batch: list[ToolCall] = []
    for index, message in enumerate(messages):
        if message.role is Role.TOOL:
            continue
        if message.tool_results:
            # a non-tool message carrying results (some wire formats put them on user messages)
            others = [p for p in message.parts if not isinstance(p, ToolResult)]
            if not others:
                continue
            message = message.model_copy(update={"parts": others})
        repaired.append(message)
        if not message.tool_calls:
            continue
        trailing = index == last_caller and all(m.role is Role.TOOL for m in messages[index + 1 :])
        unanswered = [c for c in message.tool_calls if c.id not in results]
        if trailing and unanswered:
            # the last turn's calls: answered ones go to records via the batch, so keep them all open
            open_batch = list(message.tool_calls)
            continue
        for call in message.tool_calls:
            result = results.get(call.id) or ToolResult(call_id=call.id, name=call.name, content=NOT_RUN, is_error=True)
            repaired.append(Message(role=Role.TOOL, parts=[result], name=result.name))
    return repaired, open_batch


def recorded_for(batch: list[ToolCall], messages: list[Message]) -> dict[str, ToolResult]:
    """Results already present in `messages` for calls of the open batch (kept as records)."""
    wanted = {c.id for c in batch}
    found: dict[str, ToolResult] = {}
    for message in messages:
        for result in message.tool_results:
            if result.call_id in wanted:
                found.setdefault(result.call_id, result)
    return found


def _last_assistant_with_calls(messages: list[Message]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role is Role.ASSISTANT and messages[index].tool_calls:
            return index
    return -1
