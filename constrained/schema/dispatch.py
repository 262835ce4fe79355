"""What a JSON Schema converter really reads: constraints both backends drop without a word.

Both converters turn one schema object into one grammar rule by picking a *single* handler: the
first dispatching keyword present wins and every other keyword of that object is ignored.
Measured on the installed versions (xgrammar 0.2.9, outlines-core 0.2.14):

- xgrammar: `$ref` > `const` > `enum` > `anyOf` > `oneOf` > `allOf` > the `type`-driven rule.
  `{"type": "object", "properties": P, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}`
  becomes "any value matching one branch": `properties`, `type` and (as the branches are untyped)
  `required` all vanish, and `{}` or `5` pass. An object without a type source and without
  `properties`/`additionalProperties`/`items`/`prefixItems` (which make it infer the type) admits
  any value: `{"minimum": 0}` alone accepts `"x"`. `required` without `properties` is ignored.
- outlines-core: `properties` > `allOf` (branches *concatenated*) > `anyOf` > `oneOf` >
  `prefixItems` > `enum` > `const` > `$ref` > `type`.
- Neither enforces `oneOf` exclusivity: it is compiled as `anyOf`, so a value matching two
  branches is generated although it is invalid.

`dropped_siblings`, `overlapping_one_of`, `untyped_keywords` and `unattached_required` find those
uses; the backends report them as unenforced (warning + validation of every output). A sibling the
chosen handler already implies is not reported: `{"type": "string", "enum": ["a", "b"]}` (every
value is a string), `{"type": "object", "anyOf": [<object branches>]}`; nor are `oneOf`s whose
branches provably exclude each other (different types, different `const`/`enum` values, or such a
difference on a property both branches require).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from parley.constrained.schema.refs import MISSING, resolve_ref
from parley.constrained.schema.walk import KeywordUse, iter_subschemas

# Keywords that constrain a value (annotations such as title/description/default are not listed).
ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "contains", "items", "prefixItems", "additionalItems", "unevaluatedItems", "maxProperties",
    "minProperties", "required", "dependentRequired", "dependencies", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "unevaluatedProperties", "dependentSchemas", "allOf", "anyOf",
    "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef",
})  # fmt: skip
TYPE_SPECIFIC = ASSERTIONS - {
    "type", "enum", "const", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef",
    "$recursiveRef",
}  # fmt: skip
ALL_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# Keywords neither converter compiles at all (reported wholesale): nothing inside them is analysed.
UNREAD = frozenset({
    "not", "if", "then", "else", "dependentSchemas", "dependencies", "contains", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems",
})  # fmt: skip
_OLD_DRAFTS = ("draft-03", "draft-04", "draft-06", "draft-07")
_MAX_DEPTH = 8


@dataclass(frozen=True)
class Converter:
    """How one converter picks the handler of a schema object."""

    name: str
    dispatch: tuple[str, ...]
    reads: Mapping[str, frozenset[str]] = field(default_factory=dict)  # read along with the dispatcher
    infers: Mapping[str, str] = field(default_factory=dict)  # untyped object: keyword -> inferred type


XGRAMMAR = Converter(
    "xgrammar",
    ("$ref", "const", "enum", "anyOf", "oneOf", "allOf"),
    infers={"properties": "object", "additionalProperties": "object", "items": "array", "prefixItems": "array"},
)
OUTLINES = Converter(
    "outlines",
    ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref"),
    reads={
        "properties": frozenset({"required", "additionalProperties"}),
        "prefixItems": frozenset({"items", "additionalItems"}),
    },
    infers={"properties": "object", "prefixItems": "array"},
)


def ref_siblings_apply(root: Any) -> bool:
    """Draft 7 and earlier ignore the siblings of `$ref`; later drafts apply them."""
    dialect = root.get("$schema") if isinstance(root, dict) else None
    return not (isinstance(dialect, str) and any(d in dialect for d in _OLD_DRAFTS))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _subset(types: frozenset[str], allowed: frozenset[str]) -> bool:
    return all(t in allowed or (t == "integer" and "number" in allowed) for t in types)


def declared_types(node: dict[str, Any]) -> frozenset[str]:
    value = node.get("type")
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return frozenset(n for n in names if isinstance(n, str))


def _meet(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    out = a & b
    if "integer" in a and "number" in b or "integer" in b and "number" in a:
        out |= {"integer"}
    return out


def generated_types(root: Any, node: Any, converter: Converter, depth: int = 0) -> frozenset[str]:
    """The JSON types `converter` may generate for `node` (ALL_TYPES when unsure)."""
    if node is False:
        return frozenset()
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return ALL_TYPES
    chosen = next((k for k in converter.dispatch if k in node), None)
    if chosen == "$ref":
        target = resolve_ref(root, node["$ref"])
        return ALL_TYPES if target is MISSING else generated_types(root, target, converter, depth + 1)
    if chosen == "const":
        return frozenset({_json_type(node["const"])})
    if chosen == "enum" and isinstance(node["enum"], list):
        return frozenset(_json_type(v) for v in node["enum"])
    if chosen in ("anyOf", "oneOf") and isinstance(node[chosen], list):
        return frozenset().union(*(generated_types(root, b, converter, depth + 1) for b in node[chosen]))
    if chosen == "allOf" and isinstance(node["allOf"], list):
        result = ALL_TYPES
        for branch in node["allOf"]:
            result = _meet(result, generated_types(root, branch, converter, depth + 1))
        return result
    if chosen is not None and chosen in converter.infers:
        return frozenset({converter.infers[chosen]})
    if "type" in node:
        return declared_types(node)
    inferred = {converter.infers[k] for k in node if k in converter.infers}
    return frozenset(inferred) if len(inferred) == 1 else ALL_TYPES


def _values_violating(root: Any, node: dict[str, Any], values: list[Any], keywords: list[str]) -> set[str]:
    """Which of `keywords` (siblings of const/enum in `node`) some of `values` violate."""
    rest = {k: node[k] for k in keywords}
    if keywords == ["type"]:
        allowed = declared_types(node)
        return set() if _subset(frozenset(_json_type(v) for v in values), allowed) else {"type"}
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
        validator = cls(root).evolve(schema=rest)
        failing: set[str] = set()
        for value in values:
            for error in validator.iter_errors(value):
                path = list(error.relative_schema_path)
                failing.add(str(path[0]) if path else str(error.validator))
        return failing
    except Exception:  # unresolvable or odd sibling: assume nothing is implied
        return set(keywords)


def dropped_siblings(root: Any, label: str, converter: Converter) -> list[KeywordUse]:
    """Assertions next to the keyword `converter` dispatches on, which it therefore ignores."""
    out: list[KeywordUse] = []
    ref_siblings = ref_siblings_apply(root)
    for path, node in iter_subschemas(root, label, UNREAD):
        chosen = next((k for k in converter.dispatch if k in node), None)
        if chosen is None or (chosen == "$ref" and not ref_siblings):
            continue
        kept = converter.reads.get(chosen, frozenset()) | {chosen}
        rest = [k for k in node if k in ASSERTIONS and k not in kept]
        if not rest:
            continue
        implied: set[str] = set()
        if chosen in ("const", "enum"):
            values = [node["const"]] if chosen == "const" else node["enum"] if isinstance(node["enum"], list) else []
            implied = set(rest) - _values_violating(root, node, values, rest)
        elif "type" in rest and _subset(generated_types(root, {chosen: node[chosen]}, converter), declared_types(node)):
            implied = {"type"}
        reason = f"next to {chosen!r}, which {converter.name} reads alone"
        out += [KeywordUse(k, path, node, reason) for k in rest if k not in implied]
    return out


def _value_set(root: Any, node: Any, depth: int = 0) -> list[Any] | None:
    """The finite set of values `node` admits (from const/enum/boolean/null), if it has one."""
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return None
    if "const" in node:
        return [node["const"]]
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    if "$ref" in node and len(node) == 1:
        target = resolve_ref(root, node["$ref"])
        return None if target is MISSING else _value_set(root, target, depth + 1)
    declared = declared_types(node)
    if declared and declared <= {"null", "boolean"}:
        return ([None] if "null" in declared else []) + ([True, False] if "boolean" in declared else [])
    return None


def _canonical(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


# Where parley's `strict` reads an untyped subschema as one type (xgrammar in strict mode, llguidance's
# `type_untyped`): from these keywords, unless something else gives it a type.
STRICT_INFERS = {"properties": "object", "additionalProperties": "object", "items": "array", "prefixItems": "array"}
_TYPE_SOURCES = frozenset({"type", "$ref", "const", "enum", "anyOf", "oneOf", "allOf", "not", "if"})


def json_types(root: Any, node: Any, depth: int = 0, strict: bool = False) -> frozenset[str]:
    """The JSON types a value valid against `node` can have (JSON Schema semantics; ALL_TYPES when unsure).
    `strict`: an untyped subschema with one kind of type-specific keyword has that type (`STRICT_INFERS`)."""
    if node is False:
        return frozenset()
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return ALL_TYPES
    result = declared_types(node) if "type" in node else ALL_TYPES
    inferred = {kind for key, kind in STRICT_INFERS.items() if key in node}
    if strict and not _TYPE_SOURCES & node.keys() and len(inferred) == 1:
        result = frozenset(inferred)
    values = _value_set(root, node, depth)
    if values is not None:
        result = _meet(result, frozenset(_json_type(v) for v in values))
    if "$ref" in node:
        target = resolve_ref(root, node["$ref"])
        if target is not MISSING:
            result = _meet(result, json_types(root, target, depth + 1, strict))
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            result = _meet(result, frozenset().union(*(json_types(root, b, depth + 1, strict) for b in node[key])))
    for branch in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
        result = _meet(result, json_types(root, branch, depth + 1, strict))
    return result


def _disjoint(
    root: Any, a: Any, b: Any, within: frozenset[str] = ALL_TYPES, depth: int = 0, strict: bool = False
) -> bool:
    """Whether no value of a type in `within` can be valid against both `a` and `b` (False when unsure)."""
    common = _meet(_meet(json_types(root, a, strict=strict), json_types(root, b, strict=strict)), within)
    if not common:
        return True
    values_a, values_b = _value_set(root, a), _value_set(root, b)
    if values_a is not None and values_b is not None:
        return not {_canonical(v) for v in values_a} & {_canonical(v) for v in values_b}
    if depth > 0 or common != {"object"}:
        return False  # a required property told apart proves nothing for the other types (Github_trivial o51159)
    a, b = _deref(root, a), _deref(root, b)
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    required = set(_names(a.get("required"))) & set(_names(b.get("required")))
    return any(
        isinstance(props_a, dict) and isinstance(props_b, dict) and name in props_a and name in props_b
        and _disjoint(root, props_a[name], props_b[name], ALL_TYPES, depth + 1, strict)
        for name in required
    )  # fmt: skip


def _deref(root: Any, node: Any) -> Any:
    for _ in range(_MAX_DEPTH):
        if not (isinstance(node, dict) and "$ref" in node):
            break
        target = resolve_ref(root, node["$ref"])
        if target is MISSING:
            break
        node = target
    return node


def _names(value: Any) -> Iterator[str]:
    return (n for n in value if isinstance(n, str)) if isinstance(value, list) else iter(())


def overlapping_one_of(root: Any, label: str, strict: bool = False) -> list[KeywordUse]:
    """`oneOf`s whose branches may overlap: compiled as `anyOf`, exclusivity is not enforced. Only the types the
    node itself admits count (`{"type": "object", "oneOf": [...]}` weighs objects alone); `strict`: parley's
    strict reading of untyped branches (`STRICT_INFERS`), which the grammars then generate."""
    out: list[KeywordUse] = []
    for path, node in iter_subschemas(root, label, UNREAD):
        branches = node.get("oneOf")
        if not isinstance(branches, list) or len(branches) < 2:
            continue
        within = json_types(root, {key: value for key, value in node.items() if key != "oneOf"})
        pairs = ((a, b) for i, a in enumerate(branches) for b in branches[i + 1 :])
        if not all(_disjoint(root, a, b, within, strict=strict) for a, b in pairs):
            out.append(KeywordUse("oneOf", path, node, "branches may overlap; exclusivity is not enforced"))
    return out


def untyped_keywords(root: Any, label: str, converter: Converter) -> list[KeywordUse]:
    """Type-specific keywords of objects with no type and nothing to infer it from (read as "any value")."""
    out: list[KeywordUse] = []
    for path, node in iter_subschemas(root, label, UNREAD):
        if "type" in node or any(k in node for k in converter.dispatch) or any(k in node for k in converter.infers):
            continue
        out += [KeywordUse(k, path, node, "untyped schema: read as any value") for k in node if k in TYPE_SPECIFIC]
    return out


def unattached_required(root: Any, label: str, converter: Converter, strict: bool) -> list[KeywordUse]:
    """`required` names the converter cannot enforce: no `properties` next to them, or (where extra
    keys are forbidden) names missing from `properties`."""
    out: list[KeywordUse] = []
    for path, node in iter_subschemas(root, label, UNREAD):
        names = list(_names(node.get("required")))
        if not names or any(k in node for k in converter.dispatch if k != "properties"):
            continue
        props = node.get("properties")
        if not isinstance(props, dict):
            if "object" in generated_types(root, node, converter):
                out.append(KeywordUse("required", path, node, "no 'properties' next to it"))
            continue
        extra_allowed = node.get("additionalProperties", not strict) is not False and converter is XGRAMMAR
        if not extra_allowed and any(n not in props for n in names):
            out.append(KeywordUse("required", path, node, "names a property the object cannot have"))
    return out


def first_per_use(uses: list[KeywordUse]) -> list[KeywordUse]:
    """`uses` without repeats of a (keyword, path), in order (the first reason wins)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for use in uses:
        if (use.keyword, use.path) not in seen:
            seen.add((use.keyword, use.path))
            out.append(use)
    return out
