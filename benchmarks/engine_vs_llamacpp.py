"""parley's local engine vs llama.cpp on the same GGUF file, same machine, same run, same prompt token ids.

The file is the embedded SmolLM2-135M-Instruct Q4_1 (parley runs it dequantised to fp32, in its own int8 mode,
or in q4 mode: the file's Q4_1 blocks loaded as they are and run by parley's group-32 kernel, quant4.py;
llama.cpp runs the Q4_1 blocks directly). Greedy, equal output lengths, `--threads` (2) on both sides.
llama.cpp is driven through `llama-cpp-python`, a benchmark-only dependency that builds from source:

    .venv/bin/pip install llama-cpp-python        # cmake + a C++ compiler, ~10 minutes on 2 cores

Without it the script still measures parley's side and prints null for llama.cpp's figures.

The same build also runs the `llamacpp`-marked integration test of `OpenAIBackend` against llama.cpp's
OpenAI-compatible server (`python -m llama_cpp.server`, on 127.0.0.1, with this GGUF file). That needs the
package's server extra on top; its dependencies are pure Python (fastapi, pydantic-settings,
starlette-context, sse-starlette, uvicorn), so adding them does not rebuild llama.cpp:

    .venv/bin/pip install 'llama-cpp-python[server]' -c constraints.txt   # keeps the pinned starlette etc.
    .venv/bin/python -m pytest -q -m llamacpp tests/sdk/backends/test_llamacpp_server.py

Without the extra that test skips, naming `llama-cpp-python[server]`.

Workloads (each the median of `--runs`, the two sides interleaved run by run so load changes hit both):
  decode   single stream, 64 tokens, tok/s after the first token; parley's best mode for the file
  decode_q8  the same on a Q8_0 file llama.cpp makes from the same model (llama_model_quantize; parley: the
           faster of int8 and q8-head, q8 loading the file's Q8_0 blocks)
  prefill  512-token prompt, cold, seconds to the first token; ratio = llama.cpp time / ours
  agg16    16 concurrent requests x 48 tokens: parley's continuous batching vs llama.cpp one after another
           (llama-cpp-python serves one sequence at a time; its server has no parallel slots)
  ppl      perplexity of benchmarks/data/perplexity.txt, fp32 vs every quantised mode (and llama.cpp's own),
           plus q4 with a 4-bit LM head (perplexity_q4_head4: why the head stays at higher precision)
  spec     speculative decoding (prompt lookup) speed-up on a JSON echo and on prose, acceptance rates
  compile  seconds to compile the decode step (EngineConfig(compile=True)) and its decode rate vs eager, on the
           fastest mode the compiled step covers (fp32/int8: q4 and q8 run parley's own kernel, eager)
Also decode at 1 thread on both sides: on a busy 2-core machine a 2-thread team waits for a descheduled thread
at every barrier, which hurts llama.cpp's spin-waiting pool far more than parley's per-op thread toggling.

Prints a table, then one JSON object as the last line. Usage:
  python benchmarks/engine_vs_llamacpp.py [--runs 3] [--threads 2] [--quick] [--no-q8]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
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

INSTALL = ".venv/bin/pip install llama-cpp-python  (builds from source with cmake, ~10 min on 2 cores)"
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


class LlamaSide:
    """llama.cpp through llama-cpp-python's `Llama`, fed token ids, greedy by argmax over its last logits."""

    def __init__(self, path: Path, threads: int, *, n_ctx: int = 2048, logits_all: bool = False) -> None:
        import numpy as np
        from llama_cpp import Llama

        self.np = np
        self.llm = Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_batch=512,
                         n_ubatch=512, logits_all=logits_all, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def _argmax(self) -> int:
        logits = self.np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.n_vocab,))
        return int(logits.argmax())

    def generate(self, prompt: list[int], n: int) -> tuple[list[int], float, float]:
        """(tokens, seconds to the first token, seconds from the first to the last token)."""
        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        out = [self._argmax()]
        t1 = time.perf_counter()
        for _ in range(n - 1):
            llm.eval([out[-1]])
            out.append(self._argmax())
        return out, t1 - t0, time.perf_counter() - t1

    def perplexity(self, ids: list[int]) -> float:
        llm = self.llm
        llm.reset()
        llm.eval(ids)
        scores = torch.from_numpy(self.np.array(llm.scores[: len(ids)], dtype=self.np.float32))
        lp = torch.log_softmax(scores[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])
        return math.exp(-float(lp.double().mean()))


