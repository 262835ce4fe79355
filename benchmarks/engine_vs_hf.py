"""parley's local engine vs Hugging Face transformers `generate()` on the same machine, model, dtype and prompts.

Workloads (greedy, equal output lengths forced on both sides, token ids compared):
  p1  single stream, 64 new tokens, fp32 and bf16          -> tok/s, ratio to HF generate()
  p2  16 streams with mixed prompt lengths (fp32)           -> aggregate tok/s vs HF padded static batch and
                                                               vs HF one request at a time
  p3  32-token suffix after a 512-token shared prefix       -> TTFT with the prefix cached vs cold
Also a STREAM-like copy to estimate memory bandwidth, and the batch-1 decode ceiling it implies (CPU).

Prints a table, then one JSON object as the last line. Usage:
  python benchmarks/engine_vs_hf.py [--runs 3] [--device cpu|cuda] [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis briefly.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
]
PAD = 2  # <|im_end|>, SmolLM2's pad id


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="timed repetitions per measurement (median reported)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all usable cores)")
    ap.add_argument("--p1-tokens", type=int, default=64)
    ap.add_argument("--p2-tokens", type=int, default=48)
    ap.add_argument("--quick", action="store_true", help="1 run, fewer tokens (smoke test of the script)")
    return ap.parse_args()


def median_time(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def memory_bandwidth_gbs() -> float:
    """Copy a 256 MiB buffer: bytes read + written per second (a rough STREAM 'copy')."""
    a = torch.ones(64 * 1024 * 1024, dtype=torch.float32)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * 4 / best / 1e9


def chat(tok: Any, text: str) -> list[int]:
    out = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(t) for t in ids]


def hf_generate(hf: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    """HF generate() on a left-padded batch (a batch of one is unpadded)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts], device=hf.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=hf.device)
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=PAD)
    return out[:, width:].tolist()


