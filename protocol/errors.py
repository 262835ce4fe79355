"""Errors of `parley.protocol`: bad envelopes, bad wire JSON, malformed model output."""

from __future__ import annotations

from parley._root import ParleyError


class ProtocolError(ParleyError):
    """A conversation, wire payload or model output does not fit the protocol."""


class UnknownRoleError(ProtocolError):
    """A message names a role that the codec does not know."""


class OrphanToolResultError(ProtocolError):
    """A tool result refers to a call id that no earlier assistant message made."""


class InvalidArgumentsError(ProtocolError):
    """Tool-call arguments are not the JSON object the protocol requires."""


class ParseError(ProtocolError):
    """Completion text or tokens could not be parsed into messages (strict mode)."""


class DecodeError(ProtocolError):
    """Token ids could not be decoded (unknown id, invalid UTF-8 at the end of a stream)."""


class EncodeError(ProtocolError):
    """Text could not be encoded: it holds a special-token string where special tokens are disallowed."""


class VocabularyUnavailableError(ProtocolError):
    """A tokenizer vocabulary (e.g. `o200k_base.tiktoken`) is not available locally; parley never downloads one."""
