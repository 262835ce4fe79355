"""`validate`: parsed value back, or `ValidationFailed` naming the JSON path and the keyword."""

from __future__ import annotations

import enum

import pytest
from pydantic import BaseModel

from parley.constrained import (
    Choice,
    Grammar,
    InvalidSpecError,
    JsonSchema,
    Regex,
    ToolCalls,
    ValidationFailed,
    validate,
)
from parley.protocol import ToolSpec


class Size(str, enum.Enum):
    small = "small"
    large = "large"


class Pet(BaseModel):
    name: str
    size: Size
    tags: list[str] = []


SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 1}, "items": {"type": "array", "items": {"type": "string"}}},
    "required": ["id"],
}


def test_json_schema_returns_the_parsed_value() -> None:
    assert validate('{"id": 3, "items": ["a"]}', JsonSchema(SCHEMA)) == {"id": 3, "items": ["a"]}
    assert validate({"id": 3}, SCHEMA) == {"id": 3}


def test_failure_names_path_and_keyword() -> None:
    with pytest.raises(ValidationFailed) as err:
        validate('{"id": 3, "items": ["a", 7]}', JsonSchema(SCHEMA))
    assert err.value.path == "$.items[1]" and err.value.keyword == "type"
    with pytest.raises(ValidationFailed) as err:
        validate('{"id": 0}', SCHEMA)
    assert err.value.keyword == "minimum"


def test_not_json_is_a_validation_failure() -> None:
    with pytest.raises(ValidationFailed) as err:
        validate('{"id": ', JsonSchema(SCHEMA))
    assert err.value.keyword == "json"


def test_formats_are_checked() -> None:
    with pytest.raises(ValidationFailed) as err:
        validate('"not-an-ip"', {"type": "string", "format": "ipv4"})
    assert err.value.keyword == "format"


def test_pydantic_models_return_instances() -> None:
    pet = validate('{"name": "Rex", "size": "small"}', JsonSchema(Pet))
    assert isinstance(pet, Pet) and pet.size is Size.small
    with pytest.raises(ValidationFailed) as err:
        validate('{"name": "Rex", "size": "huge"}', Pet)
    assert err.value.path == "$.size" and err.value.keyword == "enum"


def test_regex_choice_and_grammar() -> None:
    assert validate("2024-02-29", Regex(r"\d{4}-\d{2}-\d{2}")) == "2024-02-29"
    with pytest.raises(ValidationFailed):
        validate("2024-2-29", Regex(r"\d{4}-\d{2}-\d{2}"))
    assert validate("no", Choice(["yes", "no"])) == "no"
    with pytest.raises(ValidationFailed):
        validate("maybe", Choice(["yes", "no"]))
    grammar = Grammar('root ::= "(" [0-9]+ ")"')
    assert validate("(42)", grammar) == "(42)"
    with pytest.raises(ValidationFailed) as err:
        validate("(42", grammar)
    assert err.value.keyword == "grammar"


TOOLS = [
    ToolSpec(name="add", parameters={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
    ToolSpec(name="echo", parameters={"type": "object", "properties": {"text": {"type": "string"}}}),
]


def test_tool_calls_hermes_and_json() -> None:
    spec = ToolCalls(TOOLS, allow_multiple=True)
    text = (
        '<tool_call>{"name":"add","arguments":{"a":1}}</tool_call>\n'
        '<tool_call>{"name":"echo","arguments":{}}</tool_call>'
    )
    assert [c["name"] for c in validate(text, spec)] == ["add", "echo"]
    assert validate('{"name":"add","arguments":{"a":2}}', ToolCalls(TOOLS, format="json"))[0]["arguments"] == {"a": 2}


def test_tool_call_failures_are_typed() -> None:
    spec = ToolCalls(TOOLS)
    with pytest.raises(ValidationFailed) as err:
        validate('<tool_call>{"name":"nope","arguments":{}}</tool_call>', spec)
    assert err.value.keyword == "tool_name"
    with pytest.raises(ValidationFailed) as err:
        validate('<tool_call>{"name":"add","arguments":{"a":"x"}}</tool_call>', spec)
    assert err.value.path == "$[0].arguments.a" and err.value.keyword == "type"
    with pytest.raises(ValidationFailed):
        validate('sure! <tool_call>{"name":"add","arguments":{"a":1}}</tool_call>', spec)


def test_bad_specs_are_typed_errors() -> None:
    with pytest.raises(InvalidSpecError):
        Choice([])
    with pytest.raises(InvalidSpecError):
        ToolCalls([TOOLS[0], TOOLS[0]])
    with pytest.raises(InvalidSpecError):
        JsonSchema("{not json")
