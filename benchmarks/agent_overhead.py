"""Agent-loop overhead per turn: parley vs PydanticAI, with instant scripted models.

Both frameworks run the same job: a model double that answers instantly makes 200 tool-call turns
(one call of the same tiny tool each turn) and then a final answer; the tool returns at once. What
is left is the framework: building requests, validating and executing calls, growing history,
usage accounting. Models report usage explicitly so neither double spends time estimating tokens.

* parley: `Agent` over `FunctionBackend`, `@tool` tool.
* PydanticAI: `Agent` over `FunctionModel`, `@agent.tool_plain` tool, `UsageLimits(request_limit=None)`.

PydanticAI is never a parley dependency: it runs in its own environment (``--pydantic-ai-python``,
default ``/tmp/bench-venv/bin/python``; create it with ``python -m venv /tmp/bench-venv &&
/tmp/bench-venv/bin/pip install pydantic-ai-slim``), as a subprocess running this same file.

Prints a table, then (last line) JSON: parley_us_per_turn, pydantic_ai_us_per_turn, ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

TURNS = 200
REPEATS = 5


def lookup_value(key: int) -> str:
    return f"value-{key}"


async def bench_parley(turns: int) -> float:
    from parley import Agent, UsageLimits, tool
    from parley.backends import FunctionBackend, ModelRequest, ScriptedTurn
    from parley.protocol import ToolCall, Usage

    @tool
    def lookup(key: int) -> str:
        """Look a key up."""
        return lookup_value(key)

    usage = Usage(input_tokens=10, output_tokens=5, requests=1)
    state = {"n": 0}

    def model(request: ModelRequest) -> ScriptedTurn:
        n = state["n"]
        state["n"] = n + 1
        if n < turns:
            return ScriptedTurn(
                tool_calls=[ToolCall(id=f"c{n}", name="lookup", arguments=f'{{"key":{n}}}')], usage=usage
            )
        return ScriptedTurn(text="done", usage=usage)

    agent = Agent(
        FunctionBackend(model), tools=[lookup], max_turns=turns + 1, max_tool_rounds=None,
        usage_limits=UsageLimits(request_limit=None),
    )
    started = time.perf_counter()
    result = await agent.run("go")
    elapsed = time.perf_counter() - started
    assert result.output == "done" and result.usage.requests == turns + 1
    return elapsed


async def bench_pydantic_ai(turns: int) -> float:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage, UsageLimits

    state = {"n": 0}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = state["n"]
        state["n"] = n + 1
        usage = RequestUsage(input_tokens=10, output_tokens=5)
        if n < turns:
            call = ToolCallPart(tool_name="lookup", args=f'{{"key":{n}}}', tool_call_id=f"c{n}")
            return ModelResponse(parts=[call], usage=usage)
        return ModelResponse(parts=[TextPart("done")], usage=usage)

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def lookup(key: int) -> str:
        """Look a key up."""
        return lookup_value(key)

    started = time.perf_counter()
    result = await agent.run("go", usage_limits=UsageLimits(request_limit=None))
    elapsed = time.perf_counter() - started
    assert result.output == "done"
    return elapsed


def best_of(fn: Any, turns: int, repeats: int) -> float:
    asyncio.run(fn(5))  # warm imports and caches
    return min(asyncio.run(fn(turns)) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument(
        "--pydantic-ai-python", default=os.environ.get("PYDANTIC_AI_PYTHON", "/tmp/bench-venv/bin/python")
    )
    parser.add_argument("--only", choices=["parley", "pydantic_ai"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.only == "pydantic_ai":
        print(json.dumps({"seconds": best_of(bench_pydantic_ai, args.turns, args.repeats)}))
        return
    parley_s = best_of(bench_parley, args.turns, args.repeats)
    child = subprocess.run(
        [
            args.pydantic_ai_python,
            __file__,
            "--only",
            "pydantic_ai",
            "--turns",
            str(args.turns),
            "--repeats",
            str(args.repeats),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        sys.exit(f"PydanticAI run failed (is it installed for {args.pydantic_ai_python}?):\n{child.stderr}")
    pai_s = json.loads(child.stdout.strip().splitlines()[-1])["seconds"]

    requests = args.turns + 1
    parley_us = parley_s / requests * 1e6
    pai_us = pai_s / requests * 1e6
    print(f"{'framework':<12} {'turns':>6} {'total ms':>10} {'us/turn':>10}")
    print(f"{'parley':<12} {requests:>6} {parley_s * 1e3:>10.1f} {parley_us:>10.1f}")
    print(f"{'pydantic-ai':<12} {requests:>6} {pai_s * 1e3:>10.1f} {pai_us:>10.1f}")
    print(f"ratio parley/pydantic-ai: {parley_us / pai_us:.3f} (target <= 0.5)")
    print(
        json.dumps(
            {
                "parley_us_per_turn": round(parley_us, 1),
                "pydantic_ai_us_per_turn": round(pai_us, 1),
                "ratio": round(parley_us / pai_us, 3),
                "turns": args.turns,
            }
        )
    )


if __name__ == "__main__":
    main()
