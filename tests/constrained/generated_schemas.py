"""Schemas drawn at random from the constructs where backends were seen to reject valid answers.

Why generated schemas beside the dev split: the dev split passes in full, so it no longer finds anything; the
schemas that failed outside it mix numeric bounds with `enum`, `minItems`/`maxItems`, `pattern` with `format`,
`$ref` beside `additionalProperties`, `oneOf`/`anyOf` and `dependencies` (issue 26). This draws schemas that
combine exactly those, nested, with the awkward names and bounds real schemas have, so each run of the
differential tests meets combinations nobody wrote by hand. `random_schema(seed)` is deterministic: a
disagreement is reproduced by its seed.
"""

from __future__ import annotations

import random
from typing import Any

# Patterns paired with a format they can hold together (a value must satisfy both): "pattern with format".
FORMAT_PATTERNS: list[tuple[str, str]] = [
    ("email", "@example\\.com$"),
    ("date", "^20"),
    ("date-time", "^19[0-9]{2}-"),
    ("uri", "^https://"),
    ("ipv4", "^10\\."),
    ("hostname", "\\.org$"),
    ("uuid", "^[0-9a-f-]+$"),
    ("time", "Z$"),
    ("ipv6", "^fe80:"),
    ("duration", "^P[0-9]"),
]
FORMATS = sorted({name for name, _ in FORMAT_PATTERNS} | {"uri-reference", "json-pointer"})
PATTERNS = [
    "^[a-z]+$",
    "^[A-Z][a-z]{1,5}$",
    "^\\d{3}-\\d{4}$",
    "[0-9]",
    "^(foo|bar)[0-9]*$",
    "^x-",
    "^.{2,6}$",
    "^[^\\s]+$",
    "^\\w+(\\.\\w+)*$",
    "^[a-z0-9]+(-[a-z0-9]+)*$",
    "^$|^[A-Z]{2}$",
]
DRAFT_7 = "http://json-schema.org/draft-07/schema#"
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
NAMES = ["id", "name", "type", "value", "items", "kind", "x-tag", "a b", "ünï", "$ref", "1", "", "enum", "min"]
ENUM_VALUES: list[Any] = [0, 1, 2, 5, 10, 20, -3, 2.5, 1.0, "a", "B", "", "x y", None, True, False]


