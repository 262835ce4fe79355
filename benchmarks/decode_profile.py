"""Where one q4 decode step of the embedded SmolLM2 spends its time, beside llama-bench's tg on the same file.

Not a test. For each thread count (default 1 and 2): an engine `Engine.from_pretrained(None, quantization="q4")`
without speculation decodes `--tokens` greedy tokens from one chat prompt, batch 1, and

- `plain`: the decode rate without instrumentation (1 / TPOT), interleaved run by run with `llama-bench -n 64`
  at the same thread count (so load changes hit both sides);
- `profile`: the same decode with timers around each op class (wall, `time.perf_counter`), summed over the
  pure-decode steps and divided by their number. By default a decode step runs fused (models/fused_decode.py:
  every layer, and an 8-bit LM head, in one C++ call), timed as the one class `fused_step` and split by the
  step's own phase timers (`fused_phases`: GEMM tiles, attention, SwiGLU, each serial phase, barrier waits, as
  the calling thread spends them); `--loop` runs the
  Python layer loop instead, where each class is timed apart: layer GEMMs (q/k/v, o, gate/up, down: the group kernel),
  LM head (the 576 -> 49152 GEMM and the final norm), attention (KV gather, two bmm, softmax), RoPE, the
  RMSNorms, SwiGLU, the rest of the forward (embedding lookup, KV write, residual adds, thread toggles and the
  Python loop over 30 layers: everything not inside a timed call), the runner's input preparation, sampling,
  the scheduler (schedule + postprocess), the rest of the engine step, and the time between two steps
  (delivery, the command queue). Wrapping costs about a microsecond a call (~300 calls a step): the profiled
  rate is printed beside the plain one so the distortion is visible. Beside each wall time, the engine
  thread's own CPU time (`time.thread_time`) in that class: on a loaded machine wall time also counts the time
  the thread waited for a core, CPU time does not (at 2 threads it misses the GEMMs' second thread).
- `cpu`: CPU milliseconds per decoded token, all threads of the process, on both sides, as the difference
  between a long and a short generation (`--cpu-tokens` more tokens) so loading and prefill cancel: parley's
  `time.process_time`, llama-bench's children CPU time (`resource.getrusage`). On a loaded machine this is the
  figure that load does not distort (wall time waits for a core; CPU time does not), and the one that says
  whether a gap is work or parallel efficiency.
- `ops`: one torch.profiler pass over a few decode steps: ATen ops per step and their summed self CPU time,
  so the dispatch share (wall minus op time) is a measurement, not a guess.

Prints a table per thread count, then one JSON line. Usage:
  python benchmarks/decode_profile.py [--threads 1,2] [--tokens 64] [--runs 3] [--no-llama]
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from parley.local_engine import Engine, SamplingParams, loader
from parley.local_engine.bench import QUESTIONS, chat_ids, load_average, open_engine
from parley.local_engine.models import decoder as decoder_module

LLAMA_BIN = Path.home() / ".cache" / "parley-peers" / "llama-build" / "bin"
CLASSES = ("fused_step", "layer_gemm", "lm_head", "attention", "rope", "norm", "swiglu", "forward_rest", "prepare",
           "sampling", "scheduler", "step_rest", "between_steps")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="q4,q4-head",
                    help="local_engine/bench.py MODES to profile (q4-head: the 8-bit LM head the auto mode picks)")
    ap.add_argument("--cpu-tokens", type=int, default=192, help="extra tokens of the long run for CPU/token")
    ap.add_argument("--no-llama", action="store_true", help="skip llama-bench")
    ap.add_argument("--loop", action="store_true",
                    help="profile the Python layer loop instead of the fused step (each op class timed apart)")
    ap.add_argument("--llama-bench", default=str(LLAMA_BIN / "llama-bench"))
    return ap.parse_args()


class Clock:
    """Per-class wall time of the current step, folded into totals when the step was a pure decode."""

    def __init__(self) -> None:
        self.step: dict[str, float] = defaultdict(float)
        self.total: dict[str, float] = defaultdict(float)
        self.cpu_step: dict[str, float] = defaultdict(float)  # the engine thread's CPU time (time.thread_time)
        self.cpu_total: dict[str, float] = defaultdict(float)
        self.steps = 0
        self.decode_step = False
        self.last_end: float | None = None

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        step = self.step

        cpu = self.cpu_step

        def wrapper(*a: Any, **k: Any) -> Any:
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                step[name] += time.perf_counter() - t
                cpu[name] += time.thread_time() - c

        return wrapper

    def fold(self, gap: float | None) -> None:
        if self.decode_step:
            for k, v in self.step.items():
                self.total[k] += v
            for k, v in self.cpu_step.items():
                self.cpu_total[k] += v
            if gap is not None:
                self.total["between_steps"] += gap
            self.steps += 1
        self.step.clear()
        self.cpu_step.clear()
        self.decode_step = False


def instrument(engine: Engine, clock: Clock) -> Callable[[], None]:
    """Timers around every op class; returns the undo."""
    core = engine._core
    model: Any = core.runner.model
    runner = core.runner
    saved_model = {k: getattr(model, k) for k in ("gemm", "head_gemm", "forward", "compute_logits")}
    saved_dec = {k: getattr(decoder_module, k) for k in ("rms_normalize", "swiglu_", "attention_plan")}
    saved_rope = model.rope.rotation
    saved = (core._step, runner.prepare, core.sampler, core.scheduler.schedule, core.scheduler.postprocess)
    step = clock.step

    model.gemm = clock.timed("layer_gemm", saved_model["gemm"])
    model.head_gemm = clock.timed("lm_head", saved_model["head_gemm"])
    decoder_module.rms_normalize = clock.timed("norm", saved_dec["rms_normalize"])
    decoder_module.swiglu_ = clock.timed("swiglu", saved_dec["swiglu_"])

    def plan(*a: Any, **k: Any) -> Any:
        return clock.timed("attention", saved_dec["attention_plan"](*a, **k))

    def rotation(*a: Any, **k: Any) -> Any:
        return clock.timed("rope", saved_rope(*a, **k))

    decoder_module.attention_plan = plan
    model.rope.rotation = rotation

    cpu = clock.cpu_step
    inside = ("fused_step", "layer_gemm", "attention", "rope", "norm", "swiglu")
    fused = model._fused_step  # the fused step (models/fused_decode.py) is one C++ call: timed as one class
    model._fused_step = lambda *a: _timed_fused(fused(*a), clock)

    def forward(input_ids: torch.Tensor, *a: Any) -> Any:
        clock.decode_step = input_ids.shape[0] == 1
        t, c = time.perf_counter(), time.thread_time()
        inner, inner_cpu = sum(step[k] for k in inside), sum(cpu[k] for k in inside)
        out = saved_model["forward"](input_ids, *a)
        step["forward_rest"] += time.perf_counter() - t - (sum(step[k] for k in inside) - inner)
        cpu["forward_rest"] += time.thread_time() - c - (sum(cpu[k] for k in inside) - inner_cpu)
        return out

    def logits(hidden: torch.Tensor) -> Any:
        t, c = time.perf_counter(), time.thread_time()
        head, head_cpu = step["lm_head"], cpu["lm_head"]
        out = saved_model["compute_logits"](hidden)
        step["lm_head"] = head + time.perf_counter() - t  # the final norm counts with the head
        cpu["lm_head"] = head_cpu + time.thread_time() - c
        return out

    model.forward = forward
    model.compute_logits = logits
    runner.prepare = clock.timed("prepare", saved[1])
    core.sampler = clock.timed("sampling", saved[2])
    core.scheduler.schedule = clock.timed("scheduler", saved[3])
    core.scheduler.postprocess = clock.timed("scheduler", saved[4])

    def timed_step() -> None:
        t, c = time.perf_counter(), time.thread_time()
        gap = None if clock.last_end is None else t - clock.last_end
        before, before_cpu = sum(step.values()), sum(cpu.values())
        saved[0]()
        end = time.perf_counter()
        step["step_rest"] += end - t - (sum(step.values()) - before)
        cpu["step_rest"] += time.thread_time() - c - (sum(cpu.values()) - before_cpu)
        clock.last_end = end
        clock.fold(gap)

    core._step = timed_step

    def undo() -> None:
        model.gemm, model.head_gemm, core.sampler = saved_model["gemm"], saved_model["head_gemm"], saved[2]
        for k, v in saved_dec.items():
            setattr(decoder_module, k, v)
        for obj, names in ((model, ("forward", "compute_logits", "_fused_step")), (model.rope, ("rotation",)),
                           (runner, ("prepare",)), (core, ("_step",)), (core.scheduler, ("schedule", "postprocess"))):
            for name in names:
                obj.__dict__.pop(name, None)

    return undo


def _timed_fused(fused: Any, clock: Clock) -> Any:
    """`fused` (a FusedDecode or None) with its `run` timed as the class `fused_step`."""
    if fused is None:
        return None
    timed = copy.copy(fused)
    timed.run = clock.timed("fused_step", fused.run)
    return timed


def llama_tg(binary: str, path: Path, threads: int, n: int) -> float | None:
    """One llama-bench tg run (tok/s), or None when llama-bench is absent or fails."""
    if not Path(binary).is_file():
        return None
    out = subprocess.run([binary, "-m", str(path), "-t", str(threads), "-p", "0", "-n", str(n), "-r", "1",
                          "-o", "json"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return None
    rows = json.loads(out.stdout)
    return round(float(rows[0]["avg_ts"]), 2)


def llama_pp(binary: str, path: Path, threads: int) -> float | None:
    if not Path(binary).is_file():
        return None
    out = subprocess.run([binary, "-m", str(path), "-t", str(threads), "-p", "512", "-n", "0", "-r", "2",
                          "-o", "json"], capture_output=True, text=True, timeout=600)
    return round(float(json.loads(out.stdout)[0]["avg_ts"]), 2) if out.returncode == 0 else None


def llama_cpu_ms(binary: str, path: Path, threads: int, extra: int) -> float | None:
    """CPU ms per token of llama-bench's tg (all its threads): (long run - short run) / extra tokens."""
    if not Path(binary).is_file():
        return None
    used = []
    for n in (16, 16 + extra):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([binary, "-m", str(path), "-t", str(threads), "-p", "0", "-n", str(n), "-r", "1",
                              "-o", "json"], capture_output=True, text=True, timeout=600)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0:
            return None
        used.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return round((used[1] - used[0]) * 1000 / extra, 3)


