"""The JSON documents a backend compiles for a JSON-producing spec: one code path for every such spec.

A `JsonSchema` is one part (paths start at `$`). A `ToolCalls` spec is the call-object schema
(part `calls`: every tool's parameters embedded with their `$ref`s rebased) plus, with an
`answer_schema`, part `answer`. Every part goes through the same steps, so what the compiler then
does with keywords a backend does not enforce — delegate to the other backend, strip, or record a
warning and validate every output — applies to tool arguments exactly as to a plain schema:

1. `check_schema` (per tool first, so errors name the tool's own paths);
2. references to plain-name anchors (`"#rulePriority"`) become pointers (`refs.point_anchors`), and pointers
   through `patternProperties` members or to subschemas outside schema keywords are hoisted into `$defs`
   (`refs.hoist_refs`); a `$ref` parley still cannot resolve is recorded as relaxed (validated);
3. `pattern`s become full-match regexes with escaped control characters;
4. a `required` name missing from `properties` is declared there, with the schema an undeclared key gets
   (`_declare_required`: exact, and writable where `strict` closes the object);
5. `properties: {"x": false}` ("x must not appear"; neither backend compiles a `false` schema) is
   removed: exact where extra keys are forbidden, otherwise recorded as relaxed;
6. what the document's draft does not read is removed, as the validator ignores it too, where backends
   enforce it whatever the draft: under Draft 7 and earlier the assertions beside a `$ref` (llguidance
   applied a generated schema's `{"$ref": ..., "additionalProperties": {"type": "string"}}` and refused a valid
   `{"min": 5}`), and keywords of other drafts (`propertyNames` under Draft 4, where xgrammar refused the key
   `"Y"` of JsonSchemaStore staticwebapp.config.json; `dependencies` under 2020-12...);
7. every subschema's `$ref`, `anyOf`, `oneOf` and `allOf` move ahead of its other keywords, in that order
   (`_branches_first`): the key order of the output is then the same on every backend (see there).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from parley.constrained.schema.check import check_schema
from parley.constrained.schema.dispatch import ASSERTIONS, ref_siblings_apply
from parley.constrained.schema.patterns import rewrite_patterns
from parley.constrained.schema.refs import hoist_refs, point_anchors, unresolved_refs
from parley.constrained.schema.walk import KeywordUse, iter_subschemas
from parley.constrained.specs import JsonSchema, ToolCalls


@dataclass(frozen=True)
class JsonPart:
    """One document to compile; `label` roots the paths of its keyword uses."""

    label: str
    schema: Any
    relaxed: tuple[KeywordUse, ...] = ()
    aliases: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # path prefix -> readable name

    def describe(self, path: str) -> str:
        """`path` with a known prefix replaced (`calls.anyOf[1].properties.arguments.x` -> `search:$.x`)."""
        for prefix, name in self.aliases:
            if path == prefix or path.startswith(prefix) and path[len(prefix)] in ".[":
                return name + path[len(prefix) :]
        return path


def _drop_false_properties(schema: Any, label: str, strict: bool) -> tuple[Any, list[KeywordUse]]:
    if not isinstance(schema, dict):
        return schema, []
    out = copy.deepcopy(schema)
    relaxed: list[KeywordUse] = []
    for path, node in iter_subschemas(out, label):
        props = node.get("properties")
        if not isinstance(props, dict):
            continue
        banned = [name for name, sub in props.items() if sub is False]
        if not banned:
            continue
        node["properties"] = {name: sub for name, sub in props.items() if sub is not False}
        if node.get("additionalProperties", not strict) is not False or "patternProperties" in node:
            reason = f"forbidden propert{'y' if len(banned) == 1 else 'ies'} {banned} (false schema) may appear"
            relaxed.append(KeywordUse("properties", path, node, reason))
    return out, relaxed


def _declare_required(schema: Any, label: str) -> Any:
    """A `required` name missing from `properties` becomes a property with the schema an undeclared key would
    get (`additionalProperties`, else any value), unless extra keys are forbidden or a `patternProperties` key
    may claim it. Exact in JSON Schema terms, and it keeps such names writable where parley's `strict` closes
    the object (xgrammar rejected every valid value of `{"properties": {"x": {}}, "required": ["b"]}`, strict
    or not)."""
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    for _, node in iter_subschemas(out, label):
        props, required = node.get("properties"), node.get("required")
        if not isinstance(props, dict) or not isinstance(required, list):
            continue
        extra = node.get("additionalProperties", True)
        if extra is False or {"patternProperties", "unevaluatedProperties"} & node.keys():
            continue
        for name in required:
            if isinstance(name, str) and name not in props:
                props[name] = copy.deepcopy(extra) if isinstance(extra, dict) else {}
    return out


UNRESOLVED = "parley cannot resolve it (a base URI below the root, an ambiguous name): it may be read as any value"


# The order xgrammar's converter picks a subschema's handler in (`dispatch.XGRAMMAR`), less `const`/`enum`.
BRANCHES_FIRST = ("$ref", "anyOf", "oneOf", "allOf")


# Keywords some drafts read and others do not (`then`/`else` go with `if`, `minContains`/`maxContains` with 2019-09).
_VERSIONED = frozenset({
    "const", "contains", "propertyNames", "if", "then", "else", "dependencies", "dependentRequired",
    "dependentSchemas", "prefixItems", "additionalItems", "unevaluatedProperties", "unevaluatedItems", "minContains",
    "maxContains",
})  # fmt: skip


def _unread_keywords(schema: Any) -> frozenset[str]:
    """The versioned keywords the validator of `schema`'s draft does not read (it defaults to 2020-12)."""
    from parley.constrained.validate import draft_validator_class

    known = set(draft_validator_class(schema).VALIDATORS)
    known |= {"then", "else"} if "if" in known else set()
    known |= {"minContains", "maxContains"} if "dependentRequired" in known else set()
    return _VERSIONED - known


