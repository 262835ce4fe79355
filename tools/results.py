"""Turning a tool's return value into the text a model reads, within a size budget.

`str` is passed as is; `None` becomes an empty string; pydantic models, dataclasses and other
JSON-able values (dicts, lists, numbers, datetimes, enums...) become compact JSON via pydantic's
serialiser. A value that cannot be serialised is an error, not a `repr` (which could leak object
internals). Over-long text is cut and the cut is marked, so the model knows it saw only part.
Images and documents (`ImagePart`, `DocumentPart`), returned alone or in a list or tuple beside
text (``["the chart:", image]``), become the result's attachments (`split_attachments`).
"""

from __future__ import annotations

from typing import Any

from parley.protocol.envelope import DocumentPart, ImagePart, TextPart

DEFAULT_MAX_RESULT_CHARS = 16_000


class UnserializableResult(TypeError):
    """A tool returned a value that has no JSON form."""


def render_result(value: Any) -> str:
    """The model-facing text of a tool's return value (see the module docstring)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    from pydantic_core import PydanticSerializationError, to_json

    try:
        return to_json(value, inf_nan_mode="null").decode("utf-8")
    except (PydanticSerializationError, TypeError, ValueError, RecursionError):
        raise UnserializableResult(f"a {type(value).__name__} value cannot be serialised to JSON") from None


def split_attachments(value: Any) -> tuple[Any, list[ImagePart | DocumentPart]]:
    """A tool's return value without its images and documents, and those (in order).

    An `ImagePart`/`DocumentPart` alone leaves nothing (``None``: empty text); a list or tuple holding
    some leaves its other items: text (``str``/`TextPart`) joined by newlines, otherwise the one item
    left or the list of them, rendered as usual.
    """
    if isinstance(value, ImagePart | DocumentPart):
        return None, [value]
    if not isinstance(value, list | tuple) or not any(isinstance(v, ImagePart | DocumentPart) for v in value):
        return value, []
    media = [v for v in value if isinstance(v, ImagePart | DocumentPart)]
    rest = [v.text if isinstance(v, TextPart) else v for v in value if not isinstance(v, ImagePart | DocumentPart)]
    if all(isinstance(v, str) for v in rest):
        return "\n".join(rest), media
    return (rest[0] if len(rest) == 1 else rest), media


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """Cut `text` to at most `max_chars` characters including a marker saying how much was dropped."""
    if len(text) <= max_chars:
        return text, False
    marker = f"\n[truncated: showing {{shown}} of {len(text)} characters]"
    shown = max(0, max_chars - len(marker.format(shown=max_chars)))
    return text[:shown] + marker.format(shown=shown), True
