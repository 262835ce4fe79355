"""parley's local engine vs llama.cpp on the same GGUF file, same machine, same run, same prompt lengths.

The file is the embedded SmolLM2-135M-Instruct Q4_1 (parley runs it dequantised to fp32, in its own int8 mode,
or in q4 mode: the file's Q4_1 blocks loaded as they are and run by parley's group-32 kernel, quant4.py;
llama.cpp runs the Q4_1 blocks directly). `--threads` (2) on both sides.

llama.cpp is measured by its own `llama-bench` (`-m FILE -t T -p 512 -n 64 -o json`), the figure llama.cpp
users quote, built from the llama.cpp sources the llama-cpp-python sdist on PyPI carries:

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B ~/.cache/parley-peers/llama-build -G Ninja \\
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
    cmake --build ~/.cache/parley-peers/llama-build --target llama-server llama-bench [llama-quantize]

(`--llama-bin DIR` or `$LLAMA_CPP_BIN` points elsewhere). An earlier version drove llama.cpp through
llama-cpp-python's Python generate loop, which on this machine decoded at 39.9 tok/s where llama-bench gave 85
on the same file minutes apart: that overstated parley by about 2x. Without llama-bench the script still
measures parley's side and prints null for llama.cpp's figures.

Workloads (each the median of `--runs`, the two sides interleaved run by run so load changes hit both):
  decode   single stream, 64 tokens, tok/s after the first token; parley's best mode for the file; llama-bench
           tg64 (`-p 0 -n 64`: 64 single-token evaluations after an empty prompt, sampling not timed)
  decode_q8  the same on a Q8_0 file llama.cpp's `llama-quantize` makes from the same model (parley: the
           faster of int8 and q8-head, q8 loading the file's Q8_0 blocks); null without llama-quantize
  prefill  512-token prompt, cold: parley's seconds to the first token, llama-bench pp512 as 512 / (its tok/s);
           ratio = llama.cpp time / ours
  agg16    16 concurrent requests x 48 tokens, parley's continuous batching only: llama.cpp's concurrent figure
           is its server's, with parallel slots, and benchmarks/serve_vs_peers.py measures it (llama-server
           -np 16 -cb over HTTP, beside parley serve); llama-bench has no concurrent-request workload
  ppl      perplexity of benchmarks/data/perplexity.txt, fp32 vs every quantised mode, plus q4 with a 4-bit LM
           head (perplexity_q4_head4: why the head stays at higher precision); llama.cpp's own is null here
           (llama-bench computes none; llama-perplexity scores only the second half of each context window,
           another figure)
  spec     speculative decoding (prompt lookup) speed-up on a JSON echo and on prose, acceptance rates
  compile  seconds to compile the decode step (EngineConfig(compile=True)) and its decode rate vs eager, on the
           fastest mode the compiled step covers (fp32/int8: q4 and q8 run parley's own kernel, eager)
Also decode at 1 thread on both sides: on a busy 2-core machine a 2-thread team waits for a descheduled thread
at every barrier, which hurts llama.cpp's spin-waiting pool far more than parley's per-op thread toggling.

Prints a table, then one JSON object as the last line. Usage:
  python benchmarks/engine_vs_llamacpp.py [--runs 3] [--threads 2] [--quick] [--no-q8] [--llama-bin DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from parley.local_engine import SamplingParams, loader
from parley.local_engine.bench import (
    QUESTIONS,
    chat_ids,
    document_ids,
    load_average,
    open_engine,
    spec_figures,
)
from parley.local_engine.evaluate import perplexity

LLAMA_BIN = Path(os.environ.get("LLAMA_CPP_BIN", Path.home() / ".cache" / "parley-peers" / "llama-build" / "bin"))
BUILD = ("cmake -S <llama-cpp-python sdist>/vendor/llama.cpp -B ~/.cache/parley-peers/llama-build -G Ninja "
         "-DGGML_NATIVE=ON && cmake --build ~/.cache/parley-peers/llama-build --target llama-server llama-bench "
         "(see this file's docstring; about 10-20 minutes on 2 cores)")
TEXT = Path(__file__).parent / "data" / "perplexity.txt"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="decode length")
    ap.add_argument("--modes", default="fp32,int8,int8-head,q4,q4-head",
                    help="parley modes to measure (local_engine/bench.py MODES; the best decode is compared)")
    ap.add_argument("--no-q8", action="store_true", help="skip the Q8_0 file")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled decode step (minutes to compile)")
    ap.add_argument("--llama-bin", type=Path, default=LLAMA_BIN, help="folder of llama-bench (and llama-quantize)")
    ap.add_argument("--quick", action="store_true", help="1 run, short workloads (a smoke test of the script)")
    return ap.parse_args()


def q4_head4_perplexity(ids: list[int], threads: int) -> float:
    """Perplexity in q4 mode with the LM head (the tied embedding) at 4 bits too, which no EngineConfig offers:
    the measured reason the head stays at higher precision."""
    from parley.local_engine.quant4 import GroupGemm

    e = open_engine(None, "q4", threads=threads)
    try:
        net = e.model
        net.head_gemm = GroupGemm(torch.device("cpu"), torch.float32, bits=4)
        net.lm_head = net.head_gemm.prepare(net.embed)
        return perplexity(net, ids)
    finally:
        e.close()


def median(xs: list[float]) -> float:
    return statistics.median(xs)


class LlamaBench:
    """llama.cpp's own benchmark binaries: `llama-bench` (tg/pp figures) and, when built, `llama-quantize`."""

    def __init__(self, bin_dir: Path) -> None:
        self.bench = bin_dir / "llama-bench"
        self.quantize = bin_dir / "llama-quantize"
        self.build: str | None = None

    def available(self) -> bool:
        return self.bench.is_file() and os.access(self.bench, os.X_OK)

    def run(self, path: Path, threads: int, *, prompt: int = 0, gen: int = 0, reps: int = 1) -> float:
        """tok/s of one llama-bench test: `-p prompt -n gen` (one of them 0), averaged over `reps`."""
        argv = [str(self.bench), "-m", str(path), "-t", str(threads), "-p", str(prompt), "-n", str(gen),
                "-r", str(reps), "-o", "json"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited with {out.returncode}: {out.stderr.strip()[-300:]}")
        row = json.loads(out.stdout)[0]
        self.build = f"{row.get('build_commit')} ({row.get('build_number')})"
        return float(row["avg_ts"])

    def tg(self, path: Path, threads: int, n: int) -> float:
        return self.run(path, threads, gen=n)

    def pp(self, path: Path, threads: int, n: int) -> float:
        return self.run(path, threads, prompt=n)


def q8_file(source: Path, tool: LlamaBench) -> Path | str:
    """A Q8_0 GGUF of the same model, made once by llama.cpp's `llama-quantize` (cached); or why it could not be."""
    folder = loader.cache_root() / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (loader.gguf_model_name(source) + ".Q8_0.gguf")
    if target.is_file():
        return target
    if not tool.quantize.is_file():
        return f"{tool.quantize} not found (cmake --build ... --target llama-quantize)"
    tmp = Path(tempfile.mkstemp(dir=folder, suffix=".gguf")[1])
    # the source blocks are Q4_1 (the only copy of the model here): requantising must be allowed
    out = subprocess.run([str(tool.quantize), "--allow-requantize", str(source), str(tmp), "Q8_0"],
                         capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        tmp.unlink(missing_ok=True)
        return f"llama-quantize exited with {out.returncode}: {out.stderr.strip()[-200:]}"
    os.replace(tmp, target)
    return target


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.threads = args.threads
        torch.set_num_threads(self.threads)
        self.path = loader.embedded_model_path()
        self.r: dict[str, Any] = {"threads": self.threads, "runs": args.runs, "file": self.path.name,
                                  "load_avg_start": load_average()}
        self.notes: dict[str, str] = {}
        self.rows: list[tuple[str, str, str, str]] = []
        self.llama = LlamaBench(args.llama_bin)
        self.have_llama = self.llama.available()
        if not self.have_llama:
            self.notes["llamacpp"] = f"{self.llama.bench} not found; build it with: {BUILD}"
            print(f"llama.cpp side skipped: {self.notes['llamacpp']}", file=sys.stderr)
        self.tenant = 0

    def _tenant(self) -> str:
        self.tenant += 1
        return f"vs-llamacpp-{self.tenant}"

    # ------------------------------------------------------------------ parley one-run helpers
    def ours_decode(self, engine: Any, prompt: list[int], n: int) -> tuple[float, list[int]]:
        o = engine.generate([prompt], SamplingParams(max_tokens=n, min_tokens=n), tenant=self._tenant())[0]
        return 1.0 / o.tpot_s, o.token_ids

    def ours_prefill(self, engine: Any, ids: list[int]) -> float:
        return float(engine.generate([ids], SamplingParams(max_tokens=1), tenant=self._tenant())[0].ttft_s)

    def ours_agg(self, engine: Any, prompts: list[list[int]], n: int) -> float:
        t0 = time.perf_counter()
        engine.generate(prompts, SamplingParams(max_tokens=n, min_tokens=n), tenant=self._tenant())
        return len(prompts) * n / (time.perf_counter() - t0)

    # ------------------------------------------------------------------ workloads
    def run(self) -> None:
        a, r = self.args, self.r
        runs, n = a.runs, a.tokens
        modes = [m.strip() for m in a.modes.split(",") if m.strip()]
        engines = {m: open_engine(None, m, threads=self.threads) for m in modes}
        tok = engines[modes[0]].tokenizer
        prompt = chat_ids(tok, QUESTIONS[0])
        doc = document_ids(tok, 64 if a.quick else 512)
        batch_n = 8 if a.quick else 48
        prompts = [chat_ids(tok, " ".join((QUESTIONS * 4)[i : i + 1 + i % 6])) for i in range(16)]
        llama = self.llama if self.have_llama else None
        try:
            for e in engines.values():  # warm-up
                e.generate([prompt], SamplingParams(max_tokens=4), tenant=self._tenant())
            # decode, interleaved
            ours: dict[str, list[float]] = {m: [] for m in modes}
            toks: dict[str, list[int]] = {}
            theirs: list[float] = []
            for _ in range(runs):
                for m, e in engines.items():
                    rate, toks[m] = self.ours_decode(e, prompt, n)
                    ours[m].append(rate)
                if llama is not None:
                    theirs.append(llama.tg(self.path, self.threads, n))
            for m in modes:
                r[f"decode_tok_s_{m}"] = round(median(ours[m]), 2)
            best = max(modes, key=lambda m: median(ours[m]))
            r["mode"] = best
            r["decode_tok_s"] = round(median(ours[best]), 2)
            r["llamacpp_decode_tok_s"] = round(median(theirs), 2) if theirs else None
            r["decode_ratio"] = round(median(ours[best]) / median(theirs), 3) if theirs else None
            self.rows.append((f"decode 1x{n} tok/s ({best})", f"{r['decode_tok_s']}",
                              f"{r['llamacpp_decode_tok_s']}", f"{r['decode_ratio']}x"))
            # prefill 512, interleaved
            pre_ours: list[float] = []
            pre_theirs: list[float] = []
            for _ in range(runs):
                pre_ours.append(self.ours_prefill(engines[best], doc))
                if llama is not None:
                    pre_theirs.append(len(doc) / llama.pp(self.path, self.threads, len(doc)))
            r["prefill_512_s"] = round(median(pre_ours), 4)
            r["llamacpp_prefill_512_s"] = round(median(pre_theirs), 4) if pre_theirs else None
            r["prefill_ratio"] = round(median(pre_theirs) / median(pre_ours), 3) if pre_theirs else None
            r["llamacpp_pp_tok_s"] = round(len(doc) / median(pre_theirs), 2) if pre_theirs else None
            self.rows.append((f"prefill {len(doc)} s ({best})", f"{r['prefill_512_s']}",
                              f"{r['llamacpp_prefill_512_s']}", f"{r['prefill_ratio']}x"))
            # 16 concurrent: parley's side only (llama-server's parallel slots: benchmarks/serve_vs_peers.py)
            agg_ours = [self.ours_agg(engines[best], prompts, batch_n) for _ in range(runs)]
            r["agg16_tok_s"] = round(median(agg_ours), 2)
            self.notes["agg16"] = ("parley only: llama.cpp's concurrent figure is llama-server's with parallel slots, "
                                   "measured over HTTP by benchmarks/serve_vs_peers.py")
            self.rows.append((f"16x{batch_n} agg tok/s ({best})", f"{r['agg16_tok_s']}", "serve_vs_peers", "-"))
            # 1 thread on both sides (a busy machine's view)
            self.one_thread(engines, best, prompt, n, llama)
        finally:
            for e in engines.values():
                e.close()
        r["llamacpp_build"] = self.llama.build
        self.quality(best, modes)
        self.speculation(best, runs)
        self.compiled(best, runs, n)
        if not self.args.no_q8:
            self.q8(runs, n)
        r["load_avg_end"] = load_average()
        r["notes"] = self.notes
        self.report()

    def one_thread(self, engines: dict[str, Any], best: str, prompt: list[int], n: int, llama: Any) -> None:
        r = self.r
        del engines  # each engine's thread count is fixed at construction: open 1-thread ones
        e1 = open_engine(None, best, threads=1)
        try:
            e1.generate([prompt], SamplingParams(max_tokens=4))
            ours, theirs = [], []
            for _ in range(self.args.runs):
                ours.append(self.ours_decode(e1, prompt, n)[0])
                if llama is not None:
                    theirs.append(llama.tg(self.path, 1, n))
            r["decode_tok_s_1thread"] = round(median(ours), 2)
            r["llamacpp_decode_tok_s_1thread"] = round(median(theirs), 2) if theirs else None
            r["decode_ratio_1thread"] = round(median(ours) / median(theirs), 3) if theirs else None
            self.rows.append((f"decode 1 thread tok/s ({best})", f"{r['decode_tok_s_1thread']}",
                              f"{r['llamacpp_decode_tok_s_1thread']}", f"{r['decode_ratio_1thread']}x"))
        finally:
            e1.close()

    def quality(self, best: str, modes: list[str]) -> None:
        """Perplexity of the shipped text in fp32 and in every quantised mode; `perplexity_mode` is the best
        decode mode's (fp32's own when that is the best)."""
        r = self.r
        text = TEXT.read_text()
        ppl: dict[str, float] = {}
        for m in dict.fromkeys(["fp32", *modes]):
            e = open_engine(None, m, threads=self.threads)
            try:
                ids = e.tokenizer.encode(text)
                ppl[m] = round(perplexity(e.model, ids), 4)
            finally:
                e.close()
        from parley.local_engine.bench import MODES

        if any(MODES[m].get("quantization") == "q4" for m in modes):
            r["perplexity_q4_head4"] = round(q4_head4_perplexity(ids, self.threads), 4)
            self.rows.append(("perplexity q4 with a 4-bit LM head", f"{r['perplexity_q4_head4']}", "-",
                              f"{100 * (r['perplexity_q4_head4'] / ppl['fp32'] - 1):+.2f}%"))
        r["perplexity_tokens"] = len(ids)
        r["perplexity_fp32"] = ppl["fp32"]
        r["perplexity_mode"] = ppl[best]
        r["perplexity_mode_name"] = best
        r["perplexity_mode_change_pct"] = round(100 * (ppl[best] / ppl["fp32"] - 1), 2)
        for m, v in ppl.items():
            r[f"perplexity_{m}"] = v
        r["llamacpp_perplexity"] = None  # llama-bench computes none (see the docstring)
        self.rows.append((f"perplexity ({len(ids)} tok) fp32/{best}", f"{ppl['fp32']}/{ppl[best]}",
                          f"{r.get('llamacpp_perplexity')}", f"{r['perplexity_mode_change_pct']:+}%"))

    def compiled(self, best: str, runs: int, n: int) -> None:
        """Compile time of the decode step (EngineConfig(compile=True)) and its decode rate beside eager's."""
        r = self.r
        if self.args.no_compile:
            r["compile_s"] = None
            self.notes["compile_s"] = "skipped (--no-compile)"
            return
        from parley.local_engine import Engine, EngineConfig
        from parley.local_engine.bench import MODES

        # The compiled step covers fp32 and int8 GEMMs (q4/q8 run our own C++ kernel eagerly): measure it on
        # the fastest mode it covers.
        covered = best if MODES[best].get("quantization") in (None, "int8") else "int8-head"
        spec = MODES[covered]
        best = covered
        engines = {}
        for flag in (False, True):
            cfg = EngineConfig(num_threads=self.threads, quantization=spec.get("quantization"),
                               quantize_lm_head=spec.get("quantize_lm_head", False), compile=flag,
                               speculation=None)
            engines[flag] = Engine.from_pretrained(None, device="cpu", dtype=spec["dtype"], config=cfg)
        try:
            stats = engines[True].stats()
            r["compile_s"] = stats["compile_s"]
            if not stats["compiled"]:
                self.notes["compile_s"] = "the compiled step fell back to eager (see the warning above)"
                return
            prompt = chat_ids(engines[True].tokenizer, QUESTIONS[0])
            rates: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(runs):
                for flag, e in engines.items():
                    rates[flag].append(self.ours_decode(e, prompt, n)[0])
            r["decode_tok_s_compiled"] = round(median(rates[True]), 2)
            r["decode_tok_s_eager"] = round(median(rates[False]), 2)
            self.rows.append((f"decode compiled/eager tok/s ({best})", f"{r['decode_tok_s_compiled']}",
                              f"{r['decode_tok_s_eager']} (eager)", f"compile {r['compile_s']}s"))
        finally:
            for e in engines.values():
                e.close()

    def speculation(self, best: str, runs: int) -> None:
        r = self.r
        figs = spec_figures(None, best, threads=self.threads, runs=runs, tokens=32 if self.args.quick else 128)
        r.update(figs)
        for kind in ("structured", "prose"):
            self.rows.append((f"spec {kind} tok/s ({best})", f"{figs[f'spec_tok_s_{kind}']}",
                              f"{figs[f'plain_tok_s_{kind}']} (plain)", f"{figs[f'spec_speedup_{kind}']}x"))

    def q8(self, runs: int, n: int) -> None:
        r = self.r
        if not self.have_llama:
            r["decode_ratio_q8"] = None
            return
        made = q8_file(self.path, self.llama)
        if isinstance(made, str):
            r["decode_ratio_q8"] = None
            self.notes["decode_ratio_q8"] = made
            return
        q8_modes = ("int8", "q8-head")
        es = {m: open_engine(made, m, threads=self.threads) for m in q8_modes}
        try:
            prompt = chat_ids(es["int8"].tokenizer, QUESTIONS[0])
            for e in es.values():
                e.generate([prompt], SamplingParams(max_tokens=4))
            ours: dict[str, list[float]] = {m: [] for m in q8_modes}
            theirs = []
            for _ in range(runs):
                for m, e in es.items():
                    ours[m].append(self.ours_decode(e, prompt, n)[0])
                theirs.append(self.llama.tg(made, self.threads, n))
            best = max(q8_modes, key=lambda m: median(ours[m]))
            for m in q8_modes:
                r[f"decode_tok_s_q8_{m}"] = round(median(ours[m]), 2)
            r["mode_q8"] = best
            r["decode_tok_s_q8"] = round(median(ours[best]), 2)
            r["llamacpp_decode_tok_s_q8"] = round(median(theirs), 2)
            r["decode_ratio_q8"] = round(median(ours[best]) / median(theirs), 3)
            self.rows.append((f"decode Q8_0 file tok/s ({best})", f"{r['decode_tok_s_q8']}",
                              f"{r['llamacpp_decode_tok_s_q8']}", f"{r['decode_ratio_q8']}x"))
        finally:
            for e in es.values():
                e.close()

    def report(self) -> None:
        r = self.r
        print(f"{'workload':<40}{'parley':>16}{'llama.cpp':>18}{'ratio':>10}")
        for row in self.rows:
            print(f"{row[0]:<40}{row[1]:>16}{row[2]:>18}{row[3]:>10}")
        print(f"threads {self.threads}; load average {r['load_avg_start']} at start, {r['load_avg_end']} at end")
        for key, note in self.notes.items():
            print(f"note ({key}): {note}")
        for key in ("decode_ratio", "llamacpp_decode_tok_s", "llamacpp_prefill_512_s", "prefill_ratio",
                    "decode_ratio_q8"):
            r.setdefault(key, None)
        print(json.dumps(r))


if __name__ == "__main__":
    args = parse()
    if args.quick:
        args.runs, args.tokens = 1, 16
    Bench(args).run()
