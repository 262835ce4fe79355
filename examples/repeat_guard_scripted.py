"""A model that repeats itself: the report is sent once, and the run still ends with an answer.

    python examples/repeat_guard_scripted.py

Small local models loop: having sent a report and read "sent", they send it again, turn after turn.
The stand-in model here does exactly that (a `FunctionBackend`, no weights), and answers only
when it is asked with tools off. What happens:

* the first `send_report` pauses for approval; a person approves it; it runs;
* the identical second call (same arguments, keys in another order) is neither run nor sent for
  approval again: the model gets the recorded result, marked as a repeat (`result.repeats`, and a
  `ToolCallRepeated` event when streaming);
* a round of nothing but repeats turns tools off, so the next request has ``tool_choice="none"``
  and the model answers. (`Agent(max_tool_rounds=...)` caps the rounds in any case; default 3.)
"""

from __future__ import annotations

from parley import Agent, RunState, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedTurn
from parley.backends.scripted import call

SENT: list[str] = []


@tool(needs_approval=True)
def send_report(to: str, text: str) -> str:
    """Email a report (a side effect: a person approves it first).

    Args:
        to: Recipient address.
        text: The report.
    """
    SENT.append(to)
    return f"sent to {to}"


def model(request: ModelRequest) -> ScriptedTurn | str:
    """Sends the same report every turn it has tools, however the results read."""
    if request.tool_choice == "none":
        return "The Oslo report went to ada@example.com."
    turn = sum(1 for m in request.conversation if m.tool_calls)
    arguments = '{"to": "ada@example.com", "text": "4 C in Oslo"}'
    if turn % 2:
        arguments = '{"text": "4 C in Oslo", "to": "ada@example.com"}'  # the same call, written differently
    return ScriptedTurn(tool_calls=[call("send_report", arguments)])


def main() -> None:
    backend = FunctionBackend(model)
    agent = Agent(backend, tools=[send_report])
    result = agent.run_sync("Report the Oslo weather to ada@example.com")
    approvals = 0
    while result.paused:
        state = result.state
        for pending in result.interruptions:
            approvals += 1
            print(f"approve? {pending.tool_name}({pending.parsed_arguments()}) -> approved")
            state.approve(pending.call_id)
        result = agent.run_sync(state=RunState.from_json(state.to_json()))
    for repeat in result.repeats:
        print(f"repeat: {repeat.tool_name} {repeat.call_id} answered from {repeat.original_call_id} ({repeat.action})")
    choices = [request.tool_choice for request in backend.requests]
    print(f"tool choice per request: {', '.join(map(str, choices))}")
    print(f"answer: {result.output}")
    print(f"sent: {len(SENT)} time(s), approvals asked: {approvals}, model requests: {result.turns}")


if __name__ == "__main__":
    main()
