"""Prepare a conversation for a (possibly different) provider: the backend-switching rules.

A conversation may have been produced by several backends (local -> Anthropic -> OpenAI and
back). Before it is sent anywhere, `prepare_history`:

* drops opaque reasoning payloads of *other* providers (a signature or encrypted reasoning is bound
  to the provider and model that made it; sending it elsewhere is an error or a leak) - the
  reasoning text itself is kept, unsigned, and each codec decides whether it can carry it;
* drops other providers' native compactions (`CompactionPart`): only their maker reads them, and
  the messages they summarised are still in the conversation;
* makes tool-call ids unique in the conversation (local parsers number calls per turn, so ``call_0``
  repeats), renaming a repeated id and the results that answer it;
* keeps every call/result pair adjacent and complete: the results of an assistant message's calls
  move right after it, in call order, and a call that never got a result (before the conversation
  went on) gets an explicit error result instead of a dangling ``tool_use``.

Provider-specific id patterns are applied by each codec (``anthropic.tool_id``, ``openai.tool_id``).
"""

from __future__ import annotations

from collections.abc import Sequence

from parley.protocol.envelope import (
    CompactionPart,
    Conversation,
    Message,
    Part,
    ReasoningPart,
    Role,
    ToolCall,
    ToolResult,
)

MISSING_RESULT = "No result was recorded for this tool call."


def strip_foreign_reasoning(message: Message, provider: str | None) -> Message:
    """`message` without other providers' signatures / redacted payloads (text kept, unsigned) and
    without their native compactions."""
    parts: list[Part] = []
    changed = False
    for part in message.parts:
        if isinstance(part, CompactionPart) and part.provider != provider:
            changed = True
            continue
        if isinstance(part, ReasoningPart) and part.provider not in (None, provider):
            changed = True
            if part.redacted is not None or not part.text:
                continue
            parts.append(ReasoningPart(text=part.text))
        else:
            parts.append(part)
    return message.model_copy(update={"parts": parts}) if changed else message


def _unique_ids(messages: list[Message]) -> list[Message]:
    seen: set[str] = set()
    renames: dict[str, str] = {}
    out: list[Message] = []
    for message in messages:
        parts: list[Part] = []
        for part in message.parts:
            if isinstance(part, ToolCall):
                new_id = part.id
                n = 1
                while new_id in seen:
                    new_id = f"{part.id}_{n}"
                    n += 1
                seen.add(new_id)
                renames[part.id] = new_id
                parts.append(part if new_id == part.id else part.model_copy(update={"id": new_id}))
            elif isinstance(part, ToolResult) and renames.get(part.call_id, part.call_id) != part.call_id:
                parts.append(part.model_copy(update={"call_id": renames[part.call_id]}))
            else:
                parts.append(part)
        out.append(message.model_copy(update={"parts": parts}))
    return out


def _adjacent(messages: list[Message]) -> list[Message]:
    results: dict[str, ToolResult] = {}
    for message in messages:
        for result in message.tool_results:
            results.setdefault(result.call_id, result)
    placed: set[str] = set()
    out: list[Message] = []
    last_assistant = max((i for i, m in enumerate(messages) if m.role is Role.ASSISTANT), default=-1)
    for index, message in enumerate(messages):
        own_results = message.tool_results
        if own_results:
            rest = [p for p in message.parts if not isinstance(p, ToolResult)]
            if any(not isinstance(p, ReasoningPart) for p in rest):
                out.append(message.model_copy(update={"parts": rest}))
            continue  # results are re-emitted right after their calls
        out.append(message)
        if message.role is not Role.ASSISTANT or not message.tool_calls:
            continue
        trailing = index == last_assistant and not any(m.role is Role.USER for m in messages[index + 1 :])
        for call in message.tool_calls:
            found = results.get(call.id)
            if found is None and trailing:
                continue  # the calls of the last turn may still be running
            result = found or ToolResult(call_id=call.id, name=call.name, content=MISSING_RESULT, is_error=True)
            if call.id not in placed:
                placed.add(call.id)
                out.append(Message(role=Role.TOOL, parts=[result], name=result.name))
    return out


def prepare_history(messages: Sequence[Message], *, provider: str | None) -> list[Message]:
    """The switching rules above, applied in order; the input is not modified."""
    Conversation.model_construct(messages=list(messages)).check_tool_pairing()
    cleaned = [strip_foreign_reasoning(m, provider) for m in messages]
    return _adjacent(_unique_ids(cleaned))
