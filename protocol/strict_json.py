"""Strict JSON: one parser for every untrusted JSON text (tool arguments, HTTP bodies).

Python's `json.loads` is lenient in ways that matter when the text comes from a model that may have
been prompt-injected or from a hostile client: it keeps the *last* of duplicate keys silently
(`{"path": "ok", "path": "../../etc/passwd"}`), accepts `NaN`/`Infinity`, turns `1e999` into
`inf`, and recurses until `RecursionError` on deep nesting. `loads_strict` refuses all of these with
a `StrictJsonError` whose `code` says which, checking the byte size first and the nesting depth
before parsing, so a hostile payload costs at most one linear scan. (The sandbox keeps its own
copy for its result channel: that layer imports nothing of ours.)
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any, Literal

from parley.protocol.errors import ProtocolError

StrictJsonCode = Literal["too_large", "not_json", "duplicate_key", "non_finite_number", "too_deep"]

_STRING_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class StrictJsonError(ProtocolError):
    """Untrusted JSON text was refused; `code` is machine-readable, the message never echoes input."""

    def __init__(self, message: str, *, code: StrictJsonCode, key: str | None = None) -> None:
        super().__init__(message)
        self.code: StrictJsonCode = code
        self.key = key
        """The repeated key, for `duplicate_key`."""


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


def decode_utf8_bounded(data: str | bytes, *, max_bytes: int) -> str:
    """`data` as text, refusing more than `max_bytes` of UTF-8 (before decoding or encoding it whole)."""
    if isinstance(data, bytes | bytearray):
        if len(data) > max_bytes:
            raise StrictJsonError(f"too large ({len(data)} bytes; the limit is {max_bytes})", code="too_large")
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrictJsonError(f"not valid UTF-8 (byte {exc.start})", code="not_json") from None
    if isinstance(data, str):
        # Cheap upper bound first (4 bytes per code point) so a huge string is refused before encoding it.
        if len(data) > max_bytes or len(data.encode("utf-8", "surrogatepass")) > max_bytes:
            size = len(data.encode("utf-8", "surrogatepass"))
            raise StrictJsonError(f"too large ({size} bytes; the limit is {max_bytes})", code="too_large")
        return data
    raise StrictJsonError("not JSON text", code="not_json")


def loads_strict(data: str | bytes, *, max_bytes: int, max_depth: int) -> Any:
    """Parse untrusted JSON text, refusing anything ambiguous (see the module docstring)."""
    text = decode_utf8_bounded(data, max_bytes=max_bytes)
    if nesting_depth(text) > max_depth:
        raise StrictJsonError(f"nested deeper than {max_depth} levels", code="too_deep")
    try:
        return json.loads(
            text,
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except _DuplicateKey as exc:
        shown = exc.key if len(exc.key) <= 40 else exc.key[:40] + "…"
        raise StrictJsonError(
            f"duplicate key {shown!r}; each key may appear once", code="duplicate_key", key=exc.key
        ) from None
    except _NonFinite:
        raise StrictJsonError(
            "NaN, Infinity or an out-of-range number; only finite numbers are allowed", code="non_finite_number"
        ) from None
    except json.JSONDecodeError as exc:
        raise StrictJsonError(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", code="not_json"
        ) from None
    except (ValueError, RecursionError):  # e.g. an integer beyond CPython's 4300-digit limit
        raise StrictJsonError("not valid JSON (a value is out of range)", code="not_json") from None
