"""A typed answer, and the repair loop that gets one from a model that first gets it wrong.

    python examples/structured_output_scripted.py

`Agent(..., output_type=Forecast)` makes `result.output` a `Forecast` instance. The agent validates
the model's final text against the pydantic model; when it does not validate, the validation errors
go back to the model as a user message and it gets another try (at most `output_retries` of them,
then `OutputValidationError`). The model here is a `ScriptedBackend` playing two turns, so the
example runs anywhere: the first answer is wrong (a string where a number belongs, a field
missing), the second is right.
"""

from __future__ import annotations

import asyncio
import json

from pydantic import BaseModel, Field

from parley import Agent, Role
from parley.backends import ModelRequest, ScriptedBackend, ScriptedTurn


class Forecast(BaseModel):
    """What the caller wants back: typed fields, not prose."""

    city: str
    temperature_c: float = Field(description="Air temperature in degrees Celsius.")
    conditions: str


def saw_repair_prompt(request: ModelRequest) -> bool:
    """The second turn only plays if the agent told the model what was wrong with the first."""
    last = request.conversation.messages[-1]
    return last.role is Role.USER and "temperature_c" in last.text


BACKEND = ScriptedBackend(
    [
        # Turn 1: almost right, but "mild" is not a number and `conditions` is missing.
        json.dumps({"city": "Oslo", "temperature_c": "mild"}),
        # Turn 2: played only after the repair prompt; this one validates.
        ScriptedTurn(
            text=json.dumps({"city": "Oslo", "temperature_c": 4.5, "conditions": "light rain"}),
            expect=saw_repair_prompt,
        ),
    ]
)


async def main() -> None:
    agent = Agent(
        BACKEND,
        instructions="Reply with a JSON weather forecast.",
        output_type=Forecast,
        output_retries=2,  # up to two repair rounds before OutputValidationError
    )
    result = await agent.run("What is the weather in Oslo?")

    # What the model was told after its first answer (the agent wrote this message, not us).
    repair = BACKEND.requests[1].conversation.messages[-1]
    print(f"repair prompt: {repair.text}")

    forecast = result.output  # a Forecast instance, already validated
    assert isinstance(forecast, Forecast)
    print(f"output type: {type(forecast).__name__}")
    print(f"forecast: {forecast.city} {forecast.temperature_c} C, {forecast.conditions}")
    print(f"model requests: {result.usage.requests}")


if __name__ == "__main__":
    asyncio.run(main())
