"""JSON Schema intake: check a schema, find keywords a backend would drop, rewrite it for grammars.

Three jobs, done before any backend sees a schema:

1. `check_schema` — reject what is not a schema: wrong type, unknown `$schema` dialect, metaschema
   violations, `$ref`s that do not resolve inside the document (remote refs are never fetched).
2. `scan_keywords` — list every keyword in schema position with its JSON path. Backends declare
   which keywords they do not enforce; those must never pass silently (the compiler records a
   warning and flags the matcher for validation of its output).
3. `rewrite_patterns` — JSON Schema `pattern` / `patternProperties` use *search* semantics
   (`"^/"` means "starts with /"), grammar backends match the whole string; patterns are rewritten
   to the equivalent full match.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from parley.constrained.errors import (
    InvalidRegexError,
    InvalidSchemaError,
    UnresolvableRefError,
    UnsupportedDraftError,
)

# Keywords whose values are maps from names to subschemas.
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
# Keywords whose values are a subschema or a list of subschemas.
_SCHEMA_VALUES = {
    "items", "additionalItems", "prefixItems", "contains", "additionalProperties", "propertyNames",
    "not", "if", "then", "else", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf",
}  # fmt: skip
# Keywords whose values are data, never schemas.
_DATA = {"enum", "const", "default", "examples", "example", "required", "description", "title"}

_DRAFTS = {
    "http://json-schema.org/draft-04/schema",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "https://json-schema.org/draft/2020-12/schema",
}


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


def check_schema(schema: Any) -> None:
    """Raise a typed `InvalidSchemaError` unless `schema` is a usable JSON Schema."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidSchemaError(f"a JSON Schema must be an object or a boolean, not {type(schema).__name__}")
    import jsonschema
    from jsonschema.exceptions import SchemaError

    dialect = schema.get("$schema")
    if dialect is not None:
        if not isinstance(dialect, str) or dialect.rstrip("#") not in _DRAFTS:
            raise UnsupportedDraftError(
                f"unsupported $schema {dialect!r}; supported: Draft 4, 6, 7, 2019-09 and 2020-12"
            )
    for use in scan_keywords(schema):
        if use.keyword == "pattern" and isinstance(use.schema.get("pattern"), str):
            _check_regex(use.schema["pattern"], use.path)
        if use.keyword == "patternProperties" and isinstance(use.schema.get("patternProperties"), dict):
            for pattern in use.schema["patternProperties"]:
                _check_regex(pattern, use.path)
    validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator_cls.check_schema(schema)
    except SchemaError as exc:
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path)
        raise InvalidSchemaError(f"not a valid JSON Schema at {where}: {exc.message}") from None
    _check_refs(schema)


def _check_regex(pattern: str, path: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InvalidRegexError(f"invalid regex {pattern!r} at {path}: {exc}") from None


def _check_refs(schema: dict[str, Any]) -> None:
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012, specification_with

    dialect = schema.get("$schema")
    specification = specification_with(dialect, default=DRAFT202012) if isinstance(dialect, str) else DRAFT202012
    resource = specification.create_resource(schema)
    raw_base = schema.get("$id", schema.get("id"))
    base = raw_base.split("#", 1)[0] if isinstance(raw_base, str) else ""  # an empty fragment is no part of the URI
    resolver = Registry().with_resource(base, resource).resolver(base_uri=base)
    nested_ids = any("$id" in sub or "id" in sub for path, sub in iter_subschemas(schema) if path != "$")
    for path, sub in iter_subschemas(schema):
        ref = sub.get("$ref")
        if not isinstance(ref, str):
            continue
        if not ref.startswith("#") and "://" in ref:
            raise UnresolvableRefError(f"remote $ref {ref!r} at {path} is not fetched; inline it or use $defs")
        try:
            resolver.lookup(ref)
        except Unresolvable:
            if nested_ids and not ref.startswith("#/"):
                continue  # relative to a nested $id: resolvable only with base tracking; validation checks it
            raise UnresolvableRefError(f"$ref {ref!r} at {path} does not resolve inside the schema") from None
        except Exception as exc:  # malformed pointers and the like
            raise UnresolvableRefError(f"$ref {ref!r} at {path} cannot be resolved: {exc}") from None


def _split_top_level(pattern: str) -> list[str]:
    """Split a regex on `|` outside groups and classes."""
    parts, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":
                i += 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def _ends_with_anchor(alt: str) -> bool:
    if not alt.endswith("$"):
        return False
    backslashes = len(alt) - 1 - len(alt[:-1].rstrip("\\"))
    return backslashes % 2 == 0


def escape_control_chars(pattern: str) -> str:
    """`pattern` with raw control characters written as `\\xHH` escapes (the same regex).

    A schema's JSON may carry `"[^\\u0000]"` or a raw newline inside a class; xgrammar's regex
    parser refuses raw NUL and newline characters, escaped ones are fine everywhere.
    """
    if not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in pattern):
        return pattern
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(f"\\x{ord(nxt):02x}" if ord(nxt) < 0x20 or ord(nxt) == 0x7F else ch + nxt)
            i += 2
            continue
        out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch)
        i += 1
    return "".join(out)


