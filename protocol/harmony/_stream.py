"""`StreamParser`: Harmony model output, one token id or one text chunk at a time, as parley events.

It never raises while fed. Malformed output becomes an `ErrorEvent` (its `code` says what: see
`_parser`), the partial message is flushed as a `MessageEnd` with `finish_reason="error"`,
and parsing resumes at the next `<|start|>`.

Events per message: tool calls give `ToolCallStart` / `ToolCallDelta` (argument text) /
`ToolCallEnd`; `analysis` text gives `ReasoningDelta`; other text gives `TextDelta` with its channel;
every message ends with `MessageEnd` whose `finish_reason` names what ended it: `"return"`,
`"call"` or `"end"` (the stop token), `"eos"` (`finish()`), `"unterminated"` (a `<|start|>` came
first, lenient mode) or `"error"`.
"""

from __future__ import annotations

from parley.protocol.envelope import Role, ToolCall
from parley.protocol.errors import DecodeError, ProtocolError, VocabularyUnavailableError
from parley.protocol.events import (
    ErrorEvent,
    Event,
    MessageEnd,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from parley.protocol.harmony._envelope import CallIdFactory, EnvelopeConverter, Opened, tool_name_for
from parley.protocol.harmony._header import ParsedHeader
from parley.protocol.harmony._parser import HarmonyMachine, StreamState
from parley.protocol.harmony._tokens import (
    CALL,
    END,
    RETURN,
    SPECIAL_BY_ID,
    HarmonyEncoding,
    could_start_special,
    encodable_text,
    load_harmony_encoding,
    split_special,
)
from parley.protocol.harmony._types import HarmonyMessage

_FINISH = {RETURN: "return", CALL: "call", END: "end"}


class _TextSplitter:
    """Splits text chunks at special-token strings, holding back a tail that may be half a token."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, chunk: str) -> list[tuple[str, bool]]:
        pieces = split_special(self._pending + chunk)
        self._pending = ""
        if pieces and not pieces[-1][1]:
            last = pieces[-1][0]
            cut = last.rfind("<")
            if cut >= 0 and could_start_special(last[cut:]):
                self._pending = last[cut:]
                pieces[-1] = (last[:cut], False)
                if not last[:cut]:
                    pieces.pop()
        return pieces

    def flush(self) -> list[tuple[str, bool]]:
        pending, self._pending = self._pending, ""
        return [(pending, False)] if pending else []


class StreamParser:
    """Incremental Harmony parser.

    `role`: the role whose header the input starts in — `"assistant"` (the default) for a completion
    of a prompt ending in `<|start|>assistant`; None when the input starts with `<|start|>`.
    `strict=False` accepts a stop token before `<|message|>` (the header words become the content)
    and a `<|start|>` that ends a message without its stop token.
    `encoding` maps ordinary token ids to bytes; if None, `o200k_harmony` is loaded on the first
    ordinary id (special ids need no vocabulary).
    """

    def __init__(
        self,
        role: Role | str | None = "assistant",
        *,
        strict: bool = True,
        encoding: HarmonyEncoding | None = None,
        call_id_factory: CallIdFactory | None = None,
    ) -> None:
        role_name = role.value if isinstance(role, Role) else role
        self._machine = HarmonyMachine(self, role=role_name, strict=strict)
        self._encoding = encoding
        self._converter = EnvelopeConverter(call_id_factory)
        self._splitter = _TextSplitter()
        self._opened: Opened | None = None
        self._vocabulary_failed = False
        self._events: list[Event] = []
        self.errors: list[tuple[str, str, type[ProtocolError]]] = []
        """Every problem reported so far: (code, message, error class)."""

    # -- feeding --------------------------------------------------------------------------------------
    def feed(self, item: int | str) -> list[Event]:
        """Feed one token id or one text chunk; returns the events it completes."""
        if isinstance(item, str):
            return self.feed_text(item)
        return self.feed_token(item)

    def feed_token(self, token_id: int) -> list[Event]:
        self._flush_text()
        special = SPECIAL_BY_ID.get(token_id) if isinstance(token_id, int) else None
        if special is not None:
            self._machine.special(special)
        else:
            data = self._token_bytes(token_id)
            if data is not None:
                self._machine.data(data)
        return self._take()

    def feed_text(self, chunk: str) -> list[Event]:
        for piece, special in self._splitter.feed(chunk):
            self._unit(piece, special)
        return self._take()

    def finish(self) -> list[Event]:
        """End of input: flush a held-back text tail and end the message in progress."""
        self._flush_text()
        self._machine.finish()
        return self._take()

    # -- state ----------------------------------------------------------------------------------------
    @property
    def state(self) -> StreamState:
        return self._machine.state

    @property
    def messages(self) -> list[HarmonyMessage]:
        """Completed Harmony messages so far (flushed partial messages included)."""
        return self._machine.messages

    def _header(self) -> ParsedHeader | None:
        return self._machine.current_header

    @property
    def current_role(self) -> str | None:
        header = self._header()
        return header.role if header else None

    @property
    def current_channel(self) -> str | None:
        header = self._header()
        return header.channel if header else None

    @property
    def current_recipient(self) -> str | None:
        header = self._header()
        return header.recipient if header else None

    @property
    def current_content_type(self) -> str | None:
        header = self._header()
        return header.content_type if header else None

    @property
    def current_content(self) -> str:
        return self._machine.current_content

    @property
    def last_content_delta(self) -> str | None:
        return self._machine.last_content_delta

    # -- sink (called by the machine) -----------------------------------------------------------------
    def content_start(self, header: ParsedHeader) -> None:
        self._opened = self._converter.open(header)
        if self._opened.kind == "call" and header.recipient is not None:
            assert self._opened.index is not None and self._opened.call_id is not None
            self._events.append(
                ToolCallStart(index=self._opened.index, id=self._opened.call_id, name=tool_name_for(header.recipient))
            )

    def content_delta(self, text: str) -> None:
        opened = self._opened
        if opened is None:
            return
        if opened.kind == "call" and opened.index is not None:
            self._events.append(ToolCallDelta(index=opened.index, arguments_delta=text))
        elif opened.kind == "reasoning":
            self._events.append(ReasoningDelta(text=text))
        else:
            self._events.append(TextDelta(text=text, channel=self.current_channel))

    def message_end(self, message: HarmonyMessage, reason: str) -> None:
        opened = self._opened or self._converter.open(
            ParsedHeader(message.role, message.name, message.recipient, message.channel, message.content_type)
        )
        self._opened = None
        envelope, problems = self._converter.close(message, opened)
        for code, text, error_type in problems:
            self.error(code, text, error_type)
        call = next((p for p in envelope.parts if isinstance(p, ToolCall)), None)
        if call is not None and opened.index is not None and reason != "error" and not problems:
            self._events.append(ToolCallEnd(index=opened.index, call=call))
        finish = "error" if problems else _FINISH.get(reason, reason)
        self._events.append(MessageEnd(message=envelope, finish_reason=finish))

    def error(self, code: str, message: str, error_type: type[ProtocolError]) -> None:
        self.errors.append((code, message, error_type))
        self._events.append(ErrorEvent(code=code, message=message))

    # -- internals ------------------------------------------------------------------------------------
    def _unit(self, piece: str, special: bool) -> None:
        if special:
            self._machine.special(piece)
        else:
            self._machine.data(encodable_text(piece).encode("utf-8"))

    def _flush_text(self) -> None:
        for piece, special in self._splitter.flush():
            self._unit(piece, special)

    def _token_bytes(self, token_id: int) -> bytes | None:
        if self._encoding is None and self._vocabulary_failed:
            if self._machine.state is not StreamState.SKIP:
                message = "no vocabulary to decode ordinary token ids"
                self._machine.fail("vocabulary_unavailable", message, VocabularyUnavailableError)
            return None
        if self._encoding is None:
            self._vocabulary_failed = True
            try:
                self._encoding = load_harmony_encoding()
            except VocabularyUnavailableError as exc:
                self._machine.fail("vocabulary_unavailable", str(exc), VocabularyUnavailableError)
                return None
            except Exception as exc:  # a corrupt vocabulary file must not break the no-raise promise
                message = f"could not load o200k_harmony: {exc}"
                self._machine.fail("vocabulary_unavailable", message, VocabularyUnavailableError)
                return None
            self._vocabulary_failed = False
        try:
            return self._encoding.token_bytes(token_id)
        except DecodeError as exc:
            self._machine.fail("unknown_token", str(exc), DecodeError)
            return None

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        return events
