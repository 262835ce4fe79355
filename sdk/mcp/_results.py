"""An MCP `CallToolResult` -> what a parley tool returns (text, images, documents), nothing dropped silently.

* text blocks -> the result's text, in order (joined by newlines);
* ``structuredContent`` -> compact JSON text when the server sent no text (servers SHOULD send both;
  when they do, the text is what the model reads);
* images (png/jpeg/gif/webp) -> `ImagePart` attachments; other image types, audio and binary
  resources -> one line naming what was left out (media type, size), so the model knows;
* embedded resources: text -> ``[resource URI]`` and the text; a PDF blob -> a `DocumentPart`,
  an image blob -> an `ImagePart`; resource links -> ``[resource link: NAME <URI>]``;
* ``isError`` -> `ToolError` with the server's text: the executor turns it into an error result the
  model sees (``tool 'fs_delete' failed: ...``).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from parley.protocol.envelope import IMAGE_MEDIA_TYPES, DocumentPart, ImagePart
from parley.tools.errors import ToolError


def _bytes(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _media(data: str, mime: str | None, what: str) -> ImagePart | DocumentPart | str:
    raw = _bytes(data)
    media_type = (mime or "").lower()
    if raw is None:
        return f"[{what} ({media_type or 'unknown type'}) left out: its base64 data is invalid]"
    if media_type in IMAGE_MEDIA_TYPES:
        try:
            return ImagePart.from_bytes(raw, media_type)
        except ValueError:
            return f"[{what} ({media_type}, {len(raw)} bytes) left out: not a valid image]"
    if media_type == "application/pdf":
        return DocumentPart.from_bytes(raw)
    return f"[{what} ({media_type or 'unknown type'}, {len(raw)} bytes) left out: parley cannot pass it on]"


def result_value(result: Any) -> list[Any]:
    """The parts of a successful result (str / ImagePart / DocumentPart), or `ToolError` for ``isError``."""
    parts: list[Any] = []
    for block in result.content or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "image":
            parts.append(_media(block.data, block.mime_type, "image"))
        elif kind == "audio":
            size = len(_bytes(block.data) or b"")
            parts.append(f"[audio ({block.mime_type}, {size} bytes) left out: parley cannot pass audio on]")
        elif kind == "resource_link":
            described = f"[resource link: {block.name} <{block.uri}>]"
            parts.append(f"{described} {block.description}" if block.description else described)
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            if text is not None:
                parts.append(f"[resource {resource.uri}]\n{text}")
            else:
                item = _media(resource.blob, resource.mime_type, f"resource {resource.uri}")
                parts.append(item)
        else:
            parts.append(f"[a {kind or 'unknown'} content block left out: parley does not know it]")
    texts = [p for p in parts if isinstance(p, str)]
    if not texts and result.structured_content is not None:
        structured = json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":"), default=str)
        parts.insert(0, structured)
    if result.is_error:
        message = "\n".join(p for p in parts if isinstance(p, str)) or "the server reported an error"
        raise ToolError(message)
    return parts
