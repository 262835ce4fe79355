"""The envelope: one message type for every backend.

A `Message` is Harmony-shaped (role, channel, recipient, content type) and carries a list of
*parts* discriminated by `kind`: text (a compaction summary is a `SummaryPart`, a kind of text),
reasoning (with a provider signature or a redacted payload), tool calls, tool results, images and
documents, and a provider's own compaction (`CompactionPart`, kept verbatim). Codecs (Harmony,
chat templates, Anthropic and OpenAI wire JSON) only translate
envelopes; nothing else in parley depends on a provider's shape.

Media parts (`ImagePart`: png, jpeg, gif or webp; `DocumentPart`: PDF) hold a URL or bytes. Bytes
are content-hashed: the part carries their ``sha256``, checked whenever the part is built or loaded
(`BlobIntegrityError`). In JSON, bytes are inline base64, or, when serialised with a blob store
(`parley.protocol.blobs`) and larger than its ``inline_limit`` (256 KiB by default), kept in the
store with only the hash and media type in the JSON; loading such JSON without the store raises
`MissingBlobError` naming the hash. A tool result's images and documents are its `attachments`
(its `content` stays the text, so every text reader keeps working); ``ToolResult(content=[...])``
with text and media parts splits them.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from parley.protocol.blobs import BlobStore, blob_context, inline_limit_of, sha256_of, store_in
from parley.protocol.errors import (
    BlobIntegrityError,
    InvalidArgumentsError,
    MissingBlobError,
    OrphanToolResultError,
    UnsupportedPartError,
)


class Role(str, Enum):
    """Author roles, in Harmony's order of instruction priority."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Channel(str, Enum):
    """Harmony's well-known channels; any other string is allowed too."""

    ANALYSIS = "analysis"
    COMMENTARY = "commentary"
    FINAL = "final"


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Part):
    """Plain text content."""

    kind: Literal["text"] = "text"
    text: str


class SummaryPart(TextPart):
    """A summary standing in for earlier messages, written by compaction (`parley.compaction`).

    A kind of `TextPart` (``isinstance(part, TextPart)`` holds), so every codec renders it as the
    text it is; its own `kind` lets code (and the JSON) tell a summary from what a person wrote."""

    kind: Literal["summary"] = "summary"  # type: ignore[assignment]


class ReasoningPart(_Part):
    """Chain of thought; `signature`/`redacted` are opaque provider payloads sent back unchanged."""

    kind: Literal["reasoning"] = "reasoning"
    text: str = ""
    signature: str | None = None
    """Anthropic's thinking signature (or another provider's integrity token)."""
    redacted: str | None = None
    """An encrypted/redacted reasoning payload; `text` is empty when this is set."""
    provider: str | None = None
    """Which provider produced the signature or payload; other providers drop them."""


class CompactionPart(_Part):
    """A provider's own (server-side) compaction of the earlier conversation, kept verbatim.

    Anthropic returns a ``compaction`` content block (its ``content`` is a readable summary; it may
    carry ``encrypted_content`` and a ``signature``), OpenAI's Responses API a ``compaction`` output
    item (``encrypted_content`` only, opaque). Either must be sent back unchanged on later requests,
    like a thinking signature, and only to the provider that made it: `payload` is the block/item as
    received, `text` the readable summary where there is one (never sent; for people and logs).
    Other providers' codecs drop it (`parley.protocol._wire_history`): the messages it summarised
    are still in the conversation, so nothing is lost by switching.
    """

    kind: Literal["compaction"] = "compaction"
    provider: str
    payload: dict[str, Any]
    text: str = ""


class ToolCall(_Part):
    """A model's request to run a tool. `arguments` is the JSON text exactly as produced."""

    kind: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_as_json_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return value

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a JSON object, or `InvalidArgumentsError`."""
        try:
            value = json.loads(self.arguments)
        except (ValueError, RecursionError) as exc:
            raise InvalidArgumentsError(f"arguments of tool call {self.id!r} are not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise InvalidArgumentsError(f"arguments of tool call {self.id!r} must be a JSON object")
        return value


ImageMediaType = Literal["image/png", "image/jpeg", "image/gif", "image/webp"]
IMAGE_MEDIA_TYPES: tuple[str, ...] = ("image/png", "image/jpeg", "image/gif", "image/webp")
PDF_MEDIA_TYPE = "application/pdf"
_MEDIA_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}


def sniff_image_type(data: bytes) -> str | None:
    """The media type of png, jpeg, gif or webp bytes, read from their signature (None if unknown)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def decode_base64(text: str) -> bytes:
    """Standard base64 (whitespace ignored, padding required); `ValueError` on anything else."""
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("data is not valid base64") from None


