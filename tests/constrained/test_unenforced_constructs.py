"""Constructs the grammar backends compile but do not enforce never pass silently.

Both converters read one handler per schema object (xgrammar: `$ref` > `const` > `enum` > `anyOf` >
`oneOf` > `allOf` > `type`; outlines-core: `properties` first), ignore untyped keywords, and compile
`oneOf` as `anyOf`. Each case below shows the mask admitting an invalid value (the gap is real),
then that the matcher says so (`warnings`, `needs_validation`) and that validation rejects it.
Schemas without such constructs, and `oneOf`s whose branches provably exclude each other, stay
warning-free.
"""

from __future__ import annotations

import enum
import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from parley.constrained import CompileCache, JsonSchema, ToolCalls, ValidationFailed, compile, validate
from parley.protocol import ToolSpec
from tests.constrained.conftest import feed

PROPS = {"a": {"type": "string"}, "b": {"type": "string"}}
REQUIRED_BRANCHES = {"type": "object", "properties": PROPS, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}


def compiled(tokenizer: Any, spec: Any, backend: str = "auto") -> Any:
    return compile(spec, tokenizer, backend=backend, cache=CompileCache())  # type: ignore[arg-type]


def admits(tokenizer: Any, matcher: Any, text: str) -> bool:
    matcher.reset()
    return feed(matcher, tokenizer, text)


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
@pytest.mark.parametrize("strict", [True, False])
def test_required_only_branches_are_flagged_and_violations_caught(
    smol_tokenizer: Any, backend: str, strict: bool
) -> None:
    matcher = compiled(smol_tokenizer, JsonSchema(REQUIRED_BRANCHES, strict=strict), backend)
    assert admits(smol_tokenizer, matcher, "{}")  # neither backend enforces "a or b is required"
    assert matcher.needs_validation
    assert any("'required'" in w or "'anyOf'" in w for w in matcher.warnings), matcher.warnings
    with pytest.raises(ValidationFailed) as failed:
        matcher.validate("{}")
    assert failed.value.keyword == "anyOf"
    assert matcher.validate('{"b":"x"}') == {"b": "x"}


@pytest.mark.parametrize("strict", [True, False])
def test_auto_enforces_required_only_branches_exactly_with_llguidance(smol_tokenizer: Any, strict: bool) -> None:
    matcher = compiled(smol_tokenizer, JsonSchema(REQUIRED_BRANCHES, strict=strict))
    assert matcher.backend == "llguidance" and not matcher.needs_validation, matcher.choice
    assert not admits(smol_tokenizer, matcher, "{}")
    assert admits(smol_tokenizer, matcher, '{"b":"x"}') and admits(smol_tokenizer, matcher, '{"a":"x","b":"y"}')


@pytest.mark.parametrize(
    ("schema", "both_branches"),
    [
        ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}, "5"),
        ({"type": "object", "properties": PROPS, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
         '{"a":"x","b":"y"}'),
        (
            {"oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}],
             "$defs": {"A": {"type": "object", "properties": {"a": {"type": "integer"}}},
                       "B": {"type": "object", "properties": {"b": {"type": "integer"}}}}},
            "{}",
        ),
    ],
)  # fmt: skip
def test_oneof_exclusivity_is_flagged_when_branches_overlap(
    smol_tokenizer: Any, schema: Any, both_branches: str
) -> None:
    matcher = compiled(smol_tokenizer, JsonSchema(schema, strict=False))
    assert admits(smol_tokenizer, matcher, both_branches)  # valid for two branches: oneOf is compiled as anyOf
    assert matcher.needs_validation and any("'oneOf'" in w for w in matcher.warnings), matcher.warnings
    with pytest.raises(ValidationFailed) as failed:
        validate(both_branches, JsonSchema(schema, strict=False))
    assert failed.value.keyword == "oneOf"


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    pet: Cat | Dog
    color: Color
    nickname: str | None = None
    tags: list[str] = Field(default_factory=list, max_length=3)


