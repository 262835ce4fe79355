"""The Harmony parser's state machine, over *units*: a special token, or ordinary bytes.

Both inputs reduce to units — a token id is a special token or its bytes; a text chunk is split at
special-token strings — so text-level and token-level parsing share one set of rules. The machine
never raises: problems go to the sink's `error` (strict parsing raises there; the stream parser turns
them into `ErrorEvent`s), the partial message is flushed, and parsing resumes at the next `<|start|>`.

States: EXPECT_START -> HEADER (on `<|start|>`) -> CONTENT (on `<|message|>`) -> EXPECT_START (on a
stop token), plus SKIP after an error (everything up to the next `<|start|>` is dropped).
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from parley.protocol.errors import ParseError, ProtocolError
from parley.protocol.harmony._header import HeaderError, ParsedHeader, header_as_content, parse_header
from parley.protocol.harmony._tokens import CHANNEL, CONSTRAIN, MESSAGE, START, STOP_TOKENS, incremental_utf8_decoder
from parley.protocol.harmony._types import HarmonyMessage

MAX_HEADER_BYTES = 64 * 1024
"""A header longer than this is malformed output (a model that never writes `<|message|>`)."""


class StreamState(str, Enum):
    EXPECT_START = "expect_start"
    HEADER = "header"
    CONTENT = "content"
    SKIP = "skip"


class Sink(Protocol):
    def content_start(self, header: ParsedHeader) -> None: ...

    def content_delta(self, text: str) -> None: ...

    def message_end(self, message: HarmonyMessage, reason: str) -> None: ...

    def error(self, code: str, message: str, error_type: type[ProtocolError]) -> None: ...


class HarmonyMachine:
    """Harmony's parsing rules over units. `role` set: the input starts inside that role's first header."""

    def __init__(self, sink: Sink, *, role: str | None = None, strict: bool = True) -> None:
        self.sink = sink
        self.strict = strict
        self.messages: list[HarmonyMessage] = []
        self.last_content_delta: str | None = None
        self._next_role = role
        self._role: str | None = role
        self._explicit_start = False
        self._header = bytearray()
        self._parsed: ParsedHeader | None = None
        self._parts: list[str] = []
        self._decoder = incremental_utf8_decoder()
        self.state = StreamState.HEADER if role is not None else StreamState.EXPECT_START

    # -- views -------------------------------------------------------------------------------------
    @property
    def current_header(self) -> ParsedHeader | None:
        return self._parsed if self.state is StreamState.CONTENT else None

    @property
    def current_content(self) -> str:
        return "".join(self._parts) if self.state is StreamState.CONTENT else ""

    # -- input ---------------------------------------------------------------------------------------
    def special(self, token: str) -> None:
        self.last_content_delta = None
        state = self.state
        if state is StreamState.CONTENT:
            if token in STOP_TOKENS:
                self._end_message(token)
            elif token == START:
                if self.strict:
                    self.fail("unterminated_message", f"{START} arrived before the message ended")
                else:
                    self._end_message("unterminated")
                self._begin_header()
            else:  # the reference keeps other special tokens in content as their text
                self._content_bytes(token.encode("ascii"))
        elif state is StreamState.HEADER:
            if token == MESSAGE:
                self._end_header()
            elif token in STOP_TOKENS:
                self._stop_in_header(token)
            elif token in (CHANNEL, CONSTRAIN):
                self._header_bytes(token.encode("ascii"))
            elif token == START:
                self.fail("malformed_header", f"{START} arrived inside a message header")
                self._begin_header()
            else:
                self.fail("unexpected_token", f"special token {token} inside a message header")
        elif token == START:
            self._begin_header()
        elif state is StreamState.EXPECT_START:
            self.fail("unexpected_token", f"Unexpected token {token} while expecting start token {START}")

    def data(self, chunk: bytes) -> None:
        self.last_content_delta = None
        if not chunk:
            return
        state = self.state
        if state is StreamState.CONTENT:
            self._content_bytes(chunk)
        elif state is StreamState.HEADER:
            self._header_bytes(chunk)
        elif state is StreamState.EXPECT_START:
            if self.strict or chunk.strip():
                shown = chunk[:40].decode("utf-8", "replace")
                self.fail("unexpected_token", f"Unexpected text {shown!r} while expecting start token {START}")

    def finish(self) -> None:
        """End of input: the message in progress ends here (a model stopped on its stop token)."""
        self.last_content_delta = None
        if self.state is StreamState.CONTENT:
            self._end_message("eos")
        elif self.state is StreamState.HEADER and (self._header or self._explicit_start):
            if self.strict or not self._header:
                self.fail("truncated", "input ended inside a message header")
            else:
                self._stop_in_header("eos")
        self._reset(StreamState.EXPECT_START)

    # -- transitions -----------------------------------------------------------------------------------
    def _reset(self, state: StreamState) -> None:
        self.state = state
        self._header.clear()
        self._parsed = None
        self._parts = []
        self._decoder = incremental_utf8_decoder()

    def fail(self, code: str, message: str, error_type: type[ProtocolError] = ParseError) -> None:
        """Report, flush the partial message, and skip to the next `<|start|>`."""
        partial = self._partial_message() if self.state is StreamState.CONTENT else None
        self._next_role = None
        self._reset(StreamState.SKIP)
        self.sink.error(code, message, error_type)
        if partial is not None:
            self.messages.append(partial)
            self.sink.message_end(partial, "error")

    def _begin_header(self) -> None:
        self._reset(StreamState.HEADER)
        self._role = self._next_role
        self._next_role = None
        self._explicit_start = True

    def _header_bytes(self, chunk: bytes) -> None:
        self._header += chunk
        if len(self._header) > MAX_HEADER_BYTES:
            self.fail("malformed_header", f"message header longer than {MAX_HEADER_BYTES} bytes")

    def _header_text(self) -> str:
        return self._header.decode("utf-8", errors="replace")

    def _end_header(self) -> None:
        try:
            parsed = parse_header(self._header_text(), self._role)
        except HeaderError as exc:
            self.fail(exc.code, str(exc), exc.error_type)
            return
        self._next_role = None
        self._reset(StreamState.CONTENT)
        self._parsed = parsed
        self.sink.content_start(parsed)

    def _stop_in_header(self, token: str) -> None:
        header = self._header_text()
        if self.strict:
            words = header.split()
            self.fail(
                "malformed_header",
                f"unexpected tokens remaining in message header: {words} ({token} arrived before {MESSAGE})",
            )
            self.state = StreamState.EXPECT_START
            return
        try:
            parsed, content = header_as_content(header, self._role)
        except HeaderError as exc:
            self.fail(exc.code, str(exc), exc.error_type)
            self.state = StreamState.EXPECT_START
            return
        self._reset(StreamState.CONTENT)
        self._parsed = parsed
        self.sink.content_start(parsed)
        if content:
            self._parts.append(content)
            self.sink.content_delta(content)
        self._end_message(token)

    def _content_bytes(self, chunk: bytes) -> None:
        delta = self._decoder.decode(chunk)
        if delta:
            self._parts.append(delta)
            self.last_content_delta = delta
            self.sink.content_delta(delta)

    def _partial_message(self) -> HarmonyMessage:
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._parts.append(tail)
        header = self._parsed or ParsedHeader(role=self._role or "assistant")
        return HarmonyMessage(
            role=header.role,
            content="".join(self._parts),
            name=header.name,
            recipient=header.recipient,
            channel=header.channel,
            content_type=header.content_type,
        )

    def _end_message(self, reason: str) -> None:
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._parts.append(tail)
            self.last_content_delta = tail
            self.sink.content_delta(tail)
        message = self._partial_message()
        self.messages.append(message)
        self._reset(StreamState.EXPECT_START)
        self.sink.message_end(message, reason)
