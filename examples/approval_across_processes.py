"""Pause for approval in one process, decide in a second, resume in a third.

    python examples/approval_across_processes.py start  STATE.json   # runs until the approval pause
    python examples/approval_across_processes.py decide STATE.json [--reject "reason"]
    python examples/approval_across_processes.py resume STATE.json   # finishes the run

The model is a `FunctionBackend` (deterministic, no weights), so the example runs anywhere; swap in
`LocalBackend()` or a hosted backend and nothing else changes. Only the JSON file travels between
the processes.
"""

from __future__ import annotations

import argparse
import sys

from parley import Agent, RunState, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedTurn
from parley.backends.scripted import call

ACCOUNTS = {"alice": 120, "bob": 40}


@tool
def balance(account: str) -> int:
    """Balance of an account.

    Args:
        account: The account name.
    """
    return ACCOUNTS[account]


@tool(needs_approval=lambda args: args["amount"] > 50)
def transfer(source: str, target: str, amount: int) -> str:
    """Move money; amounts over 50 need a human.

    Args:
        source: Account to debit.
        target: Account to credit.
        amount: Whole units.
    """
    return f"moved {amount} from {source} to {target}"


def model(request: ModelRequest) -> ScriptedTurn | str:
    """A stand-in model: check the balance, transfer, then report what happened."""
    results = [r for m in request.conversation for r in m.tool_results]
    if not results:
        return ScriptedTurn(tool_calls=[call("balance", {"account": "alice"}, id="bal")])
    if len(results) == 1:
        return ScriptedTurn(
            tool_calls=[call("transfer", {"source": "alice", "target": "bob", "amount": 100}, id="xfer")]
        )
    return f"Done: {results[-1].content}"


AGENT = Agent(FunctionBackend(model), instructions="You move money carefully.", tools=[balance, transfer])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["start", "decide", "resume"])
    parser.add_argument("state")
    parser.add_argument("--reject", metavar="REASON")
    args = parser.parse_args(argv)

    if args.step == "start":
        result = AGENT.run_sync("Send bob 100 from alice.")
        result.state.save(args.state)
        for item in result.interruptions:
            print(f"paused: {item.tool_name} {item.arguments} needs {item.kind} (call {item.call_id})")
        return 0
    state = RunState.load(args.state)
    if args.step == "decide":
        for item in state.pending:
            if args.reject:
                state.reject(item.call_id, message=args.reject)
                print(f"rejected {item.call_id}: {args.reject}")
            else:
                state.approve(item.call_id)
                print(f"approved {item.call_id}")
        state.save(args.state)
        return 0
    result = AGENT.run_sync(state=state)
    result.state.save(args.state)
    print("paused again" if result.paused else f"answer: {result.output}")
    print(f"model requests: {result.usage.requests}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
