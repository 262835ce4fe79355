"""The agent loop: alternate model turns and tool batches until an answer, a pause or a limit.

    resolve the open batch (run / answer / pause)  ->  paused? return the state
    append results next to their calls (adjacency) ->  model turn  ->  tool calls? loop
    no calls: validate the answer (bounded repair loop)  ->  return the output

Everything the loop knows lives in the `RunState`, so any point where the state is checkpointed is
a point the run can resume from, in another process if need be.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from parley._run_tools import ToolRunner
from parley._run_turn import EventSink, take_turn, unique_call_ids
from parley.backends.base import ModelRequest
from parley.errors import MaxTurnsExceeded, OutputValidationError
from parley.interruptions import plan_batch
from parley.output import OutputInvalid
from parley.protocol import Conversation, Message, MessageEnd, Role, ToolResult
from parley.result import RunResult
from parley.run_state import RunState
from parley.tools import ToolContext

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
    ) -> None:
        self.agent = agent
        self.state = state
        self.emit = emit
        self._user_checkpoint = checkpoint
        self.context = ToolContext(tenant=state.tenant, run_id=state.trace_id, deps=deps)
        # one executor per run: its in-flight dedup by call id must never join two runs' calls
        self.tool_runner = ToolRunner(agent.tools)
        self.seen_ids = {c.id for m in state.messages for c in m.tool_calls} | {c.id for c in state.batch}

    async def checkpoint(self) -> None:
        if self._user_checkpoint is not None:
            outcome = self._user_checkpoint(self.state)
            if inspect.isawaitable(outcome):
                await outcome

    async def run(self) -> RunResult[Any]:
        agent, state = self.agent, self.state
        if state.status == "complete" and not state.queued_input and not state.batch:
            # nothing new to do: a finished state resumed without input returns its answer again
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

            if state.turn >= agent.max_turns:
                raise MaxTurnsExceeded(
                    f"the run used its max_turns={agent.max_turns} model turns without a final answer", state=state
                )
            agent.usage_limits.check_before_request(state.usage)
            response = await take_turn(agent.backend, self._request(), self.emit)
            state.turn += 1
            state.usage = state.usage + response.usage
            agent.usage_limits.check_after_response(state.usage)
            produced = unique_call_ids(response.messages, self.seen_ids, state.turn)
            state.messages.extend(produced)
            calls = [c for m in produced for c in m.tool_calls]
            if calls:
                state.tool_calls += len(calls)
                agent.usage_limits.check_tool_calls(state.tool_calls, state.usage)
                state.batch = calls
                await self.checkpoint()
                continue

            answer = produced[-1].text if produced else ""
            try:
                output = agent.output_spec.parse(answer)
            except OutputInvalid as invalid:
                state.output_attempts += 1
                if state.output_attempts > agent.output_retries:
                    raise OutputValidationError(
                        f"the final answer did not match the output type after {state.output_attempts} attempt(s): "
                        f"{invalid.detail}",
                        last_attempt=answer,
                        errors=invalid.detail,
                        attempts=state.output_attempts,
                    ) from None
                state.messages.append(Message.user(agent.output_spec.repair_prompt(invalid.detail)))
                await self.checkpoint()
                continue
            state.status = "complete"
            state.output = agent.output_spec.dump(output)
            await self.checkpoint()
            return self._result(output, paused=False)

    async def _resolve_batch(self) -> bool:
        """Run / answer what can be; True when every call of the batch has a result."""
        state = self.state
        plan = plan_batch(state, self.tool_runner.tools)
        for call_id, result in plan.answered.items():
            state.records[call_id] = result
            state.decisions.pop(call_id, None)
        on_result = self._emit_result if self.emit is not None else None
        if plan.answered:
            await self.checkpoint()
            if on_result is not None:
                for result in plan.answered.values():
                    await on_result(result)
        await self.tool_runner.run_batch(
            state, plan.run, self.context, self.checkpoint if self._user_checkpoint else None, on_result
        )
        for call, _ in plan.run:
            state.decisions.pop(call.id, None)
        if plan.pause:
            state.pending = plan.pause
            return False
        for call in state.batch:
            result = state.records[call.id]
            state.messages.append(Message(role=Role.TOOL, parts=[result], name=result.name))
        state.batch, state.records, state.started, state.pending, state.decisions = [], {}, [], [], {}
        await self.checkpoint()
        return True

    async def _emit_result(self, result: ToolResult) -> None:
        assert self.emit is not None
        await self.emit(MessageEnd(message=Message(role=Role.TOOL, parts=[result], name=result.name)))

    def _request(self) -> ModelRequest:
        agent = self.agent
        choice = agent.tool_choice
        if callable(choice):
            choice = choice(self.state.messages)
        return ModelRequest(
            conversation=Conversation(messages=self._conversation()),
            tools=agent.tool_specs,
            tool_choice=choice if agent.tool_specs else "none",
            output_schema=agent.output_spec.schema,
            reasoning=agent.reasoning,
            cache=agent.cache,
            tenant=self.state.tenant,
            sampling=agent.sampling,
        )

    def _conversation(self) -> list[Message]:
        instructions = self.agent.system_prompt
        if instructions:
            return [Message.system(instructions), *self.state.messages]
        return list(self.state.messages)

    def _result(self, output: Any, *, paused: bool) -> RunResult[Any]:
        return RunResult(
            output=output,
            messages=self._conversation(),
            usage=self.state.usage,
            state=self.state,
            interruptions=list(self.state.pending),
            paused=paused,
        )
