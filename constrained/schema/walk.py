"""Where the subschemas of a JSON Schema are: every step of intake walks the same positions.

A keyword only means something in schema position (`"required"` inside `properties` is a property
name; inside `enum` it is data), so checking, scanning for keywords a backend drops, and every
rewrite share this one walk instead of each guessing which values are schemas. `scan_keywords` lists
every keyword in schema position with its JSON path: backends declare which keywords they do not
enforce, and those must never pass silently (the compiler records a warning and flags the matcher
for validation of its output).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Keywords whose values are maps from names to subschemas.
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
# Keywords whose values are a subschema or a list of subschemas.
_SCHEMA_VALUES = {
    "items", "additionalItems", "prefixItems", "contains", "additionalProperties", "propertyNames",
    "not", "if", "then", "else", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf",
}  # fmt: skip
# Keywords whose values are data, never schemas.
_DATA = {"enum", "const", "default", "examples", "example", "required", "description", "title"}


@dataclass(frozen=True)
class KeywordUse:
    """A keyword at a JSON path of the schema (e.g. `uniqueItems` at `$.properties.tags`)."""

    keyword: str
    path: str
    schema: Any
    reason: str = ""  # why a backend does not enforce it, when not obvious from the keyword


def _child(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"


def iter_subschemas(
    schema: Any, path: str = "$", skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object subschema of `schema` with its path (data keywords and `skip` keywords are not descended into)."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key, value in schema.items():
        if key in _DATA or key in skip:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield from iter_subschemas(sub, _child(_child(path, key), name), skip)
        elif key in _SCHEMA_VALUES or key == "dependencies":
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    yield from iter_subschemas(sub, _child(_child(path, key), i), skip)
            elif key == "dependencies" and isinstance(value, dict):
                for name, sub in value.items():
                    yield from iter_subschemas(sub, _child(_child(path, key), name), skip)
            else:
                yield from iter_subschemas(value, _child(path, key), skip)


def scan_keywords(schema: Any, root: str = "$") -> list[KeywordUse]:
    """Every keyword used in schema position, in document order (paths start at `root`)."""
    return [KeywordUse(k, p, sub) for p, sub in iter_subschemas(schema, root) for k in sub]


def strip_keywords(schema: Any, drop: set[tuple[str, str]], root: str = "$") -> Any:
    """A copy of `schema` without the given (keyword, path) uses (paths start at `root`).

    A stripped `additionalProperties` becomes `true` rather than absent: a backend's strict mode reads an absent
    one as `false`, and stripping must only ever loosen what the grammar admits (validation checks the rest)."""
    if not isinstance(schema, dict) or not drop:
        return schema
    out = copy.deepcopy(schema)
    for path, sub in iter_subschemas(out, root):
        for keyword in [k for k in sub if (k, path) in drop]:
            if keyword == "additionalProperties":
                sub[keyword] = True
            else:
                del sub[keyword]
    return out
