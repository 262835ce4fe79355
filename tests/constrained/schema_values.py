"""Values built by walking a schema: a second source of instances beside hypothesis-jsonschema, bounded in time.

Why a second source: hypothesis-jsonschema canonicalises every object schema it draws from, and on some
schemas that never ends (Github_ultra o17072, o21135...; JsonSchemaStore schema.json: no instance after
240 s), so those schemas were never checked; and it draws from one generator's habits (short keys, few
escapes). This walker reads a schema the way a writer of answers would: a branch of each `anyOf`/`oneOf`,
the `required` names and some of the others, lengths and counts inside their bounds, strings from the
node's `pattern` or format regex (`formats.GRAMMAR_PATTERNS`) by a random walk of the regex's parse tree.
It guesses; the caller keeps only what parley's validator calls valid, so a wrong guess costs a value,
never a wrong verdict. Deterministic: a seeded `random.Random`, and a deadline on the clock stops it early.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Callable
from typing import Any

from parley.constrained.formats import GRAMMAR_PATTERNS
from parley.constrained.schema.refs import MISSING, resolve_ref

try:  # Python 3.11+: the parser moved behind an underscore
    from re import _constants as sre_constants  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

# Characters a random string is drawn from: plain ASCII most of the time, and the ones JSON writes escaped
# (quote, backslash, controls), non-ASCII letters and an astral character, where grammars go wrong.
_PLAIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.:/@#"
_AWKWARD = '"\\\n\t\x01\x7féñ中😀'
_EXTRA_REPEATS = 3  # beyond a quantifier's minimum, at most this many more (and never past its maximum)
_FORMAT_SAMPLES: dict[str, list[str]] = {
    "date": ["2024-02-29", "1999-12-31", "2023-01-01"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-000000000000"],
    "idn-hostname": ["example.com", "bücher.de"],
    "regex": ["^a+$", "[0-9]{2}"],
}


class NoValue(Exception):
    """This walk cannot build a value for the node (`false`, an empty `enum`, too deep)."""


class _Deadline(Exception):
    pass


def _char_in(rng: random.Random, ranges: list[tuple[int, int]], negate: bool) -> str:
    def inside(code: int) -> bool:
        return any(lo <= code <= hi for lo, hi in ranges)

    if not negate:
        lo, hi = rng.choice(ranges)
        return chr(rng.randint(lo, min(hi, lo + 200)) if rng.random() < 0.8 else rng.randint(lo, hi))
    pool = [c for c in _PLAIN + _AWKWARD if not inside(ord(c))]
    if not pool:
        raise NoValue("a negated class takes every character this walk draws from")
    return rng.choice(pool)


_CATEGORIES: dict[Any, list[tuple[int, int]]] = {
    sre_constants.CATEGORY_DIGIT: [(48, 57)],
    sre_constants.CATEGORY_WORD: [(48, 57), (65, 90), (95, 95), (97, 122)],
    sre_constants.CATEGORY_SPACE: [(32, 32), (9, 10)],
}
_NOT_CATEGORIES = {
    sre_constants.CATEGORY_NOT_DIGIT: sre_constants.CATEGORY_DIGIT,
    sre_constants.CATEGORY_NOT_WORD: sre_constants.CATEGORY_WORD,
    sre_constants.CATEGORY_NOT_SPACE: sre_constants.CATEGORY_SPACE,
}


def _class_ranges(items: list[Any]) -> tuple[list[tuple[int, int]], bool]:
    ranges: list[tuple[int, int]] = []
    negate = False
    for op, arg in items:
        if op is sre_constants.NEGATE:
            negate = True
        elif op is sre_constants.LITERAL:
            ranges.append((arg, arg))
        elif op is sre_constants.RANGE:
            ranges.append(arg)
        elif op is sre_constants.CATEGORY and arg in _CATEGORIES:
            ranges += _CATEGORIES[arg]
        elif op is sre_constants.CATEGORY and arg in _NOT_CATEGORIES:
            # a negated category inside a class: draw from the printable characters outside it
            inside = _CATEGORIES[_NOT_CATEGORIES[arg]]
            ranges += [(ord(c), ord(c)) for c in _PLAIN + _AWKWARD if not any(lo <= ord(c) <= hi for lo, hi in inside)]
    return ranges, negate


def _walk_regex(rng: random.Random, parsed: Any, groups: dict[int, str], depth: int = 0) -> str:
    if depth > 40:
        raise NoValue("regex nested too deep")
    out: list[str] = []
    for op, arg in parsed:
        if op is sre_constants.LITERAL:
            out.append(chr(arg))
        elif op is sre_constants.NOT_LITERAL:
            out.append(_char_in(rng, [(arg, arg)], negate=True))
        elif op is sre_constants.ANY:
            out.append(rng.choice(_PLAIN))
        elif op is sre_constants.IN:
            out.append(_char_in(rng, *_class_ranges(arg)))
        elif op is sre_constants.CATEGORY:
            out.append(_char_in(rng, *_class_ranges([(op, arg)])))
        elif op is sre_constants.BRANCH:
            out.append(_walk_regex(rng, rng.choice(arg[1]), groups, depth + 1))
        elif op is sre_constants.SUBPATTERN:
            group, _, _, sub = arg
            text = _walk_regex(rng, sub, groups, depth + 1)
            if group is not None:
                groups[group] = text
            out.append(text)
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, getattr(sre_constants, "POSSESSIVE_REPEAT", 0)):
            low, high, sub = arg
            high = low + _EXTRA_REPEATS if high is sre_constants.MAXREPEAT else min(high, low + _EXTRA_REPEATS)
            out += [_walk_regex(rng, sub, groups, depth + 1) for _ in range(rng.randint(low, high))]
        elif op is sre_constants.GROUPREF:
            out.append(groups.get(arg, ""))
        # AT (anchors), ASSERT, ASSERT_NOT: nothing written; the validator judges the result
    return "".join(out)


def string_for_pattern(rng: random.Random, pattern: str) -> str:
    """A string the regex `pattern` matches in full, often (anchors and lookarounds are not followed)."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise NoValue(f"pattern not read: {exc}") from exc
    return _walk_regex(rng, parsed, {})