def q8_file(source: Path) -> Path | str:
    """A Q8_0 GGUF of the same model, made once by llama.cpp's quantizer (cached); or why it could not be."""
    import llama_cpp

    folder = loader.cache_root() / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (loader.gguf_model_name(source) + ".Q8_0.gguf")
    if target.is_file():
        return target
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True  # the source blocks are Q4_1 (the only copy of the model here)
    tmp = Path(tempfile.mkstemp(dir=folder, suffix=".gguf")[1])
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        return f"llama_model_quantize returned {rc}"
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
        try:
            import llama_cpp

            self.r["llamacpp_version"] = getattr(llama_cpp, "__version__", "?")
            self.have_llama = True
        except ImportError:
            self.have_llama = False
            self.notes["llamacpp"] = f"llama-cpp-python is not installed; install it with: {INSTALL}"
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
        llama = LlamaSide(self.path, self.threads) if self.have_llama else None
        try:
            for e in engines.values():  # warm-up
                e.generate([prompt], SamplingParams(max_tokens=4), tenant=self._tenant())
            if llama is not None:
                llama.generate(prompt, 4)
            # decode, interleaved
            ours: dict[str, list[float]] = {m: [] for m in modes}
            toks: dict[str, list[int]] = {}
            theirs: list[float] = []
            their_toks: list[int] = []
            for _ in range(runs):
                for m, e in engines.items():
                    rate, toks[m] = self.ours_decode(e, prompt, n)
                    ours[m].append(rate)
                if llama is not None:
                    their_toks, _, t = llama.generate(prompt, n)
                    theirs.append((n - 1) / t)
            for m in modes:
                r[f"decode_tok_s_{m}"] = round(median(ours[m]), 2)
            best = max(modes, key=lambda m: median(ours[m]))
            r["mode"] = best
            r["decode_tok_s"] = round(median(ours[best]), 2)
            r["llamacpp_decode_tok_s"] = round(median(theirs), 2) if theirs else None
            r["decode_ratio"] = round(median(ours[best]) / median(theirs), 3) if theirs else None
            if their_toks:
                same = next((i for i, (x, y) in enumerate(zip(toks["fp32"] if "fp32" in toks else toks[best],
                                                              their_toks, strict=False)) if x != y), None)
                r["decode_first_token_difference_vs_llamacpp"] = same
            self.rows.append((f"decode 1x{n} tok/s ({best})", f"{r['decode_tok_s']}",
                              f"{r['llamacpp_decode_tok_s']}", f"{r['decode_ratio']}x"))
            # prefill 512, interleaved
            pre_ours: list[float] = []
            pre_theirs: list[float] = []
            for _ in range(runs):
                pre_ours.append(self.ours_prefill(engines[best], doc))
                if llama is not None:
                    pre_theirs.append(llama.generate(doc, 1)[1])
            r["prefill_512_s"] = round(median(pre_ours), 4)
            r["llamacpp_prefill_512_s"] = round(median(pre_theirs), 4) if pre_theirs else None
            r["prefill_ratio"] = round(median(pre_theirs) / median(pre_ours), 3) if pre_theirs else None
            self.rows.append((f"prefill {len(doc)} s ({best})", f"{r['prefill_512_s']}",
                              f"{r['llamacpp_prefill_512_s']}", f"{r['prefill_ratio']}x"))
            # 16 concurrent: ours batched, theirs one after another
            agg_ours, agg_theirs = [], []
            for _ in range(runs):
                agg_ours.append(self.ours_agg(engines[best], prompts, batch_n))
                if llama is not None:
                    t0 = time.perf_counter()
                    for p in prompts:
                        llama.generate(p, batch_n)
                    agg_theirs.append(16 * batch_n / (time.perf_counter() - t0))
            r["agg16_tok_s"] = round(median(agg_ours), 2)
            r["llamacpp_agg16_tok_s"] = round(median(agg_theirs), 2) if agg_theirs else None
            r["agg16_ratio"] = round(median(agg_ours) / median(agg_theirs), 3) if agg_theirs else None
            self.notes["agg16"] = "llama.cpp: the 16 requests one after another (no parallel slots in llama-cpp-python)"
            self.rows.append((f"16x{batch_n} agg tok/s ({best})", f"{r['agg16_tok_s']}",
                              f"{r['llamacpp_agg16_tok_s']}", f"{r['agg16_ratio']}x"))
            # 1 thread on both sides (a busy machine's view)
            self.one_thread(engines, best, prompt, n, llama)
        finally:
            for e in engines.values():
                e.close()
            del llama
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
        l1 = LlamaSide(self.path, 1) if llama is not None else None
        try:
            e1.generate([prompt], SamplingParams(max_tokens=4))
            ours, theirs = [], []
            for _ in range(self.args.runs):
                ours.append(self.ours_decode(e1, prompt, n)[0])
                if l1 is not None:
                    theirs.append((n - 1) / l1.generate(prompt, n)[2])
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
        if self.have_llama:
            lq = LlamaSide(self.path, self.threads, n_ctx=len(ids) + 16, logits_all=True)
            r["llamacpp_perplexity"] = round(lq.perplexity(ids), 4)
            del lq
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
        made = q8_file(self.path)
        if isinstance(made, str):
            r["decode_ratio_q8"] = None
            self.notes["decode_ratio_q8"] = made
            return
        q8_modes = ("int8", "q8-head")
        es = {m: open_engine(made, m, threads=self.threads) for m in q8_modes}
        llama = LlamaSide(made, self.threads)
        try:
            prompt = chat_ids(es["int8"].tokenizer, QUESTIONS[0])
            for e in es.values():
                e.generate([prompt], SamplingParams(max_tokens=4))
            llama.generate(prompt, 4)
            ours: dict[str, list[float]] = {m: [] for m in q8_modes}
            theirs = []
            for _ in range(runs):
                for m, e in es.items():
                    ours[m].append(self.ours_decode(e, prompt, n)[0])
                theirs.append((n - 1) / llama.generate(prompt, n)[2])
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
                    "llamacpp_agg16_tok_s", "agg16_ratio", "decode_ratio_q8"):
            r.setdefault(key, None)
        print(json.dumps(r))


if __name__ == "__main__":
    args = parse()
    if args.quick:
        args.runs, args.tokens = 1, 16
    Bench(args).run()
