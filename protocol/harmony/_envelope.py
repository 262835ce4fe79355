"""Between parley's envelope and Harmony messages.

Harmony has no call ids: a tool result is addressed to the assistant and authored by the tool
(`functions.get_weather`), and results follow calls in order. So rendering looks each result's
`call_id` up among the earlier calls (an unknown id is an `OrphanToolResultError`, never a guess),
and parsing gives each call a fresh id and matches a result to the oldest open call of that tool.

Mapping: reasoning <-> an `analysis` message; text <-> a message on the envelope's channel (default
`final`, or `commentary` for a preamble beside tool calls); `ToolCall(name="x")` <->
`to=functions.x <|constrain|>json` on `commentary` (a dotted name such as `browser.search` is used as
the recipient as is, on `analysis`, as built-in tools are); tool results <-> role `tool`, author
`functions.x`, `to=assistant`, channel `commentary`. Envelope system/developer text at the start
becomes the developer message's `# Instructions`, together with the function tools. Harmony models
read text only: an image or document part is refused with `UnsupportedPartError` naming it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from parley.protocol.envelope import Message, Part, ReasoningPart, Role, TextPart, ToolCall, ToolResult, refuse_media
from parley.protocol.errors import InvalidArgumentsError, OrphanToolResultError, ProtocolError, UnknownRoleError
from parley.protocol.harmony._header import ParsedHeader
from parley.protocol.harmony._tokens import CONSTRAIN
from parley.protocol.harmony._types import (
    HARMONY_ROLES,
    DeveloperContent,
    HarmonyMessage,
    SystemContent,
    ToolNamespace,
)
from parley.protocol.tool_spec import ToolSpec

CallIdFactory = Callable[[], str]


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def recipient_for(tool_name: str) -> str:
    return tool_name if "." in tool_name else f"functions.{tool_name}"


def tool_name_for(recipient: str) -> str:
    return recipient.removeprefix("functions.")


def _is_json_type(content_type: str | None) -> bool:
    return content_type is not None and content_type.removeprefix(CONSTRAIN).strip() == "json"


# --------------------------------------------------------------------------------------------------
# Envelope -> Harmony (rendering).


def _assistant_to_harmony(message: Message, calls: dict[str, str]) -> list[HarmonyMessage]:
    out: list[HarmonyMessage] = []
    has_calls = bool(message.tool_calls)
    has_text = any(isinstance(p, TextPart) for p in message.parts)
    for part in message.parts:
        if isinstance(part, ReasoningPart):
            if part.text:  # a redacted payload has no Harmony form; providers' codecs carry it
                out.append(HarmonyMessage(role="assistant", content=part.text, channel="analysis"))
        elif isinstance(part, TextPart):
            channel = message.channel or ("commentary" if has_calls else "final")
            out.append(HarmonyMessage(role="assistant", content=part.text, channel=channel, name=message.name))
        elif isinstance(part, ToolCall):
            recipient = recipient_for(part.name)
            default_channel = "commentary" if recipient.startswith("functions.") else "analysis"
            channel = message.channel if message.channel and not has_text else default_channel
            content_type = message.content_type
            if content_type is None or content_type == "json":
                content_type = CONSTRAIN + "json"
            calls[part.id] = recipient
            out.append(
                HarmonyMessage(
                    role="assistant",
                    content=part.arguments,
                    recipient=recipient,
                    channel=channel,
                    content_type=content_type,
                )
            )
    return out


def _tool_to_harmony(message: Message, calls: dict[str, str]) -> list[HarmonyMessage]:
    out: list[HarmonyMessage] = []
    for part in message.parts:
        if isinstance(part, ToolResult):
            recipient = calls.get(part.call_id)
            if recipient is None:
                raise OrphanToolResultError(
                    f"tool result for call id {part.call_id!r} ({part.name}) has no matching tool call"
                )
            out.append(
                HarmonyMessage(
                    role="tool", content=part.content, name=recipient, recipient="assistant", channel="commentary"
                )
            )
        elif isinstance(part, TextPart):
            author = recipient_for(message.name) if message.name else "tool"
            out.append(HarmonyMessage(role="tool", content=part.text, name=author, recipient="assistant"))
    return out


def envelope_to_harmony(
    messages: Iterable[Message | HarmonyMessage],
    *,
    system: SystemContent | None,
    tools: Sequence[ToolSpec] = (),
) -> list[HarmonyMessage]:
    """Envelope messages (HarmonyMessages pass through) as the Harmony messages to render."""
    items = list(messages)
    for index, item in enumerate(items):  # gpt-oss reads text only: `UnsupportedPartError` naming the part
        if isinstance(item, Message):
            refuse_media([item], start=index)
    out: list[HarmonyMessage] = []
    if system is not None and not (items and isinstance(items[0], HarmonyMessage) and items[0].role == "system"):
        out.append(HarmonyMessage(role="system", content=system))
    instructions: list[str] = []
    while items and isinstance(items[0], Message) and items[0].role in (Role.SYSTEM, Role.DEVELOPER):
        instructions.append(items.pop(0).text)
    if instructions or tools:
        namespaces = (ToolNamespace.functions(tools),) if tools else ()
        content = DeveloperContent(instructions="\n\n".join(instructions) if instructions else None, tools=namespaces)
        out.append(HarmonyMessage(role="developer", content=content))
    calls: dict[str, str] = {}
    for item in items:
        if isinstance(item, HarmonyMessage):
            out.append(item)
            continue
        role = item.role.value if isinstance(item.role, Role) else str(item.role)
        if role not in HARMONY_ROLES:
            raise UnknownRoleError(f"Unknown role: {role}")
        if role in ("system", "developer"):
            out.append(HarmonyMessage(role="developer", content=DeveloperContent(instructions=item.text)))
        elif role == "user":
            out.append(HarmonyMessage(role="user", content=item.text, name=item.name))
        elif role == "assistant":
            out.extend(_assistant_to_harmony(item, calls))
        else:
            out.extend(_tool_to_harmony(item, calls))
    return out


# --------------------------------------------------------------------------------------------------
# Harmony -> envelope (parsing).

Problem = tuple[str, str, type[ProtocolError]]


@dataclass
class Opened:
    """What the converter decided when a message's header was complete."""

    kind: str  # "call" | "reasoning" | "text" | "result"
    call_id: str | None = None
    index: int | None = None


