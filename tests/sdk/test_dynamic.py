"""Dynamic instructions, typed dependencies (checked by mypy), per-turn tool availability."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from parley import Agent, RunContext, RunState, ToolContext, tool
from parley.backends import BackendCapabilities, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import ConfigurationError
from parley.protocol import Role, ToolSpec
from tests.conftest import REPO_ROOT

SAMPLE = Path(__file__).with_name("typed_deps_sample.py")


@dataclass
class Deps:
    user: str


@tool
def whoami(ctx: ToolContext[Deps]) -> str:
    """Who is asking."""
    return ctx.deps.user


def system_text(request: Any) -> str:
    first = request.conversation.messages[0]
    assert first.role is Role.SYSTEM
    return str(first.text)


async def test_instructions_may_be_a_sync_or_async_function_of_the_run_context() -> None:
    def sync_instructions(ctx: RunContext[Deps]) -> str:
        return f"You serve {ctx.deps.user}; this is request {ctx.turn + 1}."

    async def async_instructions(ctx: RunContext[Deps]) -> str:
        return f"Async for {ctx.deps.user}."

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("whoami", {})]), "You are Ada."])
    agent = Agent(backend, deps_type=Deps, instructions=sync_instructions, tools=[whoami])
    result = await agent.run("who am I?", deps=Deps("Ada"))
    assert [system_text(r) for r in backend.requests] == [
        "You serve Ada; this is request 1.",
        "You serve Ada; this is request 2.",
    ]
    assert result.output == "You are Ada." and result.messages[0].text == "You serve Ada; this is request 2."
    assert backend.requests[1].conversation.messages[-1].tool_results[0].content == "Ada"

    backend = ScriptedBackend(["ok"])
    await Agent(backend, deps_type=Deps, instructions=async_instructions).run("hi", deps=Deps("Bo"))
    assert system_text(backend.requests[0]) == "Async for Bo."


async def test_dynamic_instructions_keep_the_prompted_schema_hint() -> None:
    class Answer(BaseModel):
        city: str

    backend = ScriptedBackend(['{"city": "Oslo"}'], capabilities=BackendCapabilities(structured_output=False))
    agent = Agent(backend, instructions=lambda ctx: "Name a city.", output_type=Answer)
    result = await agent.run("any city")
    text = system_text(backend.requests[0])
    assert text.startswith("Name a city.\n\nAnswer with only a JSON value")
    assert len(backend.requests[0].conversation) == 2  # one system message: the hint is not sent twice
    assert result.output == Answer(city="Oslo")


async def test_instructions_returning_a_non_string_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="returned int"):
        await Agent(ScriptedBackend(["x"]), instructions=lambda ctx: 3).run("hi")  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="instructions must be"):
        Agent(ScriptedBackend([]), instructions=3)  # type: ignore[call-overload]


async def test_is_enabled_and_prepare_decide_the_tools_per_turn() -> None:
    @tool(is_enabled=lambda ctx: ctx.turn == 0)
    def first_only(x: int) -> str:
        """Only on the first request.

        Args:
            x: X.
        """
        return "ran"

    async def narrow(ctx: RunContext, spec: ToolSpec) -> ToolSpec | None:
        return spec.model_copy(update={"description": f"Lookup (request {ctx.turn + 1})"})

    @tool(prepare=narrow)
    def lookup(city: str) -> str:
        """Lookup.

        Args:
            city: City.
        """
        return "4 C"

    @tool(prepare=lambda ctx, spec: None)
    def hidden() -> str:
        """Never offered."""
        return "ran"

    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("first_only", {"x": 1})]),
            ScriptedTurn(tool_calls=[call("first_only", {"x": 2}), call("hidden", {})]),
            "done",
        ]
    )
    result = await Agent(backend, tools=[first_only, lookup, hidden], max_tool_rounds=None).run("go")
    offered = [[(t.name, t.description) for t in r.tools] for r in backend.requests]
    assert offered[0] == [("first_only", "Only on the first request."), ("lookup", "Lookup (request 1)")]
    assert offered[1] == [("lookup", "Lookup (request 2)")]
    refused = backend.requests[2].conversation.messages[-2:]
    assert [r.tool_results[0].is_error for r in refused] == [True, True]
    assert all("not available now" in r.tool_results[0].content for r in refused)
    assert result.output == "done"


async def test_typed_deps_sample_runs() -> None:
    sys.path.insert(0, str(SAMPLE.parent))
    try:
        import typed_deps_sample
    finally:
        sys.path.remove(str(SAMPLE.parent))
    assert await typed_deps_sample.main() == "Tea is 90."


BAD = textwrap.dedent(
    """
    from __future__ import annotations

    from parley import Agent, RunContext, ToolContext
    from parley.backends import ScriptedBackend
    from typed_deps_sample import Deps, make_agent


    def typo(ctx: ToolContext[Deps]) -> str:
        return ctx.deps.usr  # line 10


    async def wrong_deps() -> None:
        await make_agent().run("x", deps=3)  # line 14


    def other(ctx: RunContext[int]) -> str:
        return ""


    mixed = Agent(ScriptedBackend([]), deps_type=Deps, instructions=other)  # line 21
    """
)


def test_mypy_checks_typed_deps(tmp_path: Path) -> None:
    good, bad = tmp_path / "typed_deps_sample.py", tmp_path / "bad_deps.py"
    good.write_text(SAMPLE.read_text())  # checked beside the bad file, outside the tests package
    bad.write_text(BAD)
    linked = sorted((REPO_ROOT / "build").glob("__editable__.parley-*"))
    if not linked:
        pytest.skip("no strict editable link tree (run `make env`)")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO_ROOT / "pyproject.toml"), str(good), str(bad)],
        cwd=linked[-1],  # where `make typecheck` runs mypy: its cache makes this quick
        env={"MYPYPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout
    assert "typed_deps_sample.py" not in out, out  # the good file is clean
    errors = sorted({line.split(":")[1] for line in out.splitlines() if ": error:" in line})
    assert errors == ["10", "14", "21"], out
    assert '"Deps" has no attribute "usr"' in out  # (line 10 also: returning Any, since the attribute is unknown)
    assert 'incompatible type "int"; expected "Deps | None"' in out
    assert 'Argument "instructions" to "Agent" has incompatible type' in out


async def test_a_resumed_run_renders_the_instructions_again() -> None:
    @tool(needs_approval=True)
    def act() -> str:
        """Act."""
        return "acted"

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("act", {})]), "done"])
    agent = Agent(backend, deps_type=Deps, instructions=lambda ctx: f"for {ctx.deps.user}", tools=[act])
    first = await agent.run("go", deps=Deps("Ada"))
    state = RunState.from_json(first.state.to_json())
    state.approve(first.interruptions[0].call_id)
    done = await agent.run(state=state, deps=Deps("Bo"))
    assert [system_text(r) for r in backend.requests] == ["for Ada", "for Bo"] and done.output == "done"