@pytest.mark.parametrize(
    "schema",
    [
        {"oneOf": [{"type": "integer"}, {"type": "string"}]},  # different types
        {"oneOf": [{"type": "object", "properties": {"k": {"const": "x"}}, "required": ["k"]},
                   {"type": "object", "properties": {"k": {"const": "y"}}, "required": ["k"]}]},  # const discriminator
        {"oneOf": [{"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"]},
                   {"type": "object", "properties": {"k": {"enum": ["c"]}}, "required": ["k"]}]},  # enum discriminator
        {"oneOf": [{"const": 1}, {"const": 2}, {"type": "null"}]},
        {"type": "string", "enum": ["a", "b"]},  # type next to enum: implied by the values
        {"type": "object", "anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}]},
        {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "nullable"},
        {"$ref": "#/$defs/X", "description": "annotations next to $ref", "$defs": {"X": {"type": "integer"}}},
        Pet.model_json_schema(),
    ],
)  # fmt: skip
@pytest.mark.parametrize("strict", [True, False])
def test_schemas_without_such_constructs_stay_warning_free(smol_tokenizer: Any, schema: Any, strict: bool) -> None:
    matcher = compiled(smol_tokenizer, JsonSchema(schema, strict=strict))
    assert matcher.warnings == () and not matcher.needs_validation


@pytest.mark.parametrize(
    ("schema", "keyword", "invalid"),
    [
        # siblings of $ref apply since 2019-09; xgrammar reads the $ref alone
        ({"$ref": "#/$defs/X", "required": ["a"], "$defs": {"X": {"type": "object", "properties": {"a": {}}}}},
         "required", "{}"),
        ({"type": "string", "enum": ["a", 1]}, "type", "1"),  # a value of the enum breaks the sibling type
        # untyped: any value (strict mode; the JSON Schema mode spells out the types, then it holds)
        ({"type": "object", "properties": {"age": {"minimum": 0}}}, "minimum", '{"age":-1}'),
        ({"type": "object", "required": ["a"], "additionalProperties": {"type": "integer"}}, "required", "{}"),
        ({"type": "string", "pattern": "^((?!mode).)*$"}, "pattern", '"amodeb"'),  # lookahead read as true
        ({"type": "string", "pattern": "(?<!x)y$"}, "pattern", '"xy"'),  # lookbehind: would not compile, stripped
    ],
)  # fmt: skip
def test_keywords_xgrammar_never_reads_are_flagged(
    smol_tokenizer: Any, schema: Any, keyword: str, invalid: str
) -> None:
    matcher = compiled(smol_tokenizer, JsonSchema(schema), "xgrammar")
    assert admits(smol_tokenizer, matcher, invalid)
    assert any(f"{keyword!r}" in w for w in matcher.warnings), matcher.warnings
    with pytest.raises(ValidationFailed):
        matcher.validate(invalid)


def test_ref_siblings_of_draft_7_schemas_are_not_flagged(smol_tokenizer: Any) -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#/definitions/X", "required": ["a"],
              "definitions": {"X": {"type": "object", "properties": {"a": {"type": "integer"}}}}}  # fmt: skip
    matcher = compiled(smol_tokenizer, JsonSchema(schema, strict=False))
    assert matcher.warnings == ()  # Draft 7 ignores siblings of $ref, and so does validation
    assert matcher.validate("{}") == {}


ARGS = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "code": {"type": "string", "pattern": "^[A-Z]+$", "minLength": 3},
        "n": {"type": "integer", "not": {"const": 0}},
        "path": {"type": "string", "pattern": "^/"},
        "item": {"$ref": "#/$defs/Item"},
    },
    "required": ["tags", "code", "n", "path"],
    "additionalProperties": False,
    "$defs": {"Item": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
}
SEARCH = ToolSpec(name="search", description="find things", parameters=ARGS)
NOOP = ToolSpec(name="noop", description="nothing", parameters={"type": "object", "properties": {}})


