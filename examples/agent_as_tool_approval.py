"""An agent used as a tool of another, with an approval needed inside the child.

    python examples/agent_as_tool_approval.py

The assistant (one backend) delegates mail to a mailer agent (its own backend) through
`mailer.as_tool(...)`. The mailer's `send_email` needs approval, so the *assistant's* run pauses:
the pending call carries its path (the assistant's call id, then the mailer's). The state goes
through JSON (as it would between processes), the call is approved on the assistant's state, and
resuming the assistant resumes the mailer exactly where it stopped: the email goes out once, and
the assistant's usage is its own plus the mailer's. Both models are `ScriptedBackend`s (no weights);
swap in `LocalBackend()` for the mailer and a hosted backend for the assistant and nothing else changes.
"""

from __future__ import annotations

from parley import Agent, RunState, tool
from parley.backends import ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.protocol import Usage

SENT: list[str] = []


@tool(needs_approval=True)
def send_email(to: str, body: str) -> str:
    """Send an email (a person approves it first).

    Args:
        to: Recipient address.
        body: The text.
    """
    SENT.append(to)
    return f"sent to {to}"


def main() -> None:
    mailer_model = ScriptedBackend(
        [
            ScriptedTurn(
                tool_calls=[call("send_email", {"to": "ada@example.com", "body": "The report is late."}, id="mail_1")],
                usage=Usage(input_tokens=40, output_tokens=12, requests=1),
            ),
            ScriptedTurn(text="Sent to ada@example.com.", usage=Usage(input_tokens=60, output_tokens=6, requests=1)),
        ],
        name="local:mailer",
    )
    assistant_model = ScriptedBackend(
        [
            ScriptedTurn(
                tool_calls=[call("mailer", {"input": "Tell ada@example.com the report is late."}, id="ask_1")],
                usage=Usage(input_tokens=300, output_tokens=20, requests=1),
            ),
            ScriptedTurn(
                text="Done: Ada knows the report is late.", usage=Usage(input_tokens=340, output_tokens=9, requests=1)
            ),
        ],
        name="hosted:assistant",
    )
    mailer = Agent(mailer_model, name="mailer", instructions="You write short emails.", tools=[send_email])
    assistant = Agent(
        assistant_model,
        name="assistant",
        instructions="You help; delegate email to the mailer.",
        tools=[mailer.as_tool(description="Writes and sends email.")],
    )

    result = assistant.run_sync("Let Ada know the report is late.")
    for item in result.interruptions:
        print(f"paused: {item.tool_name} in agent {item.agent}, path {' -> '.join(item.path or [])}")
    state = RunState.from_json(result.state.to_json())  # what another process would load
    print(f"child state kept under: {', '.join(state.children)}")
    for item in state.pending:
        state.approve(item.call_id)
        print(f"approved {item.call_id}")
    result = assistant.run_sync(state=state)
    print(f"answer: {result.output}")
    print(f"emails sent: {len(SENT)}")
    print(
        f"usage: requests={result.usage.requests} (assistant {len(assistant_model.requests)}, "
        f"mailer {len(mailer_model.requests)}) input_tokens={result.usage.input_tokens} "
        f"output_tokens={result.usage.output_tokens}"
    )


if __name__ == "__main__":
    main()