def gemv_floor_s(model: Any, threads: int, runs: int) -> float:
    """Median time of one token's weight matmuls only (no attention, norms or Python around them)."""
    x = torch.randn(1, model.arch.hidden_size, dtype=model.dtype, device=model.device)
    xi = torch.randn(1, model.arch.intermediate_size, dtype=model.dtype, device=model.device)
    gemm = model.gemm

    def once() -> None:
        for w_qkv, w_o, w_gate_up, w_down in model.layer_weights:
            gemm(x, w_qkv)
            gemm(x, w_o)
            gemm(x, w_gate_up)
            gemm(xi, w_down)
        gemm(x, model.lm_head)

    with torch.inference_mode():
        once()
        t, _ = median_time(once, runs)
    return t


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from parley.local_engine import EngineConfig, loader

        self.args = args
        self.threads = args.threads or len(os.sched_getaffinity(0))
        torch.set_num_threads(self.threads)
        self.folder = loader.resolve(None).folder
        self.cfg = EngineConfig(num_threads=self.threads, quantization=None, speculation=None)  # HF runs unquantised
        self.results: dict[str, Any] = {"device": args.device, "threads": self.threads, "runs": args.runs}
        self.rows: list[tuple[str, str, str, str]] = []
        self.parity_identical = 0
        self.parity_total = 0
        self.tenants = itertools.count()  # a fresh tenant per timed run: no prefix reuse unless intended

    def load(self, dtype: torch.dtype) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM

        from parley.local_engine import Engine

        engine = Engine.from_pretrained(None, device=self.args.device, dtype=dtype, config=self.cfg)
        hf = AutoModelForCausalLM.from_pretrained(str(self.folder), dtype=dtype, local_files_only=True)
        return engine, hf.to(self.args.device).eval()

    def p1(self, name: str, engine: Any, hf: Any) -> None:
        from parley.local_engine import SamplingParams

        n, runs = self.args.p1_tokens, self.args.runs
        prompt = chat(engine.tokenizer, QUESTIONS[0])
        params = SamplingParams(max_tokens=n, min_tokens=n)
        engine.generate([prompt], SamplingParams(max_tokens=4, min_tokens=4))  # warm-up both sides
        hf_generate(hf, [prompt], 4)
        t_ours, ours = median_time(
            lambda: engine.generate([prompt], params, tenant=f"t{next(self.tenants)}")[0].token_ids, runs
        )
        t_hf, theirs = median_time(lambda: hf_generate(hf, [prompt], n)[0], runs)
        r = self.results
        r[f"p1_{name}_tok_s"] = round(n / t_ours, 2)
        r[f"p1_{name}_hf_tok_s"] = round(n / t_hf, 2)
        r[f"p1_{name}_ratio"] = round(t_hf / t_ours, 3)
        r[f"p1_{name}_identical"] = ours == theirs
        # bf16 rounds differently per kernel (and we fold norm weights into the GEMMs), so long greedy runs
        # may part ways after a near-tie; say where.
        pairs = enumerate(zip(ours, theirs, strict=True))
        r[f"p1_{name}_first_difference"] = next((i for i, (a, b) in pairs if a != b), None)
        if name == "fp32":
            self.parity_identical += int(ours == theirs)
            self.parity_total += 1
            if "mem_bw_gbs" in r:
                unique = {t.data_ptr(): t for t in hf.state_dict().values()}  # tied embeddings counted once
                gb = sum(t.numel() * t.element_size() for t in unique.values()) / 1e9
                r["weights_gb_fp32"] = round(gb, 3)
                r["p1_fp32_bw_ceiling_tok_s"] = round(r["mem_bw_gbs"] / gb, 1)
                r["p1_fp32_pct_of_ceiling"] = round(100 * (n / t_ours) / (r["mem_bw_gbs"] / gb), 1)
        self.rows.append((f"p1 {name} 1x{n}", f"{n / t_ours:.1f}", f"{n / t_hf:.1f}", f"{t_hf / t_ours:.2f}x"))
        # Where a decode step goes: the weight GEMVs alone (every layer + LM head, one token) bound both sides.
        floor = gemv_floor_s(engine.model, self.threads, runs * 5)
        r[f"p1_{name}_gemv_only_tok_s"] = round(1 / floor, 2)
        r[f"p1_{name}_step_ms"] = round(1000 * t_ours / n, 2)
        r[f"p1_{name}_gemv_ms"] = round(1000 * floor, 2)
        r[f"p1_{name}_gemm_kernel"] = engine.model.gemm.kernel

    def p2(self, engine: Any, hf: Any) -> None:
        from parley.local_engine import SamplingParams

        n, runs = self.args.p2_tokens, self.args.runs
        prompts = [chat(engine.tokenizer, " ".join((QUESTIONS * 4)[i : i + 1 + i % 6])) for i in range(16)]
        params = SamplingParams(max_tokens=n, min_tokens=n)
        total = 16 * n
        t_ours, ours = median_time(
            lambda: [o.token_ids for o in engine.generate(prompts, params, tenant=f"t{next(self.tenants)}")], runs
        )
        t_static, static = median_time(lambda: hf_generate(hf, prompts, n), runs)
        t0 = time.perf_counter()
        sequential = [hf_generate(hf, [p], n)[0] for p in prompts]
        t_seq = time.perf_counter() - t0
        same_seq = sum(a == b for a, b in zip(ours, sequential, strict=True))
        r = self.results
        r["p2_tok_s"] = round(total / t_ours, 2)
        r["p2_hf_static_tok_s"] = round(total / t_static, 2)
        r["p2_hf_sequential_tok_s"] = round(total / t_seq, 2)
        r["p2_vs_hf_static"] = round(t_static / t_ours, 3)
        r["p2_vs_hf_sequential"] = round(t_seq / t_ours, 3)
        r["p2_identical_vs_sequential"] = same_seq
        r["p2_identical_vs_static"] = sum(a == b for a, b in zip(ours, static, strict=True))
        self.parity_identical += same_seq
        self.parity_total += len(prompts)
        self.rows.append((f"p2 16x{n} vs HF static", f"{total / t_ours:.1f}", f"{total / t_static:.1f}",
                          f"{t_static / t_ours:.2f}x"))
        self.rows.append((f"p2 16x{n} vs HF one-by-one", f"{total / t_ours:.1f}", f"{total / t_seq:.1f}",
                          f"{t_seq / t_ours:.2f}x"))

    def p3(self, engine: Any) -> None:
        from parley.local_engine import SamplingParams

        tok, runs = engine.tokenizer, self.args.runs
        doc = " ".join(f"Clause {i}: the tenant shall keep the premises clean and tidy." for i in range(60))
        prefix = tok.encode(doc)[:512]
        suffixes = [tok.encode(f" Question {i}: what does clause {i} say? Answer in one short sentence.")[:32]
                    for i in range(2 * runs + 1)]
        one = SamplingParams(max_tokens=1)
        engine.generate([prefix + suffixes[-1]], one, tenant="p3-warm")  # fills the cache
        cached, cold = [], []
        for i in range(runs):
            out = engine.generate([prefix + suffixes[i]], one, tenant="p3-warm")[0]
            assert out.cached_tokens >= 496, out.cached_tokens
            cached.append(out.ttft_s)
            cold_out = engine.generate([prefix + suffixes[runs + i]], one, tenant=f"t{next(self.tenants)}")[0]
            assert cold_out.cached_tokens == 0
            cold.append(cold_out.ttft_s)
        tc, tk = statistics.median(cached), statistics.median(cold)
        r = self.results
        r["p3_ttft_cached_s"] = round(tc, 4)
        r["p3_ttft_cold_s"] = round(tk, 4)
        r["p3_ttft_ratio"] = round(tc / tk, 4)
        self.rows.append(("p3 TTFT 512+32 (s)", f"{tc:.3f} hit", f"{tk:.3f} cold", f"{tc / tk:.3f}"))

    def run(self) -> None:
        if self.args.device == "cpu":
            self.results["mem_bw_gbs"] = round(memory_bandwidth_gbs(), 2)
        engine, hf = self.load(torch.float32)
        try:
            self.p1("fp32", engine, hf)
            self.p2(engine, hf)
            self.p3(engine)
        finally:
            engine.close()
        engine, hf = self.load(torch.bfloat16)
        try:
            self.p1("bf16", engine, hf)
        finally:
            engine.close()
        self.results["parity_identical"] = self.parity_identical
        self.results["parity_total"] = self.parity_total
        print(f"{'workload':<28}{'parley':>14}{'HF':>14}{'ratio':>10}")
        for row in self.rows:
            print(f"{row[0]:<28}{row[1]:>14}{row[2]:>14}{row[3]:>10}")
        print(f"parity (fp32 token ids equal to HF generate): {self.parity_identical}/{self.parity_total}")
        print(json.dumps(self.results))


if __name__ == "__main__":
    args = parse()
    if args.quick:
        args.runs, args.p1_tokens, args.p2_tokens = 1, 16, 8
    Bench(args).run()
