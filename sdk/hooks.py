"""`RunHooks`: callbacks at each step of a run, to log, measure, or change what the model is sent.

    class Audit(RunHooks):
        async def before_model_request(self, ctx, request):
            request.sampling = replace(request.sampling, temperature=0)   # edit in place, or return a new one

        def after_tool_call(self, ctx, call, result):
            log.info("%s -> %s", call.name, result.content[:80])

    agent = Agent(backend, tools=[...], hooks=Audit())

Override the methods you need; each may be sync or async. The order, for a run whose model calls
a tool, then one needing approval (pause), then answers after the resume::

    on_run_start, before_model_request, after_model_request, before_tool_call, after_tool_call,
    before_model_request, after_model_request, on_interruption, on_run_end      (paused)
    on_run_start, before_tool_call, after_tool_call,                             (the approved call)
    before_model_request, after_model_request, on_run_end                        (the answer)

`on_handoff` comes before the first request of the agent handed to. `before_model_request` may
change the request (messages, tools, settings) by mutating it or by returning a new `ModelRequest`;
the backend receives what it leaves. Hooks are given to the agent a run starts with and see the
whole run, handoffs included (an agent used as a tool runs with its own hooks). An exception in a
hook stops the run with `parley.errors.HookError`, which names the hook and chains the cause.
`on_run_end` is called for every run that returns a result, paused or finished (not when the run
raises).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from parley.backends.base import ModelRequest, ModelResponse
from parley.context import RunContext
from parley.errors import HookError
from parley.protocol import ToolCall, ToolResult
from parley.run_state import Interruption

if TYPE_CHECKING:
    from parley.agent import Agent
    from parley.result import RunResult

DepsT = TypeVar("DepsT", default=Any)


class RunHooks(Generic[DepsT]):
    """Lifecycle callbacks (all no-ops here; see the module docstring for the order)."""

    def on_run_start(self, ctx: RunContext[DepsT]) -> Any:
        """The run (or a resume of it) starts."""

    def on_run_end(self, ctx: RunContext[DepsT], result: RunResult[Any]) -> Any:
        """The run returns `result`, paused or finished."""

    def before_model_request(self, ctx: RunContext[DepsT], request: ModelRequest) -> Any:
        """About to send `request`: mutate it, or return a replacement `ModelRequest`."""

    def after_model_request(self, ctx: RunContext[DepsT], request: ModelRequest, response: ModelResponse) -> Any:
        """The backend answered `request` with `response`."""

    def before_tool_call(self, ctx: RunContext[DepsT], call: ToolCall) -> Any:
        """About to run `call` (with the arguments it will run with)."""

    def after_tool_call(self, ctx: RunContext[DepsT], call: ToolCall, result: ToolResult) -> Any:
        """`call` ran; `result` is what the model will read."""

    def on_handoff(self, ctx: RunContext[DepsT], source: Agent[Any, Any], target: Agent[Any, Any]) -> Any:
        """The conversation moves from `source` to `target`."""

    def on_interruption(self, ctx: RunContext[DepsT], interruptions: list[Interruption]) -> Any:
        """The run pauses, waiting on `interruptions`."""


async def call_hook(hooks: RunHooks[Any], name: str, *args: Any) -> Any:
    """Call `hooks.<name>(*args)`, awaiting it if needed; any exception becomes `HookError` naming it."""
    try:
        value = getattr(hooks, name)(*args)
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:
        raise HookError(f"RunHooks.{name} raised {type(exc).__name__}: {exc}", hook=name) from exc
    return value
