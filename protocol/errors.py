"""Errors of `parley.protocol`: bad envelopes, bad wire JSON, malformed model output."""

from __future__ import annotations

from parley._root import ParleyError


class ProtocolError(ParleyError):
    """A conversation, wire payload or model output does not fit the protocol.

    `param` is the JSON path of the offending field when a wire payload is to blame
    (``messages[2].tool_call_id``), so that a server can name it in its 400; None otherwise.
    """

    param: str | None = None

    def __init__(self, *args: object, param: str | None = None) -> None:
        super().__init__(*args)
        self.param = param


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


class UnencodableTextError(ProtocolError):
    """Text the tokenizer cannot encode (a lone surrogate such as ``"\\ud800"``, or anything else it refuses).

    `where` names the place (``messages[2].content``, ``tools[0].description``, ...; message indexes count
    the conversation's messages), `position` the offending character's offset in that text when known.
    The message never repeats the text itself.
    """

    def __init__(self, message: str, *, where: str, position: int | None = None) -> None:
        super().__init__(message)
        self.where = where
        self.position = position


class CodecConfigError(ProtocolError, ValueError):
    """A codec was built or used without what the operation needs (a tokenizer, a chat template, a known style).

    Also a `ValueError`, as it was before it joined the error tree.
    """


class UnsupportedPartError(ProtocolError):
    """A message part the codec or model cannot carry (an image for a text-only model, a PDF URL for OpenAI...).

    `where` (also `param`) names the part: ``messages[2].content[1]`` for the second part of the third
    message, ``messages[3].tool_results[0].attachments[0]`` for an image a tool returned. Message
    indexes count the conversation's messages, as the codec got them. `kind` is the part's kind.
    """

    def __init__(self, message: str, *, where: str, kind: str) -> None:
        super().__init__(message, param=where)
        self.where = where
        self.kind = kind


class MissingBlobError(ProtocolError):
    """Serialised content refers to bytes by hash that are not at hand: no blob store given, or not in it.

    `sha256` is the hash of the missing bytes.
    """

    def __init__(self, message: str, *, sha256: str) -> None:
        super().__init__(message)
        self.sha256 = sha256


class BlobIntegrityError(ProtocolError):
    """Bytes do not match the sha256 recorded for them (a corrupt blob store or an edited state)."""

    def __init__(self, message: str, *, expected: str, actual: str) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual
