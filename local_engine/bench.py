"""The engine's own speed figures on this machine and model (what `parley bench` prints, like `llama-bench`).

Workloads, each greedy with equal output lengths forced (`min_tokens`), per mode (fp32, bf16, int8, ...):
  decode    one stream, `decode_tokens` tokens: tok/s between the first and the last token (1 / TPOT)
  prefill   a `prefill_tokens`-token prompt, cold (a fresh tenant, so no prefix-cache hit): seconds to the first token
  batch     `batch` concurrent requests of `batch_tokens` tokens each: aggregate output tok/s
  cached    the same long prompt with a new suffix once its prefix is cached: TTFT, and the cold TTFT beside it
  spec      decode of a prompt-echoing JSON answer with `speculation="ngram"`, and its speed-up over plain decode

Every figure is the median of `runs` timed runs and also the best run (a shared machine is noisy: the best run
is the closest to what the hardware does). The prompts are built in: nothing is read from the network or disk.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis briefly.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
)
RECORD = {"name": "Ada Lovelace", "born": "1815-12-10", "died": "1852-11-27", "city": "London",
          "fields": ["mathematics", "computing"], "known_for": "the first published computer program",
          "collaborator": "Charles Babbage", "machine": "Analytical Engine"}
STRUCTURED_TASK = (f"Here is a record: {json.dumps(RECORD)}\n"
                   "Return the same record as JSON with one more field, \"verified\": true.")
PROSE_TASK = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` as one user turn in the model's chat format, ready for the assistant's answer."""
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
    else:
        ids = tokenizer.encode(text)
    return [int(t) for t in ids]


