"""Strict parsing of tool-call arguments: the JSON text a model produced, before any code runs.

Python's `json.loads` is lenient in ways that matter when the text comes from a model that may have
been prompt-injected: it keeps the *last* of duplicate keys silently (`{"path": "ok", "path":
"../../etc/passwd"}`), accepts `NaN`/`Infinity`, turns `1e999` into `inf`, and recurses until
`RecursionError` on deep nesting. `parse_arguments` refuses all of these with a typed
`ToolArgumentError`, checking the byte size first and the nesting depth before parsing, so a hostile
payload costs at most one linear scan.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

from parley.tools.errors import ToolArgumentError

DEFAULT_MAX_BYTES = 256 * 1024
"""Default cap on the UTF-8 size of one call's arguments."""

DEFAULT_MAX_DEPTH = 32
"""Default cap on nesting of arrays/objects (the top-level object is depth 1)."""

_STRING_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _NonFinite(ValueError):
    pass


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 overflows to inf
        raise _NonFinite(text)
    return value


def nesting_depth(text: str) -> int:
    """The maximum bracket nesting of JSON `text`, ignoring brackets inside string literals.

    Linear and non-recursive, so it is safe to run on input that would make a parser recurse.
    """
    stripped = _STRING_LITERAL.sub("", text)
    steps = (_DEPTH_STEP[b] for b in _BRACKETS.findall(stripped))
    return max(itertools.accumulate(steps, initial=0))


_JSON_KIND = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _short(key: str, limit: int = 40) -> str:
    return key if len(key) <= limit else key[:limit] + "…"


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
    if isinstance(arguments_json, bytes | bytearray):
        size = len(arguments_json)
        if size > max_bytes:
            raise ToolArgumentError(
                f"arguments are too large ({size} bytes; the limit is {max_bytes})", code="too_large", tool=tool
            )
        try:
            text = bytes(arguments_json).decode("utf-8")
        except UnicodeDecodeError:
            raise ToolArgumentError("arguments are not valid UTF-8", code="not_json", tool=tool) from None
    elif isinstance(arguments_json, str):
        text = arguments_json
        # Cheap upper bound first (4 bytes per code point) so a huge string is refused before encoding it.
        if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
            size = len(text.encode("utf-8", "surrogatepass"))
            raise ToolArgumentError(
                f"arguments are too large ({size} bytes; the limit is {max_bytes})", code="too_large", tool=tool
            )
    else:
        raise ToolArgumentError("arguments must be JSON text", code="not_json", tool=tool)

    if not text.strip():
        return {}
    if nesting_depth(text) > max_depth:
        raise ToolArgumentError(f"arguments are nested deeper than {max_depth} levels", code="too_deep", tool=tool)
    try:
        value = json.loads(
            text,
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except _DuplicateKey as exc:
        raise ToolArgumentError(
            f"duplicate key {_short(exc.key)!r} in arguments; each key may appear once", code="duplicate_key", tool=tool
        ) from None
    except _NonFinite:
        raise ToolArgumentError(
            "arguments contain NaN, Infinity or an out-of-range number; only finite numbers are allowed",
            code="non_finite_number",
            tool=tool,
        ) from None
    except json.JSONDecodeError as exc:
        raise ToolArgumentError(
            f"arguments are not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            code="not_json",
            tool=tool,
        ) from None
    except (ValueError, RecursionError):  # e.g. an integer beyond CPython's 4300-digit limit
        raise ToolArgumentError(
            "arguments are not valid JSON (a value is out of range)", code="not_json", tool=tool
        ) from None
    if not isinstance(value, dict):
        kind = _JSON_KIND.get(type(value), "null")
        raise ToolArgumentError(f"arguments must be a JSON object, not {kind}", code="not_object", tool=tool)
    if _has_lone_surrogate(value):
        raise ToolArgumentError("arguments contain an unpaired UTF-16 surrogate", code="invalid_string", tool=tool)
    return value
