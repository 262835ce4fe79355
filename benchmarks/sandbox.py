"""Start-to-result latency of `run_python("print(1)")`, per sandbox tier.

Each tier runs 50 sequential cells after one warm-up; the baseline measured in the same run is a bare
`python3 -I -S -c "print(1)"` subprocess (no isolation), so the ratio shows what isolation costs.
Prints a table, then (last line) a JSON object for the default tier: tier, start_p50_ms, start_p95_ms,
plus every tier's figures under "tiers". Target: p50 <= 150 ms on a 2-core machine.

    .venv/bin/python benchmarks/sandbox.py [--runs 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

from parley.sandbox import Sandbox, SandboxUnavailable
from parley.sandbox.detect import LAUNCHER_ENV, find_interpreter


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_tier(tier: str, runs: int) -> list[float]:
    sandbox = Sandbox.detect(tier=tier)  # type: ignore[arg-type]
    warm = sandbox.run_python_sync("print(1)")
    assert warm.ok and warm.stdout == "1\n", warm
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        result = sandbox.run_python_sync("print(1)")
        samples.append((time.perf_counter() - started) * 1000)
        assert result.stdout == "1\n", result
    return samples


def measure_baseline(runs: int) -> list[float]:
    interpreter = find_interpreter()
    assert interpreter is not None
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([interpreter.executable, "-I", "-S", "-c", "print(1)"], env=LAUNCHER_ENV,
                       capture_output=True, check=True)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    baseline = measure_baseline(args.runs)
    base_p50 = statistics.median(baseline)
    rows = {"bare subprocess (baseline)": baseline}
    figures: dict[str, dict[str, float]] = {}
    for tier, reason in Sandbox.probe().items():
        if reason is not None:
            print(f"{tier}: unavailable ({reason})")
            continue
        rows[tier] = measure_tier(tier, args.runs)
    print(f"{'tier':<28} {'p50 ms':>8} {'p95 ms':>8} {'min ms':>8} {'x baseline':>11}")
    for name, samples in rows.items():
        p50, p95 = statistics.median(samples), percentile(samples, 0.95)
        print(f"{name:<28} {p50:8.1f} {p95:8.1f} {min(samples):8.1f} {p50 / base_p50:11.2f}")
        if name in ("bwrap", "landlock", "unsafe-process"):
            figures[name] = {"start_p50_ms": round(p50, 1), "start_p95_ms": round(p95, 1),
                             "ratio_vs_bare_subprocess": round(p50 / base_p50, 2)}
    try:
        default = Sandbox.detect().tier
    except SandboxUnavailable:
        default = "unsafe-process"
    print(json.dumps({"tier": default, **figures.get(default, {}), "runs": args.runs,
                      "baseline_p50_ms": round(base_p50, 1), "tiers": figures}))


if __name__ == "__main__":
    main()
