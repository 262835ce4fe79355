"""A triage agent hands the conversation to a specialist, whose typed answer ends the run.

    python examples/handoff_triage.py

The triage agent is offered one tool per handoff (`transfer_to_billing`, `transfer_to_support`).
It transfers to billing; billing continues with its own instructions, tools and output type
(`Refund`), and sees the history through an input filter that drops the tool calls. Billing's
refund needs approval, so the run pauses *inside the specialist*; the state goes through JSON and
the resume (started with the triage agent, as always) continues with billing. A guardrail on the
refund tool rejects amounts over 100 before anyone is asked. Models are `ScriptedBackend`s.
"""

from __future__ import annotations

from pydantic import BaseModel

from parley import Agent, RunState, ToolDecision, handoff, tool, tool_input_guardrail
from parley.backends import ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.handoffs import remove_tool_calls
from parley.protocol import ToolCall


class Refund(BaseModel):
    order: str
    amount: int


@tool(needs_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund part of an order (a person approves it).

    Args:
        order: Order id.
        amount: Amount in euros.
    """
    return f"refunded {amount} EUR on {order}"


@tool_input_guardrail(tools=["refund"])
def refund_cap(ctx: object, call: ToolCall) -> ToolDecision:
    amount = call.parsed_arguments().get("amount", 0)
    return ToolDecision.reject("Refunds over 100 EUR go to a manager.") if amount > 100 else ToolDecision.allow()


def main() -> None:
    billing_model = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("refund", {"order": "A17", "amount": 30})]),
            '{"order": "A17", "amount": 30}',
        ]
    )
    billing = Agent(
        billing_model,
        name="billing",
        description="Refunds and invoices.",
        instructions="You settle refunds. Answer with the refund made.",
        tools=[refund],
        output_type=Refund,
        guardrails=[refund_cap],
    )
    support = Agent(ScriptedBackend([]), name="support", description="Technical problems.")
    triage_model = ScriptedBackend([ScriptedTurn(tool_calls=[call("transfer_to_billing", {})])])
    triage = Agent(
        triage_model,
        name="triage",
        instructions="Route the customer to the right team.",
        handoffs=[handoff(billing, input_filter=remove_tool_calls), support],
    )

    result = triage.run_sync("I was charged twice for order A17: please refund the 30 EUR.")
    print(f"triage offered: {', '.join(t.name for t in triage_model.requests[0].tools)}")
    first = billing_model.requests[0]
    print(f"billing saw: {', '.join(m.role.value for m in first.conversation)} (tool calls filtered out)")
    for item in result.interruptions:
        print(f"paused in {result.last_agent}: {item.tool_name} {item.parsed_arguments()}")
    state = RunState.from_json(result.state.to_json())
    for item in state.pending:
        state.approve(item.call_id)
    result = triage.run_sync(state=state)
    print(f"answered by: {result.last_agent}")
    print(f"output: {type(result.output).__name__} {result.output}")


if __name__ == "__main__":
    main()
