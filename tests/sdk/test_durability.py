"""Durable side effects: a run SIGKILLed at random points and resumed from its last saved state
executes every tool call exactly once and never re-executes a recorded call."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).with_name("sigkill_worker.py")
EXPECTED = {f"t{turn}c{i}" for turn in range(6) for i in range(3)}


def test_sigkill_at_random_points_then_resume(tmp_path: Path) -> None:
    state, effects, attempts = tmp_path / "state.json", tmp_path / "effects.log", tmp_path / "attempts.log"
    rng = random.Random(20261130)
    kills = 0
    finished = False
    for run in range(60):
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(state), str(effects), str(attempts), str(run)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        if kills < 12:
            time.sleep(rng.uniform(0.0, 0.05))
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
            if proc.returncode == -signal.SIGKILL:
                kills += 1
                continue
        else:
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "DONE all effects done" in out
        finished = True
        break
    assert finished and kills >= 10

    effect_ids = effects.read_text().split()
    assert sorted(effect_ids) == sorted(EXPECTED)  # every call exactly once, none lost
    attempt_lines = attempts.read_text().splitlines()
    print(f"kills={kills} executions={len(attempt_lines)} distinct calls={len(EXPECTED)}")
    assert not [line for line in attempt_lines if line.startswith("VIOLATION")]
    # executions beyond one per call are only calls that were in flight when a kill landed
    assert len(attempt_lines) - len(EXPECTED) <= kills * 3  # at most the 3 parallel calls per kill