def _drop_what_the_draft_ignores(schema: Any, label: str) -> None:
    """Removes, in place (prepare's own copy), what `schema`'s draft does not read (step 6)."""
    unread = _unread_keywords(schema) if isinstance(schema, dict) else frozenset()
    siblings = ref_siblings_apply(schema)
    for node in [node for _, node in iter_subschemas(schema, label)]:
        ignored = unread | (ASSERTIONS - {"$ref"} if "$ref" in node and not siblings else frozenset())
        for key in [key for key in node if key in ignored]:
            del node[key]


def _branches_first(schema: Any, label: str) -> None:
    """Reorders the subschemas of `schema` in place (prepare's own copy): `$ref`, `anyOf`, `oneOf`, `allOf` first,
    in that order, the other keywords after them as written.

    Why: an object's key order comes from where its names are declared, and the backends read that differently.
    llguidance merges a subschema's keywords in the order they are written: `{"properties": {"a": ...},
    "anyOf": [{"properties": {"b": ...}}]}` writes `a` before `b`, with `anyOf` written first `b` before `a`.
    xgrammar picks one handler per subschema (`$ref` > `anyOf` > `oneOf` > `allOf` > the type's rule) and
    writes its names first whatever the order: `b` then `a` in both (Github_hard o61027 wrote `oneOf` before
    `properties`, most schemas write it after). In this order llguidance writes what xgrammar does, so an
    output's key order no longer depends on the backend `auto` picks."""
    rank = {key: i for i, key in enumerate(BRANCHES_FIRST)}
    for node in [node for _, node in iter_subschemas(schema, label)]:  # listed before any is reordered
        ordered = sorted(node.items(), key=lambda item: rank.get(item[0], len(rank)))
        node.clear()
        node.update(ordered)


def prepare(schema: Any, label: str, strict: bool, aliases: tuple[tuple[str, str], ...] = ()) -> JsonPart:
    """Check `schema` and rewrite it for grammar backends (steps 2-7 of the module docstring)."""
    check_schema(schema)
    rewritten = _declare_required(rewrite_patterns(hoist_refs(point_anchors(schema))), label)
    rewritten, relaxed = _drop_false_properties(rewritten, label, strict)  # a copy: reordered in place next
    relaxed += [KeywordUse("$ref", path, node, UNRESOLVED) for path, node in unresolved_refs(rewritten, label)]
    _drop_what_the_draft_ignores(rewritten, label)
    _branches_first(rewritten, label)
    return JsonPart(label, rewritten, tuple(relaxed), aliases)


def json_parts(spec: JsonSchema | ToolCalls) -> list[JsonPart]:
    """The prepared documents of `spec`: `[$]` for a schema, `[calls]` or `[calls, answer]` for tool calls."""
    if isinstance(spec, JsonSchema):
        return [prepare(spec.schema_dict(), "$", spec.strict)]
    for tool in spec.tools:
        check_schema(tool.parameters)
    single = len(spec.tools) == 1
    aliases = tuple(
        ("calls" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in spec.arguments_pointer(None if single else i)),
         f"{tool.name}:$")
        for i, tool in enumerate(spec.tools)
    )  # fmt: skip
    parts = [prepare(spec.call_schema(), "calls", spec.strict, aliases)]
    if spec.answer_schema is not None:
        parts.append(prepare(spec.answer_schema, "answer", spec.strict, (("answer", "answer:$"),)))
    return parts
