"""Instances for differential tests of the backends: valid ones from hypothesis-jsonschema and the schema walker
(`schema_values`), invalid ones by mutation.

Why both kinds: a matcher must accept every valid instance (a false rejection is a valid answer the
model can never give) and reject every invalid one whose violated keyword it claims to enforce (a
false acceptance the compile did not warn about is a silently dropped constraint).

Generation is deterministic (`derandomize=True`, no example database; a seeded walker): the same schema gives
the same instances on every run and machine, unless a source's time bound cuts it short on a slow one. Valid
instances are re-checked with `jsonschema` (formats included) and kept only if valid; objects are serialised
with their keys in the order the backends write them: the schema's property order (as MaskBench does), where the
names of a subschema's `$ref`, `anyOf`, `oneOf`, `allOf` come before its own `properties` (parley's prepared
order, `_property_order`; not those of an `anyOf`/`oneOf` with a branch the grammars read as any value,
`_branches`), `required` names missing from `properties` after those (in `required` order: declared by parley
right after the node's own properties where it can, else at the end), recursively through `properties`, matching
`patternProperties` and `additionalProperties`, so backends are compared fairly. Invalid instances are single
mutations of a valid one (a key dropped or added, a value replaced by one of another type or pushed past a
bound), kept only if `jsonschema` rejects them; each carries the keyword `jsonschema` names as violated.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from parley.constrained.schema.dispatch import ASSERTIONS, UNREAD
from parley.constrained.schema.prepare import BRANCHES_FIRST
from parley.constrained.schema.refs import MISSING, resolve_ref
from parley.constrained.schema.walk import iter_subschemas
from tests.constrained.schema_values import walk_values


@dataclass(frozen=True)
class Instance:
    text: str
    valid: bool
    keyword: str = ""  # for invalid instances: the keyword jsonschema reports as violated


def validator(schema: Any) -> Any:
    """The validator `parley.constrained.validate` uses (formats asserted, `multipleOf` exact, ECMA-262 regexes).

    Why its readings matter here: Python's `re` matches `"Ń"` with `\\w`, so hypothesis-jsonschema draws such
    strings and plain `jsonschema` calls them valid (Github_medium o42527 `provider`, o90425's `^\\w$` keys);
    Draft 4's checker passes `"tokenize"` as a uuid (o73993); float division passes -43536423848412.805 as a
    multiple of 0.1 (o43991). Under parley's readings those are invalid instances, as they are to the backends.
    """
    from parley.constrained.validate import schema_validator

    return schema_validator(schema)


class _LegacyMany:
    """The `more()`/`reject()` element loop hypothesis-jsonschema 0.23.1 expects from `cu.many`.

    Hypothesis 6.16x replaced it with a context manager, so drawing any object schema raised
    AttributeError; this keeps the old protocol on top of `draw_boolean` (shrinking is not needed:
    instances are generated only, never shrunk).
    """

    def __init__(self, data: Any, min_size: int, max_size: float, average_size: float) -> None:
        from hypothesis.internal.conjecture.utils import _calc_p_continue

        self.data, self.min_size, self.max_size, self.count = data, min_size, max_size, 0
        self.p_continue = _calc_p_continue(average_size - min_size, max_size - min_size)

    def more(self) -> bool:
        if self.count < self.min_size:
            go = True
        elif self.count >= self.max_size:
            go = False
        else:
            go = bool(self.data.draw_boolean(self.p_continue))
        self.count += go
        return go

    def reject(self) -> None:
        self.count -= 1


def _patch_hypothesis_jsonschema() -> None:
    from hypothesis_jsonschema import _from_schema

    if not hasattr(_from_schema.cu, "many") or hasattr(_from_schema.cu.many, "more"):
        return
    import types

    _from_schema.cu = types.SimpleNamespace(**{**vars(_from_schema.cu), "many": _LegacyMany})


def _cache_composite_source_check() -> None:
    """Hypothesis parses a `@composite` function's source on every call of the decorator, to warn if it never
    uses `draw`; hypothesis-jsonschema decorates a fresh closure per object schema it draws from, so that
    parse took a third of the generation time of large schemas (Github_hard o12459: 22 of 64 s). The answer
    depends on the code alone: it is cached per code object (what is drawn does not change)."""
    from hypothesis.strategies._internal import core

    check = core.is_first_param_referenced_in_function
    if getattr(check, "by_code", False):
        return
    answers: dict[Any, bool] = {}

    def by_code(f: Any) -> bool:
        code = getattr(f, "__code__", None)
        if code is None:
            return bool(check(f))
        if code not in answers:
            answers[code] = bool(check(f))
        return answers[code]

    by_code.by_code = True  # type: ignore[attr-defined]  # marks the patch as applied
    core.is_first_param_referenced_in_function = by_code


def _no_local_constants() -> None:
    """Hypothesis mixes string and number constants from the loaded modules into what it draws
    (`_get_local_constants`), so the same schema gave other instances in another process ("tokenize" from
    parley's own sources); without them a schema's instances depend on the schema alone."""
    from hypothesis.internal.conjecture import providers

    if hasattr(providers, "_get_local_constants") and hasattr(providers, "Constants"):
        providers._get_local_constants = providers.Constants  # type: ignore[attr-defined]  # an empty set


class _OutOfTime(BaseException):
    """Raised by the timer inside a draw; a BaseException, so hypothesis lets it through rather than replay the
    draw as a failing example."""


@contextlib.contextmanager
def _time_bound(seconds: float) -> Iterator[None]:
    """Interrupt the body after `seconds` (a real-time timer; only the main thread can take its signal, so
    elsewhere the body runs unbounded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        code = frame.f_code if frame is not None else None
        if code is not None and (code.co_filename.endswith("weakref.py") or code.co_name == "gc_callback"):
            return  # what a weakref or gc callback raises is swallowed (and may leave it half done): next tick
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.2)  # again every 0.2 s, until the body is out
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def generate(schema: Any, count: int, budget_s: float = 30.0) -> list[Any]:
    """Up to `count` distinct values hypothesis-jsonschema draws for `schema` within `budget_s` seconds (those
    drawn before the bound when it stalls; empty if it cannot draw). Eight dev schemas stall in its
    canonicalisation of object schemas (Github_ultra o17072...): unbounded, a full run hung on them."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis_jsonschema import from_schema

    _patch_hypothesis_jsonschema()
    _no_local_constants()
    _cache_composite_source_check()

    drawn: list[Any] = []

    @settings(
        max_examples=count, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(value=from_schema(copy.deepcopy(schema)))
    def collect(value: Any) -> None:
        drawn.append(value)

    try:
        with _time_bound(budget_s):
            collect()  # on a copy: hypothesis-jsonschema rewrites the schema it is given in place (o66267)
    except _OutOfTime:
        pass
    except Exception:  # recursive $refs, unsatisfiable merges...: hypothesis-jsonschema cannot draw, no instances
        return []
    seen: set[str] = set()
    out = []
    for value in drawn:
        key = json.dumps(value, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out


# Keywords every grammar backend leaves to validation (llguidance strips them, xgrammar ignores them).
_UNCOMPILED = UNREAD | {"dependentRequired", "minContains", "maxContains"}


def _vacuous(branch: Any) -> bool:
    """Whether the grammars read `branch` as any value: no assertion but keywords no backend compiles."""
    return branch is True or isinstance(branch, dict) and not (ASSERTIONS - _UNCOMPILED) & branch.keys()


_ROOT_VALIDATORS: dict[int, tuple[Any, Any]] = {}


def _root_validator(root: Any) -> Any:
    """The validator of `root`, from which a branch's is evolved: its pointers resolve against the whole document
    (Github_ultra o65975 points into `#/paypal/definitions`, not a definitions keyword)."""
    kept = _ROOT_VALIDATORS.get(id(root))
    if kept is None or kept[0] is not root:
        if len(_ROOT_VALIDATORS) > 64:
            _ROOT_VALIDATORS.clear()
        kept = _ROOT_VALIDATORS[id(root)] = (root, validator(root))
    return kept[1]


def _branches(root: Any, node: Any, key: str, value: Any, names: bool = True) -> list[Any]:
    """The branches of `node[key]` that shape `value`: every `allOf` branch; of `anyOf`/`oneOf`, the first the
    value matches (the backends write the chosen branch's own property order, Github_trivial o83689), else all.

    With `names`, none where `node` has `properties` and one branch is vacuous (`{"not": ...}` once `not` is
    left out): the list admits any value, llguidance drops it, and its branches' names are written as undeclared
    keys after the node's own (Github_trivial o21864). Without own names, the branch's order is one llguidance's
    any value takes too; and the branches that shape a property's value (`names=False`) keep it, as xgrammar
    writes it (JsonSchemaStore ci.json's `{".": {"when": ..., "start_in": ...}}`)."""
    branches = node.get(key) if isinstance(node.get(key), list) else []
    if names and key != "allOf" and node.get("properties") and any(map(_vacuous, branches)):
        return []
    if key == "allOf" or value is MISSING:
        return branches
    check = _root_validator(root)
    for branch in branches:
        try:
            if isinstance(branch, dict) and check.evolve(schema=branch).is_valid(value):
                return [branch]
        except Exception:  # noqa: BLE001 - an unresolvable branch: fall back to every branch
            break
    return branches


def _declares_required(node: dict[str, Any]) -> bool:
    """Whether parley declares `node`'s `required` names missing from its `properties` there, after them
    (`parley.constrained.schema.prepare._declare_required`), so they are written with the node's own names."""
    return (isinstance(node.get("properties"), dict) and isinstance(node.get("required"), list)
            and node.get("additionalProperties", True) is not False
            and not {"patternProperties", "unevaluatedProperties"} & node.keys())  # fmt: skip


def _property_order(root: Any, node: Any, value: Any = MISSING, depth: int = 0, key: str = "properties") -> list[str]:
    """Names in the order the backends write them: parley puts every subschema's `$ref`, `anyOf`, `oneOf`,
    `allOf` ahead of its other keywords (`BRANCHES_FIRST`, the order xgrammar writes in whatever the schema's
    order; llguidance writes keywords in the order given), so the names of those come first, then the node's
    own `node[key]`. `key`: `properties` (then the `required` names parley declares after them), or `required`
    (names no `properties` declares: both backends write them after all the others)."""
    if not isinstance(node, dict) or depth > 8:
        return []
    names: list[str] = []
    for keyword in BRANCHES_FIRST:
        if keyword == "$ref" and "$ref" in node:
            target = resolve_ref(root, node["$ref"])
            names += [] if target is MISSING else _property_order(root, target, value, depth + 1, key)
        elif keyword != "$ref":
            for branch in _branches(root, node, keyword, value):
                names += _property_order(root, branch, value, depth + 1, key)
    own = node.get(key)
    names += [name for name in own if isinstance(name, str)] if isinstance(own, (dict, list)) else []
    if key == "properties" and _declares_required(node):
        names += [name for name in node["required"] if isinstance(name, str)]
    return list(dict.fromkeys(names))


def _key_matches(pattern: str, name: str) -> bool:
    """Whether `patternProperties` key `pattern` applies to property `name`, as parley's validator reads it."""
    try:
        return re.search(pattern, name, re.ASCII) is not None
    except re.error:
        return False


def _subschemas_for(root: Any, node: Any, name: str, value: Any = MISSING, depth: int = 0) -> list[Any]:
    """The subschemas that may apply to property `name` of `value`, an object matching `node`."""
    if not isinstance(node, dict) or depth > 8:
        return []
    out: list[Any] = []
    if "$ref" in node:
        target = resolve_ref(root, node["$ref"])
        if target is not MISSING:
            out += _subschemas_for(root, target, name, value, depth + 1)
    props = node.get("properties")
    named = isinstance(props, dict) and name in props
    if named:
        out.append(props[name])
    patterns = node.get("patternProperties")
    matched = [sub for key, sub in patterns.items() if _key_matches(key, name)] if isinstance(patterns, dict) else []
    out += matched  # a key under a pattern is shaped by it, as the backends compile it (WashingtonPost wp_68)
    if not named and not matched and isinstance(node.get("additionalProperties"), dict):
        out.append(node["additionalProperties"])
    for key in ("allOf", "anyOf", "oneOf"):
        for branch in _branches(root, node, key, value, names=False):
            out += _subschemas_for(root, branch, name, value, depth + 1)
    return out


def _items_of(root: Any, node: Any, value: Any = MISSING, depth: int = 0) -> Any:
    """The `items` schema of array `value` matching `node`, through `$ref` and the combinator branches: of
    `anyOf`/`oneOf`, the one `value` matches (Github_hard o66267: strings or objects, `_branches`)."""
    if not isinstance(node, dict) or depth > 8:
        return {}
    if isinstance(node.get("items"), dict):
        return node["items"]
    if "$ref" in node:
        target = resolve_ref(root, node["$ref"])
        found = {} if target is MISSING else _items_of(root, target, value, depth + 1)
        if found:
            return found
    for key in ("allOf", "anyOf", "oneOf"):
        for branch in _branches(root, node, key, value, names=False):
            found = _items_of(root, branch, value, depth + 1)
            if found:
                return found
    return {}


def in_schema_order(root: Any, node: Any, value: Any) -> Any:
    """`value` with object keys in the order the schema lists them (unknown keys last)."""
    if isinstance(value, list):
        items = _items_of(root, node, value)
        return [in_schema_order(root, items, v) for v in value]
    if not isinstance(value, dict):
        return value
    names = dict.fromkeys(_property_order(root, node, value) + _property_order(root, node, value, key="required"))
    order = {name: i for i, name in enumerate(names)}
    keys = sorted(value, key=lambda k: (order.get(k, len(order)), 0))
    out = {}
    for key in keys:
        subs = _subschemas_for(root, node, key, value)
        subs = [sub for sub in subs if sub not in (True, {})] or subs  # `"contains": true` beside a branch's object
        out[key] = in_schema_order(root, subs[0] if subs else {}, value[key])
    return out


def _listed_integral_floats(schema: Any) -> set[float]:
    """Integral floats (`1.0`) written anywhere inside the `enum`/`const` values of `schema`."""
    found: set[float] = set()

    def numbers(value: Any) -> None:
        if isinstance(value, float) and value.is_integer():
            found.add(value)
        elif isinstance(value, (list, dict)):
            for item in value.values() if isinstance(value, dict) else value:
                numbers(item)

    for _, node in iter_subschemas(schema, "$"):
        numbers(node.get("const"))
        numbers(node.get("enum"))
    return found


def integer_spelled(value: Any, listed: set[float]) -> Any:
    """`value` with the floats in `listed` written as integers: a listed `1.0` is the integer 1 to JSON Schema,
    and the grammars write what the schema lists in integer spelling (the rule in `parley.constrained.choice`;
    seed 13 of the generated schemas: `{"enum": [1.0]}`, which xgrammar writes `1`)."""
    if isinstance(value, float) and value in listed:
        return int(value)
    if isinstance(value, list):
        return [integer_spelled(v, listed) for v in value]
    if isinstance(value, dict):
        return {k: integer_spelled(v, listed) for k, v in value.items()}
    return value


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_OTHER_TYPES: list[Any] = ["x", 7, 2.5, True, None, [], {}]


def _mutations(value: Any) -> list[Any]:
    """Single-step mutations of `value` (at the root and one level down)."""
    out: list[Any] = [v for v in _OTHER_TYPES if type(v) is not type(value)]
    if isinstance(value, dict):
        for key in list(value)[:4]:
            out.append({k: v for k, v in value.items() if k != key})
            out += [{**value, key: v} for v in _OTHER_TYPES if type(v) is not type(value[key])][:3]
        out.append({**value, "zz_extra": 1})
    elif isinstance(value, list):
        out += [value + value[-1:], value[:-1]] if value else [[0]]
        out += [[v] + value[1:] for v in _OTHER_TYPES[:3]] if value else []
    elif isinstance(value, bool):
        out.append(not value)
    elif isinstance(value, (int, float)):
        out += [value + 1, value - 1, -value - 1, value * 1000 + 0.5]
    elif isinstance(value, str):
        out += [value + "x", value[:-1], "", value * 3 + "!"]
    return out


def _violated(check: Any, value: Any) -> str | None:
    errors = list(check.iter_errors(value))
    if not errors:
        return None
    best = min(errors, key=lambda e: len(e.relative_schema_path))
    return str(best.validator)


def _valid_by(check: Any) -> Callable[[Any], bool]:
    def valid(value: Any) -> bool:
        try:
            return bool(check.is_valid(value))
        except (ValueError, RecursionError):
            return False

    return valid


def instances(schema: Any, count: int, invalid_per_valid: int = 2, budget_s: float = 30.0) -> list[Instance]:
    """Valid instances (re-checked, in schema order) and invalid mutations of them, deterministic: up to `count`
    from hypothesis-jsonschema and up to `count` more from `schema_values` (each source bounded in time)."""
    check = validator(schema)
    out: list[Instance] = []
    seen: set[str] = set()
    walked = walk_values(schema, count, _valid_by(check), budget_s=budget_s / 3)
    listed = _listed_integral_floats(schema)
    for value in [integer_spelled(v, listed) for v in generate(schema, count, budget_s) + walked]:
        try:
            if not check.is_valid(value):
                continue
            text = dumps(in_schema_order(schema, schema, value))
        except (ValueError, RecursionError):
            continue
        if text in seen:
            continue
        seen.add(text)
        out.append(Instance(text, True))
        made = 0
        for mutated in _mutations(value):
            if made >= invalid_per_valid:
                break
            try:
                keyword = _violated(check, mutated)
                text = dumps(in_schema_order(schema, schema, mutated))
            except (ValueError, RecursionError):
                continue
            if keyword is not None and text not in seen:
                seen.add(text)
                out.append(Instance(text, False, keyword))
                made += 1
    return out
