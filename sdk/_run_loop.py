"""The agent loop: alternate model turns and tool batches until an answer, a pause or a limit.

    resolve the open batch (run / answer / pause)  ->  paused? return the state
    append results next to their calls (adjacency) ->  model turn  ->  tool calls? loop
    no calls: validate the answer (bounded repair loop)  ->  return the output

Two rules make every run converge, on small local models too:

* the repeat rule (`parley.interruptions`): a call identical to one already settled since the last
  user message is answered from the record, not run or sent for approval again;
* tools off: after `Agent.max_tool_rounds` model turns with tool calls (since the last user
  message), after a round whose every call was a repeat (the model is going round in circles), once
  an answer failed the output type (the repair turns: a self-hosted server enforces the answer schema
  only on a turn with tools off), and on the last turn `max_turns` allows, the request goes with
  ``tool_choice="none"``:
  the local backend's grammar then admits only the typed answer, hosted backends get the same
  field. Calls a model makes anyway are not run (each gets an error result) and count as failed
  answer attempts, so the run ends with an answer or `OutputValidationError` naming the cause,
  never by quietly using up `max_turns`.

Everything the loop knows lives in the `RunState`, so any point where the state is checkpointed is
a point the run can resume from, in another process if need be.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from parley._history_run import shape_history
from parley._run_controls import RunControls
from parley._run_ledger import CallGate
from parley._run_tools import ToolRunner
from parley._run_turn import EventSink, take_turn, unique_call_ids
from parley.agent_tool import forward_events, take_link
from parley.backends.base import ModelRequest
from parley.compaction import still_valid
from parley.errors import MaxTurnsExceeded, OutputValidationError
from parley.fingerprint import AllowAgentChange, check_resume, fingerprint_of
from parley.interruptions import plan_batch, repeat_mode, repeat_outcome, settled_call
from parley.ledger import Ledger
from parley.output import OutputInvalid
from parley.protocol import Conversation, Message, MessageEnd, Role, ToolCall, ToolResult
from parley.protocol.events import ToolCallRepeated
from parley.result import RunResult
from parley.run_state import CompactionRecord, RepeatedCall, RunState
from parley.sessions import Session
from parley.sessions._run import commit_turn, load_history, stored_record
from parley.sessions._storable import refuse_unstorable
from parley.sessions.base import LiveView
from parley.tools import ToolContext, call_key

if TYPE_CHECKING:
    from parley.agent import Agent

CheckpointFn = Callable[[RunState], "None | Awaitable[None]"]


class RunLoop:
    """One execution of `Agent.run`: owns the state it mutates."""

    def __init__(
        self,
        agent: Agent[Any],
        state: RunState,
        *,
        checkpoint: CheckpointFn | None,
        emit: EventSink | None,
        deps: Any = None,
        session: Session | None = None,
        tracer: Any = None,
        ledger: Ledger | None = None,
        allow_agent_change: AllowAgentChange = False,
        resumed: bool = False,
    ) -> None:
        self.agent = agent
        self.ledger = ledger
        """The execution ledger (`parley.ledger`), or None (``ledger=False``)."""
        self.allow_agent_change = allow_agent_change
        self.resumed = resumed
        """The state was handed in (a resume): it is checked against the agent (`parley.fingerprint`)."""
        self.gate = CallGate(ledger, state.trace_id) if ledger is not None else None
        self._catch_up = self.gate is not None and bool(state.batch)
        """The open batch came with the state: ask the ledger what other copies of it recorded."""
        self.tracer = tracer
        """A `parley.tracing` run tracer, or None (not traced: no tracing code runs)."""
        self.session = session
        self.history: list[Message] = []
        """The session's items before this run's turn: shown to the model, never put in the state."""
        self.session_view: LiveView | None = None
        """Where the session stores each item of `history` (so the run's compaction can be recorded)."""
        self.seeded_compaction: CompactionRecord | None = None
        """The session's own latest compaction, as the run's starting `RunState.compaction`."""
        self.state = state
        self.emit = emit
        self._user_checkpoint = checkpoint
        self.context = ToolContext(tenant=state.tenant, run_id=state.trace_id, deps=deps)
        # one executor per run: its in-flight dedup by call id must never join two runs' calls
        self.tool_runner = ToolRunner(agent.tools, agent.toolsets, tracer)
        self.tool_runner.gate = self.gate
        self.seen_ids = {c.id for m in state.messages for c in m.tool_calls} | {c.id for c in state.batch}
        self.tools_off: str | None = None
        """Why the current request has tools off (None: it has them as the agent says)."""
        self.missed = ""
        """Why the last turn gave no final answer (named when `max_turns` runs out)."""
        self.controls: RunControls | None = None
        """Hooks, guardrails, handoffs, agent tools, dynamic instructions (None: the agent uses none)."""
        link = take_link()  # set when this run is an agent tool's child run
        if link is not None and self.emit is None:
            self.emit = forward_events(link, self)  # a streaming parent streams its children too
        if agent.controlled or link is not None or state.current_agent is not None:  # (after a handoff)
            self.controls = self.tool_runner.controls = RunControls(self, link)

    async def checkpoint(self) -> None:
        if self._user_checkpoint is not None:
            outcome = self._user_checkpoint(self.state)
            if inspect.isawaitable(outcome):
                await outcome

    async def run(self) -> RunResult[Any]:
        self.tool_runner.refresh()  # the toolsets are open now: their tools count in the fingerprint
        if self.resumed:  # before anything runs: a state is resumed only by its own agent
            self.state = check_resume(self.state, self.agent, self.tool_runner.tools, self.allow_agent_change)
        else:
            self.state.fingerprint = fingerprint_of(self.agent, self.tool_runner.tools)
        if self.controls is not None:
            return await self.controls.run(self._run)
        return await self._run()

    async def _run(self) -> RunResult[Any]:
        agent, state = self.agent, self.state
        if self.session is not None:
            self.history, self.session_view = await load_history(self.session)
            self.seen_ids |= {c.id for m in self.history for c in m.tool_calls}
            self._seed_compaction()
        if state.status == "complete" and not state.queued_input and not state.batch:
            # nothing new to do: a finished state resumed without input returns its answer again
            await self._commit()  # (once per trace id: a no-op if already written)
            return self._result(agent.output_spec.load(state.output), paused=False)
        state.status = "running"
        while True:
            if state.batch:
                if not await self._resolve_batch():
                    state.status = "paused"
                    await self.checkpoint()
                    return self._result(None, paused=True)
            if state.queued_input:
                state.messages.extend(state.queued_input)
                state.queued_input = []
                new_user_turn(state)
            if self.controls is not None:
                agent = await self.controls.before_turn()  # a handoff may change the agent

            if state.turn >= agent.max_turns:
                why = f"; on the last turn {self.missed}" if self.missed else ""
                raise MaxTurnsExceeded(
                    f"the run used its max_turns={agent.max_turns} model turns without a final answer{why}",
                    state=state,
                )
            if self.session is not None:  # text the session could not store: refused before the model is paid
                refuse_unstorable(state.messages)
            agent.usage_limits.check_before_request(state.usage)
            request = self._request()
            if agent.history_processors or agent.compaction is not None:  # parley.history, parley.compaction
                request = await shape_history(self, request)
            if self.controls is not None:
                request = await self.controls.prepare_request(request)
            if self.tracer is None:
                response = await take_turn(agent.backend, request, self.emit)
            else:
                response = await self.tracer.turn(agent.backend, request, self.emit, state)
            state.turn += 1
            state.usage = state.usage + response.usage
            agent.usage_limits.check_after_response(state.usage)
            if self.controls is not None:
                await self.controls.after_turn(request, response)
            produced = unique_call_ids(response.messages, self.seen_ids, state.turn)
            state.messages.extend(produced)
            calls = [c for m in produced for c in m.tool_calls]
            if calls and request.tool_choice == "none":
                await self._refuse(calls)
                continue
            if calls:
                state.tool_calls += len(calls)
                state.tool_rounds += 1
                agent.usage_limits.check_tool_calls(state.tool_calls, state.usage)
                state.batch = calls
                await self.checkpoint()
                continue

            answer = produced[-1].text if produced else ""
            try:
                output = agent.output_spec.parse(answer)
            except OutputInvalid as invalid:
                state.output_attempts += 1
                cut = (
                    " (the turn was cut off at the token limit, finish_reason='length'; raise max_tokens)"
                    if response.finish_reason == "length"
                    else ""
                )
                self.missed = f"the answer did not match the output type: {invalid.detail}{cut}"
                if state.output_attempts > agent.output_retries:
                    raise OutputValidationError(
                        f"the final answer did not match the output type after {state.output_attempts} attempt(s): "
                        f"{invalid.detail}{cut}",
                        last_attempt=answer,
                        errors=invalid.detail,
                        attempts=state.output_attempts,
                    ) from None
                state.messages.append(Message.user(agent.output_spec.repair_prompt(invalid.detail)))
                await self.checkpoint()
                continue
            if self.controls is not None:
                await self.controls.check_output(output)
            state.status = "complete"
            state.output = agent.output_spec.dump(output)
            await self.checkpoint()
            await self._commit()  # the whole turn, one transaction, after the last checkpoint
            return self._result(output, paused=False)

    async def _commit(self) -> None:
        await commit_turn(self.session, self.state, self.session_view, self.seeded_compaction)

    def _seed_compaction(self) -> None:
        """Start from the session's stored compaction (when the agent compacts and the state holds no
        valid compaction of its own), so a later compaction replaces the stored summary."""
        self.seeded_compaction = stored_record(self.history, self.session_view)
        if self.agent.compaction is None or self.seeded_compaction is None:
            return
        own = self.state.compaction
        body = [*self.history, *self.state.messages]
        if own is None or not still_valid(own, body):
            self.state.compaction = self.seeded_compaction

    async def _refuse(self, calls: list[ToolCall]) -> None:
        """The model called tools on a turn that had them off: answer each call without running it.

        This counts as a failed answer attempt (bounded by `output_retries`), so a model that will not
        stop calling tools ends the run with a typed error naming the cause, not by using up `max_turns`.
        """
        state, agent = self.state, self.agent
        reason = self.tools_off or "tool_choice is 'none'"
        names = ", ".join(sorted({c.name for c in calls}))
        self.missed = f"the model called {names} although tools were off ({reason})"
        content = f"Not run: tools are off now ({reason}). Answer with what you already know."
        for call in calls:
            result = ToolResult(call_id=call.id, name=call.name, content=content, is_error=True)
            state.messages.append(Message(role=Role.TOOL, parts=[result], name=result.name))
            if self.emit is not None:
                await self._emit_result(result)
        state.tool_calls += len(calls)
        agent.usage_limits.check_tool_calls(state.tool_calls, state.usage)
        state.output_attempts += 1
        if state.output_attempts > agent.output_retries:
            raise OutputValidationError(
                f"no final answer: the model kept calling tools ({names}) after tools were turned off ({reason}), "
                f"{state.output_attempts} time(s); raise max_tool_rounds / max_turns or check the backend honours "
                "tool_choice='none'",
                last_attempt=", ".join(f"{c.name}({c.arguments})" for c in calls),
                errors=f"tool calls while tool_choice='none' ({reason})",
                attempts=state.output_attempts,
            )
        await self.checkpoint()

    async def _resolve_batch(self) -> bool:
        """Run / answer what can be; True when every call of the batch has a result."""
        state = self.state
        self.tool_runner.refresh()  # a toolset's list may have changed (e.g. an MCP server's)
        if self._catch_up and self.gate is not None:
            self._catch_up = False
            found = await self.gate.catch_up(state)
            if found:
                calls = {c.id: c for c in state.batch}
                for result in found:  # the repeat rule knows them as if they ran here
                    self.tool_runner.log(state, calls[result.call_id], calls[result.call_id].arguments, result)
                await self.checkpoint()
        decided = {i for i, d in state.decisions.items() if d.kind != "approved"}  # answered by a person
        plan = plan_batch(state, self.tool_runner.tools)
        if self.controls is not None:
            plan = await self.controls.plan(plan)
        if self.tracer is not None:
            self.tracer.answered(state, plan.answered)
        for call_id, result in plan.answered.items():
            state.records[call_id] = result
            state.decisions.pop(call_id, None)
        for key, entry in plan.settled.items():
            state.call_log.setdefault(key, entry)
        state.repeats.extend(plan.repeats)
        if self.gate is not None and decided:
            await self.gate.settle_answered({i: r for i, r in plan.answered.items() if i in decided})
        on_result = self._emit_result if self.emit is not None else None
        if plan.answered:
            await self.checkpoint()
            if on_result is not None:
                by_call = {r.call_id: r for r in plan.repeats}
                for result in plan.answered.values():
                    if result.call_id in by_call:
                        await self._emit_repeat(by_call[result.call_id])
                    await on_result(result)
        await self.tool_runner.run_batch(
            state, plan.run, self.context, self.checkpoint if self._user_checkpoint else None, on_result
        )
        for call, _ in plan.run:
            state.decisions.pop(call.id, None)
        if self.gate is not None:
            plan.pause.extend(self.gate.take_uncertain())  # claimed by a run that died: a person decides
        await self._answer_followers(plan.follow)
        if plan.pause:
            state.pending = plan.pause
            return False
        repeated = {r.call_id for r in state.repeats[-len(state.batch) :]}  # this batch's are the latest
        if all(c.id in repeated for c in state.batch):
            state.stalled = True  # the model is going round in circles: more rounds bring nothing new
        for call in state.batch:
            result = state.records[call.id]
            state.messages.append(Message(role=Role.TOOL, parts=[result], name=result.name))
        state.batch, state.records, state.started, state.pending, state.decisions = [], {}, [], [], {}
        await self.checkpoint()
        return True

    async def _answer_followers(self, follow: dict[str, str]) -> None:
        """Calls identical to an earlier call of the same batch get its outcome, once it is known."""
        state = self.state
        calls = {c.id: c for c in state.batch}
        answered = []
        for call_id, leader_id in follow.items():
            leader = state.records.get(leader_id)
            if leader is None:  # the first call is waiting for a decision: so does this one
                continue
            call = calls[call_id]
            tool = self.tool_runner.tools.get(call.name)
            entry = state.call_log.get(call_key(call.name, call.arguments)) or settled_call(leader, "ran")
            result, repeat = repeat_outcome(call, entry, repeat_mode(tool), turn=state.turn)
            state.records[call_id] = result
            state.repeats.append(repeat)
            answered.append((repeat, result))
        if not answered:
            return
        await self.checkpoint()
        if self.emit is not None:
            for repeat, result in answered:
                await self._emit_repeat(repeat)
                await self._emit_result(result)

    async def _emit_repeat(self, repeat: RepeatedCall) -> None:
        assert self.emit is not None
        await self.emit(
            ToolCallRepeated(
                call_id=repeat.call_id,
                tool_name=repeat.tool_name,
                original_call_id=repeat.original_call_id,
                action=repeat.action,
            )
        )

    async def _emit_result(self, result: ToolResult) -> None:
        assert self.emit is not None
        await self.emit(MessageEnd(message=Message(role=Role.TOOL, parts=[result], name=result.name)))

    def _request(self) -> ModelRequest:
        agent, state = self.agent, self.state
        choice = agent.tool_choice
        if callable(choice):
            choice = choice([*self.history, *state.messages])
        self.tools_off = None
        self.tool_runner.refresh()
        specs = self.tool_runner.specs
        if specs and choice != "none":
            if agent.max_tool_rounds is not None and state.tool_rounds >= agent.max_tool_rounds:
                self.tools_off = f"max_tool_rounds={agent.max_tool_rounds} rounds of tool calls are used up"
            elif state.turn + 1 >= agent.max_turns:
                self.tools_off = f"this is the last of max_turns={agent.max_turns} model turns"
            elif state.stalled:
                self.tools_off = "a round of tool calls only repeated earlier calls"
            elif state.output_attempts and agent.output_spec.schema is not None:
                self.tools_off = "an answer did not match the output type: the repair asks for the answer alone"
            if self.tools_off is not None:
                choice = "none"
        return ModelRequest(
            conversation=Conversation(messages=self._conversation()),
            tools=specs,
            tool_choice=choice if specs else "none",
            output_schema=agent.output_spec.schema,
            reasoning=agent.reasoning,
            cache=agent.cache,
            tenant=self.state.tenant,
            sampling=agent.sampling,
        )

    def _conversation(self) -> list[Message]:
        instructions = self.agent.system_prompt
        if instructions:
            return [Message.system(instructions), *self.history, *self.state.messages]
        return [*self.history, *self.state.messages]

    def _result(self, output: Any, *, paused: bool) -> RunResult[Any]:
        return RunResult(
            output=output,
            messages=self._conversation(),
            usage=self.state.usage,
            state=self.state,
            interruptions=list(self.state.pending),
            paused=paused,
        )


def new_user_turn(state: RunState) -> None:
    """A new user message starts a new request: the repeat rule's record and the tool rounds restart
    (the user may ask for the same call again; it then runs, or asks for approval, again)."""
    state.call_log = {}
    state.tool_rounds = 0
    state.stalled = False
    state.input_guarded = False
