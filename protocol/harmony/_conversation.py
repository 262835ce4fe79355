"""The conversation-level entry points: a `Conversation` (or Harmony messages) in, a prompt or messages out.

They only compose the layers below (envelope conversion, rendering, the parser's state machine), so
each rule keeps one home and the package's `__init__` stays a list of names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from parley.protocol.envelope import Conversation, Message, Role
from parley.protocol.errors import DecodeError, ProtocolError
from parley.protocol.events import MessageEnd
from parley.protocol.harmony._envelope import CallIdFactory, EnvelopeConverter, envelope_to_harmony, new_call_id
from parley.protocol.harmony._header import ParsedHeader
from parley.protocol.harmony._parser import HarmonyMachine
from parley.protocol.harmony._render import (
    render_for_completion,
    render_for_training,
    render_message_pieces,
    render_messages,
)
from parley.protocol.harmony._stream import StreamParser
from parley.protocol.harmony._tokens import (
    SPECIAL_BY_ID,
    HarmonyEncoding,
    encodable_text,
    load_harmony_encoding,
    split_special,
)
from parley.protocol.harmony._types import (
    HarmonyMessage,
    RenderedPrompt,
    SystemContent,
)
from parley.protocol.tool_spec import ToolSpec

ConversationLike = Conversation | Iterable[Message | HarmonyMessage]
_DEFAULT_SYSTEM = SystemContent()


def to_harmony_messages(
    conversation: ConversationLike, *, system: SystemContent | None = _DEFAULT_SYSTEM, tools: Sequence[ToolSpec] = ()
) -> list[HarmonyMessage]:
    """The Harmony messages a conversation renders as.

    `system`: the system message's content (None: no system message; one already given as a
    `HarmonyMessage` first is kept). `tools`: function tools, offered in the developer message.
    """
    messages = conversation.messages if isinstance(conversation, Conversation) else conversation
    return envelope_to_harmony(messages, system=system, tools=tools)


def render_conversation(
    conversation: ConversationLike,
    *,
    system: SystemContent | None = _DEFAULT_SYSTEM,
    tools: Sequence[ToolSpec] = (),
    auto_drop_analysis: bool = True,
) -> RenderedPrompt:
    """The conversation as Harmony messages, back to back."""
    messages = to_harmony_messages(conversation, system=system, tools=tools)
    return render_messages(messages, auto_drop_analysis=auto_drop_analysis)


def render_conversation_for_completion(
    conversation: ConversationLike,
    *,
    next_turn_role: Role | str = Role.ASSISTANT,
    system: SystemContent | None = _DEFAULT_SYSTEM,
    tools: Sequence[ToolSpec] = (),
    auto_drop_analysis: bool = True,
) -> RenderedPrompt:
    """The prompt for the next turn: the conversation, then `<|start|>assistant` (or another role)."""
    messages = to_harmony_messages(conversation, system=system, tools=tools)
    role = next_turn_role.value if isinstance(next_turn_role, Role) else next_turn_role
    return render_for_completion(messages, role, auto_drop_analysis=auto_drop_analysis)


def render_conversation_for_training(
    conversation: ConversationLike,
    *,
    system: SystemContent | None = _DEFAULT_SYSTEM,
    tools: Sequence[ToolSpec] = (),
    auto_drop_analysis: bool = True,
) -> RenderedPrompt:
    """As `render_conversation`, with a last `final` answer ending in `<|return|>` (the training target)."""
    messages = to_harmony_messages(conversation, system=system, tools=tools)
    return render_for_training(messages, auto_drop_analysis=auto_drop_analysis)


def render_message(message: HarmonyMessage, *, conversation_has_function_tools: bool = False) -> RenderedPrompt:
    """One Harmony message. `conversation_has_function_tools` adds the functions line to system content."""
    return RenderedPrompt(tuple(render_message_pieces(message, has_function_tools=conversation_has_function_tools)))


# --------------------------------------------------------------------------------------------------
# Parsing.


class _Collect:
    """A sink that keeps only the problems (the machine keeps the messages)."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str, type[ProtocolError]]] = []

    def content_start(self, header: ParsedHeader) -> None:
        return None

    def content_delta(self, text: str) -> None:
        return None

    def message_end(self, message: HarmonyMessage, reason: str) -> None:
        return None

    def error(self, code: str, message: str, error_type: type[ProtocolError]) -> None:
        self.errors.append((code, message, error_type))


