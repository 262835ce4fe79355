"""What a run does beyond the plain loop: hooks, guardrails, handoffs, agent tools, dynamic instructions.

A `RunLoop` gets a `RunControls` only when its agent has one of those (or the run is an agent tool's
child run); otherwise `loop.controls` is None and the loop pays one attribute test per step, nothing
more. The loop calls in at fixed points:

    run()            -> controls.run(body)          restore the current agent, on_run_start ... on_run_end
    each iteration   -> controls.before_turn()      apply a handoff; input guardrails (blocking ones)
    request built    -> controls.prepare_request()  parents' limits, instructions, tool availability,
                                                    before_model_request, parallel input guardrails start
    response in      -> controls.after_turn()       parallel guardrails done, usage up to the parents,
                                                    after_model_request
    batch planned    -> controls.plan()             tool guardrails, handoff calls, tools not offered
    each call        -> controls.run_call()         before/after_tool_call, tool output guardrails,
                                                    agent tools (child runs)
    final answer     -> controls.check_output()     output guardrails
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from parley.agent_tool import AgentTool, RunLink, mark_outer, run_agent_call
from parley.backends.base import ModelRequest, ModelResponse
from parley.context import RunContext
from parley.errors import CallInProgressError, ConfigurationError, GuardrailTripped, HookError, UsageLimitExceeded
from parley.guardrails import GuardrailSet, check_all, check_tool_output, screen_call, user_input, verdict_of
from parley.handoffs import (
    HandoffTool,
    filtered_history,
    find_agent,
    handoffs_of,
    run_on_handoff,
    transfer_result,
)
from parley.hooks import RunHooks, call_hook
from parley.interruptions import BatchPlan, plan_batch
from parley.protocol import Conversation, Message, Role, ToolCall, ToolResult, ToolSpec, Usage
from parley.result import RunResult
from parley.run_state import GuardrailRecord, Interruption, RunState
from parley.tools import ToolContext

if TYPE_CHECKING:
    from parley._run_loop import RunLoop
    from parley._run_tools import Checkpoint, ToolRunner
    from parley.agent import Agent


def configure(
    agent: Agent[Any, Any],
    *,
    description: str | None,
    deps_type: Any,
    hooks: RunHooks[Any] | None,
    guardrails: Sequence[Any],
    handoffs: Sequence[Any],
) -> None:
    """Set the agent's options for working with others and for run control (called by `Agent.__init__`)."""
    if hooks is not None and not isinstance(hooks, RunHooks):
        raise ConfigurationError(f"hooks must be a parley.RunHooks (subclass it), not {type(hooks).__name__}")
    instructions = agent.instructions
    if instructions is not None and not isinstance(instructions, str) and not callable(instructions):
        raise ConfigurationError(
            f"instructions must be a str or a function of the run context, not {type(instructions).__name__}"
        )
    agent.description = description
    agent.deps_type = deps_type
    agent.hooks = hooks
    agent.guardrails = GuardrailSet.of(guardrails)
    agent.handoffs = handoffs_of(handoffs)
    agent.tools = [*agent.tools, *(HandoffTool(h) for h in agent.handoffs)]
    agent.dynamic_instructions = callable(instructions)
    agent.dynamic_tools = any(
        getattr(t, "is_enabled", True) is not True or getattr(t, "prepare", None) is not None for t in agent.tools
    )
    agent.controlled = bool(
        hooks is not None
        or agent.guardrails
        or agent.handoffs
        or agent.dynamic_instructions
        or agent.dynamic_tools
        or any(isinstance(t, AgentTool) for t in agent.tools)
    )


