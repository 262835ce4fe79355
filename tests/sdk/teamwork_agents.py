"""Agents for the agent-as-tool and handoff tests, importable by the tests and runnable as a worker.

    python -m tests.sdk.teamwork_agents resume-mail   STATE COUNTER TAG   # approve all pending, resume
    python -m tests.sdk.teamwork_agents resume-refund STATE COUNTER TAG

Models are `FunctionBackend`s deciding from the conversation, so a run resumed in a fresh process
behaves exactly as in the first. Side effects append ``TAG call_id`` lines to COUNTER.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from parley import Agent, RunState, ToolContext, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedTurn
from parley.backends.scripted import call
from parley.handoffs import handoff, remove_tool_calls
from parley.protocol import Usage

PARENT_USAGE = Usage(input_tokens=100, output_tokens=10, requests=1)
CHILD_USAGE = Usage(input_tokens=7, output_tokens=3, requests=1)


def counter_tool(counter: Path, tag: str, **options: Any) -> Any:
    @tool(name="send_email", needs_approval=True, **options)
    def send_email(ctx: ToolContext, to: str, body: str) -> str:
        """Send an email.

        Args:
            to: Address.
            body: Text.
        """
        with open(counter, "a", encoding="utf-8") as handle:
            handle.write(f"{tag} {ctx.call_id}\n")
        return f"sent to {to}"

    return send_email


def results_in(request: ModelRequest) -> list[str]:
    return [r.content for m in request.conversation for r in m.tool_results]


def mailer_model(request: ModelRequest) -> ScriptedTurn:
    results = results_in(request)
    if not results:
        return ScriptedTurn(
            tool_calls=[call("send_email", {"to": "ada@example.com", "body": "The report is late."}, id="mail_1")],
            usage=CHILD_USAGE,
        )
    return ScriptedTurn(text=f"Mailer: {results[-1]}", usage=CHILD_USAGE)


def assistant_model(request: ModelRequest) -> ScriptedTurn:
    results = results_in(request)
    if not results:
        return ScriptedTurn(tool_calls=[call("mailer", {"input": "Tell Ada the report is late"}, id="ask_1")],
                            usage=PARENT_USAGE)
    return ScriptedTurn(text=f"Done. {results[-1]}", usage=PARENT_USAGE)


def mail_agents(counter: Path, tag: str = "main") -> tuple[Agent[str], FunctionBackend, FunctionBackend]:
    """A hosted-style parent using a child agent (its own backend) whose send_email needs approval."""
    child_backend = FunctionBackend(mailer_model, name="local:child")
    parent_backend = FunctionBackend(assistant_model, name="hosted:parent")
    mailer = Agent(child_backend, name="mailer", instructions="You send email.", tools=[counter_tool(counter, tag)])
    assistant = Agent(
        parent_backend,
        name="assistant",
        instructions="You help.",
        tools=[mailer.as_tool(description="Writes and sends email.")],
    )
    return assistant, parent_backend, child_backend


class Refund(BaseModel):
    order: str
    amount: int


def triage_model(request: ModelRequest) -> ScriptedTurn | str:
    return ScriptedTurn(tool_calls=[call("transfer_to_billing", {}, id="handoff_1")])


def billing_model(request: ModelRequest) -> ScriptedTurn | str:
    results = results_in(request)
    if not results:
        return ScriptedTurn(tool_calls=[call("refund", {"order": "A17", "amount": 30}, id="refund_1")])
    return json.dumps({"order": "A17", "amount": 30})


def refund_agents(counter: Path, tag: str = "main") -> tuple[Agent[str], FunctionBackend, FunctionBackend]:
    """Triage hands billing the conversation (tool calls filtered out); billing's refund needs approval."""

    @tool(needs_approval=True)
    def refund(ctx: ToolContext, order: str, amount: int) -> str:
        """Refund an order.

        Args:
            order: Order id.
            amount: Amount.
        """
        with open(counter, "a", encoding="utf-8") as handle:
            handle.write(f"{tag} {ctx.call_id}\n")
        return f"refunded {amount} on {order}"

    billing_backend = FunctionBackend(billing_model, name="billing-model")
    triage_backend = FunctionBackend(triage_model, name="triage-model")
    billing = Agent(
        billing_backend, name="billing", instructions="You settle refunds.", tools=[refund], output_type=Refund
    )
    triage = Agent(
        triage_backend,
        name="triage",
        instructions="Route the customer.",
        handoffs=[handoff(billing, input_filter=remove_tool_calls)],
    )
    return triage, triage_backend, billing_backend


def main(argv: list[str]) -> int:
    mode, state_path, counter, tag = argv[0], Path(argv[1]), Path(argv[2]), argv[3]
    agent = (mail_agents if mode == "resume-mail" else refund_agents)(counter, tag)[0]
    state = RunState.from_json(state_path.read_text(encoding="utf-8"))
    for item in list(state.pending):
        state.approve(item.call_id)
    result = agent.run_sync(state=state)
    output = result.output.model_dump() if isinstance(result.output, BaseModel) else result.output
    print(json.dumps({"output": output, "paused": result.paused, "requests": result.usage.requests,
                      "last_agent": result.last_agent, "input_tokens": result.usage.input_tokens}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
