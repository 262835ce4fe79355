"""Strict parsing of tool-call arguments: the JSON text a model produced, before any code runs.

The parsing itself is `parley.protocol.strict_json` (duplicate keys, NaN/Infinity, `1e999`, deep
nesting and oversized payloads refused before anything runs); this module turns its refusals into
`ToolArgumentError`s and requires a JSON object.
"""

from __future__ import annotations

from typing import Any

from parley.protocol.strict_json import StrictJsonError, decode_utf8_bounded, loads_strict
from parley.tools.errors import ToolArgumentError

DEFAULT_MAX_BYTES = 256 * 1024
"""Default cap on the UTF-8 size of one call's arguments."""

DEFAULT_MAX_DEPTH = 32
"""Default cap on nesting of arrays/objects (the top-level object is depth 1)."""

_JSON_KIND = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def parse_arguments(
    arguments_json: str | bytes,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    tool: str | None = None,
) -> dict[str, Any]:
    """Parse a tool call's argument text into a JSON object, refusing anything ambiguous.

    Empty or all-whitespace text counts as `{}` (models emit it for tools without parameters).
    Raises `ToolArgumentError` with `code` one of: `too_large`, `not_json`, `duplicate_key`,
    `non_finite_number`, `too_deep`, `not_object`, `invalid_string`.
    """
    try:
        text = decode_utf8_bounded(arguments_json, max_bytes=max_bytes)
        if not text.strip():
            return {}
        value = loads_strict(text, max_bytes=max_bytes, max_depth=max_depth)
    except StrictJsonError as exc:
        raise ToolArgumentError(f"arguments: {exc}", code=exc.code, tool=tool) from None
    if not isinstance(value, dict):
        kind = _JSON_KIND.get(type(value), "null")
        raise ToolArgumentError(f"arguments must be a JSON object, not {kind}", code="not_object", tool=tool)
    if _has_lone_surrogate(value):
        raise ToolArgumentError("arguments contain an unpaired UTF-16 surrogate", code="invalid_string", tool=tool)
    return value