def parse_data_url(url: str) -> tuple[str, bytes]:
    """``data:<media type>[;base64],<payload>`` as (media type, bytes); `ValueError` if malformed."""
    if not url[:5].lower() == "data:" or "," not in url:
        raise ValueError("a data URL looks like data:<media type>;base64,<data>")
    header, _, payload = url[5:].partition(",")
    fields = [f.strip() for f in header.split(";")]
    media_type = (fields[0] or "text/plain").lower()
    if any(f.lower() == "base64" for f in fields[1:]):
        return media_type, decode_base64(payload)
    return media_type, urllib.parse.unquote_to_bytes(payload)


_M = TypeVar("_M", bound="_MediaPart")


class _MediaPart(_Part):
    """A URL, or bytes with their sha256 (see the module docstring for how JSON carries them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _what: ClassVar[str] = "media"

    url: str | None = None
    """An http(s) URL the provider fetches (a ``data:`` URL is turned into `data` on the way in)."""
    data: bytes | None = Field(default=None, repr=False)
    """The bytes (base64 text is accepted and decoded)."""
    sha256: str | None = None
    """Lowercase hex sha256 of `data`, computed when the part is built; None for a URL."""
    _wire_path: str | None = PrivateAttr(default=None)
    """Where a request decoder found the part (``messages[0].content[1]``), so that a refusal names the
    client's own position; not part of the value (equality, hash, JSON)."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _MediaPart):
            return type(self) is type(other) and self.__dict__ == other.__dict__
        return NotImplemented

    __hash__ = BaseModel.__hash__

    def noted_at(self: _M, path: str) -> _M:
        """This part, remembering the request position `path` it was decoded from (returns self)."""
        self._wire_path = path
        return self

    @model_validator(mode="before")
    @classmethod
    def _bytes_in(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            return value
        fields = dict(value)
        data = fields.get("data")
        if isinstance(data, str):
            fields["data"] = data = decode_base64(data)
        elif isinstance(data, bytearray | memoryview):
            fields["data"] = data = bytes(data)
        url = fields.get("url")
        if isinstance(url, str) and url[:5].lower() == "data:":
            if data is not None:
                raise ValueError("give a data: URL or data, not both")
            media_type, fields["data"] = parse_data_url(url)
            data = fields["data"]
            fields["url"] = None
            fields.setdefault("media_type", media_type)
        sha = fields.get("sha256")
        if isinstance(sha, str):
            fields["sha256"] = sha = sha.lower()
        if data is None and fields.get("url") is None and isinstance(sha, str):
            store = store_in(info.context)
            if store is None:
                raise MissingBlobError(
                    f"this {cls._what} part's bytes are in a blob store (sha256 {sha}); load it with that store "
                    "(e.g. RunState.from_json(text, blobs=FolderBlobStore(...)))",
                    sha256=sha,
                )
            fields["data"] = data = store.get(sha)
        if isinstance(data, bytes):
            digest = sha256_of(data)
            if isinstance(sha, str) and sha != digest:
                raise BlobIntegrityError(
                    f"this {cls._what} part's bytes hash to {digest}, not to its recorded sha256 {sha}",
                    expected=sha, actual=digest,
                )
            fields["sha256"] = digest
        return cls._fill_media_type(fields)

    @classmethod
    def _fill_media_type(cls, fields: dict[str, Any]) -> dict[str, Any]:
        return fields

    @model_validator(mode="after")
    def _one_source(self) -> Any:
        if (self.url is None) == (self.data is None):
            raise ValueError(f"a {self._what} part needs a url or data (bytes), and not both")
        if self.url is not None and not self.url:
            raise ValueError("url must not be empty")
        if self.url is not None and self.sha256 is not None:
            raise ValueError("sha256 is the hash of data; a url part has none")
        return self

    @field_serializer("data", when_used="json")
    def _data_as_base64(self, data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    @model_serializer(mode="wrap")
    def _json_shape(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        out = {"kind": out.pop("kind", self.kind), **out}  # type: ignore[attr-defined]
        if info.mode_is_json():
            store = store_in(info.context)
            if self.data is not None and store is not None and len(self.data) > inline_limit_of(store):
                store.put(self.data)
                out.pop("data", None)
            for key in ("url", "data", "title"):
                if key in out and out[key] is None:
                    del out[key]
        return out

    # -- views --------------------------------------------------------------------------------------
    @property
    def size(self) -> int | None:
        """The number of bytes (None for a URL)."""
        return None if self.data is None else len(self.data)

    def base64(self) -> str:
        """The bytes as standard base64 (`ValueError` for a URL part)."""
        if self.data is None:
            raise ValueError(f"this {self._what} part is a URL; it has no bytes")
        return base64.b64encode(self.data).decode("ascii")

    def data_url(self) -> str:
        """``data:<media type>;base64,...`` for a bytes part, the URL itself for a URL part."""
        if self.url is not None:
            return self.url
        return f"data:{getattr(self, 'media_type', None) or 'application/octet-stream'};base64,{self.base64()}"


class ImagePart(_MediaPart):
    """An image: a URL, or png/jpeg/gif/webp bytes with their media type (sniffed from the bytes if omitted)."""

    _what: ClassVar[str] = "image"
    kind: Literal["image"] = "image"
    media_type: ImageMediaType | None = None
    """Required for bytes (read from the signature when omitted); optional for a URL."""

    @classmethod
    def _fill_media_type(cls, fields: dict[str, Any]) -> dict[str, Any]:
        media_type = fields.get("media_type")
        if isinstance(media_type, str):
            media_type = media_type.lower()
            fields["media_type"] = media_type = _MEDIA_ALIASES.get(media_type, media_type)
        data = fields.get("data")
        if media_type is None and isinstance(data, bytes):
            sniffed = sniff_image_type(data)
            if sniffed is None:
                raise ValueError(f"image bytes need a media_type, one of {', '.join(IMAGE_MEDIA_TYPES)}")
            fields["media_type"] = sniffed
        return fields

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str | None = None) -> ImagePart:
        return cls(data=data, media_type=media_type)  # type: ignore[arg-type]

    @classmethod
    def from_url(cls, url: str) -> ImagePart:
        return cls(url=url)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], media_type: str | None = None) -> ImagePart:
        return cls.from_bytes(Path(path).read_bytes(), media_type)