def full_match_pattern(pattern: str) -> str:
    """The full-match regex equivalent to JSON Schema's search-semantics `pattern`."""
    pattern = escape_control_chars(pattern)
    alternatives = []
    for alt in _split_top_level(pattern):
        head = alt[1:] if alt.startswith("^") else ".*" + alt if alt else ".*"
        if _ends_with_anchor(head):
            head = head[:-1]
        elif not head.endswith(".*"):
            head = head + ".*"
        alternatives.append(head)
    if len(alternatives) == 1:
        return alternatives[0]
    return "(?:" + ")|(?:".join(alternatives) + ")"


def rewrite_patterns(schema: Any) -> Any:
    """A copy of `schema` with `pattern` and `patternProperties` keys turned into full-match regexes."""
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    for _, sub in iter_subschemas(out):
        if isinstance(sub.get("pattern"), str):
            sub["pattern"] = full_match_pattern(sub["pattern"])
        props = sub.get("patternProperties")
        if isinstance(props, dict):
            sub["patternProperties"] = {full_match_pattern(k): v for k, v in props.items()}
    return out


def strip_keywords(schema: Any, drop: set[tuple[str, str]], root: str = "$") -> Any:
    """A copy of `schema` without the given (keyword, path) uses (paths start at `root`)."""
    if not isinstance(schema, dict) or not drop:
        return schema
    out = copy.deepcopy(schema)
    for path, sub in iter_subschemas(out, root):
        for keyword in [k for k in sub if (k, path) in drop]:
            del sub[keyword]
    return out


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


# A `pattern` that names a backslash or a double quote: both backends match patterns against the raw
# characters between the JSON quotes, so the escaped forms `\\` and `\"` never match and every value
# holding one is rejected. Such patterns are left out of the grammar and validated instead. (Wildcards such as `.`
# or `[^a]` keep the same blind spot: values with `\` or `"` are unreachable, outputs stay valid.)
_ESCAPE_MENTIONS = re.compile(r'"|\\\\|\\x(?:5[cC]|22)|\\u00(?:5[cC]|22)|\\x\{(?:5[cC]|22)\}')


def pattern_mentions_escape(pattern: str) -> bool:
    """Whether a regex names `\\` or `"` (characters a JSON string carries escaped)."""
    return bool(_ESCAPE_MENTIONS.search(pattern))


# Regex assertions xgrammar cannot express: a lookahead is read as always true (`^((?!mode).)*$`
# accepts "amodeb": a superset, so the pattern may stay in the grammar), a lookbehind or a
# backreference is a compile error. outlines-core refuses all of them. Left to validation.
_UNESCAPED = r"(?<!\\)(?:\\\\)*"
_LOOKAHEAD = re.compile(_UNESCAPED + r"\(\?[=!]")
_LOOKBEHIND_OR_BACKREF = re.compile(_UNESCAPED + r"(?:\(\?<[=!]|\\[1-9]|\\k<)")


def pattern_has_lookahead(pattern: str) -> bool:
    """Whether a regex uses a lookahead (`(?=...)`, `(?!...)`)."""
    return bool(_LOOKAHEAD.search(pattern))


def pattern_has_lookbehind_or_backreference(pattern: str) -> bool:
    """Whether a regex uses a lookbehind or a backreference."""
    return bool(_LOOKBEHIND_OR_BACKREF.search(pattern))


def admits_fractions(node: Any) -> bool:
    """Whether a subschema declares the `number` type (so bounds next to it apply to non-integers)."""
    declared = node.get("type") if isinstance(node, dict) else None
    return declared == "number" or isinstance(declared, list) and "number" in declared
