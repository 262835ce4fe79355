"""JSON Schema semantics the grammar backends get wrong on their own, and how `compile` keeps them right.

Each case is a valid instance a compiled matcher once rejected on the MaskBench dev split. The rule
checked: a valid value is never refused by the mask; what a backend cannot enforce correctly is left
out of its grammar and recorded in `Matcher.warnings` (`needs_validation`), so outputs are validated.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from parley.constrained import CompileCache, InvalidSchemaError, JsonSchema, ValidationFailed, compile
from tests.conftest import SHARED
from tests.constrained.conftest import feed


def accepts(tokenizer: Any, schema: Any, value: Any, *, strict: bool = False, backend: str = "auto") -> bool:
    spec = JsonSchema(schema, strict=strict, string_lengths="validate")
    matcher = compile(spec, tokenizer, backend=backend, cache=CompileCache())  # type: ignore[arg-type]
    return feed(matcher, tokenizer, json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def test_untyped_keywords_constrain_only_their_own_type(smol_tokenizer: Any) -> None:
    # `items` applies to arrays only; `properties` to objects only: other types pass (Github_medium o69887, taurus)
    assert accepts(smol_tokenizer, {"type": "array", "items": {"properties": {}}}, ["season1", 2])
    assert accepts(smol_tokenizer, {"type": "array", "items": {"items": {"type": "string"}}}, [{"module": "x"}])
    # ...while still constraining the type they name
    assert not accepts(smol_tokenizer, {"items": {"type": "string"}}, [1])
    assert not accepts(smol_tokenizer, {"properties": {"a": {"type": "integer"}}}, {"a": "x"})


def test_untyped_branches_keep_their_parents_type(smol_tokenizer: Any) -> None:
    # widening stops at the parent's `type`: a branch of an object's oneOf still needs an object
    schema = {"type": "object", "oneOf": [{"properties": {"a": {"type": "integer"}}}, {"required": ["b"]}]}
    assert not accepts(smol_tokenizer, schema, "text")
    assert accepts(smol_tokenizer, schema, {"a": 1})
    # ...and an untyped anyOf lets each branch constrain only its own type (JsonSchemaStore taurus)
    items = {"type": "array", "items": {"anyOf": [{"items": {"type": "object"}}, {"type": "array"}]}}
    assert accepts(smol_tokenizer, items, [{"module": "final-stats"}, ["console"]])


def test_untyped_object_keywords_keep_meaning_object_in_strict_mode(smol_tokenizer: Any) -> None:
    assert not accepts(smol_tokenizer, {"properties": {"a": {"type": "integer"}}}, "text", strict=True)
    assert accepts(smol_tokenizer, {"properties": {"a": {"type": "integer"}}}, {"a": 1}, strict=True)


def test_pattern_properties_admit_other_keys_unless_strict(smol_tokenizer: Any) -> None:
    # additionalProperties absent = true: a key outside the pattern is allowed (Github_hard o14390, o61781)
    schema = {"type": "object", "patternProperties": {"^[a-f0-9]+$": {"type": "integer"}}}
    assert accepts(smol_tokenizer, schema, {"abc": 1, "project1": "x"})
    # xgrammar would admit only pattern keys: it leaves them to validation; llguidance enforces them exactly
    xgr = compile(JsonSchema(schema, strict=False), smol_tokenizer, backend="xgrammar", cache=CompileCache())
    assert xgr.needs_validation and any("patternProperties" in w for w in xgr.warnings)
    auto = compile(JsonSchema(schema, strict=False), smol_tokenizer, cache=CompileCache())
    assert auto.backend == "llguidance" and not auto.needs_validation
    assert not feed(auto, smol_tokenizer, '{"abc":"x"}')
    assert not accepts(smol_tokenizer, schema, {"abc": 1, "project1": "x"}, strict=True)


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
@pytest.mark.parametrize(
    ("pattern", "value"),
    [(r"^\w+[\\](\w+\.)*\w+\.dll$", "bins\\bts1.dll"), (r"^a\\b$", "a\\b"), (r'^say "\w+"$', 'say "hi"')],
)
def test_patterns_naming_a_backslash_or_quote_go_to_validation(
    smol_tokenizer: Any, backend: str, pattern: str, value: str
) -> None:
    # both backends match a pattern against the raw characters, never the JSON escapes `\\` and `\"`
    # (JsonSchemaStore BizTalkServerApplicationSchema)
    schema = {"type": "object", "properties": {"path": {"type": "string", "pattern": pattern}}}
    assert accepts(smol_tokenizer, schema, {"path": value}, backend=backend)
    matcher = compile(JsonSchema(schema, strict=False), smol_tokenizer, backend=backend, cache=CompileCache())  # type: ignore[arg-type]
    assert matcher.needs_validation and any("'pattern' at $.properties.path" in w for w in matcher.warnings)


def test_patterns_without_escapes_stay_in_the_grammar(smol_tokenizer: Any) -> None:
    matcher = compile(JsonSchema({"type": "string", "pattern": r"^\d+\.dll$"}), smol_tokenizer, cache=CompileCache())
    assert matcher.backend == "llguidance" and not matcher.needs_validation
    assert not feed(matcher, smol_tokenizer, '"x.dll"')
    matcher.reset()
    assert feed(matcher, smol_tokenizer, '"12.dll"')


def test_absolute_uri_references_are_accepted(smol_tokenizer: Any) -> None:
    # xgrammar's uri-reference rule refuses "https://..." (Github_hard o71528, the draft-07 metaschema)
    schema = {"type": "object", "properties": {"$id": {"type": "string", "format": "uri-reference"}}}
    assert accepts(smol_tokenizer, schema, {"$id": "https://example.com/schema#x"})
    assert accepts(smol_tokenizer, schema, {"$id": "../other.json"})


def test_integer_bounds_past_64_bits_go_to_validation_never_to_outlines(smol_tokenizer: Any) -> None:
    # xgrammar refuses them and llguidance's numbers are 64-bit; outlines would forbid the extra keys
    # this schema admits (Snowplow sp_160)
    schema = {
        "type": "object",
        "additionalProperties": True,
        "properties": {"experimentId": {"type": ["integer", "null"], "minimum": 0, "maximum": 9223372036854776000}},
    }
    matcher = compile(JsonSchema(schema, strict=False), smol_tokenizer, cache=CompileCache())
    assert matcher.backend in ("llguidance", "xgrammar")
    assert matcher.needs_validation and any("'maximum'" in w for w in matcher.warnings)
    assert not any("'minimum'" in w for w in matcher.warnings)  # in range: still enforced
    assert accepts(smol_tokenizer, schema, {"experimentId": 123456789, "extra": "x"})
    assert not accepts(smol_tokenizer, schema, {"experimentId": -1})


# The dev-split schemas that did not compile on auto (3,674 of 3,683 before), with the cause:
DEV_COMPILE_FAILURES = {
    # a raw NUL / newline / CR inside a pattern's character class: xgrammar's regex parser refuses raw
    # control characters, outlines-core then timed out or met an untyped `{"pattern": ...}` (fixed:
    # patterns get `\xHH` escapes)
    "Github_easy/Github_easy---o27354.json": None,
    "Github_hard/Github_hard---o27348.json": None,
    "JsonSchemaStore/JsonSchemaStore---ansible.json": None,
    # the same, in subschemas addressed as "#/nonEmptyString" — outside any schema keyword, so no
    # rewrite reached them (fixed: such $ref targets are hoisted into $defs first)
    "Github_hard/Github_hard---o5983.json": None,
    # `properties: {"writable": false}` (or a property mistakenly named "additionalProperties"):
    # neither backend compiles a `false` schema (fixed: the key is dropped from `properties`; exact when
    # extra keys are forbidden, else recorded as relaxed and validated)
    "Github_easy/Github_easy---o46906.json": None,
    "Handwritten/Handwritten---oneof12.json": None,
    "JsonSchemaStore/JsonSchemaStore---fly.json": None,
    "JsonSchemaStore/JsonSchemaStore---ui5-workspace.yaml.json": None,
    # $refs pointing through `patternProperties/%5B-_.a-zA-Z0-9%5D%2B/...`: our full-match rewrite of
    # the key left them dangling (xgrammar: "Cannot find field"); fixed by hoisting their targets
    "JsonSchemaStore/JsonSchemaStore---opspec-io-0.1.7.json": None,
    # a Draft-4 schema whose enum lists "commit-msg" twice: invalid under its own metaschema
    "Github_easy/Github_easy---o66201.json": "has non-unique elements",
}


@pytest.mark.parametrize("name", sorted(DEV_COMPILE_FAILURES))
def test_dev_split_schemas_that_failed_to_compile(smol_tokenizer: Any, name: str) -> None:
    path = SHARED / "data" / "jsonschemabench" / "dev" / name
    if not path.exists():
        pytest.skip(f"MaskBench dev split not found at {path}")
    case = json.loads(path.read_text())
    spec = JsonSchema(case["schema"], strict=False, any_order=True, string_lengths="validate")
    reason = DEV_COMPILE_FAILURES[name]
    if reason is not None:
        with pytest.raises(InvalidSchemaError, match=reason):
            compile(spec, smol_tokenizer, cache=CompileCache())
        return
    matcher = compile(spec, smol_tokenizer, cache=CompileCache())
    for test in case["tests"]:
        if test["valid"]:
            matcher.reset()
            assert feed(matcher, smol_tokenizer, json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False))


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_raw_control_characters_in_patterns_compile(smol_tokenizer: Any, backend: str) -> None:
    schema = {"type": "object", "properties": {"p": {"type": "string", "pattern": "^/[^\u0000\n]+$"}}}
    assert accepts(smol_tokenizer, schema, {"p": "/usr/bin"}, backend=backend)
    assert not accepts(smol_tokenizer, schema, {"p": "usr"}, backend=backend)


def test_false_property_schemas_forbid_the_key(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "writable": False}}
    strict = compile(JsonSchema(schema), smol_tokenizer, cache=CompileCache())
    assert strict.warnings == ()  # extra keys are forbidden anyway: dropping the property is exact
    assert not feed(strict, smol_tokenizer, '{"writable":1}')
    loose = compile(JsonSchema(schema, strict=False), smol_tokenizer, cache=CompileCache())
    assert loose.needs_validation and any("'writable'" in w for w in loose.warnings)
    assert feed(loose, smol_tokenizer, '{"writable":1}')  # an extra key to the grammar...
    with pytest.raises(ValidationFailed):
        loose.validate('{"writable":1}')  # ...caught by validation


def test_refs_into_pattern_properties_and_outside_schema_keywords_resolve(smol_tokenizer: Any) -> None:
    schema = {
        "type": "object",
        "nonEmpty": {"type": "string", "pattern": "[a-z]"},
        "properties": {
            "inputs": {
                "type": "object",
                "patternProperties": {"[a-z]+": {"type": "object", "properties": {"d": {"type": "integer"}}}},
                "additionalProperties": False,
            },
            "d": {"$ref": "#/properties/inputs/patternProperties/%5Ba-z%5D%2B/properties/d"},
            "name": {"$ref": "#/nonEmpty"},
        },
    }
    for strict in (True, False):
        assert accepts(smol_tokenizer, schema, {"inputs": {"x": {"d": 1}}, "d": 2, "name": "1a2"}, strict=strict)
        assert not accepts(smol_tokenizer, schema, {"d": "x"}, strict=strict)
        assert not accepts(smol_tokenizer, schema, {"name": "123"}, strict=strict)  # the hoisted pattern holds
