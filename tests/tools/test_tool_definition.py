"""`@tool` reads a function: name, description and parameter texts from the docstring, schema from hints."""

from __future__ import annotations

import asyncio
import dataclasses
from enum import Enum
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from parley.protocol import ToolSpec
from parley.tools import Tool, ToolContext, ToolDefinitionError, parse_docstring, tool


class Units(str, Enum):
    C = "C"
    F = "F"


class Location(BaseModel):
    lat: float
    lon: float


def test_google_docstring_gives_description_and_parameter_texts() -> None:
    @tool
    def get_weather(city: str, units: Units = Units.C, days: int = 1) -> str:
        """Current weather for a city.

        Uses the national service
        when it can.

        Args:
            city: City name,
                e.g. "Paris".
            units (Units): Temperature unit.
            days: How many days.

        Returns:
            A short report.
        """
        return city

    spec = get_weather.spec
    assert isinstance(spec, ToolSpec)
    assert spec.name == "get_weather"
    assert spec.description == "Current weather for a city.\n\nUses the national service when it can."
    props = spec.parameters["properties"]
    assert props["city"] == {"type": "string", "description": 'City name, e.g. "Paris".'}
    assert props["units"]["description"] == "Temperature unit."
    assert props["days"] == {"type": "integer", "default": 1, "description": "How many days."}
    assert spec.parameters["required"] == ["city"]
    assert spec.parameters["additionalProperties"] is False
    assert "title" not in spec.parameters and all("title" not in p for p in props.values())


def test_numpy_docstring() -> None:
    doc = parse_docstring(
        """Add two numbers.

        Parameters
        ----------
        a : int
            The first.
        b, c : int
            The others,
            continued.

        Returns
        -------
        int
        """
    )
    assert doc.description == "Add two numbers."
    assert doc.params == {"a": "The first.", "b": "The others, continued.", "c": "The others, continued."}


def test_rest_docstring() -> None:
    doc = parse_docstring(
        """Send a message.

        :param to: Recipient address.
        :param str body: The text,
            over two lines.
        :returns: the id
        :raises ValueError: never
        """
    )
    assert doc.description == "Send a message."
    assert doc.params == {"to": "Recipient address.", "body": "The text, over two lines."}


def test_explicit_options_override_the_function() -> None:
    @tool(name="lookup", description="Find a thing.")
    async def f(query: str) -> str:
        """Ignored docstring."""
        return query

    assert (f.name, f.description, f.is_async) == ("lookup", "Find a thing.", True)


def test_field_descriptions_win_over_the_docstring() -> None:
    @tool
    def f(a: Annotated[int, Field(ge=0, description="own a")], b: int = Field(2, description="own b")) -> int:
        """Doc.

        Args:
            a: doc a
            b: doc b
        """
        return a + b

    props = f.parameters["properties"]
    assert props["a"] == {"type": "integer", "minimum": 0, "description": "own a"}
    assert props["b"]["description"] == "own b"
    assert f.validate_arguments('{"a": 1}') == {"a": 1, "b": 2}


def test_context_parameter_is_injected_and_not_in_the_schema() -> None:
    seen: list[ToolContext] = []

    @tool
    def whoami(ctx: ToolContext, greeting: str = "hi") -> str:
        seen.append(ctx)
        return f"{greeting} {ctx.tenant}"

    assert whoami.takes_context
    assert list(whoami.parameters["properties"]) == ["greeting"]
    context = ToolContext(tenant="acme", run_id="r1", metadata={"k": "v"})
    result = asyncio.run(whoami.invoke(whoami.validate_arguments("{}"), context.for_call("c1", "whoami")))
    assert result == "hi acme"
    assert (seen[0].call_id, seen[0].tool_name, seen[0].metadata) == ("c1", "whoami", {"k": "v"})


