"""Parsing one Harmony message header (the text between `<|start|>` and `<|message|>`).

The rules follow openai/harmony's parser, because models trained on Harmony emit its variants: the
channel may come before or after the recipient, `<|constrain|>` may follow a word without a space,
and an unknown first word followed by more words is a tool author (`browser.search to=assistant`).
Two extensions, both only where the reference would fail: a lone dotted author (`functions.x`) is a
tool, as the renderer writes it; and `role:name` gives an author name to another role.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from parley.protocol.errors import ParseError, ProtocolError, UnknownRoleError
from parley.protocol.harmony._tokens import CHANNEL, CONSTRAIN
from parley.protocol.harmony._types import HARMONY_ROLES

_ASCII_WS = re.compile(r"[ \t\n\x0c\r]+")
_CHANNEL_VALUE = re.compile(r"[^\s<]*")
_DOTTED_NAME = re.compile(r"[A-Za-z_][\w-]*(\.[\w-]+)+")


@dataclass(frozen=True)
class ParsedHeader:
    role: str
    name: str | None = None
    recipient: str | None = None
    channel: str | None = None
    content_type: str | None = None


class HeaderError(Exception):
    """A header the parser cannot accept; `code` names it for `ErrorEvent`, `error_type` for strict parsing."""

    def __init__(self, code: str, message: str, error_type: type[ProtocolError] = ParseError) -> None:
        super().__init__(message)
        self.code = code
        self.error_type = error_type


def _split_channel(header: str) -> tuple[str, str | None]:
    index = header.find(CHANNEL)
    if index < 0:
        return header, None
    after = header[index + len(CHANNEL) :]
    match = _CHANNEL_VALUE.match(after)
    value = match.group(0) if match else ""
    if not value:
        raise HeaderError("malformed_header", "channel marker present but no channel value found in header")
    return header[:index] + after[len(value) :], value


def _words(header: str) -> list[str]:
    return [word for word in _ASCII_WS.split(header) if word]


def _resolve_role(words: list[str], role: str | None) -> tuple[str, str | None]:
    """Take the author off the front of `words` (in place); returns (role, author name)."""
    if role is not None:
        if words and words[0] == role:
            words.pop(0)
        return role, None
    if not words:
        raise HeaderError("malformed_header", "message header did not contain a role")
    first = words[0]
    if first in HARMONY_ROLES:
        words.pop(0)
        return first, None
    prefix, colon, name = first.partition(":")
    if colon and prefix in HARMONY_ROLES and name:
        words.pop(0)
        return prefix, name
    if len(words) > 1 or first.startswith("to=") or _DOTTED_NAME.fullmatch(first):
        words.pop(0)
        return "tool", first
    raise HeaderError("unknown_role", f"Unknown role: {first}", UnknownRoleError)


def parse_header(header: str, role: str | None) -> ParsedHeader:
    """`role[ to=recipient][<|channel|>channel][ content_type]` in any of the reference's variants."""
    rest, channel = _split_channel(header)
    rest = rest.strip()
    if CONSTRAIN in rest:
        rest = rest.replace(CONSTRAIN, " " + CONSTRAIN).strip()
    words = _words(rest)
    role, name = _resolve_role(words, role)
    recipient: str | None = None
    content_type: str | None = None
    if words:
        count = len(words)
        last = words.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif count == 1:
            content_type = last
        else:
            content_type = last
            raw = words.pop()
            recipient = raw[3:] if raw.startswith("to=") else raw
    if words:
        raise HeaderError("malformed_header", f"unexpected tokens remaining in message header: {words}")
    return ParsedHeader(role=role, name=name, recipient=recipient, channel=channel, content_type=content_type)


def header_as_content(header: str, role: str | None) -> tuple[ParsedHeader, str]:
    """Lenient reading of a header that a stop token ended before `<|message|>`.

    Models sometimes skip `<|message|>` (`I must refuse<|end|>`). The reference's lenient mode keeps
    the channel and takes the other words, a leading role word removed, as the content.
    """
    rest, channel = _split_channel(header)
    words = _words(rest)
    if role is None:
        if not words or words[0] not in HARMONY_ROLES:
            shown = words[0] if words else ""
            raise HeaderError("unknown_role", f"Unknown role: {shown}", UnknownRoleError)
        role = words.pop(0)
    elif words and words[0] == role:
        words.pop(0)
    return ParsedHeader(role=role, channel=channel), " ".join(words)
