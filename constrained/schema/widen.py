"""Which JSON types a subschema's keywords apply to, where xgrammar reads it more narrowly.

JSON Schema applies a type-specific keyword (`items`, `minimum`...) to its own type and lets every
other type through; xgrammar instead infers the type from it. `widen_untyped` spells the types out
where that is exact, and `admits_fractions` tells the backends when numeric bounds reach non-integers.
"""

from __future__ import annotations

import copy
from typing import Any

# Keywords that constrain only one JSON type (JSON Schema applies them to that type and lets every
# other type through; xgrammar instead infers the type from them).
_TYPE_KEYWORDS = {
    "properties", "patternProperties", "additionalProperties", "required", "minProperties", "maxProperties",
    "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
    "minContains", "maxContains", "unevaluatedItems",
    "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
}  # fmt: skip
# An untyped subschema with these is left as it is: its type comes from them (or xgrammar merges them).
_TYPE_SOURCES = {"type", "$ref", "enum", "const", "anyOf", "oneOf", "allOf", "not", "if"}
ALL_TYPES = ["object", "array", "string", "number", "boolean", "null"]
# Subschemas that constrain a value on their own (any type may stand there).
_VALUE_MAPS = {"properties", "patternProperties", "dependentSchemas"}
_VALUE_SCHEMAS = {
    "items", "prefixItems", "additionalItems", "additionalProperties", "contains", "unevaluatedItems",
    "unevaluatedProperties",
}  # fmt: skip
_BRANCHES = {"anyOf", "oneOf", "allOf"}
_KEEP = "keep"  # context unknown (a definition may be referenced from a branch): leave xgrammar's reading


def widen_untyped(schema: Any) -> Any:
    """A copy of `schema` where untyped subschemas with type-specific keywords admit every type.

    `{"items": {"type": "string"}}` constrains arrays only; an object or a number also matches it.
    xgrammar reads such a schema as `"type": "array"` and rejects those valid values, so the type
    list is spelled out (`["object", "array", ...]`), which xgrammar applies keyword by type.

    Only where that is exact: a value position admits every type; a branch of `anyOf`/`oneOf`/
    `allOf` gets its parent's types (xgrammar does not intersect them itself); a definition's root
    is left alone, as its context is unknown (it keeps xgrammar's narrower reading, which is safe).
    """
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    _widen(out, None)
    return out


def _widen(node: Any, context: list[str] | str | None) -> None:
    if not isinstance(node, dict):
        return
    if "type" in node:
        types = node["type"]
        branch_context: list[str] | str | None = [types] if isinstance(types, str) else types
    elif not _TYPE_SOURCES & node.keys() and _TYPE_KEYWORDS & node.keys():
        if context == _KEEP:
            branch_context = _KEEP
        else:
            node["type"] = list(context or ALL_TYPES)
            branch_context = node["type"]
    elif _TYPE_KEYWORDS & node.keys():
        branch_context = _KEEP  # typed by xgrammar from its keywords next to a combinator or $ref
    else:
        branch_context = context
    for key, value in node.items():
        if key in _BRANCHES and isinstance(value, list):
            for branch in value:
                _widen(branch, branch_context)
        elif key in _VALUE_MAPS and isinstance(value, dict):
            for sub in value.values():
                _widen(sub, None)
        elif key in _VALUE_SCHEMAS:
            for sub in value if isinstance(value, list) else [value]:
                _widen(sub, None)
        elif key in ("$defs", "definitions") and isinstance(value, dict):
            for sub in value.values():
                _widen(sub, _KEEP)


def admits_fractions(node: Any) -> bool:
    """Whether a subschema declares the `number` type (so bounds next to it apply to non-integers)."""
    declared = node.get("type") if isinstance(node, dict) else None
    return declared == "number" or isinstance(declared, list) and "number" in declared