class Walker:
    """Builds values for the subschemas of `root`, one `value(node)` at a time."""

    def __init__(self, root: Any, seed: int, deadline: float) -> None:
        self.root, self.rng, self.deadline = root, random.Random(seed), deadline

    def value(self, node: Any, depth: int = 0) -> Any:
        if time.monotonic() > self.deadline:
            raise _Deadline
        if depth > 12:
            raise NoValue("too deep")
        if node is True or node == {}:
            return self._any(depth)
        if node is False or not isinstance(node, dict):
            raise NoValue("false schema")
        if "$ref" in node:
            target = resolve_ref(self.root, node["$ref"])
            if target is MISSING:
                raise NoValue(f"unresolved {node['$ref']}")
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {**target, **rest} if isinstance(target, dict) else target
            return self.value(node, depth + 1)
        if "const" in node:
            return node["const"]
        if isinstance(node.get("enum"), list):
            if not node["enum"]:
                raise NoValue("empty enum")
            return self.rng.choice(node["enum"])
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and node[key]:
                branch = self.rng.choice(node[key])
                rest = {k: v for k, v in node.items() if k != key}
                return self.value(_merge(rest, branch), depth + 1)
        if isinstance(node.get("allOf"), list) and node["allOf"]:
            merged = {k: v for k, v in node.items() if k != "allOf"}
            for branch in node["allOf"]:
                merged = _merge(merged, self._resolved(branch))
            return self.value(merged, depth + 1)
        return self._typed(node, self._type_of(node), depth)

    def _resolved(self, node: Any) -> Any:
        for _ in range(8):
            if not (isinstance(node, dict) and "$ref" in node):
                break
            target = resolve_ref(self.root, node["$ref"])
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}} if isinstance(target, dict) else {}
        return node

    def _type_of(self, node: dict[str, Any]) -> str:
        types = node.get("type")
        if isinstance(types, list) and types:
            return str(self.rng.choice(types))
        if isinstance(types, str):
            return types
        keys = node.keys()
        if keys & {"properties", "required", "additionalProperties", "patternProperties", "minProperties"}:
            return "object"
        if keys & {"items", "prefixItems", "minItems", "maxItems", "contains", "uniqueItems"}:
            return "array"
        if keys & {"pattern", "format", "minLength", "maxLength"}:
            return "string"
        if keys & {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}:
            return "number"
        return self.rng.choice(["string", "integer", "number", "boolean", "null", "object", "array"])

    def _any(self, depth: int) -> Any:
        kind = self.rng.choice(["string", "integer", "number", "boolean", "null"] + (["object", "array"] * (depth < 3)))
        return self._typed({}, kind, depth)

    def _typed(self, node: dict[str, Any], kind: str, depth: int) -> Any:
        if kind == "null":
            return None
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind in ("integer", "number"):
            return self._number(node, integer=kind == "integer")
        if kind == "string":
            return self._string(node)
        if kind == "array":
            return self._array(node, depth)
        if kind == "object":
            return self._object(node, depth)
        raise NoValue(f"unknown type {kind!r}")

    def _number(self, node: dict[str, Any], *, integer: bool) -> Any:
        low, high = _bound(node, "minimum", "exclusiveMinimum"), _bound(node, "maximum", "exclusiveMaximum")
        low = low if low is not None else (high - 1000 if high is not None else -1000.0)
        high = high if high is not None else low + 1000
        step = node.get("multipleOf")
        if isinstance(step, (int, float)) and not isinstance(step, bool) and step > 0:
            k_low, k_high = math.ceil(low / step), math.floor(high / step)
            k = self.rng.randint(k_low, max(k_low, min(k_high, k_low + 100)))
            value = k * step
            return int(value) if integer or float(value).is_integer() and isinstance(step, int) else value
        if integer or self.rng.random() < 0.3:
            return self.rng.randint(math.ceil(low), max(math.ceil(low), math.floor(high)))
        return round(self.rng.uniform(low, high), self.rng.choice([1, 2, 6, 15]))

    def _string(self, node: dict[str, Any]) -> str:
        if isinstance(node.get("pattern"), str):
            return string_for_pattern(self.rng, node["pattern"])
        fmt = node.get("format")
        if isinstance(fmt, str) and fmt in GRAMMAR_PATTERNS:
            return string_for_pattern(self.rng, GRAMMAR_PATTERNS[fmt])
        if isinstance(fmt, str) and fmt in _FORMAT_SAMPLES:
            return self.rng.choice(_FORMAT_SAMPLES[fmt])
        low = node.get("minLength", 0) if isinstance(node.get("minLength"), int) else 0
        high = node.get("maxLength", low + 12) if isinstance(node.get("maxLength"), int) else low + 12
        size = self.rng.randint(low, max(low, min(high, low + 12)))
        pool = _PLAIN if self.rng.random() < 0.6 else _PLAIN + _AWKWARD
        return "".join(self.rng.choice(pool) for _ in range(size))

    def _count(self, node: dict[str, Any], low_key: str, high_key: str, floor: int) -> int:
        low = node.get(low_key, 0) if isinstance(node.get(low_key), int) else 0
        high = node.get(high_key, max(low, floor) + 3) if isinstance(node.get(high_key), int) else max(low, floor) + 3
        return self.rng.randint(max(low, min(floor, high)), max(low, min(high, max(low, floor) + 3)))

    def _array(self, node: dict[str, Any], depth: int) -> list[Any]:
        prefix = node.get("prefixItems") or (node.get("items") if isinstance(node.get("items"), list) else [])
        items = node.get("items") if isinstance(node.get("items"), (dict, bool)) else node.get("additionalItems", {})
        size = self._count(node, "minItems", "maxItems", 0)
        out: list[Any] = []
        for i in range(size):
            sub = prefix[i] if i < len(prefix) else items
            if sub is False:
                break
            out.append(self.value(sub, depth + 1))
        if "contains" in node and size and not isinstance(node["contains"], bool):
            out[self.rng.randrange(len(out))] = self.value(node["contains"], depth + 1)
        if node.get("uniqueItems") is True:
            unique: dict[str, Any] = {}
            for item in out:
                unique.setdefault(repr(item), item)
            out = list(unique.values())
        return out

    def _object(self, node: dict[str, Any], depth: int) -> dict[str, Any]:
        props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        listed = node.get("required") if isinstance(node.get("required"), list) else []
        required = [name for name in listed if isinstance(name, str)]
        names = list(dict.fromkeys(required + [n for n in props if self.rng.random() < 0.5]))
        out: dict[str, Any] = {}
        for name in names:
            sub = props.get(name, node.get("additionalProperties", {}))
            out[name] = self.value(True if sub is False and name in required else sub, depth + 1)
        patterns = node.get("patternProperties") if isinstance(node.get("patternProperties"), dict) else {}
        for pattern, sub in list(patterns.items())[:2]:
            if self.rng.random() < 0.5:
                try:
                    out.setdefault(string_for_pattern(self.rng, pattern), self.value(sub, depth + 1))
                except NoValue:
                    pass
        extra = node.get("additionalProperties", True)
        wanted = self._count(node, "minProperties", "maxProperties", len(out))
        while len(out) < wanted and extra is not False:
            out.setdefault(self._key(node), self.value(extra if isinstance(extra, dict) else {}, depth + 1))
            if len(out) < wanted and self.rng.random() < 0.1:
                break
        return out

    def _key(self, node: dict[str, Any]) -> str:
        names = node.get("propertyNames")
        if isinstance(names, dict) and isinstance(names.get("pattern"), str):
            return string_for_pattern(self.rng, names["pattern"])
        return "".join(self.rng.choice(_PLAIN[:62]) for _ in range(self.rng.randint(1, 8)))


