"""The chat-template stream parser: model output (text chunks or token ids) -> events and messages.

It understands the ChatML transcript frame (``<|im_start|>role\\n ... <|im_end|>``) and, inside an
assistant message, the convention the chat-template codec renders: ``<think>...</think>`` for
reasoning (the analysis channel) and ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
blocks for tool calls. A completion usually starts inside an assistant message (the generation
prompt already opened it), so the header is optional.

Two feeding modes keep the trust boundary: text chunks are scanned for the frame markers (the text
level cannot tell a marker from look-alike text), while token ids carry the frame only as special
ids, so ``<|im_start|>`` spelt with ordinary tokens stays plain text. The parser never raises while
fed: malformed input becomes an `ErrorEvent`, the partial message is flushed, and parsing goes on.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.protocol.envelope import Channel, Message, Part, ReasoningPart, Role, TextPart, ToolCall
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

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
THINK_OPEN = "<think>"
THINK_END = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
REASONING_CLOSE = "\n" + THINK_END + "\n\n"
"""What closes a reasoning block in a rendered assistant message."""

_ROLES = {"system": Role.SYSTEM, "developer": Role.DEVELOPER, "user": Role.USER, "assistant": Role.ASSISTANT,
          "tool": Role.TOOL}
_MAX_HEADER = 64
_MAX_UTF8_HOLD = 4
_CALL_PREFIX = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)')


def _decoder_of(tokenizer: Any) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, skip_special_tokens=False)`, by the shortest route that gives the same text.

    The parser decodes twice per token; through transformers' wrapper a decode costs about five times
    the Rust call itself (argument conversion, batching checks, cleanup options). Its fast tokenizers
    (`TokenizersBackend`) add nothing to the Rust result unless `clean_up_tokenization_spaces` is set,
    so for one whose `decode` is not overridden the backend is called directly.
    """
    backend: Any = getattr(tokenizer, "_tokenizer", None)
    module = sys.modules.get("transformers.tokenization_utils_tokenizers")
    base = getattr(module, "TokenizersBackend", None) if module is not None else None
    cls = type(tokenizer)
    if (
        base is not None
        and isinstance(tokenizer, base)
        and cls.decode is base.decode
        and cls._decode is base._decode
        and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False
        and callable(getattr(backend, "decode", None))
    ):
        fast: Callable[[list[int]], str] = lambda ids: backend.decode(ids, skip_special_tokens=False)  # noqa: E731
        return fast
    return lambda ids: str(tokenizer.decode(ids, skip_special_tokens=False))


def call_id(index: int) -> str:
    """The deterministic id of the `index`-th tool call a parser has seen (``call_0``, ``call_1``...)."""
    return f"call_{index}"


