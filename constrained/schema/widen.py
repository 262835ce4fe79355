"""Which JSON types a subschema's keywords apply to, where xgrammar reads it more narrowly.

JSON Schema applies a type-specific keyword (`items`, `minimum`...) to its own type and lets every
other type through; xgrammar instead infers the type from it. `widen_untyped` spells the types out
where that is exact, and `admits_fractions` tells the backends when numeric bounds reach non-integers.
"""

from __future__ import annotations

import copy
from typing import Any

from parley.constrained.schema.refs import decode_pointer

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
# Not `not` or `if`: xgrammar reads neither (both are validated), so `{"properties": ..., "if": ...}` is typed
# by its `properties` alone, and `1` was rejected where it is valid (Github_medium o3385's items).
_TYPE_SOURCES = {"type", "$ref", "enum", "const", "anyOf", "oneOf", "allOf"}
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
    `allOf` gets its parent's types (xgrammar does not intersect them itself); a definition gets
    the union of the contexts of the `$ref`s that point at it (`#/definitions/X`, `#/$defs/X`):
    `{"additionalProperties": false}` reached from `properties` admits `null` (Github_ultra o6352); where
    that is unknown (unreferenced, or pointed into) it is left alone and keeps xgrammar's narrower reading,
    which rejects valid values but never admits invalid ones.
    """
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    _widen(out, None, _definition_contexts(out))
    return out


def _definition_contexts(schema: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """The context each definition is referenced in, where every `$ref` to it agrees (a fixpoint:
    a `$ref` at a definition's root or in its branches takes that definition's context)."""
    contexts: dict[tuple[str, str], Any] = {}
    for _ in range(len(schema.get("definitions") or {}) + len(schema.get("$defs") or {}) + 2):
        sites: dict[tuple[str, str], set[Any]] = {}
        _widen(copy.deepcopy(schema), None, contexts, sites)
        joined = {key: _union(found) for key, found in sites.items()}
        agreed = {key: found for key, found in joined.items() if found != _KEEP}
        if agreed == contexts:
            break
        contexts = agreed
    return contexts


def _union(contexts: set[Any]) -> Any:
    """One context for a definition referenced from several: any value (None) if one site admits any, unknown
    (`_KEEP`) if one is unknown, else the union of the sites' types. Where sites differ, the narrower site's
    own `type` is then no longer implied by the definition: it is reported as not enforced and validated
    (Github_medium o69248's `feature`, referenced both from `items` and under an object's `oneOf`)."""
    if _KEEP in contexts:
        return _KEEP
    if None in contexts:
        return None
    return [t for t in ALL_TYPES if any(t in c for c in contexts)] + sorted(
        {t for c in contexts for t in c} - set(ALL_TYPES))


def _record_ref(node: dict[str, Any], context: Any, sites: dict[tuple[str, str], set[Any]]) -> None:
    ref = node.get("$ref")
    parts = decode_pointer(ref) if isinstance(ref, str) else None
    if not parts or parts[0] not in ("$defs", "definitions") or len(parts) < 2:
        return
    seen = tuple(context) if isinstance(context, list) else context
    sites.setdefault((parts[0], parts[1]), set()).add(seen if len(parts) == 2 else _KEEP)


def _widen(
    node: Any,
    context: list[str] | str | None,
    defs: dict[tuple[str, str], Any],
    sites: dict[tuple[str, str], set[Any]] | None = None,
) -> None:
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
    else:
        # next to a combinator or `$ref`, the node's type-specific keywords constrain only their own type, and
        # xgrammar reads the combinator alone (the others are reported and validated, `dispatch.dropped_siblings`):
        # its branches take the node's context (Github_ultra o6365: `{"anyOf": [<untyped object branches>],
        # "required": ["image"]}` as `items` admits null, and xgrammar rejected it)
        branch_context = context
    if sites is not None and "$ref" in node:
        _record_ref(node, branch_context, sites)
    for key, value in node.items():
        if key in _BRANCHES and isinstance(value, list):
            for branch in value:
                _widen(branch, branch_context, {}, sites)
        elif key in _VALUE_MAPS and isinstance(value, dict):
            for sub in value.values():
                _widen(sub, None, {}, sites)
        elif key in _VALUE_SCHEMAS:
            for sub in value if isinstance(value, list) else [value]:
                _widen(sub, None, {}, sites)
        elif key in ("$defs", "definitions") and isinstance(value, dict):
            for name, sub in value.items():
                _widen(sub, defs.get((key, name), _KEEP), {}, sites)  # `defs`: the root's only


def admits_fractions(node: Any) -> bool:
    """Whether a subschema declares the `number` type (so bounds next to it apply to non-integers)."""
    declared = node.get("type") if isinstance(node, dict) else None
    return declared == "number" or isinstance(declared, list) and "number" in declared