class DocumentPart(_MediaPart):
    """A PDF document: a URL or bytes, with an optional title."""

    _what: ClassVar[str] = "document"
    kind: Literal["document"] = "document"
    media_type: Literal["application/pdf"] = "application/pdf"
    title: str | None = None

    @classmethod
    def _fill_media_type(cls, fields: dict[str, Any]) -> dict[str, Any]:
        if isinstance(fields.get("media_type"), str):
            fields["media_type"] = fields["media_type"].lower()
        return fields

    @classmethod
    def from_bytes(cls, data: bytes, *, title: str | None = None) -> DocumentPart:
        return cls(data=data, title=title)

    @classmethod
    def from_url(cls, url: str, *, title: str | None = None) -> DocumentPart:
        return cls(url=url, title=title)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], *, title: str | None = None) -> DocumentPart:
        return cls.from_bytes(Path(path).read_bytes(), title=title)


MediaPart = ImagePart | DocumentPart
Attachment = Annotated[ImagePart | DocumentPart, Field(discriminator="kind")]
"""What a tool result may carry besides its text."""


class ToolResult(_Part):
    """The outcome of a tool call, addressed by `call_id`."""

    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str
    """The result's text (what text-only codecs send)."""
    is_error: bool = False
    attachments: list[Attachment] = Field(default_factory=list)
    """Images and documents the tool returned (left out of the JSON when there are none)."""

    @model_validator(mode="before")
    @classmethod
    def _split_content(cls, value: Any) -> Any:
        """``content=[text, image, ...]``: the text parts become `content`, the media `attachments`."""
        if not isinstance(value, dict) or not isinstance(value.get("content"), list | tuple):
            return value
        texts: list[str] = []
        media: list[Any] = list(value.get("attachments") or [])
        for item in value["content"]:
            kind = item.get("kind") if isinstance(item, dict) else getattr(item, "kind", None)
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, TextPart):
                texts.append(item.text)
            elif kind == "text" and isinstance(item, dict):
                texts.append(str(item.get("text", "")))
            elif kind in ("image", "document"):
                media.append(item)
            else:
                raise ValueError(f"tool result content may hold text, image and document parts, not {kind or item!r}")
        return {**value, "content": "".join(texts), "attachments": media}

    @model_serializer(mode="wrap")
    def _without_empty_attachments(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if not self.attachments:
            out.pop("attachments", None)
        return out

    @property
    def content_parts(self) -> list[TextPart | ImagePart | DocumentPart]:
        """The text (when not empty) then the attachments, as parts."""
        head: list[TextPart | ImagePart | DocumentPart] = [TextPart(text=self.content)] if self.content else []
        return head + list(self.attachments)


Part = Annotated[
    TextPart | SummaryPart | ReasoningPart | CompactionPart | ToolCall | ToolResult | ImagePart | DocumentPart,
    Field(discriminator="kind"),
]


class CacheMark(BaseModel):
    """A prompt-cache breakpoint placed after a message (Anthropic `cache_control`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl: Literal["5m", "1h"] = "5m"


class Message(BaseModel):
    """One message of a conversation."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["message"] = "message"
    role: Role
    parts: list[Part] = Field(default_factory=list)
    channel: str | None = None
    recipient: str | None = None
    """Harmony `to=`: e.g. `functions.get_weather` on an assistant call, or the tool on a result."""
    name: str | None = None
    """Author name (Harmony `role:name`, OpenAI `name`)."""
    content_type: str | None = None
    """E.g. `json` for `<|constrain|>json`."""
    cache: CacheMark | None = None

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def system(cls, text: str) -> Message:
        return cls(role=Role.SYSTEM, parts=[TextPart(text=text)])

    @classmethod
    def developer(cls, text: str) -> Message:
        return cls(role=Role.DEVELOPER, parts=[TextPart(text=text)])

    @classmethod
    def user(cls, text: str | TextPart | ImagePart | DocumentPart, *more: str | TextPart | ImagePart | DocumentPart
             ) -> Message:
        """A user message: ``Message.user("hi")``, or text and media: ``Message.user("what is this?", image)``."""
        parts: list[Part] = [TextPart(text=item) if isinstance(item, str) else item for item in (text, *more)]
        return cls(role=Role.USER, parts=parts)

    @classmethod
    def assistant(
        cls,
        text: str | None = None,
        *,
        channel: str | None = None,
        reasoning: str | None = None,
        tool_calls: Iterable[ToolCall] = (),
    ) -> Message:
        parts: list[Part] = []
        if reasoning is not None:
            parts.append(ReasoningPart(text=reasoning))
        if text is not None:
            parts.append(TextPart(text=text))
        parts.extend(tool_calls)
        return cls(role=Role.ASSISTANT, parts=parts, channel=channel)

    @classmethod
    def tool(
        cls, call_id: str, name: str, content: str, *, is_error: bool = False,
        attachments: Iterable[ImagePart | DocumentPart] = (),
    ) -> Message:
        result = ToolResult(call_id=call_id, name=name, content=content, is_error=is_error,
                            attachments=list(attachments))
        return cls(role=Role.TOOL, parts=[result], name=name)

    # -- views ----------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """The concatenated text parts (reasoning excluded)."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def reasoning(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, ReasoningPart))

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [p for p in self.parts if isinstance(p, ToolResult)]

    @property
    def media(self) -> list[ImagePart | DocumentPart]:
        """The message's own image and document parts (a tool result's attachments excluded)."""
        return [p for p in self.parts if isinstance(p, ImagePart | DocumentPart)]


class Conversation(BaseModel):
    """An ordered list of messages with a JSON round trip."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["conversation"] = "conversation"
    messages: list[Message] = Field(default_factory=list)

    def __iter__(self) -> Iterator[Message]:  # type: ignore[override]
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def append(self, message: Message) -> None:
        self.messages.append(message)

    def to_json(self, *, blobs: BlobStore | None = None) -> str:
        """JSON; with `blobs`, media bytes over its inline limit go to the store (see the module docstring)."""
        return self.model_dump_json(exclude_defaults=False, context=blob_context(blobs))

    @classmethod
    def from_json(cls, text: str | bytes, *, blobs: BlobStore | None = None) -> Conversation:
        """Load JSON; media stored by hash need `blobs` (`MissingBlobError` names the hash otherwise)."""
        return cls.model_validate_json(text, context=blob_context(blobs))

    def check_tool_pairing(self) -> None:
        """Raise `OrphanToolResultError` if a tool result answers no earlier call."""
        called: set[str] = set()
        for message in self.messages:
            called.update(call.id for call in message.tool_calls)
            for result in message.tool_results:
                if result.call_id not in called:
                    raise OrphanToolResultError(
                        f"tool result for call id {result.call_id!r} ({result.name}) has no matching tool call"
                    )


def media_places(messages: Sequence[Message], *, start: int = 0) -> Iterator[tuple[str, ImagePart | DocumentPart]]:
    """Every image and document of `messages` with the name of its place.

    ``messages[i].content[j]`` is part j of message i (counted from `start`);
    ``messages[i].tool_results[k].attachments[m]`` is attachment m of the k-th tool result of message i.
    """
    for i, message in enumerate(messages, start=start):
        results = 0
        for j, part in enumerate(message.parts):
            if isinstance(part, ImagePart | DocumentPart):
                yield f"messages[{i}].content[{j}]", part
            elif isinstance(part, ToolResult):
                for m, attachment in enumerate(part.attachments):
                    yield f"messages[{i}].tool_results[{results}].attachments[{m}]", attachment
                results += 1


def refuse_media(messages: Sequence[Message], *, reader: str = "this model", start: int = 0) -> None:
    """Raise `UnsupportedPartError` for the first image or document: for codecs of text-only models.

    The part is named by `media_places`, or, when a request decoder noted where it found it
    (`_MediaPart.noted_at`), by that position in the request (a server's 400 names the client's field).
    """
    for place, part in media_places(messages, start=start):
        where = part._wire_path or place  # a decoded request's part is named at its position in the request
        raise UnsupportedPartError(
            f"{where}: {part.kind} input is not supported by {reader} (text only)", where=where, kind=part.kind
        )