def decode_tool_call(body: str, *, strict: bool) -> tuple[str, str] | str:
    """Parse a ``<tool_call>`` body into (name, arguments JSON text), or return an error message."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return f"tool call is not valid JSON: {exc}"
    if not isinstance(value, dict):
        return "tool call must be a JSON object with 'name' and 'arguments'"
    name = value.get("name")
    args: Any = value.get("arguments", None if strict else value.get("parameters", {}))
    if not strict and isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            pass
    if not isinstance(name, str) or not name:
        return "tool call has no string 'name'"
    if not isinstance(args, dict):
        return f"arguments of tool call {name!r} must be a JSON object"
    return name, json.dumps(args, ensure_ascii=False, separators=(",", ":"))


@dataclass
class _MessageBuilder:
    role: Role
    parts: list[Part] = field(default_factory=list)

    def add_text(self, text: str, reasoning: bool) -> None:
        kind = ReasoningPart if reasoning else TextPart
        last = self.parts[-1] if self.parts else None
        if isinstance(last, kind) and not isinstance(last, ToolCall):
            last.text += text
        else:
            self.parts.append(ReasoningPart(text=text) if reasoning else TextPart(text=text))


class StreamParser:
    """Incremental parser for chat-template model output; see the module docstring.

    ``tokenizer`` (duck-typed: ``decode``, ``convert_ids_to_tokens``, ``all_special_ids``) is needed
    only for `feed_token`. ``start_in_reasoning`` says the prompt ended with ``<think>``.
    """

    _builder: _MessageBuilder
    _header: str | None
    _opened: bool
    _mode: str
    """"text", "think" or "call"."""
    _buf: str
    _pending_ws: str
    _at_run_start: bool
    _call_buf: str
    _call_started: bool
    _call_args_from: int
    _call_args_sent: int

    def __init__(
        self,
        tokenizer: Any = None,
        *,
        strict: bool = False,
        start_in_reasoning: bool = False,
        role: Role = Role.ASSISTANT,
        call_ids: Callable[[int], str] = call_id,
    ) -> None:
        self._tokenizer = tokenizer
        self._strict = strict
        self._call_ids = call_ids
        self.messages: list[Message] = []
        self._calls_seen = 0
        self._special_ids: set[int] = set(getattr(tokenizer, "all_special_ids", []) or []) if tokenizer else set()
        self._decode = _decoder_of(tokenizer) if tokenizer is not None else None
        self._vocab_len: int | None = None  # len(tokenizer), read once: it costs microseconds per call
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._text_buf = ""
        self._start_new(role, start_in_reasoning, opened=True)

    # -- state, as Harmony's parser exposes it -----------------------------------------------
    @property
    def current_role(self) -> Role | None:
        """The role of the message being parsed (None while reading a header)."""
        return None if self._header is not None else self._builder.role

    @property
    def current_channel(self) -> str | None:
        """``analysis`` inside ``<think>``, ``commentary`` inside ``<tool_call>``, else ``final``."""
        if self._header is not None or self._builder.role is not Role.ASSISTANT:
            return None
        return {"think": Channel.ANALYSIS, "call": Channel.COMMENTARY}.get(self._mode, Channel.FINAL).value

    # -- public feeding API -------------------------------------------------------------------
    def feed_text(self, chunk: str) -> list[Event]:
        """Feed decoded text; frame markers in it are structure (text level trusts the markers)."""
        out: list[Event] = []
        try:
            self._text_buf += chunk
            while self._text_buf:
                cut = self._next_frame_marker(self._text_buf)
                if cut is None:
                    keep = self._partial_marker_len(self._text_buf, (IM_START, IM_END, END_OF_TEXT))
                    body, self._text_buf = self._text_buf[: len(self._text_buf) - keep], self._text_buf[
                        len(self._text_buf) - keep :
                    ]
                    if body:
                        self._content(body, out)
                    break
                start, marker = cut
                if start:
                    self._content(self._text_buf[:start], out)
                self._text_buf = self._text_buf[start + len(marker) :]
                self._frame(marker, out)
        except Exception as exc:  # never raise mid-stream
            self._text_buf = ""
            self._recover("internal_error", exc, out)
        return out

    def feed_token(self, token_id: int) -> list[Event]:
        """Feed one token id; only special ids count as frame markers."""
        return self.feed_tokens([token_id])

    def feed_tokens(self, token_ids: Iterable[int]) -> list[Event]:
        out: list[Event] = []
        for token_id in token_ids:
            try:
                self._one_token(int(token_id), out)
            except Exception as exc:  # never raise mid-stream
                self._ids, self._prefix, self._read = [], 0, 0
                self._recover("invalid_token", exc, out)
        return out

    def finish(self, finish_reason: str | None = "stop") -> list[Event]:
        """End of the stream: flush held text and close the current message if it has content."""
        out: list[Event] = []
        try:
            self._flush_utf8(out, final=True)
            if self._text_buf:
                tail, self._text_buf = self._text_buf, ""
                self._content(tail, out)
            if self._header is not None:
                self._error("incomplete_header", f"stream ended inside a message header {self._header!r}", out)
            self._end_message(out, finish_reason)
        except Exception as exc:
            self._recover("internal_error", exc, out)
        return out

    # -- token decoding -------------------------------------------------------------------------
    def _one_token(self, token_id: int, out: list[Event]) -> None:
        tok = self._tokenizer
        if tok is None:
            raise TypeError("feed_token needs a tokenizer")
        if self._vocab_len is None:
            self._vocab_len = len(tok)
        if token_id < 0 or token_id >= self._vocab_len:
            self._error("invalid_token", f"token id {token_id} is outside the vocabulary", out)
            return
        if token_id in self._special_ids:
            self._flush_utf8(out, final=True)
            marker = tok.convert_ids_to_tokens(token_id)
            if marker in (IM_START, IM_END, END_OF_TEXT) or token_id == getattr(tok, "eos_token_id", None):
                self._frame(marker if marker in (IM_START, IM_END) else END_OF_TEXT, out)
            else:
                self._content(marker, out)
            return
        self._ids.append(token_id)
        self._flush_utf8(out, final=False)

    def _flush_utf8(self, out: list[Event], *, final: bool) -> None:
        """Incremental detokenisation that holds incomplete UTF-8 (replacement char) back."""
        if self._read >= len(self._ids):
            self._ids, self._prefix, self._read = [], 0, 0
            return
        decode = self._decode
        assert decode is not None  # ids are only collected with a tokenizer
        before = decode(self._ids[self._prefix : self._read])
        now = decode(self._ids[self._prefix :])
        held = len(self._ids) - self._read
        if now.endswith("\ufffd") and not final and held < _MAX_UTF8_HOLD:
            return
        if now.endswith("\ufffd"):
            self._error("invalid_utf8", "token ids decode to invalid UTF-8 (replaced by U+FFFD)", out)
        delta = now[len(before) :] if now.startswith(before) else now
        self._prefix, self._read = self._read, len(self._ids)
        if final:
            self._ids, self._prefix, self._read = [], 0, 0
        if delta:
            self._content(delta, out)

    # -- framing ----------------------------------------------------------------------------------
    def _frame(self, marker: str, out: list[Event]) -> None:
        if marker == IM_START:
            if self._header is not None:
                self._error("incomplete_header", f"message header {self._header!r} was not finished", out)
            elif self._has_content():
                self._error("unexpected_start", "a new message started before the previous one ended", out)
                self._end_message(out, "stop")
            self._start_new(Role.ASSISTANT, False, opened=False)
            self._header = ""
            return
        # IM_END or end of text
        if self._header is not None:
            self._error("incomplete_header", f"message ended inside its header {self._header!r}", out)
            self._header = None
            self._opened = True
        self._end_message(out, "stop")

    def _content(self, text: str, out: list[Event]) -> None:
        if self._header is not None:
            self._header += text
            # only a newline within the first _MAX_HEADER + 1 characters ends a header, so whether a long one
            # is bad never depends on where the chunks were cut
            newline = self._header.find("\n", 0, _MAX_HEADER + 1)
            if newline < 0:
                if len(self._header) > _MAX_HEADER:
                    bad, self._header = self._header, None
                    self._error("bad_header", f"message header too long: {bad[:_MAX_HEADER]!r}", out)
                    self._start_new(Role.ASSISTANT, False, opened=True)
                    self._scan(bad, out)
                return
            name, rest = self._header[:newline].strip(), self._header[newline + 1 :]
            self._header = None
            role = _ROLES.get(name)
            if role is None:
                self._error("unknown_role", f"unknown role {name!r} in message header", out)
                role = Role.USER
            self._start_new(role, False, opened=True)
            text = rest
            if not text:
                return
        self._scan(text, out)

    # -- assistant content scanner --------------------------------------------------------------
    def _scan(self, text: str, out: list[Event]) -> None:
        if self._builder.role is not Role.ASSISTANT:
            self._emit_text(text, out)
            return
        self._buf += text
        while self._buf:
            if self._mode == "call":
                end = self._buf.find(TOOL_CALL_CLOSE)
                if end < 0:
                    keep = self._partial_marker_len(self._buf, (TOOL_CALL_CLOSE,))
                    self._call_body(self._buf[: len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep :]
                    return
                self._call_body(self._buf[:end], out)
                self._buf = self._buf[end + len(TOOL_CALL_CLOSE) :]
                self._close_call(out)
                continue
            markers = (THINK_END,) if self._mode == "think" else (THINK_OPEN, TOOL_CALL_OPEN)
            hit = min(((i, m) for m in markers if (i := self._buf.find(m)) >= 0), default=None)
            if hit is None:
                keep = self._partial_marker_len(self._buf, markers)
                self._emit_text(self._buf[: len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep :]
                return
            index, marker = hit
            self._emit_text(self._buf[:index], out)
            self._buf = self._buf[index + len(marker) :]
            self._pending_ws = ""
            self._at_run_start = True
            if marker == THINK_OPEN:
                self._mode = "think"
            elif marker == THINK_END:
                self._mode = "text"
            else:
                self._mode, self._call_buf, self._call_args_sent, self._call_started = "call", "", 0, False

    def _emit_text(self, text: str, out: list[Event]) -> None:
        """Emit text; in assistant messages a run's outer whitespace (the template's layout) is dropped."""
        if not text:
            return
        if not self._is_assistant():
            self._builder.add_text(text, False)
            out.append(TextDelta(text=text, channel=None))
            return
        if self._at_run_start:
            text = text.lstrip()
            if not text:
                return
            self._at_run_start = False
        text = self._pending_ws + text
        stripped = text.rstrip()
        self._pending_ws = text[len(stripped) :]
        if not stripped:
            return
        reasoning = self._mode == "think"
        self._builder.add_text(stripped, reasoning)
        if reasoning:
            out.append(ReasoningDelta(text=stripped))
        else:
            out.append(TextDelta(text=stripped, channel=Channel.FINAL.value if self._is_assistant() else None))

    def _call_body(self, text: str, out: list[Event]) -> None:
        self._call_buf += text
        if not self._call_started:
            match = _CALL_PREFIX.match(self._call_buf)
            if match is None:
                return
            try:
                name = json.loads(f'"{match.group(1)}"')
            except ValueError:
                return
            self._call_started = True
            self._call_args_from = match.end()
            out.append(ToolCallStart(index=self._calls_seen, id=self._call_ids(self._calls_seen), name=name))
        # Stream argument text, holding back what might be the closing brace of the outer object.
        args = self._call_buf[self._call_args_from :]
        safe = len(args.rstrip().rstrip("}").rstrip()) if args.rstrip().endswith("}") else len(args.rstrip())
        if safe > self._call_args_sent:
            out.append(ToolCallDelta(index=self._calls_seen, arguments_delta=args[self._call_args_sent : safe]))
            self._call_args_sent = safe

    def _close_call(self, out: list[Event]) -> None:
        self._mode, self._at_run_start, self._pending_ws = "text", True, ""
        body, self._call_buf = self._call_buf, ""
        decoded = decode_tool_call(body, strict=self._strict)
        index = self._calls_seen
        if isinstance(decoded, str):
            if self._call_started:
                self._calls_seen += 1  # its index and id were announced: never reuse them
            self._error("invalid_tool_call", f"tool call {index}: {decoded}", out)
            self._raw_text(f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}", out)
            return
        name, arguments = decoded
        if not self._call_started:
            out.append(ToolCallStart(index=index, id=self._call_ids(index), name=name))
            out.append(ToolCallDelta(index=index, arguments_delta=arguments))
        else:
            # Keep the model's own spelling when it is the same object, so the deltas add up to it.
            raw = body[self._call_args_from :].rstrip()
            raw = raw[:-1].rstrip() if raw.endswith("}") else raw
            try:
                same = json.loads(raw) == json.loads(arguments)
            except (ValueError, RecursionError):
                same = False
            if same and raw.startswith(body[self._call_args_from :][: self._call_args_sent]):
                arguments = raw
            if len(arguments) > self._call_args_sent and arguments.startswith(
                body[self._call_args_from :][: self._call_args_sent]
            ):
                out.append(ToolCallDelta(index=index, arguments_delta=arguments[self._call_args_sent :]))
        call = ToolCall(id=self._call_ids(index), name=name, arguments=arguments)
        self._calls_seen += 1
        self._builder.parts.append(call)
        out.append(ToolCallEnd(index=index, call=call))

    # -- message lifecycle ----------------------------------------------------------------------
    def _start_new(self, role: Role, in_reasoning: bool, *, opened: bool) -> None:
        """Begin a message; an `opened` one (header seen, or the completion's own) ends even if empty."""
        self._builder = _MessageBuilder(role=role)
        self._opened = opened
        self._header = None
        self._mode = "think" if in_reasoning else "text"
        self._buf = ""
        self._pending_ws = ""
        self._at_run_start = True
        self._call_buf = ""
        self._call_started = False
        self._call_args_from = 0
        self._call_args_sent = 0

    def _is_assistant(self) -> bool:
        return self._builder.role is Role.ASSISTANT

    def _has_content(self) -> bool:
        return bool(self._builder.parts or self._buf.strip() or self._call_buf)

    def _end_message(self, out: list[Event], finish_reason: str | None) -> None:
        if self._mode == "call":
            if self._call_started:
                self._calls_seen += 1
            self._error("incomplete_tool_call", "message ended inside a <tool_call> block", out)
            self._raw_text(TOOL_CALL_OPEN + self._call_buf + self._buf, out)
            self._buf = ""
        elif self._buf:
            self._emit_text(self._buf, out)
            self._buf = ""
        if not self._builder.parts and not self._opened:
            self._start_new(Role.ASSISTANT, False, opened=False)
            return
        message = Message(role=self._builder.role, parts=list(self._builder.parts))
        if self._is_assistant() and message.tool_calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        self.messages.append(message)
        out.append(MessageEnd(message=message, finish_reason=finish_reason))
        self._start_new(Role.ASSISTANT, False, opened=False)

    def _raw_text(self, text: str, out: list[Event]) -> None:
        """A tool call that did not parse stays what the model wrote: text, in the message and the stream."""
        self._builder.parts.append(TextPart(text=text))
        out.append(TextDelta(text=text, channel=Channel.FINAL.value if self._is_assistant() else None))

    def _error(self, code: str, message: str, out: list[Event]) -> None:
        out.append(ErrorEvent(code=code, message=message))

    def _recover(self, code: str, exc: Exception, out: list[Event]) -> None:
        """After an unexpected failure: report it, flush the partial message, reset."""
        self._error(code, f"{type(exc).__name__}: {exc}", out)
        try:
            self._end_message(out, "error")
        except Exception:  # the partial message itself is broken: drop it, keep going
            self._start_new(Role.ASSISTANT, False, opened=False)

    # -- helpers ----------------------------------------------------------------------------------
    @staticmethod
    def _next_frame_marker(text: str) -> tuple[int, str] | None:
        found = [(i, m) for m in (IM_START, IM_END, END_OF_TEXT) if (i := text.find(m)) >= 0]
        return min(found) if found else None

    @staticmethod
    def _partial_marker_len(text: str, markers: Sequence[str]) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a marker."""
        best = 0
        for marker in markers:
            for n in range(min(len(marker) - 1, len(text)), best, -1):
                if text.endswith(marker[:n]):
                    best = n
                    break
        return best
