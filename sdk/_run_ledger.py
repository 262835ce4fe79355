"""The execution ledger's part in one run (`parley.ledger` says what it guarantees).

Three points of the tool phase touch it:

* **catching up** — a resumed run first asks the ledger about every call of its open batch that the
  state has no result for: a result another copy of the state recorded goes into `RunState.records`
  (with its pending approval, decision or child state dropped), so an older copy neither runs the
  call again nor asks for its approval again;
* **entering a call** — a guarded call (a tool that is not idempotent, or an approved call) is
  claimed before it runs; a result found instead is used as is; an orphaned claim (its holder died
  without a record) is taken over for idempotent tools, for an agent tool whose child state is kept
  (the child's own calls are in the ledger too), and when a person approved the ``uncertain`` call;
  otherwise it becomes an ``uncertain`` interruption;
* **finishing it** — the result goes to the ledger before the state records it (and is checkpointed),
  so a crash between the two leaves the result where a resume finds it. A child run that paused gives
  its parent call's claim back; a call that raised (cancelled, killed, a hook error) leaves its claim
  without a record: it may have run.

Beside tool calls: a handoff's ``on_handoff`` callback runs at most once per run (`CallGate.once`,
keyed by the turn and the agent handed to), and a call's tool-input guardrail verdicts are recorded
once and reused by every copy (`CallGate.shared`): no copy re-runs or re-bills them, and every copy
acts on the same verdicts.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from parley.ledger import Claim, Ledger
from parley.protocol import ToolCall, ToolResult
from parley.run_state import Approved, Interruption, RunState

UNCERTAIN_REASON = (
    "This call was claimed by a run that stopped before recording its result (a crash?): it may or may "
    "not have run. Approve it to run it again, or reject it with a message to skip it."
)


class CallGate:
    """The ledger as one run loop uses it: claims held by this run, uncertain calls found."""

    def __init__(self, ledger: Ledger, run_id: str) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.claims: dict[str, Claim] = {}
        self.uncertain: list[Interruption] = []
        """Calls found orphaned while running the batch (they join the batch's pause)."""

    def guards(self, state: RunState, call: ToolCall, tool: Any) -> bool:
        if tool is None:
            return False
        return not getattr(tool, "idempotent", False) or isinstance(state.decisions.get(call.id), Approved)

    async def catch_up(self, state: RunState) -> list[ToolResult]:
        """Take into `state` the results other copies of it recorded for its open batch."""
        found: list[ToolResult] = []
        for call in state.batch:
            if call.id in state.records:
                continue
            result = await self.ledger.lookup(self.run_id, call.id)
            if result is None:
                continue
            state.records[call.id] = result
            state.decisions.pop(call.id, None)
            state.started = [c for c in state.started if c != call.id]
            state.pending = [i for i in state.pending if i.call_id != call.id and not (i.path and i.path[0] == call.id)]
            state.children.pop(call.id, None)
            found.append(result)
        return found

    async def enter(self, state: RunState, call: ToolCall, tool: Any, arguments: str) -> ToolResult | bool:
        """Claim `call`: True (run it), a `ToolResult` (recorded already: use it) or False (uncertain)."""
        decision = state.decisions.get(call.id)
        take_over = decision.retry_of if isinstance(decision, Approved) else None
        retry = bool(getattr(tool, "idempotent", False)) or call.id in state.children
        claim = await self.ledger.claim(self.run_id, call.id, tool=call.name, retry=retry, take_over=take_over)
        if claim.status == "recorded":
            assert claim.result is not None
            return claim.result
        if claim.status == "orphaned":
            parameters = getattr(tool, "parameters", None)
            self.uncertain.append(
                Interruption(
                    kind="uncertain",
                    call_id=call.id,
                    tool_name=call.name,
                    arguments=arguments,
                    parameters=parameters if isinstance(parameters, dict) else None,
                    reason=UNCERTAIN_REASON,
                    claim=claim.token,
                )
            )
            return False
        self.claims[call.id] = claim
        return True

    @contextlib.asynccontextmanager
    async def holding(self, call_id: str) -> AsyncIterator[None]:
        claim = self.claims.get(call_id)
        if claim is None:
            yield
            return
        try:
            async with self.ledger.holding(claim):
                yield
        except BaseException:
            self.claims.pop(call_id, None)
            self.ledger.abandon(claim)  # no record: it may have run
            raise

    async def record(self, call_id: str, result: ToolResult) -> ToolResult:
        claim = self.claims.pop(call_id, None)
        return result if claim is None else await self.ledger.record(claim, result)

    async def release(self, call_id: str) -> None:
        claim = self.claims.pop(call_id, None)
        if claim is not None:
            await self.ledger.release(claim)

    async def settle_answered(self, answered: dict[str, ToolResult]) -> None:
        """A person answered calls without running them (reject / provide_result): where such a call
        was an ``uncertain`` one (its claim left without a record), record the answer on the claim, so
        every other copy of the state gets the same answer instead of asking again."""
        for call_id, result in answered.items():
            entry = await self.ledger._io(self.ledger._get, self.run_id, call_id)
            if entry is None or entry.result_json is not None or self.ledger.alive(entry):
                continue
            claim = await self.ledger.claim(self.run_id, call_id, tool=result.name, take_over=entry.token)
            if claim.status == "claimed":
                await self.ledger.record(claim, result)

    async def once(self, key: str, name: str, action: Callable[[], Awaitable[None]]) -> bool:
        """Run `action` (a callback with a side effect, e.g. ``on_handoff``) at most once per run, across
        copies of the state; True when it ran here. A holder that died mid-action leaves it unknown:
        it is not run again (at most once)."""
        claim = await self.ledger.claim(self.run_id, key, tool=name)
        if claim.status != "claimed":
            return False
        try:
            await action()
        except BaseException:
            self.ledger.abandon(claim)
            raise
        await self.ledger.record(claim, ToolResult(call_id=key, name=name, content="done"))
        return True

    async def shared(self, key: str, name: str, make: Callable[[], Awaitable[str]]) -> str:
        """The text another copy of the state recorded under `key`, or `make()`'s, recorded for the others
        (results that must agree across copies, e.g. a call's tool-guardrail verdicts)."""
        found = await self.ledger.lookup(self.run_id, key)
        if found is not None:
            return found.content
        text = await make()
        claim = await self.ledger.claim(self.run_id, key, tool=name, retry=True)
        if claim.status == "recorded":
            assert claim.result is not None
            return claim.result.content  # another copy recorded first: its verdicts stand
        if claim.status == "claimed":
            return (await self.ledger.record(claim, ToolResult(call_id=key, name=name, content=text))).content
        return text

    def take_uncertain(self) -> list[Interruption]:
        found, self.uncertain = self.uncertain, []
        return found