def _role_name(role: Role | str | None) -> str | None:
    return role.value if isinstance(role, Role) else role


def parse_messages(
    completion: str | Sequence[int],
    *,
    role: Role | str | None = None,
    strict: bool = True,
    encoding: HarmonyEncoding | None = None,
) -> list[HarmonyMessage]:
    """Parse completion text or token ids into Harmony messages (the reference's parse_messages_from_completion_tokens).

    The end of input ends the message in progress, so pass the completion without its stop token or
    with it. Strict: the first problem raises its typed error (`ParseError`, `UnknownRoleError`,
    `DecodeError` for an id outside the vocabulary). Lenient: problems are skipped as the stream
    parser skips them, and what could be parsed is returned.
    """
    sink = _Collect()
    machine = HarmonyMachine(sink, role=_role_name(role), strict=strict)
    if isinstance(completion, str):
        for piece, special in split_special(completion):
            if special:
                machine.special(piece)
            else:
                machine.data(encodable_text(piece).encode("utf-8"))
    else:
        vocabulary = encoding
        for token in completion:
            name = SPECIAL_BY_ID.get(token)
            if name is not None:
                machine.special(name)
                continue
            vocabulary = vocabulary or load_harmony_encoding()  # no vocabulary: a set-up error, raised
            try:
                data = vocabulary.token_bytes(token)
            except DecodeError as exc:
                machine.fail("unknown_token", str(exc), DecodeError)
                continue
            machine.data(data)
    machine.finish()
    if strict and sink.errors:
        _code, message, error_type = sink.errors[0]
        raise error_type(message)
    return list(machine.messages)


def to_envelope_messages(
    messages: Iterable[HarmonyMessage], *, strict: bool = True, call_id_factory: CallIdFactory | None = None
) -> list[Message]:
    """Harmony messages as envelope messages (calls get fresh ids; results take their call's id by order).

    Strict: `InvalidArgumentsError` for non-JSON arguments under a `json` content type,
    `OrphanToolResultError` for a result that answers no earlier call.
    """
    converter = EnvelopeConverter(call_id_factory)
    out: list[Message] = []
    for message in messages:
        envelope, problems = converter.convert(message)
        if strict and problems:
            _code, text, error_type = problems[0]
            raise error_type(text)
        out.append(envelope)
    return out


def parse_completion(
    completion: str | Sequence[int],
    *,
    role: Role | str | None = Role.ASSISTANT,
    strict: bool = True,
    encoding: HarmonyEncoding | None = None,
    call_id_factory: CallIdFactory | None = None,
) -> list[Message]:
    """Parse a completion into envelope messages: reasoning, text per channel, tool calls, results.

    Strict additionally checks what the envelope needs: JSON arguments where the content type says
    `json` (`InvalidArgumentsError`) and results that answer an earlier call (`OrphanToolResultError`).
    Token ids need `encoding` (default: the local `o200k_harmony`).
    """
    parser = StreamParser(role, strict=strict, encoding=encoding, call_id_factory=call_id_factory or new_call_id)
    events = parser.feed_text(completion) if isinstance(completion, str) else []
    if not isinstance(completion, str):
        for token in completion:
            events += parser.feed_token(token)
    events += parser.finish()
    if strict and parser.errors:
        _code, message, error_type = parser.errors[0]
        raise error_type(message)
    return [event.message for event in events if isinstance(event, MessageEnd)]
