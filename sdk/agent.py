"""`Agent`: instructions, tools and an output type over any backend.

    agent = Agent(backend, instructions="Be brief.", tools=[lookup, send_email], output_type=Answer)
    result = await agent.run("Email Ada the Oslo forecast")
    if result.paused:                                   # send_email needs approval
        state = result.state
        state.approve(result.interruptions[0].call_id)
        result = await agent.run(state=RunState.from_json(state.to_json()))
    print(result.output, result.usage)

One loop serves every backend (local, hosted, scripted). A run pauses instead of running a tool
that needs approval or an outside result; the `RunState` it returns is plain versioned JSON, so the
decision can be taken later, elsewhere, and the run resumed in another process.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from typing_extensions import TypeVar as DefaultTypeVar

from parley._history_run import history_options
from parley._run_controls import configure
from parley._run_history import normalise_history, recorded_for
from parley._run_loop import CheckpointFn, RunLoop, new_user_turn
from parley._run_tools import ToolRunner, tool_objects, toolsets_of
from parley.backends.base import Backend, SamplingSettings, ToolChoice
from parley.caching import CachePolicy
from parley.context import RunContext
from parley.errors import ConfigurationError
from parley.fingerprint import AllowAgentChange
from parley.ledger import LedgerOption, resolve_ledger
from parley.output import OutputSpec
from parley.protocol import Conversation, Event, Message, Role
from parley.reasoning import Reasoning
from parley.result import RunResult
from parley.run_state import RunState
from parley.sessions import Session
from parley.sessions._run import check_session_run
from parley.tools import Toolset
from parley.tracing import Instrumentation, check_instrument, run_tracer
from parley.usage_limits import UsageLimits

if TYPE_CHECKING:
    from parley.agent_tool import AgentTool, OutputExtractor
    from parley.compaction import Compaction
    from parley.guardrails import Guardrail, GuardrailSet
    from parley.handoffs import Handoff
    from parley.history import HistoryProcessor
    from parley.hooks import RunHooks
    from parley.tools.policy import NeedsApproval

OutputT = TypeVar("OutputT")
DepsT = DefaultTypeVar("DepsT", default=Any)
"""The type of `deps` (``Agent(deps_type=Deps)``): tools see it as `ToolContext[Deps]`, callbacks as
`RunContext[Deps]`. Second, so ``Agent[Answer]`` keeps meaning the output type."""

Instructions = str | Callable[[RunContext[DepsT]], "str | None | Awaitable[str | None]"]
"""Fixed text, or a function of the run context (sync or async) called before every model request."""

ToolChoicePolicy = Callable[[list[Message]], ToolChoice]
"""Decides the tool choice per turn from the conversation so far (e.g. force a plan's next tool)."""

DEFAULT_MAX_TOOL_ROUNDS = 3
"""Rounds of tool calls per user message before the model must answer (`Agent(max_tool_rounds=...)`).

Small on purpose: look something up, act, check — then answer. Small local models otherwise loop
(the same call turn after turn); hosted multi-step agents should raise it or pass None."""

AgentInput = str | Message | Sequence[Message] | Conversation | None
"""A user prompt, one message, or a whole history (repaired for tool-call adjacency)."""


class Agent(Generic[OutputT, DepsT]):
    """An agent: a backend plus instructions, tools and an output type.

    `output_type` is `str` (default), a pydantic model class or a JSON Schema dict. `max_turns`
    caps model requests for the whole run (resumes included); `usage_limits` caps requests,
    tokens, tool calls and cost; `output_retries` bounds the repair loop for structured answers.
    `tool_choice` is fixed, or a function of the conversation so far deciding each turn.

    Convergence: after `max_tool_rounds` model turns with tool calls since the last user message
    (default 3; None: no limit), after a round in which every call repeated an earlier one, and on
    the last turn `max_turns` allows, the model is asked with
    ``tool_choice="none"`` — locally the grammar then admits only the typed answer — so a looping
    model ends with an answer, or a typed error naming why, instead of using up `max_turns`. A call
    identical to one already settled is not run again (the repeat rule, per tool ``on_repeat``).

    `tools` may hold toolsets beside plain tools (`parley.mcp.MCPServerStdio`, `MCPServerHTTP`):
    ``async with agent:`` keeps them open across runs, otherwise each run opens and closes them.
    `instrument` traces runs with OpenTelemetry (`parley.tracing`): None (default) traces when a
    tracer provider is configured globally, True or an `Instrumentation` always, False never.

    Working with others and run control: `instructions` may be a function of the `RunContext`
    (sync or async, rendered before each request); `deps_type` types the `deps` that tools
    (`ToolContext[Deps]`) and callbacks (`RunContext[Deps]`) receive; `hooks` (`parley.RunHooks`)
    see every step; `guardrails` check input, output and tool calls (`parley.guardrails`);
    `handoffs` let the model pass the conversation to other agents (`parley.handoffs`);
    `as_tool()` makes this agent a tool of another (`parley.agent_tool`). `description` says what
    the agent does (used for its handoff and agent-tool descriptions).

    Long conversations: `history_processors` (`parley.history`) shape what each request shows the
    model (sync or async functions of the messages, optionally of the context; a call is never sent
    without its result); `compaction` (`parley.compaction.Compaction`) summarises the oldest turns
    when a request passes a fraction of the model's context window, keeping the cached prefix.
    The stored history is never changed by either.
    """

    # set by `parley._run_controls.configure`
    description: str | None
    deps_type: type[DepsT] | None
    hooks: RunHooks[DepsT] | None
    guardrails: GuardrailSet
    handoffs: list[Handoff]
    dynamic_instructions: bool
    """`instructions` is a function, rendered before each request."""
    dynamic_tools: bool
    """Some tool has `is_enabled`/`prepare`: the tools offered are decided per turn."""
    controlled: bool
    """Runs need `parley._run_controls.RunControls` (hooks, guardrails, handoffs, agent tools, ...)."""

    @overload
    def __init__(
        self: Agent[str, DepsT],
        backend: Backend,
        *,
        instructions: Instructions[DepsT] | None = None,
        tools: Sequence[Any] = (),
        output_type: None = None,
        reasoning: Reasoning | None = None,
        cache: CachePolicy | None = None,
        max_turns: int = 20,
        max_tool_rounds: int | None = DEFAULT_MAX_TOOL_ROUNDS,
        name: str | None = None,
        usage_limits: UsageLimits | None = None,
        output_retries: int = 2,
        tool_choice: ToolChoice | ToolChoicePolicy = "auto",
        sampling: SamplingSettings | None = None,
        instrument: bool | Instrumentation | None = None,
        description: str | None = None,
        deps_type: type[DepsT] | None = None,
        hooks: RunHooks[DepsT] | None = None,
        guardrails: Sequence[Guardrail] = (),
        handoffs: Sequence[Agent[Any, Any] | Handoff] = (),
        history_processors: Sequence[HistoryProcessor] = (),
        compaction: Compaction | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: Agent[OutputT, DepsT],
        backend: Backend,
        *,
        instructions: Instructions[DepsT] | None = None,
        tools: Sequence[Any] = (),
        output_type: type[OutputT] | dict[str, Any],
        reasoning: Reasoning | None = None,
        cache: CachePolicy | None = None,
        max_turns: int = 20,
        max_tool_rounds: int | None = DEFAULT_MAX_TOOL_ROUNDS,
        name: str | None = None,
        usage_limits: UsageLimits | None = None,
        output_retries: int = 2,
        tool_choice: ToolChoice | ToolChoicePolicy = "auto",
        sampling: SamplingSettings | None = None,
        instrument: bool | Instrumentation | None = None,
        description: str | None = None,
        deps_type: type[DepsT] | None = None,
        hooks: RunHooks[DepsT] | None = None,
        guardrails: Sequence[Guardrail] = (),
        handoffs: Sequence[Agent[Any, Any] | Handoff] = (),
        history_processors: Sequence[HistoryProcessor] = (),
        compaction: Compaction | None = None,
    ) -> None: ...

    def __init__(
        self,
        backend: Backend,
        *,
        instructions: Instructions[DepsT] | None = None,
        tools: Sequence[Any] = (),
        output_type: Any = None,
        reasoning: Reasoning | None = None,
        cache: CachePolicy | None = None,
        max_turns: int = 20,
        max_tool_rounds: int | None = DEFAULT_MAX_TOOL_ROUNDS,
        name: str | None = None,
        usage_limits: UsageLimits | None = None,
        output_retries: int = 2,
        tool_choice: ToolChoice | ToolChoicePolicy = "auto",
        sampling: SamplingSettings | None = None,
        instrument: bool | Instrumentation | None = None,
        description: str | None = None,
        deps_type: type[DepsT] | None = None,
        hooks: RunHooks[DepsT] | None = None,
        guardrails: Sequence[Guardrail] = (),
        handoffs: Sequence[Agent[Any, Any] | Handoff] = (),
        history_processors: Sequence[HistoryProcessor] = (),
        compaction: Compaction | None = None,
    ) -> None:
        if not isinstance(backend, Backend):
            raise ConfigurationError(f"backend must implement parley.backends.Backend, not {type(backend).__name__}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ConfigurationError(f"max_turns must be a positive int, not {max_turns!r}")
        if max_tool_rounds is not None and (
            isinstance(max_tool_rounds, bool) or not isinstance(max_tool_rounds, int) or max_tool_rounds < 1
        ):
            raise ConfigurationError(f"max_tool_rounds must be a positive int or None, not {max_tool_rounds!r}")
        if isinstance(output_retries, bool) or not isinstance(output_retries, int) or output_retries < 0:
            raise ConfigurationError(f"output_retries must be a non-negative int, not {output_retries!r}")
        self.backend = backend
        self.instructions = instructions
        self.output_type = output_type
        self.output_spec = OutputSpec.from_type(output_type)
        self.reasoning = reasoning
        self.cache = cache
        self.max_turns = max_turns
        self.max_tool_rounds = max_tool_rounds
        self.name = name
        self.usage_limits = usage_limits or UsageLimits()
        self.output_retries = output_retries
        self.tool_choice: ToolChoice | ToolChoicePolicy = tool_choice
        self.sampling = sampling or SamplingSettings()
        self.tools = tool_objects(tools)
        self.toolsets = toolsets_of(tools)
        self.instrument = check_instrument(instrument)
        configure(
            self, description=description, deps_type=deps_type, hooks=hooks, guardrails=guardrails, handoffs=handoffs
        )
        self.history_processors, self.compaction = history_options(history_processors, compaction)
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigurationError(f"two tools share the name(s) {duplicates}")
        self.system_prompt = self._system_prompt()
        ToolRunner(self.tools)  # fail now, not at the first call, if the executor rejects the tools
        self.tool_specs = [t.spec for t in self.tools]

    def _system_prompt(self, instructions: str | None = None) -> str | None:
        """The instructions (`instructions`: as rendered for this turn, when they are a function), plus the
        answer's schema when the backend cannot enforce one natively (prompted output: the answer is still
        validated and repaired by the loop)."""
        text = instructions if instructions is not None or callable(self.instructions) else self.instructions
        schema = self.output_spec.schema
        if schema is None or self.backend.capabilities.structured_output:
            return text or None
        import json

        hint = f"Answer with only a JSON value matching this JSON Schema:\n{json.dumps(schema, separators=(',', ':'))}"
        return f"{text}\n\n{hint}" if text else hint

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, backend={self.backend.name!r}, tools={[t.name for t in self.tools]})"

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        *,
        needs_approval: NeedsApproval = False,
        output_extractor: OutputExtractor | None = None,
        timeout_s: float | None = None,
    ) -> AgentTool:
        """This agent as a tool of another agent (one argument, ``input``; see `parley.agent_tool`).

        Its runs add to the parent's usage and limits; a call inside it that needs approval pauses the
        parent, and resuming the parent resumes it. `output_extractor(result)` makes the text the
        parent's model reads (default: the answer, as JSON unless it is a str).
        """
        from parley.agent_tool import AgentTool

        tool_name = name or self.name
        if not tool_name:
            raise ConfigurationError("as_tool() needs a name=... (or an Agent(name=...))")
        about = description or self.description or f"Ask the {tool_name} agent."
        return AgentTool(
            self,
            name=tool_name,
            description=about,
            needs_approval=needs_approval,
            output_extractor=output_extractor,
            timeout_s=timeout_s,
        )

    # -- toolsets and tracing -----------------------------------------------------------------------
    async def __aenter__(self) -> Agent[OutputT]:
        """Open every toolset (e.g. start the MCP servers) and keep them open until `__aexit__`."""
        held = await self._acquire_toolsets()
        self._holds: list[list[Toolset]] = [*getattr(self, "_holds", []), held]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        holds: list[list[Toolset]] = getattr(self, "_holds", [])
        if holds:
            await self._release_toolsets(holds.pop())

    async def _acquire_toolsets(self) -> list[Toolset]:
        held: list[Toolset] = []
        try:
            for toolset in self.toolsets:
                await toolset.acquire()
                held.append(toolset)
        except BaseException:
            await self._release_toolsets(held)
            raise
        return held

    async def _release_toolsets(self, held: list[Toolset]) -> None:
        for toolset in reversed(held):
            try:
                await asyncio.shield(toolset.release())
            except Exception:  # closing never fails a run; the toolset logs why
                pass

    async def _drive(self, loop: RunLoop) -> RunResult[Any]:
        """Run the loop with the toolsets open, inside an `invoke_agent` span when tracing is on."""
        tracer = run_tracer(self.instrument)
        held = await self._acquire_toolsets() if self.toolsets else []
        try:
            if tracer is None:
                return await loop.run()
            loop.tracer = loop.tool_runner.tracer = tracer
            traced: RunResult[Any] = await tracer.run(self, loop)
            return traced
        finally:
            if held:
                await self._release_toolsets(held)

    # -- running ------------------------------------------------------------------------------------
    async def run(
        self,
        input: AgentInput = None,
        *,
        state: RunState | None = None,
        tenant: str | None = None,
        checkpoint: CheckpointFn | None = None,
        deps: DepsT | None = None,
        session: Session | None = None,
        ledger: LedgerOption = None,
        allow_agent_change: AllowAgentChange = False,
    ) -> RunResult[OutputT]:
        """Run until a final answer or a pause. `checkpoint(state)` is called at every durable point.

        With `state`, the run resumes where it paused (decisions taken on `state` apply); `input`
        then adds a user message (after the open batch's results, never between a call and its
        result). `deps` reaches tools as `ToolContext.deps`. With `session`, the model also sees the
        session's history, and the run's whole turn is appended to it in one transaction when the
        run completes (never at a pause: resume with the same session; see `parley.sessions`).

        `ledger` is where calls with side effects are claimed and recorded, so that any number of
        resumes of copies of one state run each such call once (`parley.ledger`: by default the
        session's database, else ``$PARLEY_LEDGER`` or ``~/.local/state/parley/ledger.sqlite3``;
        a path, a `Ledger`, or False for none). A state is resumed only by the agent that saved it
        (`RunStateMismatchError` otherwise); `allow_agent_change` (True, or a migration hook)
        accepts a deliberate upgrade whose open calls still fit (`parley.fingerprint`).
        """
        loop = self._loop(input, state, tenant, checkpoint, None, deps, session, ledger, allow_agent_change)
        result: RunResult[OutputT] = await self._drive(loop)
        return result

    def run_sync(
        self,
        input: AgentInput = None,
        *,
        state: RunState | None = None,
        tenant: str | None = None,
        checkpoint: CheckpointFn | None = None,
        deps: DepsT | None = None,
        session: Session | None = None,
        ledger: LedgerOption = None,
        allow_agent_change: AllowAgentChange = False,
    ) -> RunResult[OutputT]:
        """`run` for code without an event loop."""
        return asyncio.run(
            self.run(
                input,
                state=state,
                tenant=tenant,
                checkpoint=checkpoint,
                deps=deps,
                session=session,
                ledger=ledger,
                allow_agent_change=allow_agent_change,
            )
        )

    async def run_stream(
        self,
        input: AgentInput = None,
        *,
        state: RunState | None = None,
        tenant: str | None = None,
        checkpoint: CheckpointFn | None = None,
        deps: DepsT | None = None,
        session: Session | None = None,
        ledger: LedgerOption = None,
        allow_agent_change: AllowAgentChange = False,
    ) -> AsyncIterator[Event | RunResult[OutputT]]:
        """Yield the run's events as they happen (model deltas, tool results as tool `MessageEnd`s),
        then the `RunResult` as the last item.

        While an agent used as a tool (`as_tool`) runs, its events come too, each unchanged inside a
        `parley.protocol.AgentToolEvent` naming the agent and the path of call ids down to it."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()

        async def emit(event: Any) -> None:
            await queue.put(event)

        loop = self._loop(input, state, tenant, checkpoint, emit, deps, session, ledger, allow_agent_change)

        async def drive() -> RunResult[Any]:
            try:
                return await self._drive(loop)
            finally:
                await queue.put(done)

        task = asyncio.ensure_future(drive())
        try:
            while True:
                item = await queue.get()
                if item is done:
                    break
                yield item
            yield task.result()
        finally:
            if not task.done():
                task.cancel()

    # -- state --------------------------------------------------------------------------------------
    def _loop(
        self,
        input: AgentInput,
        state: RunState | None,
        tenant: str | None,
        checkpoint: CheckpointFn | None,
        emit: Any,
        deps: Any,
        session: Session | None,
        ledger: LedgerOption,
        allow_agent_change: AllowAgentChange,
    ) -> RunLoop:
        check_session_run(session, state, input)
        if not (isinstance(allow_agent_change, bool) or callable(allow_agent_change)):
            raise ConfigurationError(
                f"allow_agent_change must be a bool or a migration hook, not {type(allow_agent_change).__name__}"
            )
        return RunLoop(
            self,
            self._start(input, state, tenant),
            checkpoint=checkpoint,
            emit=emit,
            deps=deps,
            session=session,
            ledger=resolve_ledger(ledger, session),
            allow_agent_change=allow_agent_change,
            resumed=state is not None,
        )

    def _start(self, input: AgentInput, state: RunState | None, tenant: str | None) -> RunState:
        new_messages = self._input_messages(input)
        if state is None:
            if not new_messages:
                raise ConfigurationError("Agent.run needs an input or a state to resume")
            messages, batch = normalise_history(new_messages)
            run_state = RunState(
                trace_id=uuid.uuid4().hex,
                agent_name=self.name,
                backend=self.backend.name,
                tenant=tenant,
                messages=messages,
                batch=batch,
            )
            if batch:
                run_state.records = recorded_for(batch, new_messages)
            return run_state
        if not isinstance(state, RunState):
            raise ConfigurationError(f"state must be a RunState, not {type(state).__name__}")
        if tenant is not None and state.tenant is not None and tenant != state.tenant:
            raise ConfigurationError(f"this run state belongs to tenant {state.tenant!r}, not {tenant!r}")
        state = state.model_copy(deep=True)  # the caller's state object is never changed by the run
        if tenant is not None:
            state.tenant = tenant
        state.backend = self.backend.name
        if new_messages:
            state.output_attempts = 0
            if state.batch:
                state.queued_input.extend(new_messages)
            else:
                state.messages.extend(new_messages)
                state.status = "running"
                new_user_turn(state)
        return state

    def _input_messages(self, input: AgentInput) -> list[Message]:
        if input is None:
            return []
        if isinstance(input, str):
            return [Message.user(input)]
        if isinstance(input, Message):
            return [input]
        messages = list(input.messages if isinstance(input, Conversation) else input)
        for message in messages:
            if not isinstance(message, Message):
                raise ConfigurationError(f"input messages must be parley Messages, not {type(message).__name__}")
        # a history handed back from a previous result starts with our own instructions: drop them
        ours = self.system_prompt
        return [m for m in messages if not (m.role is Role.SYSTEM and ours and m.text == ours)]
