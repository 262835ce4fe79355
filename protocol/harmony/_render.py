"""Rendering Harmony messages into prompt pieces (`RenderedPrompt`).

Every formatting token is written here and nowhere else, as a special piece; everything a message
*says* (and the header words) is an ordinary piece. That is what keeps the trust boundary when the
prompt is turned into token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from parley.protocol.errors import UnknownRoleError
from parley.protocol.harmony._tokens import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START
from parley.protocol.harmony._types import (
    HARMONY_ROLES,
    DeveloperContent,
    HarmonyMessage,
    RenderedPrompt,
    SystemContent,
)
from parley.protocol.harmony._typescript import render_tools_section

Pieces = list[tuple[str, bool]]
_FUNCTIONS_LINE = "Calls to these tools must go to the commentary channel: 'functions'."


def render_system_content(content: SystemContent, *, has_function_tools: bool) -> str:
    """Sections joined by a blank line: identity/dates, reasoning, built-in tools, valid channels."""
    sections: list[str] = []
    head = [
        line
        for line in (
            content.model_identity,
            f"Knowledge cutoff: {content.knowledge_cutoff}" if content.knowledge_cutoff is not None else None,
            f"Current date: {content.current_date}" if content.current_date is not None else None,
        )
        if line is not None
    ]
    if head:
        sections.append("\n".join(head))
    if content.reasoning_effort is not None:
        sections.append(f"Reasoning: {content.reasoning_effort}")
    if content.tools:
        sections.append(render_tools_section(content.tools))
    if content.valid_channels:
        line = f"# Valid channels: {', '.join(content.valid_channels)}."
        if content.channel_required:
            line += " Channel must be included for every message."
        if has_function_tools:
            line += "\n" + _FUNCTIONS_LINE
        sections.append(line)
    return "\n\n".join(section for section in sections if section)


def render_developer_content(content: DeveloperContent) -> str:
    sections: list[str] = []
    if content.instructions is not None:
        sections.append("# Instructions\n\n" + content.instructions)
    if content.tools:
        sections.append(render_tools_section(content.tools))
    return "\n\n".join(sections)


def _author(message: HarmonyMessage) -> str:
    if message.role == "tool":
        return message.name or "tool"
    return f"{message.role}:{message.name}" if message.name else message.role


def _has_recipient(message: HarmonyMessage) -> bool:
    return message.recipient is not None and message.recipient != "all"


def render_message_pieces(message: HarmonyMessage, *, has_function_tools: bool = False) -> Pieces:
    """`<|start|>author[ to=r][<|channel|>c][ type]<|message|>content<|end|>` (or `<|call|>`)."""
    if message.role not in HARMONY_ROLES:
        raise UnknownRoleError(f"Unknown role: {message.role}")
    pieces: Pieces = [(START, True), (_author(message), False)]
    if _has_recipient(message):
        pieces.append((f" to={message.recipient}", False))
    if message.channel is not None:
        pieces += [(CHANNEL, True), (message.channel, False)]
    if message.content_type is not None:
        if message.content_type.startswith(CONSTRAIN):
            pieces += [(" ", False), (CONSTRAIN, True)]
            rest = message.content_type[len(CONSTRAIN) :]
            if rest:
                pieces.append((rest, False))
        else:
            pieces.append((" " + message.content_type, False))
    pieces.append((MESSAGE, True))
    if isinstance(message.content, SystemContent):
        body = render_system_content(message.content, has_function_tools=has_function_tools)
    elif isinstance(message.content, DeveloperContent):
        body = render_developer_content(message.content)
    else:
        body = message.content
    if body:
        pieces.append((body, False))
    pieces.append((CALL if message.role == "assistant" and _has_recipient(message) else END, True))
    return pieces


def conversation_has_function_tools(messages: Sequence[HarmonyMessage]) -> bool:
    return any(isinstance(m.content, DeveloperContent) and m.content.has_function_tools for m in messages)


def drop_analysis(messages: Sequence[HarmonyMessage]) -> list[HarmonyMessage]:
    """The reference's `auto_drop_analysis`.

    Only when the last assistant message is on `final` (a turn has been answered) are the `analysis`
    messages dropped, and only those before the *first* `final` message: chain of thought of an
    answered turn is not shown to the model again, while a turn still in progress (e.g. a tool
    call awaiting its result) keeps its reasoning.
    """
    last_assistant = next((m for m in reversed(messages) if m.role == "assistant"), None)
    if last_assistant is None or last_assistant.channel != "final":
        return list(messages)
    first_final = next(i for i, m in enumerate(messages) if m.channel == "final")
    return [m for i, m in enumerate(messages) if not (i < first_final and m.channel == "analysis")]


def render_messages(messages: Sequence[HarmonyMessage], *, auto_drop_analysis: bool = True) -> RenderedPrompt:
    has_functions = conversation_has_function_tools(messages)
    kept = drop_analysis(messages) if auto_drop_analysis else list(messages)
    pieces: Pieces = []
    for message in kept:
        pieces += render_message_pieces(message, has_function_tools=has_functions)
    return RenderedPrompt(tuple(pieces))


def render_for_completion(
    messages: Sequence[HarmonyMessage], next_turn_role: str = "assistant", *, auto_drop_analysis: bool = True
) -> RenderedPrompt:
    rendered = render_messages(messages, auto_drop_analysis=auto_drop_analysis)
    return rendered + RenderedPrompt(((START, True), (next_turn_role, False)))


def render_for_training(messages: Sequence[HarmonyMessage], *, auto_drop_analysis: bool = True) -> RenderedPrompt:
    """As `render_messages`, but a last assistant `final` message ends in `<|return|>` (the training target)."""
    rendered = render_messages(messages, auto_drop_analysis=auto_drop_analysis)
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant" and last.channel == "final" and rendered.pieces[-1] == (END, True):
        return RenderedPrompt(rendered.pieces[:-1] + ((RETURN, True),))
    return rendered
