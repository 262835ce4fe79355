"""Structured output: pydantic models and JSON Schemas, a bounded repair loop, a typed failure."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from parley import Agent
from parley.backends import ModelRequest, ScriptedBackend, ScriptedTurn
from parley.errors import ConfigurationError, OutputValidationError
from parley.protocol import Role


class Forecast(BaseModel):
    city: str
    temp_c: int


async def test_a_pydantic_answer_is_parsed_and_the_schema_is_requested() -> None:
    def asks_for_schema(req: ModelRequest) -> bool:
        return req.output_schema is not None and req.output_schema["required"] == ["city", "temp_c"]

    backend = ScriptedBackend([ScriptedTurn(text='{"city": "Oslo", "temp_c": 4}', expect=asks_for_schema)])
    result = await Agent(backend, output_type=Forecast).run("weather")
    assert result.output == Forecast(city="Oslo", temp_c=4)
    assert result.state.output == {"city": "Oslo", "temp_c": 4}


async def test_reasoning_is_never_parsed_as_the_answer() -> None:
    turn = ScriptedTurn(reasoning="{not json at all", text='{"city": "Oslo", "temp_c": 4}')
    result = await Agent(ScriptedBackend([turn]), output_type=Forecast).run("weather")
    assert result.output.city == "Oslo"  # type: ignore[union-attr]


async def test_a_json_schema_dict_gives_plain_json() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    result = await Agent(ScriptedBackend(['```json\n{"ok": true}\n```']), output_type=schema).run("?")
    assert result.output == {"ok": True}


async def test_an_invalid_answer_is_repaired_with_the_error_fed_back() -> None:
    def sees_the_error(req: ModelRequest) -> bool:
        last = req.conversation.messages[-1]
        return last.role is Role.USER and "temp_c" in last.text

    backend = ScriptedBackend(
        [
            '{"city": "Oslo"}',
            ScriptedTurn(text='{"city": "Oslo", "temp_c": 4}', expect=sees_the_error),
        ]
    )
    result = await Agent(backend, output_type=Forecast).run("weather")
    assert result.output == Forecast(city="Oslo", temp_c=4)
    assert result.state.output_attempts == 1


async def test_the_repair_loop_is_bounded_and_the_error_carries_the_last_attempt() -> None:
    backend = ScriptedBackend(["nope", "still nope", "not even close", "never asked"])
    with pytest.raises(OutputValidationError) as caught:
        await Agent(backend, output_type=Forecast, output_retries=2).run("weather")
    assert caught.value.last_attempt == "not even close"
    assert caught.value.attempts == 3 and backend.remaining == 1


@pytest.mark.parametrize("bad", [int, {"type": "no-such-type"}, "Forecast"])
def test_an_unusable_output_type_is_a_configuration_error(bad: Any) -> None:
    with pytest.raises(ConfigurationError):
        Agent(ScriptedBackend([]), output_type=bad)


async def test_json_schema_mismatch_is_reported_with_its_path() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    backend = ScriptedBackend(['{"n": "x"}'])
    with pytest.raises(OutputValidationError, match=r"'x' is not of type 'integer' \(at \$\.n"):
        await Agent(backend, output_type=schema, output_retries=0).run("?")


async def test_backends_without_native_schema_mode_get_the_schema_in_the_prompt() -> None:
    from parley.backends import BackendCapabilities

    plain = ScriptedBackend(
        ['{"city": "Oslo", "temp_c": 4}'], capabilities=BackendCapabilities(structured_output=False)
    )
    result = await Agent(plain, instructions="Be brief.", output_type=Forecast).run("weather")
    system = plain.requests[0].conversation.messages[0]
    assert system.role is Role.SYSTEM and system.text.startswith("Be brief.") and '"temp_c"' in system.text
    assert result.output == Forecast(city="Oslo", temp_c=4)
    native = ScriptedBackend(['{"city": "Oslo", "temp_c": 4}'])
    await Agent(native, instructions="Be brief.", output_type=Forecast).run("weather")
    assert native.requests[0].conversation.messages[0].text == "Be brief."