def _where(warnings: tuple[str, ...], prefix: str) -> set[str]:
    """Warnings with the location prefix cut off, to compare one schema's across specs."""
    return {w.replace(f" at {prefix}", " at $") for w in warnings}


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_tool_arguments_get_the_same_keyword_treatment_as_a_json_schema(smol_tokenizer: Any, backend: str) -> None:
    plain = compiled(smol_tokenizer, JsonSchema(ARGS), backend)
    assert {"'uniqueItems'", "'not'"} <= {w.split()[4] for w in plain.warnings}
    assert any("'minLength'" in w or "'pattern'" in w for w in plain.warnings)  # one of the pair is dropped
    specs = [(ToolCalls([SEARCH]), "search:$"), (ToolCalls([NOOP], answer_schema=ARGS), "answer:$")]
    if backend == "xgrammar":  # outlines-core's index for an array of such calls takes over 10 s
        specs.append((ToolCalls([NOOP, SEARCH], format="json", allow_multiple=True), "search:$"))
    for spec, prefix in specs:
        matcher = compiled(smol_tokenizer, spec, backend)
        assert matcher.needs_validation
        assert _where(matcher.warnings, prefix) == set(plain.warnings)


def test_tool_arguments_are_rewritten_and_stripped_like_a_json_schema(smol_tokenizer: Any) -> None:
    matcher = compiled(smol_tokenizer, ToolCalls([NOOP, SEARCH]), "xgrammar")
    args = {"tags": ["x", "x"], "code": "AB", "n": 0, "path": "/etc/x", "item": {"x": 1}}
    call = "<tool_call>" + json.dumps({"name": "search", "arguments": args}, separators=(",", ":")) + "</tool_call>"
    # search semantics for "^/" (a full match would refuse "/etc/x"), the $ref resolved inside the
    # tool's own parameters, minLength stripped next to the pattern: the mask admits the call...
    assert admits(smol_tokenizer, matcher, call)
    assert not admits(smol_tokenizer, matcher, call.replace('"AB"', '"ab"'))  # ...the pattern is enforced
    assert not admits(smol_tokenizer, matcher, call.replace('{"x":1}', '{"y":1}'))  # ...so is the $ref target
    # ...and validation rejects what the mask could not: duplicate tags, short code, n == 0
    with pytest.raises(ValidationFailed) as failed:
        matcher.validate(call)
    assert failed.value.path is not None and failed.value.path.startswith("$[0].arguments")
    good = call.replace('["x","x"]', '["x","y"]').replace('"AB"', '"ABC"').replace('"n":0', '"n":2')
    assert matcher.validate(good)[0]["arguments"]["code"] == "ABC"


def test_tool_calls_with_an_answer_validate_the_answer_against_its_schema(smol_tokenizer: Any) -> None:
    spec = ToolCalls([NOOP], answer_schema=REQUIRED_BRANCHES)
    assert not admits(smol_tokenizer, compiled(smol_tokenizer, spec), "{}")  # auto: llguidance enforces it
    matcher = compiled(smol_tokenizer, spec, "xgrammar")
    assert admits(smol_tokenizer, matcher, "{}") and matcher.needs_validation
    with pytest.raises(ValidationFailed) as failed:
        matcher.validate("{}")
    assert failed.value.keyword == "anyOf"
    assert matcher.validate('{"a":"x"}') == {"a": "x"}
    assert matcher.validate('<tool_call>{"name":"noop","arguments":{}}</tool_call>') == [
        {"name": "noop", "arguments": {}}
    ]


def test_pattern_property_lookaheads_stay_in_the_grammar(smol_tokenizer: Any) -> None:
    # JsonSchemaStore browser.i18n: keys "^(?!@@)[@a-zA-Z0-9_-]+$", no other keys. Stripping the
    # pattern would forbid every key; kept, the lookahead is read as true (a superset) and validated.
    schema = {"type": "object", "patternProperties": {"^(?!@@)[@a-z_]+$": {"type": "integer"}},
              "additionalProperties": False}  # fmt: skip
    matcher = compiled(smol_tokenizer, JsonSchema(schema, strict=False), "xgrammar")
    assert admits(smol_tokenizer, matcher, '{"app_name":1}')
    assert any("'patternProperties'" in w for w in matcher.warnings)
    assert admits(smol_tokenizer, matcher, '{"@@x":1}')
    with pytest.raises(ValidationFailed):
        matcher.validate('{"@@x":1}')
