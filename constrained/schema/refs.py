"""Local `$ref` pointers inside one schema document: resolve them, rebase them, keep them valid.

Grammar converters follow `"#/..."` JSON Pointers through the very document they are given, so
every rewrite that moves or renames a subschema must carry the pointers along:

- `rebase_refs`: a schema embedded in a larger document (a tool's parameters inside the tool-call
  schema) gets its root-relative pointers prefixed with where it now lives.
- `hoist_refs`: a pointer that walks through a `patternProperties` key breaks when that key is
  rewritten to a full-match regex or the keyword is stripped (MaskBench's opspec-io-0.1.7 points
  into `patternProperties/%5B-_.a-zA-Z0-9%5D%2B/...`), and a pointer to a subschema outside any
  schema keyword (`"#/nonEmptyString"`, Github_hard o5983) escapes every rewrite, and outlines-core
  cannot follow a pointer through an array index; such targets are copied into `$defs` under fresh
  names and the pointers repointed there.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import unquote

from parley.constrained.schema.walk import iter_subschemas

MISSING = object()


def decode_pointer(ref: str) -> list[str] | None:
    """The segments of a local `$ref` (`"#/a/b~1c"` -> `["a", "b/c"]`); None for other references."""
    if not ref.startswith("#"):
        return None
    fragment = unquote(ref[1:])
    if fragment == "":
        return []
    if not fragment.startswith("/"):
        return None  # a plain-name anchor
    return [s.replace("~1", "/").replace("~0", "~") for s in fragment[1:].split("/")]


def resolve_pointer(root: Any, parts: list[str]) -> Any:
    """The value at `parts` inside `root`, or `MISSING`."""
    node = root
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def resolve_ref(root: Any, ref: Any) -> Any:
    """The subschema a local `$ref` names inside `root`, or `MISSING`."""
    parts = decode_pointer(ref) if isinstance(ref, str) else None
    return MISSING if parts is None else resolve_pointer(root, parts)


def _has_nested_ids(schema: Any) -> bool:
    return any("$id" in sub or "id" in sub for path, sub in iter_subschemas(schema) if path != "$")


def rebase_refs(schema: Any, prefix: list[str]) -> Any:
    """A copy of `schema` whose local pointers are valid once it sits at `prefix` in another document."""
    if not isinstance(schema, dict) or not prefix or _has_nested_ids(schema):
        return schema
    out = copy.deepcopy(schema)
    head = "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in prefix)
    for _, sub in iter_subschemas(out):
        ref = sub.get("$ref")
        if isinstance(ref, str) and decode_pointer(ref) is not None:
            sub["$ref"] = head + ref[1:] if ref != "#" else head
    return out


def _through_list(root: Any, parts: list[str]) -> bool:
    node = root
    for part in parts:
        if isinstance(node, list):
            return True
        node = node.get(part) if isinstance(node, dict) else None
    return False


def _needs_hoist(root: Any, parts: list[str], target: Any, visited: set[int]) -> bool:
    through_pattern_key = "patternProperties" in parts[:-1]
    outside = isinstance(target, dict) and id(target) not in visited
    return through_pattern_key or outside or _through_list(root, parts)


def hoist_refs(schema: Any) -> Any:
    """A copy of `schema` whose pointers all land on subschemas in schema position.

    Pointers are repointed into `$defs` (the target copied there) when they pass through a
    `patternProperties` member (its key is rewritten to a full-match regex, or the keyword is
    stripped), when they land outside any schema keyword (`"#/nonEmptyString"`: such targets are
    invisible to every rewrite and keyword scan, which walk schema positions only), or when they
    index an array (`"#/anyOf/1/..."`, as rebased tool parameters do: outlines-core resolves object
    keys only).
    """
    if not isinstance(schema, dict) or _has_nested_ids(schema) or not isinstance(schema.get("$defs", {}), dict):
        return schema
    out = schema
    targets: dict[str, str] = {}
    for _ in range(_MAX_ROUNDS):
        visited = {id(sub) for _, sub in iter_subschemas(out)}
        fresh: dict[str, Any] = {}
        for _, sub in iter_subschemas(out):
            ref = sub.get("$ref")
            parts = decode_pointer(ref) if isinstance(ref, str) else None
            if not parts or ref in targets or ref in fresh:
                continue
            target = resolve_pointer(out, parts)
            if target is not MISSING and _needs_hoist(out, parts, target, visited):
                fresh[ref] = target  # type: ignore[index]
        if not fresh:
            break
        out = copy.deepcopy(out) if out is schema else out
        defs = dict(out.get("$defs", {}))
        for ref, target in fresh.items():
            name = f"parley_ref_{len(targets)}"
            while name in defs:
                name += "_"
            targets[ref] = name
            defs[name] = copy.deepcopy(resolve_ref(out, ref) if target is not MISSING else target)
        out["$defs"] = defs
        for _, sub in iter_subschemas(out):
            ref = sub.get("$ref")
            if isinstance(ref, str) and ref in targets:
                sub["$ref"] = f"#/$defs/{targets[ref]}"
    return out


_MAX_ROUNDS = 16
