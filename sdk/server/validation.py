"""Strict request parsing: JSON that means one thing, and pydantic errors that name the field.

The seed document's draft server answered 200 to `"max_tokens": "5"`, `5.0` and `true`, and gave
a misspelt `max_tokens` the default. Here a body is parsed with `NaN`/`Infinity` and duplicate keys
refused at the JSON level, then validated by pydantic models in strict mode with `extra="forbid"`,
so a string or bool is never a number, a float is never an int, and an unknown field is an error.
The first problem becomes a 400 whose message and `param` name the field (`messages[1].content`).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from parley.protocol.strict_json import StrictJsonError, loads_strict
from parley.server.errors import ApiError, invalid

ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_JSON_DEPTH = 64
"""Deeper nesting is refused before pydantic sees it (no recursion blow-ups on hostile bodies)."""


class FieldRule(ValueError):
    """A cross-field rule broken inside a model validator, naming the field (relative to that model) to blame."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Parse a request body into a JSON object or raise a 400 that says why.

    Strict (`parley.protocol.strict_json`): duplicate keys, NaN/Infinity, `1e999` and deep nesting
    are refused. The body's size was already capped (413) before it was read.
    """
    if not raw.strip():
        raise invalid("the request body is empty; send a JSON object")
    try:
        value = loads_strict(raw, max_bytes=len(raw), max_depth=MAX_JSON_DEPTH)
    except StrictJsonError as exc:
        raise invalid(f"the request body is {exc}" if exc.code == "too_deep" else f"the request body: {exc}") from None
    if not isinstance(value, dict):
        raise invalid(f"the request body must be a JSON object, not {type(value).__name__}")
    return value


def field_path(loc: tuple[int | str, ...], data: Any = None, *, missing: bool = False) -> str:
    """`("messages", 1, "content")` -> `messages[1].content`.

    Pydantic puts union branch tags (`str`, `list[...]`, a discriminator value) into error locations;
    walking the request alongside keeps only the steps that really index into it, so the path names
    a field of the client's JSON. A final step that is absent is kept only for a missing field.
    """
    out = ""
    current = data
    for position, step in enumerate(loc):
        last = position == len(loc) - 1
        if (
            not last
            and isinstance(current, dict)
            and step in (current.get("type"), current.get("role"))
            and loc[position + 1] in current
        ):
            continue  # a discriminated union's tag (the next step is a field of this object)
        if isinstance(current, dict) and isinstance(step, str) and step in current:
            current = current[step]
        elif isinstance(current, list) and isinstance(step, int) and 0 <= step < len(current):
            current = current[step]
        elif not (last and missing and isinstance(current, dict)) and data is not None:
            continue
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out


_TYPE_WORDS = {
    "int_type": "an integer (not a string, boolean or float)",
    "int_from_float": "an integer (not a float)",
    "float_type": "a number (not a string or boolean)",
    "bool_type": "a boolean",
    "string_type": "a string",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
}


def describe(error: dict[str, Any], data: Any = None, path: str | None = None) -> str:
    """A one-line, client-facing account of one pydantic error."""
    kind = str(error.get("type", ""))
    if path is None:
        path = field_path(tuple(error.get("loc", ())), data, missing=kind == "missing")
    path = path or "body"
    received = error.get("input")
    shown = json.dumps(received, ensure_ascii=False, default=str)[:80] if kind not in ("missing",) else ""
    if kind == "extra_forbidden":
        return f"unknown field {path!r}: this endpoint does not accept it (check the spelling)"
    if kind == "missing":
        return f"missing required field {path!r}"
    if kind in _TYPE_WORDS:
        return f"{path!r} must be {_TYPE_WORDS[kind]}; got {shown}"
    if kind in ("literal_error", "union_tag_invalid", "enum"):
        return f"{path!r}: {error.get('msg', 'invalid value')}; got {shown}"
    if kind == "union_tag_not_found":
        return f"{path!r}: {error.get('msg', 'a discriminator field is missing')}"
    message = str(error.get("msg", "invalid value"))
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return f"{path!r}: {message}" + (f"; got {shown}" if shown and kind != "value_error" else "")


def validate_as(model: type[ModelT], data: dict[str, Any]) -> ModelT:
    """Validate `data` strictly against `model`; the first error becomes a 400 naming its field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = _most_specific(errors)
        path = field_path(tuple(first.get("loc", ())), data, missing=first.get("type") == "missing")
        if first.get("type") in ("union_tag_invalid", "union_tag_not_found"):
            tag = str((first.get("ctx") or {}).get("discriminator", "")).strip("'")
            path = f"{path}.{tag}" if path and tag else path
        rule = (first.get("ctx") or {}).get("error")
        if isinstance(rule, FieldRule):
            path = f"{path}.{rule.field}" if path else rule.field
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise ApiError(f"{path!r}: {rule.message}{more}", param=path, code="invalid_value") from None
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        raise ApiError(
            describe(dict(first), data, path) + more, param=path or None, code=str(first.get("type"))
        ) from None


def _most_specific(errors: list[Any]) -> Any:
    """Of a union's alternatives, report the error that went deepest into the value (the likely intent)."""
    return max(errors, key=lambda error: (len(error.get("loc", ())), error.get("type") != "union_tag_invalid"))