class EnvelopeConverter:
    """Turns parsed Harmony messages into envelope messages, pairing calls and results by order."""

    def __init__(self, call_id_factory: CallIdFactory | None = None) -> None:
        self._new_id = call_id_factory or new_call_id
        self._open_calls: list[tuple[str, str]] = []  # (call id, recipient), oldest first
        self._next_index = 0

    def open(self, header: ParsedHeader) -> Opened:
        if header.role == "assistant" and header.recipient not in (None, "all"):
            opened = Opened("call", call_id=self._new_id(), index=self._next_index)
            self._next_index += 1
            return opened
        if header.role == "assistant" and header.channel == "analysis":
            return Opened("reasoning")
        if header.role == "tool":
            return Opened("result")
        return Opened("text")

    def close(self, message: HarmonyMessage, opened: Opened) -> tuple[Message, list[Problem]]:
        problems: list[Problem] = []
        content = message.text
        parts: list[Part]
        role = Role(message.role)
        name = message.name
        if opened.kind == "call" and opened.call_id is not None and message.recipient is not None:
            call = ToolCall(id=opened.call_id, name=tool_name_for(message.recipient), arguments=content)
            if _is_json_type(message.content_type):
                try:
                    call.parsed_arguments()
                except InvalidArgumentsError as exc:
                    problems.append(("invalid_arguments", str(exc), InvalidArgumentsError))
            self._open_calls.append((call.id, message.recipient))
            parts = [call]
        elif opened.kind == "reasoning":
            parts = [ReasoningPart(text=content)]
        elif opened.kind == "result":
            author = message.name or "tool"
            name = tool_name_for(author)
            match = next((i for i, (_, r) in enumerate(self._open_calls) if r == author), None)
            if match is None:
                call_id = self._new_id()
                text = f"tool result from {author!r} answers no earlier call"
                problems.append(("orphan_tool_result", text, OrphanToolResultError))
            else:
                call_id = self._open_calls.pop(match)[0]
            parts = [ToolResult(call_id=call_id, name=name, content=content)]
        else:
            parts = [TextPart(text=content)]
        content_type = message.content_type.removeprefix(CONSTRAIN) if message.content_type else None
        envelope = Message(
            role=role,
            parts=parts,
            channel=message.channel,
            recipient=message.recipient,
            name=name,
            content_type=content_type,
        )
        return envelope, problems

    def convert(self, message: HarmonyMessage) -> tuple[Message, list[Problem]]:
        header = ParsedHeader(message.role, message.name, message.recipient, message.channel, message.content_type)
        return self.close(message, self.open(header))
