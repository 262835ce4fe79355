"""Every example runs as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "approval_across_processes.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_approval_across_three_processes(tmp_path: Path) -> None:
    state = str(tmp_path / "state.json")
    assert "paused: transfer" in run("start", state)
    assert "approved xfer" in run("decide", state)
    out = run("resume", state)
    assert "answer: Done: moved 100 from alice to bob" in out and "model requests: 3" in out


def test_rejection_across_processes(tmp_path: Path) -> None:
    state = str(tmp_path / "state.json")
    run("start", state)
    run("decide", state, "--reject", "too much")
    assert "answer: Done: too much" in run("resume", state)
