"""The second source of instances: the schema walker, and the time bound on hypothesis-jsonschema.

Both exist for the dev schemas hypothesis-jsonschema stalls on (issue 26 left them unchecked): the walker must
give valid values for them in a few seconds, and `generate` must come back when its bound is spent.
"""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.constrained.formats import GRAMMAR_PATTERNS
from tests.conftest import SHARED
from tests.constrained.generated_schemas import PATTERNS
from tests.constrained.instances import _valid_by, generate, instances, validator
from tests.constrained.schema_values import string_for_pattern, walk_values

DEV = SHARED / "data" / "jsonschemabench" / "dev"
STALLED = ["Github_ultra---o17072", "Github_ultra---o21136", "Github_ultra---o38670", "JsonSchemaStore---schema"]


def dev_schema(name: str) -> Any:
    path = DEV / name.split("---")[0] / f"{name}.json"
    if not path.exists():
        pytest.skip(f"MaskBench dev split not found at {DEV}")
    return json.loads(path.read_text())["schema"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32), pattern=st.sampled_from(PATTERNS + sorted(GRAMMAR_PATTERNS.values())))
def test_strings_drawn_for_a_pattern_match_it_in_full(seed: int, pattern: str) -> None:
    text = string_for_pattern(random.Random(seed), pattern)
    assert re.fullmatch(pattern, text, re.DOTALL), (pattern, text)


SCHEMAS = [
    {"type": "integer", "minimum": 3, "exclusiveMaximum": 9, "multipleOf": 2},
    {"type": "number", "minimum": 0.5, "maximum": 0.75},
    {"type": "string", "minLength": 2, "maxLength": 4},
    {"type": "string", "format": "email"},
    {"type": "array", "items": {"enum": ["a", 1, None]}, "minItems": 2, "maxItems": 3, "uniqueItems": True},
    {"properties": {"a": {"type": "boolean"}}, "required": ["a", "b"], "additionalProperties": {"type": "null"}},
    {"oneOf": [{"type": "string", "pattern": "^x-[0-9]+$"}, {"$ref": "#/$defs/n"}], "$defs": {"n": {"const": 4}}},
    {"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"minProperties": 2}]},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: json.dumps(s)[:40])
def test_the_walker_builds_distinct_valid_values_and_nothing_else(schema: Any) -> None:
    check = validator(schema)
    values = walk_values(schema, 5, _valid_by(check), seed=1)
    assert values and all(check.is_valid(v) for v in values)
    assert len({json.dumps(v, sort_keys=True) for v in values}) == len(values)
    assert values == walk_values(schema, 5, _valid_by(check), seed=1)  # deterministic


def test_the_walker_gives_up_on_a_schema_nothing_satisfies() -> None:
    schema = {"type": "object", "properties": {"a": False}, "required": ["a"]}
    assert walk_values(schema, 5, _valid_by(validator(schema))) == []


@pytest.mark.parametrize("name", STALLED)
def test_schemas_hypothesis_jsonschema_stalls_on_get_valid_walked_instances(name: str) -> None:
    schema = dev_schema(name)
    check = validator(schema)
    values = walk_values(schema, 10, _valid_by(check), budget_s=10.0)
    assert len(values) >= 5 and all(check.is_valid(v) for v in values)


def test_hypothesis_jsonschema_is_interrupted_when_its_bound_is_spent() -> None:
    schema = dev_schema("Github_ultra---o21136")  # no end in sight unbounded (240 s without an instance)
    started = time.monotonic()
    generate(schema, 20, budget_s=2.0)
    assert time.monotonic() - started < 60  # a hang guard: the bound is 2 s, its interrupt retried every 0.2 s


def test_instances_combine_both_sources_in_schema_order() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string", "pattern": "^z+$"}},
              "required": ["b", "a"], "additionalProperties": False}  # fmt: skip
    found = [i for i in instances(schema, 4) if i.valid]
    assert len(found) > 4  # more than one source's worth
    assert all(i.text.startswith('{"b":') for i in found)
