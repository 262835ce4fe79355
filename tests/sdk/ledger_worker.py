"""What the execution-ledger tests share with their worker processes: a mail agent that counts sends.

    python -m tests.sdk.ledger_worker resume STATE SENT_LOG TAG [--sleep S] [--start-at T]
    python -m tests.sdk.ledger_worker crash STATE SENT_LOG      # the tool SIGKILLs its process mid-call

`send_email` appends ``TAG CALL_ID`` to SENT_LOG (fsync'd) for every execution: the test counts real
side effects, whatever the runs report. ``resume`` approves what is pending, resumes the saved state
(the default ledger: ``$PARLEY_LEDGER``, which the test sets) and prints the result as one JSON line;
``--start-at`` waits until that wall-clock time so that several workers resume at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from parley import Agent, RunState, ToolContext, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedTurn
from parley.backends.scripted import call


def append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def sent(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def model(request: ModelRequest) -> ScriptedTurn | str:
    results = [r for m in request.conversation for r in m.tool_results]
    if not results:
        return ScriptedTurn(tool_calls=[call("send_email", {"to": "ada@example.com"}, id="mail_1")])
    return "Done: " + "; ".join(r.content for r in results)


def mail_agent(
    log: Path, *, tag: str = "main", sleep: float = 0.0, crash: bool = False, idempotent: bool = False, **options: Any
) -> Agent[str]:
    @tool(needs_approval=True, idempotent=idempotent)
    async def send_email(ctx: ToolContext, to: str) -> str:
        """Send an email (a side effect).

        Args:
            to: The address.
        """
        append(log, f"{tag} {ctx.call_id}")
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)  # after the effect, before any record
        await asyncio.sleep(sleep)
        return f"sent to {to}"

    return Agent(FunctionBackend(model), tools=[send_email], name="mailer", **options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["resume", "crash"])
    parser.add_argument("state")
    parser.add_argument("log")
    parser.add_argument("tag", nargs="?", default="worker")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--start-at", type=float, default=0.0)
    args = parser.parse_args()
    agent = mail_agent(Path(args.log), tag=args.tag, sleep=args.sleep, crash=args.mode == "crash")
    state = RunState.from_json(Path(args.state).read_text(encoding="utf-8"))
    for item in state.pending:
        state.approve(item.call_id)
    checkpoint_path = Path(args.state + ".checkpoint")

    def checkpoint(live: RunState) -> None:
        live.save(checkpoint_path)

    delay = args.start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    result = agent.run_sync(state=state, checkpoint=checkpoint)
    print(json.dumps({"output": result.output, "paused": result.paused}), flush=True)


if __name__ == "__main__":
    main()
