"""Every script in examples/ runs as documented and prints what its docstring promises.

Each example runs as a user would run it: a fresh `python examples/<name>.py` subprocess from the
repository root, with a timeout, so a broken import, a hang or a changed public name fails here.
`approval_across_processes.py` is also run as documented, across three processes (start, decide,
resume), below. A new example without an entry in `CASES` fails `test_every_example_is_exercised`.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
TIMEOUT_S = 120  # the local-model example loads weights; the others finish in about a second


@dataclass(frozen=True)
class Example:
    """How to run one example and the lines (substrings) its output must contain."""

    script: str
    expected: tuple[str, ...]
    args: tuple[str, ...] = ()
    needs_sandbox: bool = False


CASES = [
    Example(
        "approval_across_processes.py",
        args=("--help",),
        expected=("{start,decide,resume}", "Pause for approval in one process"),
    ),
    Example(
        "structured_output_scripted.py",
        expected=(
            "repair prompt: Your answer did not match the required JSON schema: temperature_c: ",
            "conditions: Field required",
            "output type: Forecast",
            "forecast: Oslo 4.5 C, light rain",
            "model requests: 2",
        ),
    ),
    Example(
        "sandboxed_python_tool.py",
        needs_sandbox=True,
        expected=(
            "status: exit code 0",
            "result: 2432902008176640000",  # 20!, computed inside the sandbox
            "host file: blocked",  # the script's own file is invisible from inside
            "model requests: 2",
        ),
    ),
    Example(
        "hosted_backend_against_local_fake.py",
        expected=(
            "request 1: model=gpt-4o-mini roles=system,user tools=get_weather",
            "request 2: model=gpt-4o-mini roles=system,user,assistant,tool tools=get_weather",
            "answer: It is 4 C and raining in Oslo.",
            # OpenAI's prompt_tokens (1310 + 1342) include the 1280 cached ones: never counted twice.
            "requests=2 input_tokens=1372 cache_read_tokens=1280 cache_write_tokens=0 output_tokens=30",
            "prompt_tokens=2652 (provider reported 2652)",
            # gpt-4o-mini: 1372 x $0.15/M + 1280 x $0.075/M (cached rate) + 30 x $0.60/M
            "cost_usd=0.0003198",
        ),
    ),
    Example(
        "repeat_guard_scripted.py",
        expected=(
            "approve? send_report({'to': 'ada@example.com', 'text': '4 C in Oslo'}) -> approved",
            "repeat: send_report call_2 answered from call_1 (reused)",
            "tool choice per request: auto, auto, none",  # a round of nothing but repeats: tools off
            "answer: The Oslo report went to ada@example.com.",
            "sent: 1 time(s), approvals asked: 1, model requests: 3",
        ),
    ),
    Example(
        "mcp_notes_server.py",
        args=("--help",),
        expected=("--count-file COUNT_FILE", "A small MCP server (the official `mcp` SDK)"),
    ),
    Example(
        "mcp_agent.py",
        expected=(
            "tools: notes_add_note, notes_list_notes, notes_delete_note, notes_slow, notes_add_tool_later",
            'paused: notes_delete_note({"title":"draft"}) needs approval',
            "answer: notes_add_note: stored 'draft'; notes_delete_note: deleted 'draft'",
            "model requests: 2",
        ),
    ),
    Example(
        "tracing_spans.py",
        expected=(
            "invoke_agent weather\n  chat claude-example\n  execute_tool lookup\n  chat claude-example",
            "chat gen_ai.usage.input_tokens: 1210",  # 10 uncached + 1000 cache read + 200 cache write
            "chat gen_ai.usage.cache_read.input_tokens: 1000",
            "chat gen_ai.usage.cache_creation.input_tokens: 200",
            "run gen_ai.aggregated_usage.input_tokens: 2420",
        ),
    ),
    Example(
        "agent_as_tool_approval.py",
        expected=(
            "paused: send_email in agent mailer, path ask_1 -> mail_1",  # the child's approval, on the parent
            "child state kept under: ask_1",
            "approved ask_1/mail_1",
            "answer: Done: Ada knows the report is late.",
            "emails sent: 1",
            "usage: requests=4 (assistant 2, mailer 2) input_tokens=740 output_tokens=47",  # own + the child's
        ),
    ),
    Example(
        "handoff_triage.py",
        expected=(
            "triage offered: transfer_to_billing, transfer_to_support",
            "billing saw: system, user (tool calls filtered out)",
            "paused in billing: refund {'order': 'A17', 'amount': 30}",
            "answered by: billing",
            "output: Refund order='A17' amount=30",
        ),
    ),
    Example(
        "local_structured_answer.py",
        # The facts are the 135M model's business; the shape is guaranteed by the token mask.
        expected=("output type: Capital", 'answer: {"country":"', '","capital":"', "model requests: 1", "cost: 0"),
    ),
]
SLOW = {"local_structured_answer.py"}  # loads the embedded SmolLM2 weights


def run_example(example: Example) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example.script), *example.args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{example.script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def require_sandbox() -> None:
    from parley.sandbox import Sandbox, SandboxUnavailable

    try:
        Sandbox.detect()
    except SandboxUnavailable as exc:
        pytest.skip(f"no OS sandbox on this machine (neither bubblewrap nor Landlock+seccomp works): {exc}")


def test_every_example_is_exercised() -> None:
    scripts = sorted(path.name for path in EXAMPLES.glob("*.py"))
    assert scripts, f"no examples found in {EXAMPLES}"
    assert sorted(case.script for case in CASES) == scripts


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(case, id=case.script.removesuffix(".py"), marks=[pytest.mark.model] if case.script in SLOW else [])
        for case in CASES
    ],
)
def test_example_prints_what_it_promises(example: Example) -> None:
    if example.needs_sandbox:
        require_sandbox()
    out = run_example(example)
    missing = [line for line in example.expected if line not in out]
    assert not missing, f"{example.script} output lacks {missing}:\n{out}"


# -- approval_across_processes.py, as its docstring says: three processes, only the JSON file shared --


def run_approval_step(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "approval_across_processes.py"), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_approval_across_three_processes(tmp_path: Path) -> None:
    state = str(tmp_path / "state.json")
    assert "paused: transfer" in run_approval_step("start", state)
    assert "approved xfer" in run_approval_step("decide", state)
    out = run_approval_step("resume", state)
    assert "answer: Done: moved 100 from alice to bob" in out and "model requests: 3" in out


def test_rejection_across_processes(tmp_path: Path) -> None:
    state = str(tmp_path / "state.json")
    run_approval_step("start", state)
    run_approval_step("decide", state, "--reject", "too much")
    assert "answer: Done: too much" in run_approval_step("resume", state)
