"""Schemas said the way xgrammar reads them: forms it refuses or misreads, rewritten exactly.

Each rewrite was found by the generated schemas or the schema walker's instances (tests/constrained/
test_generated_schemas.py pins them) and is exact: the rewritten schema admits the same values. Only xgrammar
gets them; llguidance reads the original forms right (and reads a Draft 7 document's `prefixItems` as an
unknown keyword).
"""

from __future__ import annotations

import copy
from typing import Any

from parley.constrained.schema.refs import rebase_refs
from parley.constrained.schema.walk import iter_subschemas

ROOT_DEFINITION = "__parley_root"


def tuples_as_prefix_items(schema: Any) -> Any:
    """A copy of `schema` with tuple arrays as 2020-12 writes them.

    A tuple `items: [...]` becomes `prefixItems` and its `additionalItems` becomes `items` (xgrammar: "items must
    be a boolean or an object"); `prefixItems` past `maxItems` are cut (xgrammar refuses the whole schema: "maxItems
    is less than the number of prefixItems", where the array may still be short). Seeds 199 and 264."""
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    for node in [node for _, node in iter_subschemas(out, "$")]:
        if isinstance(node.get("items"), list) and "prefixItems" not in node:
            node["prefixItems"] = node.pop("items")
            if "additionalItems" in node:
                node["items"] = node.pop("additionalItems")
        prefix, most = node.get("prefixItems"), node.get("maxItems")
        if isinstance(prefix, list) and isinstance(most, int) and not isinstance(most, bool) and len(prefix) > most:
            node["prefixItems"] = prefix[: max(most, 0)]
            if not node["prefixItems"]:
                del node["prefixItems"]
    return out


def root_recursion_as_definition(schema: Any) -> Any:
    """`schema` moved under `$defs` and referenced from a new root, where it refers to itself (`"$ref": "#"`).

    xgrammar's matcher loses its place when the grammar's root rule recurses: for Github_medium o79558 (`values`:
    items `{"$ref": "#"}`) it refused `{"values":[{"values":[]},{}]}`, the second item after a nested array,
    while the same schema reached through a definition is read right. The walker's instances found it
    (hypothesis-jsonschema draws nothing for recursive schemas)."""
    if not isinstance(schema, dict) or not any(node.get("$ref") == "#" for _, node in iter_subschemas(schema)):
        return schema
    moved = rebase_refs(schema, ["$defs", ROOT_DEFINITION])
    if moved is schema:  # nested `$id`s: pointers cannot be rebased safely, left as written
        return schema
    head = {k: schema[k] for k in ("$schema",) if k in schema}
    return {**head, "$ref": f"#/$defs/{ROOT_DEFINITION}", "$defs": {ROOT_DEFINITION: moved}}
