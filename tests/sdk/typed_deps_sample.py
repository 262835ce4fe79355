"""Typed dependencies as a user writes them; `test_dynamic.py` runs mypy (strict) on this file and runs it.

`Agent(deps_type=Deps)` makes an ``Agent[str, Deps]``: tools annotated ``ToolContext[Deps]`` and
instructions taking ``RunContext[Deps]`` see `deps` as a `Deps`, and ``run(deps=...)`` takes a `Deps`.
"""

from __future__ import annotations

from dataclasses import dataclass

from parley import Agent, RunContext, ToolContext, tool
from parley.backends import ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call


@dataclass
class Deps:
    user: str
    discount: int


@tool
def price(ctx: ToolContext[Deps], item: str) -> str:
    """Price of an item for the current user.

    Args:
        item: The item.
    """
    percent: int = ctx.deps.discount
    return f"{item} for {ctx.deps.user}: {100 - percent}"


async def instructions(ctx: RunContext[Deps]) -> str:
    return f"You serve {ctx.deps.user}."


def make_agent() -> Agent[str, Deps]:
    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("price", {"item": "tea"})]), "Tea is 90."])
    return Agent(backend, deps_type=Deps, instructions=instructions, tools=[price])


async def main() -> str | None:
    result = await make_agent().run("How much is tea?", deps=Deps(user="ada", discount=10))
    return result.output