def test_nested_models_dataclasses_literals_and_enums() -> None:
    @dataclasses.dataclass
    class Window:
        start: int
        end: int

    @tool
    def plan(where: Location, mode: Literal["walk", "drive"], units: Units, window: Window | None = None) -> str:
        return "ok"

    args = plan.validate_arguments('{"where": {"lat": 1, "lon": 2.5}, "mode": "walk", "units": "F"}')
    assert args["where"] == Location(lat=1, lon=2.5) and args["units"] is Units.F and args["window"] is None
    assert plan.parameters["properties"]["mode"]["enum"] == ["walk", "drive"]
    assert plan.parameters["$defs"]["Location"]["additionalProperties"] is False  # closed for the model too


def test_parameters_named_like_pydantic_internals_work() -> None:
    @tool
    def f(schema: str, json: int, model_config: bool = False) -> str:
        return schema

    assert sorted(f.parameters["properties"]) == ["json", "model_config", "schema"]
    assert f.validate_arguments('{"schema": "s", "json": 1}') == {"schema": "s", "json": 1, "model_config": False}


def test_a_property_called_title_is_kept() -> None:
    @tool
    def f(title: str) -> str:
        return title

    assert f.parameters["properties"] == {"title": {"type": "string"}}


def test_positional_only_parameters_are_passed_positionally() -> None:
    @tool
    def f(a: int, /, b: int) -> int:
        return a * 10 + b

    assert asyncio.run(f.invoke(f.validate_arguments('{"a": 1, "b": 2}'))) == 12


def test_the_tool_stays_callable_like_the_function() -> None:
    @tool
    def double(x: int) -> int:
        return 2 * x

    assert isinstance(double, Tool) and double(4) == 8


@pytest.mark.parametrize(
    "options, message",
    [
        ({"name": "bad name"}, "invalid"),
        ({"name": "os.system"}, "invalid"),
        ({"name": ""}, "invalid"),
        ({"retries": 2}, "idempotent=True"),
        ({"retries": 99, "idempotent": True}, "retries"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"needs_approval": "yes"}, "needs_approval"),
    ],
)
def test_contradictory_or_invalid_options_fail_at_definition(options: dict[str, Any], message: str) -> None:
    def f(x: int) -> int:
        return x

    with pytest.raises(ToolDefinitionError, match=message):
        tool(**options)(f)


def test_unsupported_signatures_fail_at_definition() -> None:
    def star(*args: int) -> None: ...

    def two_contexts(a: ToolContext, b: ToolContext) -> None: ...

    with pytest.raises(ToolDefinitionError, match=r"\*args"):
        tool(star)
    with pytest.raises(ToolDefinitionError, match="more than one ToolContext"):
        tool(two_contexts)


def test_callables_without_a_name_and_generators_are_refused() -> None:
    import functools

    def gen(x: int) -> Any:
        yield x

    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(ToolDefinitionError, match="generator"):
        tool(gen)
    with pytest.raises(ToolDefinitionError, match="pass name="):
        tool(functools.partial(add, 1))
    add_one = tool(name="add_one")(functools.partial(add, 1))
    assert add_one.validate_arguments('{"b": 2}') == {"b": 2} and add_one.description == ""


def test_no_docstring_means_an_empty_description() -> None:
    @tool
    def bare(x: int) -> int:
        return x

    assert bare.description == "" and "description" not in bare.parameters["properties"]["x"]


def test_hostile_field_names_do_not_carry_control_characters_into_messages() -> None:
    @tool
    def f(x: int) -> int:
        return x

    from parley.tools import ToolArgumentError

    with pytest.raises(ToolArgumentError) as info:
        f.validate_arguments('{"x": 1, "\\u001b[2Jevil": 2}')
    assert "\x1b" not in str(info.value)


def test_callable_objects_become_tools() -> None:
    class Greeter:
        async def __call__(self, name: str) -> str:
            """Greet someone.

            Args:
                name: Who.
            """
            return f"hi {name}"

    greet = tool(name="greet")(Greeter())
    assert greet.is_async and greet.description == "Greet someone."
    assert greet.parameters["properties"]["name"] == {"type": "string", "description": "Who."}
    assert asyncio.run(greet.invoke(greet.validate_arguments('{"name": "Ann"}'))) == "hi Ann"