class SchemaDraw:
    """One random schema: `node()` draws a subschema, adding shared definitions to `defs` as it goes."""

    def __init__(self, seed: int, max_depth: int = 3) -> None:
        self.rng, self.max_depth = random.Random(seed), max_depth
        self.defs: dict[str, Any] = {}
        self.draft7 = self.rng.random() < 0.4  # else 2020-12: `dependencies`/`definitions` or their successors

    def node(self, depth: int = 0) -> Any:
        leaves = [self.integer, self.number, self.enum, self.numeric_enum, self.string, self.pattern,
                  self.format, self.format_with_pattern, self.const, self.plain]  # fmt: skip
        if depth >= self.max_depth:
            return self.rng.choice(leaves)()
        composite = [self.object, self.object, self.array, self.branches, self.ref, self.all_of]
        return self.rng.choice(composite)(depth) if self.rng.random() < 0.6 else self.rng.choice(leaves)()

    @property
    def defs_key(self) -> str:
        return "definitions" if self.draft7 else "$defs"

    # --- leaves ---------------------------------------------------------------------------------------------------

    def _bounds(self, node: dict[str, Any], integral: bool) -> dict[str, Any]:
        low = self.rng.choice([-10, 0, 1, 3] if integral else [-1.5, 0, 0.5, 1])
        high = low + self.rng.choice([0, 1, 7, 100] if integral else [0.25, 1, 10])
        if self.rng.random() < 0.7:
            node["exclusiveMinimum" if self.rng.random() < 0.3 and high > low else "minimum"] = low
        if self.rng.random() < 0.7:
            node["exclusiveMaximum" if self.rng.random() < 0.3 and high > low + 1 else "maximum"] = high
        return node

    def integer(self) -> dict[str, Any]:
        node = self._bounds({"type": "integer"}, integral=True)
        if self.rng.random() < 0.2:
            node["multipleOf"] = self.rng.choice([2, 5])
        return node

    def number(self) -> dict[str, Any]:
        node = self._bounds({"type": self.rng.choice(["number", ["number", "null"]])}, integral=False)
        if self.rng.random() < 0.15:
            node["multipleOf"] = self.rng.choice([0.5, 0.25, 3])
        return node

    def enum(self) -> dict[str, Any]:
        return {"enum": self.rng.sample(ENUM_VALUES, self.rng.randint(1, 5))}

    def numeric_enum(self) -> dict[str, Any]:
        values = self.rng.sample([0, 1, 2, 5, 10, 20, -3, 2.5, 1.0, 7], self.rng.randint(2, 6))
        kind = "integer" if all(isinstance(v, int) for v in values) and self.rng.random() < 0.5 else "number"
        return self._bounds({"type": kind, "enum": values}, integral=kind == "integer")

    def string(self) -> dict[str, Any]:
        node: dict[str, Any] = {"type": "string"}
        if self.rng.random() < 0.6:
            node["minLength"] = self.rng.choice([0, 1, 3])
        if self.rng.random() < 0.6:
            node["maxLength"] = node.get("minLength", 0) + self.rng.choice([0, 2, 10])
        return node

    def pattern(self) -> dict[str, Any]:
        node = {"type": "string", "pattern": self.rng.choice(PATTERNS)}
        if self.rng.random() < 0.3:
            node["maxLength"] = self.rng.choice([4, 8, 20])
        return node

    def format(self) -> dict[str, Any]:
        return {"type": "string", "format": self.rng.choice(FORMATS)}

    def format_with_pattern(self) -> dict[str, Any]:
        name, pattern = self.rng.choice(FORMAT_PATTERNS)
        return {"type": "string", "format": name, "pattern": pattern}

    def const(self) -> dict[str, Any]:
        return {"const": self.rng.choice(ENUM_VALUES + [{"k": 1}, [1, "a"]])}

    def plain(self) -> Any:
        return self.rng.choice([{"type": "boolean"}, {"type": "null"}, {}, {"type": ["string", "integer"]}])

    # --- composites -----------------------------------------------------------------------------------------------

    def object(self, depth: int) -> dict[str, Any]:
        names = self.rng.sample(NAMES, self.rng.randint(1, 4))
        node: dict[str, Any] = {"type": "object", "properties": {n: self.node(depth + 1) for n in names}}
        if self.rng.random() < 0.7:
            node["required"] = self.rng.sample(names, self.rng.randint(0, len(names)))
        extra = self.rng.random()
        if extra < 0.35:
            node["additionalProperties"] = False
        elif extra < 0.5:
            node["additionalProperties"] = self.node(self.max_depth)
        if self.rng.random() < 0.15:
            node["patternProperties"] = {self.rng.choice(["^x-", "^[0-9]+$", "_id$"]): self.node(self.max_depth)}
        if self.rng.random() < 0.2 and len(names) >= 2:
            first, second = self.rng.sample(names, 2)
            if self.draft7:
                node["dependencies"] = {first: [second]} if self.rng.random() < 0.6 else {first: self.object(depth + 1)}
            else:
                node["dependentRequired"] = {first: [second]}
        if self.rng.random() < 0.1:
            node["minProperties"] = 1
        if self.rng.random() < 0.1 and node.get("additionalProperties") is not False:
            node["maxProperties"] = len(names) + 1
        return node

    def array(self, depth: int) -> dict[str, Any]:
        node: dict[str, Any] = {"type": "array", "items": self.node(depth + 1)}
        low = self.rng.choice([0, 1, 2])
        if self.rng.random() < 0.6:
            node["minItems"] = low
        if self.rng.random() < 0.6:
            node["maxItems"] = low + self.rng.choice([0, 1, 3])
        if self.rng.random() < 0.15:
            node["uniqueItems"] = True
        if self.rng.random() < 0.15:  # a first item of its own
            first = [self.node(self.max_depth)]
            node.update({"items": first, "additionalItems": node["items"]} if self.draft7 else {"prefixItems": first})
        return node

    def branches(self, depth: int) -> dict[str, Any]:
        key = self.rng.choice(["anyOf", "oneOf"])
        node: dict[str, Any] = {key: [self.node(depth + 1) for _ in range(self.rng.randint(2, 3))]}
        if self.rng.random() < 0.3:  # branches beside the node's own keywords, as real schemas write them
            node.update({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})
        return node

    def ref(self, depth: int) -> dict[str, Any]:
        name = f"d{len(self.defs)}"
        self.defs[name] = {}  # reserved: a definition drawn inside this one takes the next name
        self.defs[name] = self.object(depth + 1) if self.rng.random() < 0.6 else self.node(depth + 1)
        node: dict[str, Any] = {"$ref": f"#/{self.defs_key}/{name}"}
        if self.rng.random() < 0.4:  # "$ref + additionalProperties"
            node["additionalProperties"] = self.rng.choice([False, {"type": "string"}])
        return node

    def all_of(self, depth: int) -> dict[str, Any]:
        base = self.ref(depth)
        return {"allOf": [base, {"properties": {"extra": self.node(depth + 1)}}]}


def random_schema(seed: int) -> dict[str, Any]:
    """The schema for `seed`: an object at the root (as tool arguments and `response_format` schemas are)."""
    draw = SchemaDraw(seed)
    schema = {"$schema": DRAFT_7 if draw.draft7 else DRAFT_2020_12, **draw.object(0)}
    if draw.defs:
        schema[draw.defs_key] = draw.defs
    return schema