def document_ids(tokenizer: Any, num_tokens: int) -> list[int]:
    """Exactly `num_tokens` ids of a plain built-in document (for prefill timings)."""
    clauses = [f"Clause {i}: the tenant keeps the premises clean and returns the keys on day {i % 28 + 1}."
               for i in range(4 * num_tokens // 20 + 8)]
    ids = [int(t) for t in tokenizer.encode(" ".join(clauses))]
    while len(ids) < num_tokens:
        ids = ids + ids
    return ids[:num_tokens]


@dataclass
class Timing:
    """Seconds (or a rate) over runs: the median and the best."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def best_low(self) -> float:
        return min(self.values)

    @property
    def best_high(self) -> float:
        return max(self.values)


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not on this platform
        return None


class EngineBench:
    """Runs the workloads on one engine. `tenant` numbers keep timed runs from reading each other's cache."""

    def __init__(self, engine: Any, *, runs: int = 3) -> None:
        self.engine = engine
        self.runs = runs
        self._tenant = 0

    def _fresh(self) -> str:
        self._tenant += 1
        return f"bench-{id(self)}-{self._tenant}"

    def decode(self, prompt: list[int], tokens: int) -> tuple[Timing, list[int]]:
        """Single-stream decode rate (tok/s after the first token) and the tokens of the last run."""
        from parley.local_engine import SamplingParams

        p = SamplingParams(max_tokens=tokens, min_tokens=tokens)
        self.engine.generate([prompt], SamplingParams(max_tokens=4), tenant=self._fresh())  # warm-up
        rates, out = Timing(), []
        for _ in range(self.runs):
            o = self.engine.generate([prompt], p, tenant=self._fresh())[0]
            rates.values.append(1.0 / o.tpot_s)
            out = o.token_ids
        return rates, out

    def prefill(self, ids: list[int]) -> Timing:
        """Cold time to the first token of a long prompt."""
        from parley.local_engine import SamplingParams

        t = Timing()
        for _ in range(self.runs):
            t.values.append(self.engine.generate([ids], SamplingParams(max_tokens=1), tenant=self._fresh())[0].ttft_s)
        return t

    def batch(self, prompts: list[list[int]], tokens: int) -> Timing:
        """Aggregate output tok/s of `len(prompts)` concurrent requests (continuous batching)."""
        from parley.local_engine import SamplingParams

        p = SamplingParams(max_tokens=tokens, min_tokens=tokens)
        t = Timing()
        for _ in range(self.runs):
            start = time.perf_counter()
            self.engine.generate(prompts, p, tenant=self._fresh())
            t.values.append(len(prompts) * tokens / (time.perf_counter() - start))
        return t

    def cached_ttft(self, prefix: list[int], suffixes: Iterable[list[int]]) -> tuple[Timing, Timing]:
        """TTFT with `prefix` served from the prefix cache, and cold, for the same prompt shapes."""
        from parley.local_engine import SamplingParams

        one = SamplingParams(max_tokens=1)
        tenant = self._fresh()
        suffixes = list(suffixes)
        self.engine.generate([prefix + suffixes[0]], one, tenant=tenant)
        hit, cold = Timing(), Timing()
        for s in suffixes[1 : self.runs + 1]:
            hit.values.append(self.engine.generate([prefix + s], one, tenant=tenant)[0].ttft_s)
            cold.values.append(self.engine.generate([prefix + s], one, tenant=self._fresh())[0].ttft_s)
        return hit, cold


MODES: dict[str, dict[str, Any]] = {
    "auto": {"dtype": "float32", "quantization": "auto", "speculation": "auto"},
    "fp32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "int8": {"dtype": "float32", "quantization": "int8"},
    "int8-head": {"dtype": "float32", "quantization": "int8", "quantize_lm_head": True},
    "q4": {"dtype": "float32", "quantization": "q4"},
    "q4-head": {"dtype": "float32", "quantization": "q4", "quantize_lm_head": True},
    "q8": {"dtype": "float32", "quantization": "q8"},
    "q8-head": {"dtype": "float32", "quantization": "q8", "quantize_lm_head": True},
}
"""Modes by name. "auto" is what every engine runs unless told otherwise (auto_mode.py: on this model q4 with an
8-bit LM head and n-gram speculation). int8, q4 and q8 keep the LM head fp32; the -head modes quantise it too
(int8 per channel; q4/q8 in 8-bit groups). q4 loads a GGUF's 4-bit blocks as they are, q8 every block type
parley runs (K-quants included)."""


def open_engine(model: Any, mode: str, *, threads: int | None, speculation: str | None = None,
                compile: bool = False) -> Any:
    """An engine over `model` in `mode` (a key of MODES), on CPU. `speculation` None: the mode's own
    ("auto" for the auto mode, off for the named ones, so their decode figures are plain decoding)."""
    from parley.local_engine import Engine, EngineConfig

    spec = MODES[mode]
    auto = spec.get("quantization") == "auto"
    cfg = EngineConfig(num_threads=threads, quantization=spec.get("quantization"),
                       quantize_lm_head=None if auto else spec.get("quantize_lm_head", False),
                       speculation=speculation if speculation is not None else spec.get("speculation"),
                       compile=compile)
    return Engine.from_pretrained(model, device="cpu", dtype=spec["dtype"], config=cfg)


def run(model: Any = None, *, modes: Iterable[str] = ("auto", "fp32"), threads: int | None = None, runs: int = 3,
        decode_tokens: int = 64, prefill_tokens: int = 512, batch: int = 16, batch_tokens: int = 48,
        speculation: bool = True, engine_speculation: str | None = None, compile: bool = False,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every workload for every mode: `{"modes": {mode: {figure: value}}, "load_avg": ..., ...}`."""
    import torch

    say = progress or (lambda _: None)
    if threads is not None:
        torch.set_num_threads(threads)
    result: dict[str, Any] = {"threads": threads or torch.get_num_threads(), "runs": runs,
                              "load_avg_start": load_average(), "modes": {}}
    for mode in modes:
        say(f"{mode}: loading")
        engine = open_engine(model, mode, threads=threads, speculation=engine_speculation, compile=compile)
        try:
            tok = engine.tokenizer
            b = EngineBench(engine, runs=runs)
            fig: dict[str, Any] = {"model_id": engine.model_id, "mode": engine.mode,
                                   "mode_reason": engine.mode_reason}
            say(f"{mode}: decode")
            rate, _ = b.decode(chat_ids(tok, QUESTIONS[0]), decode_tokens)
            fig.update(decode_tok_s=round(rate.median, 2), decode_tok_s_best=round(rate.best_high, 2))
            say(f"{mode}: prefill {prefill_tokens}")
            pre = b.prefill(document_ids(tok, prefill_tokens))
            fig.update(prefill_s=round(pre.median, 4), prefill_s_best=round(pre.best_low, 4))
            say(f"{mode}: {batch} concurrent")
            prompts = [chat_ids(tok, " ".join((QUESTIONS * 4)[i : i + 1 + i % 6])) for i in range(batch)]
            agg = b.batch(prompts, batch_tokens)
            fig.update(batch_tok_s=round(agg.median, 2), batch_tok_s_best=round(agg.best_high, 2))
            say(f"{mode}: cached prefix")
            doc = document_ids(tok, prefill_tokens)
            suffixes = [tok.encode(f" Question {i}: what does clause {i} say?") for i in range(runs + 1)]
            hit, cold = b.cached_ttft(doc, suffixes)
            fig.update(cached_ttft_s=round(hit.median, 4), cold_ttft_s=round(cold.median, 4))
        finally:
            engine.close()
        if speculation:
            say(f"{mode}: speculative decoding")
            fig.update(spec_figures(model, mode, threads=threads, runs=runs, tokens=2 * decode_tokens))
        result["modes"][mode] = fig
    result["load_avg_end"] = load_average()
    return result


def spec_figures(model: Any, mode: str, *, threads: int | None, runs: int, tokens: int) -> dict[str, Any]:
    """Speed-up of `speculation="ngram"` over plain decode on structured (JSON echo) and prose answers, the
    acceptance rate, and whether the tokens were the same (greedy)."""
    out: dict[str, Any] = {}
    engines = {s: open_engine(model, mode, threads=threads, speculation=s or "none") for s in (None, "ngram")}
    try:
        tok = engines[None].tokenizer
        for name, task in (("structured", STRUCTURED_TASK), ("prose", PROSE_TASK)):
            prompt = chat_ids(tok, task)
            rates: dict[str | None, Timing] = {}
            tokens_of: dict[str | None, list[int]] = {}
            before = engines["ngram"].stats()
            for _ in range(runs):  # interleaved, so a load change hits both alike
                for s, engine in engines.items():
                    r, toks = EngineBench(engine, runs=1).decode(prompt, tokens)
                    rates.setdefault(s, Timing()).values.extend(r.values)
                    tokens_of[s] = toks
            after = engines["ngram"].stats()
            drafted = after["spec_drafted_tokens"] - before["spec_drafted_tokens"]
            accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
            out[f"spec_speedup_{name}"] = round(rates["ngram"].median / rates[None].median, 3)
            out[f"spec_tok_s_{name}"] = round(rates["ngram"].median, 2)
            out[f"plain_tok_s_{name}"] = round(rates[None].median, 2)
            out[f"spec_acceptance_{name}"] = round(accepted / drafted, 3) if drafted else None
            out[f"spec_same_tokens_{name}"] = tokens_of["ngram"] == tokens_of[None]
    finally:
        for engine in engines.values():
            engine.close()
    return out


def table(result: dict[str, Any]) -> str:
    """The figures as a text table, one row per mode."""
    cols = [("decode tok/s", "decode_tok_s"), ("prefill s", "prefill_s"), ("batch tok/s", "batch_tok_s"),
            ("cached TTFT s", "cached_ttft_s"), ("cold TTFT s", "cold_ttft_s"),
            ("spec x JSON", "spec_speedup_structured"), ("spec x prose", "spec_speedup_prose")]
    lines = [f"{'mode':<8}" + "".join(f"{c:>15}" for c, _ in cols)]
    for mode, fig in result["modes"].items():
        lines.append(f"{mode:<8}" + "".join(f"{fig.get(k, '-')!s:>15}" for _, k in cols))
    lines.append(f"threads {result['threads']}, {result['runs']} runs (median), load average "
                 f"{result['load_avg_start']} -> {result['load_avg_end']}")
    return "\n".join(lines)