async def _value(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def finish_call(
    runner: ToolRunner,
    state: RunState,
    call: ToolCall,
    arguments: str,
    result: ToolResult,
    checkpoint: Checkpoint | None,
    on_result: Callable[[ToolResult], Any] | None,
) -> None:
    """Record a call's result the way `ToolRunner.run_batch` does (ledger, record, log, checkpoint, emit)."""
    await runner.finish(state, call, arguments, result, checkpoint, on_result)


class RunControls:
    """The controls of one run loop (see the module docstring)."""

    def __init__(self, loop: RunLoop, link: RunLink | None) -> None:
        self.loop = loop
        self.root = loop.agent
        """The agent the run started with: its hooks and input guardrails serve the whole run."""
        self.hooks: RunHooks[Any] | None = getattr(loop.agent, "hooks", None)
        self._overridden: frozenset[str] = frozenset()
        """The hook methods the user wrote (the base class's no-ops are not even called)."""
        if self.hooks is not None:
            mine, base, own = type(self.hooks), vars(RunHooks), getattr(self.hooks, "__dict__", {})
            self._overridden = frozenset(
                name
                for name in base
                if not name.startswith("_") and (getattr(mine, name) is not base[name] or name in own)
            )
        self.ctx: RunContext[Any] = RunContext(loop)
        self.link = link
        self.ancestors: list[RunLoop] = []
        if link is not None:
            parent = link.parent
            self.ancestors = [parent, *(parent.controls.ancestors if parent.controls is not None else [])]
        self.offered: set[str] | None = None
        """Tools offered on the request whose batch is planned next (None: no per-turn filter)."""
        self.prompt: str | None = None
        """The system prompt rendered for the last request (dynamic instructions)."""
        self._paused: list[Interruption] = []
        self._parallel: asyncio.Task[None] | None = None
        self._parallel_guards: list[Any] = []
        self._armed: asyncio.Task[Any] | None = None
        self._cancelled_by: GuardrailTripped | None = None
        self._held: list[tuple[Agent[Any, Any], list[Any]]] = []
        """Toolsets opened for agents handed to (the starting agent's are `Agent._drive`'s business)."""

    # -- the run as a whole -------------------------------------------------------------------------
    async def run(self, body: Callable[[], Any]) -> RunResult[Any]:
        loop = self.loop
        try:
            await self._restore()
            await self.hook("on_run_start")
            result: RunResult[Any] = await body()
        except asyncio.CancelledError:
            if self._cancelled_by is None:
                raise
            self._uncancel()
            raise self._cancelled_by from None
        finally:
            if self._parallel is not None and not self._parallel.done():
                self._parallel.cancel()
            while self._held:
                agent, held = self._held.pop()
                await agent._release_toolsets(held)
        if self.prompt is not None:
            result.messages = self._with_prompt(result.messages, loop.agent)
        if result.paused:
            await self.hook("on_interruption", list(result.interruptions))
        await self.hook("on_run_end", result)
        return result

    async def hook(self, name: str, *args: Any) -> Any:
        if self.hooks is None or name not in self._overridden:
            return None
        return await call_hook(self.hooks, name, self.ctx, *args)

    async def _restore(self) -> None:
        """A resumed run continues with the agent it was handed to."""
        name = self.loop.state.current_agent
        if name is None or name == self.loop.agent.name:
            return
        agent = find_agent(self.loop.agent, name)
        if agent is None:
            raise ConfigurationError(
                f"this run state is with agent {name!r}, which {self.loop.agent.name!r} cannot reach through "
                "its handoffs; resume with the agent the run started with"
            )
        await self._become(agent)

    async def _become(self, agent: Agent[Any, Any]) -> None:
        from parley._run_tools import ToolRunner

        if agent.toolsets and agent is not self.root:  # e.g. the MCP servers of the agent handed to
            self._held.append((agent, await agent._acquire_toolsets()))
        loop = self.loop
        loop.agent = agent
        loop.tool_runner = ToolRunner(agent.tools, agent.toolsets, getattr(loop, "tracer", None))
        loop.tool_runner.controls = self
        loop.tool_runner.gate = loop.gate

    # -- usage across agents --------------------------------------------------------------------------
    def add_usage(self, usage: Usage) -> None:
        """Add what a guardrail spent to this run and its parents, and hold it to their limits."""
        state = self.loop.state
        state.usage = state.usage + usage
        self.loop.agent.usage_limits.check_after_response(state.usage)
        self._to_parents(usage)

    def _to_parents(self, usage: Usage) -> None:
        for parent in self.ancestors:
            parent.state.usage = parent.state.usage + usage
            try:
                parent.agent.usage_limits.check_after_response(parent.state.usage)
            except UsageLimitExceeded as exc:
                raise mark_outer(exc) from None

    # -- the model turn ---------------------------------------------------------------------------------
    async def before_turn(self) -> Agent[Any, Any]:
        loop = self.loop
        state = loop.state
        if state.handoff_to is not None and not state.batch:
            await self._hand_off(state.handoff_to)
        if not state.input_guarded:
            guards = self.root.guardrails.input
            blocking = [g for g in guards if not g.run_in_parallel]
            if blocking:
                await check_all("input", blocking, loop, self.ctx, user_input(loop))
            self._parallel_guards = [g for g in guards if g.run_in_parallel]
            if not self._parallel_guards:
                state.input_guarded = True
        return loop.agent

    async def prepare_request(self, request: ModelRequest) -> ModelRequest:
        loop = self.loop
        agent = loop.agent
        for parent in self.ancestors:
            try:
                parent.agent.usage_limits.check_before_request(parent.state.usage)
            except UsageLimitExceeded as exc:
                raise mark_outer(exc) from None
        if agent.dynamic_instructions:
            render = agent.instructions
            assert callable(render)
            text = await _value(render(self.ctx))
            if text is not None and not isinstance(text, str):
                raise ConfigurationError(f"the instructions function returned {type(text).__name__}, not a str")
            self.prompt = agent._system_prompt(text or "")
            request.conversation = Conversation(messages=self._with_prompt(request.conversation.messages, agent))
        self.offered = None
        if agent.dynamic_tools:
            request.tools = await self._available(request.tools)
            self.offered = {spec.name for spec in request.tools}
            if not request.tools:
                request.tool_choice = "none"
        if self.hooks is not None:
            replaced = await self.hook("before_model_request", request)
            if isinstance(replaced, ModelRequest):
                request = replaced
        if self._parallel_guards:
            self._start_parallel()
        return request

    async def after_turn(self, request: ModelRequest, response: ModelResponse) -> None:
        if self._parallel is not None:
            task, self._parallel, self._armed = self._parallel, None, None
            if self._cancelled_by is not None:
                self._uncancel()
            await task  # a tripped guardrail raises here: the turn's calls never run, its answer is not returned
            self.loop.state.input_guarded = True
        if self.ancestors:
            self._to_parents(response.usage)
        if self.hooks is not None:
            await self.hook("after_model_request", request, response)

    def _start_parallel(self) -> None:
        guards, self._parallel_guards = self._parallel_guards, []
        self._cancelled_by = None
        self._armed = asyncio.current_task()
        self._parallel = asyncio.ensure_future(
            check_all("input", guards, self.loop, self.ctx, user_input(self.loop))
        )

        def tripped(task: asyncio.Task[None]) -> None:
            if task.cancelled() or self._armed is None:
                return
            error = task.exception()
            if isinstance(error, GuardrailTripped):
                self._cancelled_by = error
                self._armed.cancel()  # the request still in flight is not worth finishing

        self._parallel.add_done_callback(tripped)

    def _uncancel(self) -> None:
        task = asyncio.current_task()
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()

    def _with_prompt(self, messages: list[Message], agent: Agent[Any, Any]) -> list[Message]:
        """`messages` with the rendered instructions first (in place of the static schema hint, if any)."""
        rest = messages
        if agent.system_prompt and messages and messages[0].role is Role.SYSTEM:
            rest = messages[1:]
        return [Message.system(self.prompt), *rest] if self.prompt else list(rest)

    async def _available(self, specs: list[ToolSpec]) -> list[ToolSpec]:
        tools = self.loop.tool_runner.tools
        out: list[ToolSpec] = []
        for spec in specs:
            tool = tools.get(spec.name)
            enabled = getattr(tool, "is_enabled", True)
            if enabled is not True:
                if enabled is False or not await _value(enabled(self.ctx)):
                    continue
            prepare = getattr(tool, "prepare", None)
            if prepare is not None:
                prepared = await _value(prepare(self.ctx, spec))
                if prepared is None:
                    continue
                if not isinstance(prepared, ToolSpec):
                    raise ConfigurationError(
                        f"tool {spec.name!r}: prepare returned {type(prepared).__name__}, not a ToolSpec or None"
                    )
                spec = prepared.model_copy(update={"name": spec.name})  # the name stays the tool's
            out.append(spec)
        return out

    # -- handoffs -------------------------------------------------------------------------------------
    async def _hand_off(self, name: str) -> None:
        loop = self.loop
        state = loop.state
        source = loop.agent
        spec = next((h for h in source.handoffs if h.agent.name == name), None)
        if spec is None:
            raise ConfigurationError(f"the run was handed to {name!r}, which is not among {source.name!r}'s handoffs")
        state.messages = filtered_history(spec, state.messages)
        await self._become(spec.agent)
        state.current_agent = spec.agent.name
        state.handoff_to = None
        state.tool_rounds, state.stalled, state.output_attempts = 0, False, 0
        gate = loop.gate
        try:
            if gate is not None and spec.on_handoff is not None:  # once per run, whichever copy gets here
                key = f"handoff:{state.turn}:{spec.agent.name}"
                await gate.once(key, spec.tool_name, lambda: run_on_handoff(spec, self.ctx))
            else:
                await run_on_handoff(spec, self.ctx)
        except CallInProgressError:
            raise
        except Exception as exc:
            why = f"on_handoff of {spec.tool_name} raised {type(exc).__name__}: {exc}"
            raise HookError(why, hook="on_handoff") from exc
        await self.hook("on_handoff", source, spec.agent)
        await loop.checkpoint()

    # -- the tool batch ---------------------------------------------------------------------------------
    async def plan(self, plan: BatchPlan) -> BatchPlan:
        loop = self.loop
        state, tools = loop.state, loop.tool_runner.tools
        guards = loop.agent.guardrails.tool_input
        if guards:
            screen = self._screen(guards)
            plan = plan_batch(state, tools, screen)
            if plan.screen:
                for call in plan.screen:
                    await screen_call(loop, guards, call)
                plan = plan_batch(state, tools, self._screen(guards))
        offered, self.offered = self.offered, None
        run: list[tuple[ToolCall, str]] = []
        for call, arguments in plan.run:
            tool = tools.get(call.name)
            if offered is not None and call.name not in offered:
                plan.answered[call.id] = _not_offered(call)
            elif isinstance(tool, HandoffTool):
                plan.answered[call.id] = transfer_result(call, tool.handoff, already=state.handoff_to)
                if state.handoff_to is None:
                    state.handoff_to = tool.handoff.agent.name
            else:
                run.append((call, arguments))
        plan.run = run
        if offered is not None:
            for item in [i for i in plan.pause if i.tool_name not in offered]:
                plan.pause.remove(item)
                call = next(c for c in state.batch if c.id == item.call_id)
                plan.answered[call.id] = _not_offered(call)
        self._paused = plan.pause
        return plan

    def _screen(self, guards: Sequence[Any]) -> Callable[[ToolCall], tuple[str, str | None, str | None] | None]:
        state = self.loop.state
        batch = {c.id for c in state.batch}
        records: dict[str, list[GuardrailRecord]] = {}
        for entry in reversed(state.guardrails):  # this batch's are the latest (made at this turn)
            if entry.turn < state.turn:
                break
            if entry.kind == "tool_input" and entry.call_id in batch:
                records.setdefault(entry.call_id, []).insert(0, entry)

        handoffs = {h.tool_name for h in self.loop.agent.handoffs}

        def verdict(call: ToolCall) -> tuple[str, str | None, str | None] | None:
            if call.name in handoffs or not any(g.applies(call.name) for g in guards):
                return ("allow", None, None)
            found = records.get(call.id)
            return verdict_of(found) if found else None

        return verdict

    def pause_later(self, items: list[Interruption]) -> None:
        """A child run paused: its calls join the batch's pause."""
        self._paused.extend(items)

    async def run_call(
        self,
        runner: ToolRunner,
        state: RunState,
        call: ToolCall,
        target: ToolCall,
        context: ToolContext,
        checkpoint: Checkpoint | None,
        on_result: Callable[[ToolResult], Any] | None,
    ) -> None:
        """Run one call of the batch with the hooks and guardrails around it, and record it."""
        tracer = getattr(runner, "tracer", None)
        if isinstance(runner.tools.get(call.name), AgentTool):
            if tracer is None:
                await run_agent_call(self, runner, state, call, target, context, checkpoint, on_result)
            else:  # an execute_tool span, the child's run inside it
                await tracer.agent_call(runner, state, call, target, lambda: run_agent_call(
                    self, runner, state, call, target, context, checkpoint, on_result))
            return
        await self.hook("before_tool_call", target)
        if tracer is None:
            results = await runner.executor.execute([target], context=context)
        else:
            results = await tracer.tool_call(runner, state, call, target, context)
        await self.settle(runner, state, call, target.arguments, results[0], checkpoint, on_result)

    async def settle(
        self,
        runner: ToolRunner,
        state: RunState,
        call: ToolCall,
        arguments: str,
        result: ToolResult,
        checkpoint: Checkpoint | None,
        on_result: Callable[[ToolResult], Any] | None,
    ) -> None:
        """Tool output guardrails and `after_tool_call`, then record; a guardrail's stop raises once recorded."""
        stop: GuardrailTripped | None = None
        guards = self.loop.agent.guardrails.tool_output
        if guards:
            result, stop = await check_tool_output(self.loop, guards, call, result)
        await self.hook("after_tool_call", call, result)
        await finish_call(runner, state, call, arguments, result, checkpoint, on_result)
        if stop is not None:
            raise stop

    # -- the answer -------------------------------------------------------------------------------------
    async def check_output(self, output: Any) -> None:
        guards = self.loop.agent.guardrails.output
        if guards:
            await check_all("output", guards, self.loop, self.ctx, output)


def _not_offered(call: ToolCall) -> ToolResult:
    return ToolResult(
        call_id=call.id,
        name=call.name,
        content=f"Tool {call.name!r} is not available now; it was not offered on this turn.",
        is_error=True,
    )
