"""Generated schemas: every backend against the instances of schemas nobody wrote (issue 26, part 2).

Schemas come from `generated_schemas.random_schema(seed)` (numeric bounds beside `enum`, item counts, `pattern`
beside `format`, `$ref` beside `additionalProperties`, `oneOf`/`anyOf`, `dependencies`, nested, in Draft 7 and
2020-12); instances from hypothesis-jsonschema and the schema walker (`instances`). The same contract as the
dev split's (`test_differential`): every valid instance accepted to the end, every invalid one rejected or
caught by validation. CI runs `SEEDS` schemas; `PARLEY_GENERATED=N` runs N.

What the first 600 seeds found (and the walker's instances on the dev split: the recursive root), and the rule each
became (pinned below):

| construct | backend | disagreement | rule |
|---|---|---|---|
| a non-ASCII or escaped declared name, extra keys admitted | xgrammar | none: `{"ünï":"x"}` passed | validated |
| the same | xgrammar | `{"Ã_id":...}` beside `ünï` (seed 363) | a price, warned |
| assertions beside `$ref` under Draft 7 | llguidance | `{"min":5}` refused (it applied them) | removed in preparation |
| an integral float listed in `enum`/`const` (`1.0`) | xgrammar | `1.0` (it writes `1`) | integer spelling (the tests) |
| `format: uri` with an IPvFuture `V` or IPv6-with-IPv4 host | llguidance | `a://[V1.x]/` | parley's regex |
| `patternProperties` beside an `additionalProperties` schema | xgrammar | `{"🏻_id":""}` | both stripped, validated |
| a tuple `items: [...]`; `prefixItems` past `maxItems` | xgrammar | refused the schema | rewritten (exact) |
| an integer range with no multiple of `multipleOf` | xgrammar | refused the schema | stripped, validated |
| a root that refers to itself (`"$ref": "#"`) | xgrammar | `{"values":[{"values":[]},{}]}` | moved under `$defs` |
| `propertyNames` under Draft 4 (no keyword there) | xgrammar | key `"Y"` (JsonSchemaStore staticwebapp) | removed |
| a bounded string where llguidance refuses | auto (xgrammar) | `"w\u0012"` (`maxLength`) | lengths validated |
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import pytest

from parley.constrained import CompileCache, ConstrainedError, JsonSchema, ValidationFailed, compile
from tests.constrained.conftest import feed
from tests.constrained.generated_schemas import DRAFT_7, random_schema
from tests.constrained.instances import Instance, instances, validator
from tests.constrained.test_differential import EXACT, disagreements, escape_blind, spec_for, usable

pytestmark = pytest.mark.model

SEEDS = int(os.environ.get("PARLEY_GENERATED", "24"))
COUNT = 8


@functools.cache
def generated_case(seed: int) -> tuple[Any, tuple[Instance, ...]]:
    schema = random_schema(seed)
    return schema, tuple(instances(schema, COUNT, budget_s=10.0))


def test_the_same_seed_draws_the_same_schema() -> None:
    assert random_schema(7) == random_schema(7)
    assert random_schema(7) != random_schema(8)


@pytest.mark.parametrize("backend", EXACT)
def test_generated_schemas_agree_with_their_instances(smol_tokenizer: Any, backend: str) -> None:
    failures, checked, compiled_count = [], 0, 0
    for seed in range(SEEDS):
        schema, found = generated_case(seed)
        try:
            matcher = compile(spec_for(schema, backend), smol_tokenizer, backend=backend, cache=CompileCache())  # type: ignore[arg-type]
        except ConstrainedError as exc:  # a backend may refuse what it cannot read (typed); auto then takes another
            assert backend != "auto" or not any(i.valid for i in found), (seed, exc)
            continue
        compiled_count += 1
        kept = usable(smol_tokenizer, list(found))
        checked += len(kept)
        failures += [f"seed {seed} ({matcher.backend}): {d}" for d in
                     disagreements(matcher, smol_tokenizer, kept, blind=escape_blind(schema))]  # fmt: skip
    assert compiled_count >= SEEDS // 2 and checked > 10 * SEEDS
    assert not failures, failures


# --- what the generated schemas found, one regression test each ------------------------------------------------


def compiled(tokenizer: Any, schema: Any, backend: str) -> Any:
    return compile(JsonSchema(schema, strict=False), tokenizer, backend=backend, cache=CompileCache())  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["ünï", "é", 'a"b', "a\\b"])
def test_xgrammar_validates_declared_names_its_extra_key_rule_lets_through(smol_tokenizer: Any, name: str) -> None:
    schema = {"type": "object", "properties": {name: {"enum": [0, False]}}}  # extra keys admitted
    wrong = json.dumps({name: "x"}, ensure_ascii=False, separators=(",", ":"))
    xgrammar = compiled(smol_tokenizer, schema, "xgrammar")
    assert xgrammar.needs_validation and any("extra-key rule" in w for w in xgrammar.warnings)
    with pytest.raises(ValidationFailed):
        xgrammar.validate(wrong)
    assert any("at a price" in w and "non-ASCII extra keys" in w for w in xgrammar.warnings)  # it refuses some
    auto = compiled(smol_tokenizer, schema, "auto")
    assert auto.backend == "llguidance" and not auto.needs_validation
    assert not feed(auto, smol_tokenizer, wrong)
    auto.reset()
    assert feed(auto, smol_tokenizer, '{"Ã_id":1}')


def test_plain_ascii_names_stay_enforced_on_xgrammar(smol_tokenizer: Any) -> None:
    matcher = compiled(smol_tokenizer, {"type": "object", "properties": {"a b": {"enum": [0, False]}}}, "xgrammar")
    assert not matcher.needs_validation and not feed(matcher, smol_tokenizer, '{"a b":"x"}')


D0 = {"type": "object", "properties": {"min": {"enum": [5, 7]}}, "additionalProperties": False}


@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize("draft", [DRAFT_7, None])
def test_assertions_beside_a_ref_apply_only_in_drafts_that_read_them(
    smol_tokenizer: Any, backend: str, draft: str | None
) -> None:
    value = {"$ref": "#/definitions/d0", "additionalProperties": {"type": "string"}}  # "min" is extra to it
    schema = {"type": "object", "properties": {"value": value}, "definitions": {"d0": D0}}
    schema |= {"$schema": draft} if draft else {}
    text = '{"value":{"min":5}}'
    assert validator(schema).is_valid({"value": {"min": 5}}) == (draft is not None)
    matcher = compiled(smol_tokenizer, schema, backend)
    accepted = feed(matcher, smol_tokenizer, text)
    if draft is not None:
        assert accepted  # Draft 7 ignores what stands beside `$ref`
    elif accepted:
        with pytest.raises(ValidationFailed):
            matcher.validate(text)


@pytest.mark.parametrize("backend", EXACT)
def test_a_listed_integral_float_is_written_as_the_integer(smol_tokenizer: Any, backend: str) -> None:
    """JSON Schema counts 1.0 and 1 as one number; every backend writes a listed `1.0` as `1` (llguidance also
    takes `1.0`, validated), so the instances spell it so (`instances.integer_spelled`)."""
    schema = {"type": "object", "properties": {"v": {"enum": [1.0, 2.5]}}, "required": ["v"]}
    assert validator(schema).is_valid({"v": 1}) and validator(schema).is_valid({"v": 1.0})
    assert feed(compiled(smol_tokenizer, schema, backend), smol_tokenizer, '{"v":1}')
    assert {i.text for i in instances(schema, 5) if i.valid} >= {'{"v":1}', '{"v":2.5}'}


@pytest.mark.parametrize("backend", EXACT)
def test_uri_hosts_in_ip_literals_of_every_spelling_are_reachable(smol_tokenizer: Any, backend: str) -> None:
    matcher = compiled(smol_tokenizer, {"type": "string", "format": "uri"}, backend)
    for uri in ("a://[V1.x]/", "J.1l://*%D1%bd@[Vdd7.D&*3]:08/", "u://[::5bC:fD:2eaB:216.6.252.156]:04//"):
        matcher.reset()
        assert feed(matcher, smol_tokenizer, f'"{uri}"'), uri


@pytest.mark.parametrize("strict", [False, True])
def test_keys_under_a_pattern_are_not_held_to_additional_properties_on_xgrammar(
    smol_tokenizer: Any, strict: bool
) -> None:
    schema = {"type": "object", "patternProperties": {"_id$": {"type": "string"}},
              "additionalProperties": {"type": "number"}}  # fmt: skip
    matcher = compile(JsonSchema(schema, strict=strict), smol_tokenizer, backend="xgrammar", cache=CompileCache())  # type: ignore[arg-type]
    assert feed(matcher, smol_tokenizer, '{"x_id":""}')
    matcher.reset()
    assert feed(matcher, smol_tokenizer, '{"b":"x"}')  # loosened in the grammar, never tightened...
    with pytest.raises(ValidationFailed):
        matcher.validate('{"b":"x"}')  # ...and the loosened part is validated


def test_auto_leaves_string_lengths_to_validation_when_it_falls_back_to_xgrammar(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"t": {"type": "string", "maxLength": 10}}, "maxProperties": 3}
    with pytest.raises(ConstrainedError):
        compiled(smol_tokenizer, schema, "llguidance")  # llguidance refuses maxProperties beside open keys
    auto = compiled(smol_tokenizer, schema, "auto")
    assert auto.backend == "xgrammar" and any("'maxLength'" in w for w in auto.warnings)
    assert feed(auto, smol_tokenizer, '{"t":"w\\u0012"}')
    direct = compiled(smol_tokenizer, schema, "xgrammar")  # asked for by name: lengths stay bounded, and it says so
    assert any("at a price" in w and "'maxLength'" in w for w in direct.warnings)
    assert not feed(direct, smol_tokenizer, '{"t":"w\\u0012"}')


@pytest.mark.parametrize("backend", EXACT)
def test_tuple_arrays_in_every_spelling_compile_and_hold(smol_tokenizer: Any, backend: str) -> None:
    tuple_7 = {"$schema": DRAFT_7, "items": [{"type": "integer"}], "additionalItems": {"type": "string"}}
    tuple_7["type"] = "array"
    capped = {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}, "maxItems": 0}
    for schema, good, bad in ((tuple_7, ['[1,"a","b"]', "[]"], ['["a"]']), (capped, ["[]"], ["[1]"])):
        matcher = compiled(smol_tokenizer, schema, backend)
        for text in good + bad:
            matcher.reset()
            assert feed(matcher, smol_tokenizer, text) == (text in good), (schema, text)


def test_an_integer_range_without_a_multiple_is_validated_not_refused_on_xgrammar(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 2, "multipleOf": 5},
                                               "m": {"type": "integer", "multipleOf": 5}}}  # fmt: skip
    matcher = compiled(smol_tokenizer, schema, "xgrammar")  # refused the whole schema before
    assert any("holds no multiple" in w for w in matcher.warnings)
    assert feed(matcher, smol_tokenizer, "{}")
    with pytest.raises(ValidationFailed):
        matcher.validate('{"n":1}')
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, '{"m":7}')  # a multipleOf with multiples in range stays enforced


@pytest.mark.parametrize("backend", EXACT)
def test_a_root_that_refers_to_itself_takes_siblings_after_nested_items(smol_tokenizer: Any, backend: str) -> None:
    values = {"type": "array", "items": {"$ref": "#"}}
    tree = {"type": "object", "properties": {"id": {"type": "integer"}, "values": values}}
    tree["additionalProperties"] = False
    matcher = compiled(smol_tokenizer, tree, backend)  # Github_medium o79558, cut down
    for text in ('{"values":[{"values":[]},{}]}', '{"values":[{"values":[{"id":1}]},{"id":2}]}'):
        matcher.reset()
        assert feed(matcher, smol_tokenizer, text), text
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, '{"values":[{"x":1}]}')


DRAFT_4 = "http://json-schema.org/draft-04/schema#"


@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize(
    ("schema", "text"),
    [
        ({"$schema": DRAFT_4, "type": "object", "propertyNames": {"pattern": "^[0-9]+$"}}, '{"Y":1}'),
        ({"$schema": DRAFT_4, "properties": {"a": {"const": 1}}}, '{"a":2}'),
        ({"$schema": DRAFT_7, "type": "object", "dependentRequired": {"a": ["b"]}}, '{"a":1}'),
        ({"type": "object", "dependencies": {"a": ["b"]}}, '{"a":1}'),  # 2020-12 by default
    ],
)
def test_keywords_the_documents_draft_does_not_read_constrain_nothing(
    smol_tokenizer: Any, backend: str, schema: Any, text: str
) -> None:
    assert validator(schema).is_valid(json.loads(text))  # JsonSchemaStore staticwebapp.config.json: Draft 4
    assert feed(compiled(smol_tokenizer, schema, backend), smol_tokenizer, text)