def parley_cpu_ms(engine: Engine, prompt: list[int], extra: int) -> float:
    """CPU ms per token of parley's decode (every thread of this process): (long - short) / extra tokens."""
    used = []
    for n in (16, 16 + extra):
        c = time.process_time()
        engine.generate([prompt], SamplingParams(max_tokens=n, min_tokens=n), tenant=f"cpu-{n}-{time.time()}")
        used.append(time.process_time() - c)
    return round((used[1] - used[0]) * 1000 / extra, 3)


def op_census(engine: Engine, prompt: list[int], n: int) -> dict[str, Any]:
    """ATen ops per decode step and their summed self CPU time (torch.profiler over one generation)."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    # the engine thread runs the step: profile every thread, not just this one
    with profile(activities=[ProfilerActivity.CPU],
                 experimental_config=_ExperimentalConfig(profile_all_threads=True)) as prof:
        o = engine.generate([prompt], SamplingParams(max_tokens=n, min_tokens=n), tenant=f"census-{time.time()}")[0]
    events = [e for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    total_ms = sum(e.self_cpu_time_total for e in prof.events() if e.name.startswith("aten::")) / 1000
    by_name: dict[str, int] = defaultdict(int)
    for e in events:
        by_name[e.name] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:10]
    steps = len(o.token_ids)
    return {"aten_top_level_ops_per_step": round(len(events) / steps, 1),
            "aten_self_cpu_ms_per_step": round(total_ms / steps, 3),
            "profiled_tok_s": round(1 / o.tpot_s, 2) if o.tpot_s else None,
            "top_ops_per_step": {k: round(v / steps, 1) for k, v in top}}


def run_threads(args: argparse.Namespace, mode: str, threads: int, path: Path) -> dict[str, Any]:
    engine = open_engine(None, mode, threads=threads)
    if args.loop:
        engine._core.runner.model.fused_decode = False
    r: dict[str, Any] = {"mode": mode, "threads": threads, "load_avg_start": load_average(),
                         "path": ", Python layer loop" if args.loop else ""}
    try:
        prompt = chat_ids(engine.tokenizer, QUESTIONS[0])
        params = SamplingParams(max_tokens=args.tokens, min_tokens=args.tokens)
        engine.generate([prompt], SamplingParams(max_tokens=4), tenant="warm")
        plain, theirs = [], []
        for i in range(args.runs):
            plain.append(1 / engine.generate([prompt], params, tenant=f"plain-{i}")[0].tpot_s)
            if not args.no_llama:
                tg = llama_tg(args.llama_bench, path, threads, args.tokens)
                if tg is not None:
                    theirs.append(tg)
        r["parley_tok_s"] = round(sorted(plain)[len(plain) // 2], 2)
        r["parley_tok_s_runs"] = [round(x, 2) for x in plain]
        r["llamabench_tg_tok_s"] = round(sorted(theirs)[len(theirs) // 2], 2) if theirs else None
        r["llamabench_tg_tok_s_runs"] = theirs
        r["ratio_vs_llamabench"] = round(r["parley_tok_s"] / r["llamabench_tg_tok_s"], 3) if theirs else None
        if not args.no_llama:
            r["llamabench_pp512_tok_s"] = llama_pp(args.llama_bench, path, threads)
            r["llamabench_cpu_ms_per_token"] = llama_cpu_ms(args.llama_bench, path, threads, args.cpu_tokens)
        r["parley_cpu_ms_per_token"] = parley_cpu_ms(engine, prompt, args.cpu_tokens)
        clock = Clock()
        undo = instrument(engine, clock)
        ext = engine._core.runner.model.row_ops
        phases = ext is not None and hasattr(ext, "fused_phases")
        if phases:
            ext.fused_phases(True)  # the fused step's own phase timers (calling thread), reset
        try:
            rates = [1 / engine.generate([prompt], params, tenant=f"prof-{i}")[0].tpot_s for i in range(args.runs)]
        finally:
            undo()
            spent = ext.fused_phases(False) if phases else {}
        fused_steps = max(spent.pop("steps", 0.0), 1.0)
        by_time = sorted(spent.items(), key=lambda kv: -kv[1])
        r["fused_phases_ms"] = {k: round(v / 1000 / fused_steps, 3) for k, v in by_time}
        steps = max(clock.steps, 1)
        ms = {c: clock.total.get(c, 0.0) * 1000 / steps for c in CLASSES}
        whole = sum(ms.values())
        r["profiled_tok_s"] = round(sorted(rates)[len(rates) // 2], 2)
        r["profile_steps"] = clock.steps
        r["profile_ms_per_token"] = round(whole, 3)
        r["profile_ms"] = {c: round(v, 3) for c, v in ms.items()}
        r["profile_pct"] = {c: round(100 * v / whole, 1) for c, v in ms.items()}
        r["profile_cpu_ms"] = {c: round(clock.cpu_total.get(c, 0.0) * 1000 / steps, 3) for c in CLASSES}
        r.update(op_census(engine, prompt, min(args.tokens, 32)))
        r["load_avg_end"] = load_average()
    finally:
        engine.close()
    return r


def report(results: list[dict[str, Any]]) -> None:
    for r in results:
        print(f"\n== {r['mode']} decode, batch 1, {r['threads']} thread(s){r['path']}; "
              f"load {r['load_avg_start']} -> {r['load_avg_end']}")
        print(f"parley {r['parley_tok_s']} tok/s (runs {r['parley_tok_s_runs']}); llama-bench tg "
              f"{r['llamabench_tg_tok_s']} (runs {r['llamabench_tg_tok_s_runs']}), pp512 "
              f"{r.get('llamabench_pp512_tok_s')}; ratio {r['ratio_vs_llamabench']}")
        print(f"CPU ms per token (all threads): parley {r['parley_cpu_ms_per_token']}, llama-bench "
              f"{r.get('llamabench_cpu_ms_per_token')}")
        print(f"profiled {r['profiled_tok_s']} tok/s over {r['profile_steps']} decode steps, "
              f"{r['profile_ms_per_token']} ms a token:")
        print(f"  {'class':<16}{'wall ms':>10}{'%':>7}{'engine-thread CPU ms':>22}")
        for c in CLASSES:
            print(f"  {c:<16}{r['profile_ms'][c]:>10.3f}{r['profile_pct'][c]:>7.1f}{r['profile_cpu_ms'][c]:>22.3f}")
        if r["fused_phases_ms"]:
            print("inside fused_step, the calling thread's ms a step per phase (fused_phases):")
            for k, v in r["fused_phases_ms"].items():
                print(f"  {k:<16}{v:>10.3f}")
        print(f"ATen ops per step (top level) {r['aten_top_level_ops_per_step']}, their self CPU "
              f"{r['aten_self_cpu_ms_per_step']} ms; most frequent: {r['top_ops_per_step']}")
    print(json.dumps({"decode_profile": results}))


def main() -> None:
    args = parse()
    path = loader.embedded_model_path()
    if not args.no_llama and not Path(args.llama_bench).is_file():
        print(f"llama-bench not found at {args.llama_bench}: build it from the llama.cpp sources the "
              "llama-cpp-python sdist carries (see benchmarks/serve_vs_peers.py); parley's side only",
              file=sys.stderr)
    results = []
    for m in args.modes.split(","):
        for t in args.threads.split(","):
            results.append(run_threads(args, m.strip(), int(t), path))
            print(f"done: {json.dumps(results[-1])}", file=sys.stderr, flush=True)  # survives an interrupted run
    report(results)


if __name__ == "__main__":
    main()
