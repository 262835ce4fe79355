"""RunHooks: every step in order, sync or async; a hook may edit the request; a failing hook is named."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from parley import Agent, RunHooks, RunState, tool
from parley.backends import ModelRequest, ModelResponse, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import HookError
from parley.protocol import Message, ToolCall, ToolResult


@tool
def lookup(city: str) -> str:
    """Weather.

    Args:
        city: City.
    """
    return f"4 C in {city}"


@tool(needs_approval=True)
def send_email(to: str) -> str:
    """Send.

    Args:
        to: Address.
    """
    return f"sent to {to}"


class Recorder(RunHooks):
    """Sync and async methods mixed, as users write them."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def on_run_start(self, ctx: Any) -> None:
        self.events.append("run_start")

    def on_run_end(self, ctx: Any, result: Any) -> None:
        self.events.append(f"run_end:{'paused' if result.paused else result.output}")

    async def before_model_request(self, ctx: Any, request: ModelRequest) -> None:
        self.events.append(f"before_request:{ctx.turn + 1}")

    def after_model_request(self, ctx: Any, request: ModelRequest, response: ModelResponse) -> None:
        self.events.append(f"after_request:{ctx.turn}")

    def before_tool_call(self, ctx: Any, call: ToolCall) -> None:
        self.events.append(f"before_tool:{call.name}")

    async def after_tool_call(self, ctx: Any, call: ToolCall, result: ToolResult) -> None:
        self.events.append(f"after_tool:{call.name}:{result.content}")

    def on_interruption(self, ctx: Any, interruptions: list[Any]) -> None:
        self.events.append(f"interruption:{','.join(i.tool_name for i in interruptions)}")


async def test_hooks_see_every_event_in_order_across_a_pause() -> None:
    turns = [
        ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})]),
        ScriptedTurn(tool_calls=[call("send_email", {"to": "ada@example.com"})]),
        "Sent the Oslo weather.",
    ]
    hooks = Recorder()
    agent = Agent(ScriptedBackend(turns), tools=[lookup, send_email], hooks=hooks)
    first = await agent.run("Mail Ada the Oslo weather")
    assert first.paused
    state = RunState.from_json(first.state.to_json())
    state.approve(first.interruptions[0].call_id)
    resumed = Agent(ScriptedBackend(turns[2:]), tools=[lookup, send_email], hooks=hooks)
    done = await resumed.run(state=state)
    assert done.output == "Sent the Oslo weather."
    assert hooks.events == [
        "run_start",
        "before_request:1",
        "after_request:1",
        "before_tool:lookup",
        "after_tool:lookup:4 C in Oslo",
        "before_request:2",
        "after_request:2",
        "interruption:send_email",
        "run_end:paused",
        "run_start",
        "before_tool:send_email",
        "after_tool:send_email:sent to ada@example.com",
        "before_request:3",
        "after_request:3",
        "run_end:Sent the Oslo weather.",
    ]


async def test_a_hook_editing_the_request_changes_what_the_backend_receives() -> None:
    class Edit(RunHooks):
        def before_model_request(self, ctx: Any, request: ModelRequest) -> ModelRequest:
            request.sampling = replace(request.sampling, temperature=0.0)
            request.tools = []  # mutate in place ...
            messages = [*request.conversation.messages, Message.user("(answer in one word)")]
            return replace(request, conversation=type(request.conversation)(messages=messages))  # ... or replace

    backend = ScriptedBackend(["Cold."])
    await Agent(backend, tools=[lookup], hooks=Edit()).run("Weather?")
    [seen] = backend.requests
    assert seen.sampling.temperature == 0.0 and seen.tools == []
    assert seen.conversation.messages[-1].text == "(answer in one word)"


async def test_an_exception_in_a_hook_is_a_typed_error_naming_it() -> None:
    class Broken(RunHooks):
        async def after_tool_call(self, ctx: Any, call: ToolCall, result: ToolResult) -> None:
            raise KeyError("audit log down")

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})]), "never"])
    with pytest.raises(HookError, match="RunHooks.after_tool_call raised KeyError") as caught:
        await Agent(backend, tools=[lookup], hooks=Broken()).run("go")
    assert caught.value.hook == "after_tool_call" and isinstance(caught.value.__cause__, KeyError)


def test_hooks_must_be_run_hooks() -> None:
    from parley.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="RunHooks"):
        Agent(ScriptedBackend([]), hooks=object())  # type: ignore[arg-type]