def _bound(node: dict[str, Any], inclusive: str, exclusive: str) -> float | None:
    """The closest value inside `node`'s bound on one side, if it has one."""
    nudge = 1 if exclusive == "exclusiveMinimum" else -1
    strict, value = node.get(exclusive), node.get(inclusive)
    if isinstance(strict, (int, float)) and not isinstance(strict, bool):
        return float(strict) + nudge * (1 if isinstance(strict, int) else 1e-3)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return float(value) + nudge * (strict is True)  # Draft 4's boolean `exclusiveMinimum`


def _merge(base: dict[str, Any], branch: Any) -> Any:
    """`base` narrowed by `branch` (their keywords together: properties merged, `required` joined)."""
    if not isinstance(branch, dict):
        return base if branch is True else branch
    merged = {**base, **branch}
    if isinstance(base.get("properties"), dict) and isinstance(branch.get("properties"), dict):
        merged["properties"] = {**base["properties"], **branch["properties"]}
    if isinstance(base.get("required"), list) and isinstance(branch.get("required"), list):
        merged["required"] = list(dict.fromkeys(base["required"] + branch["required"]))
    return merged


def walk_values(
    schema: Any, count: int, accept: Callable[[Any], bool], *, seed: int = 0, budget_s: float = 5.0, tries: int = 20
) -> list[Any]:
    """Up to `count` distinct values built for `schema` that `accept` takes, from `count * tries` tries at most,
    within `budget_s` seconds."""
    walker = Walker(schema, seed, time.monotonic() + budget_s)
    out: dict[str, Any] = {}
    for _ in range(count * tries):
        if len(out) >= count:
            break
        try:
            value = walker.value(schema)
            key = json.dumps(value, sort_keys=True, allow_nan=False)
            if key not in out and accept(value):
                out[key] = value
        except _Deadline:
            break
        except (NoValue, RecursionError, ValueError, TypeError, OverflowError):
            continue
    return list(out.values())
