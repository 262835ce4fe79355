"""The outlines-core index worker: deadlines kill it, a fresh one takes over, and the process still exits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("outlines_core")

SCRIPT = textwrap.dedent(
    """
    import outlines_core
    from parley.constrained.backends.index_worker import build_index_isolated
    from parley.constrained.errors import CompileLimitError

    if __name__ == "__main__":
        vocab = outlines_core.Vocabulary(0, {c: [i + 1] for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ")})
        print("first", type(build_index_isolated("[a-z]{2,5}", vocab, 60)).__name__)
        try:
            build_index_isolated("[a-z]*a[a-z]{20}", vocab, 0.3)  # a DFA of millions of states
        except CompileLimitError as exc:
            print("deadline", "longer than 0.3 s" in str(exc))
        print("after", type(build_index_isolated("[0-9 ]+|[a-c]+", vocab, 60)).__name__)
        try:
            build_index_isolated("(unclosed", vocab, 60)
        except CompileLimitError:
            print("bad pattern", "CompileLimitError")
        except Exception as exc:
            print("bad pattern", type(exc).__name__)
    """
)


def test_an_overrunning_build_is_killed_replaced_and_the_interpreter_still_exits(tmp_path: Path) -> None:
    script = tmp_path / "worker_script.py"  # spawned workers re-import the main module: it must be a file
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == [
        "first Index",
        "deadline True",
        "after Index",
        "bad pattern ValueError",  # the backend classifies outlines-core's own errors (InvalidRegexError)
    ]
