"""K-quant GGUF files (Q4_K_M, Q5_K_M, Q6_K) in parley vs llama.cpp: perplexity on the same text, decode speed.

The files are llama.cpp's own quantisations of the embedded SmolLM2-135M-Instruct, made by `llama-quantize`
from an f32 GGUF (`--make` makes them when the tool and the f32 file are there; convert the fp32 folder parley
caches under ~/.cache/parley/models with llama.cpp's convert_hf_to_gguf.py --outtype f32). SmolLM2's 576-wide
matrices are not whole 256-value super-blocks, so llama.cpp stores most of them as Q5_0 / Q5_1 / Q8_0 and only
the 1536-wide ffn_down as Q4_K / Q5_K / Q6_K; the table's first column lists each file's layer types.

Per file:
  ppl parley   perplexity in llama-perplexity's protocol (chunks of `--ctx` tokens, the second half of each
               scored, a BOS first where the vocabulary adds one), in q8 mode (every layer matrix the file's
               own blocks, gguf_weights.py), q4 mode (4-bit blocks kept, others requantised to 4 bits) and
               fp32 (the file dequantised)
  ppl llama    `llama-perplexity -c CTX` on the same file and text
  f32 row      the f32 source file in fp32 on both sides: checks that the two protocols (and tokenisers) agree
  decode       single-stream decode tok/s (64 tokens after a chat prompt, median of `--runs`, speculation off)
               in q8 and q4 mode, and `llama-bench -p 0 -n 64` (tg64) on the same file

Tools come from `--llama-bin` (default $LLAMA_BIN, else /root/.cache/parley-peers/llama-build/bin). Missing
files or tools are skipped and named in the output; the script never downloads anything.
Prints a table, then one JSON object as the last line. Usage:
  python benchmarks/kquants.py [--dir DIR] [--ctx 128] [--runs 3] [--threads 2] [--make] [--no-decode]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TEXT = Path(__file__).parent / "data" / "perplexity.txt"
PEERS = Path("/root/.cache/parley-peers")
TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K")
STEM = "SmolLM2-135M-Instruct"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=PEERS / "kquants", help="folder of the K-quant files")
    p.add_argument("--llama-bin", type=Path, default=Path(os.environ.get("LLAMA_BIN", PEERS / "llama-build" / "bin")))
    p.add_argument("--ctx", type=int, default=128, help="perplexity chunk length (the text is ~700 tokens)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--make", action="store_true", help="make missing files with llama-quantize from the f32 GGUF")
    p.add_argument("--no-decode", action="store_true", help="perplexity only")
    return p.parse_args()


def tool(args: argparse.Namespace, name: str) -> Path | None:
    path = args.llama_bin / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def make_files(args: argparse.Namespace, notes: list[str]) -> None:
    quantize, source = tool(args, "llama-quantize"), args.dir / f"{STEM}.f32.gguf"
    if quantize is None or not source.is_file():
        notes.append(f"--make: needs {args.llama_bin / 'llama-quantize'} and {source}")
        return
    for t in TYPES:
        target = args.dir / f"{STEM}.{t}.gguf"
        if not target.is_file():
            subprocess.run([str(quantize), str(source), str(target), t, str(args.threads)], check=True,
                           capture_output=True)


def llama_perplexity(args: argparse.Namespace, path: Path) -> float | None:
    exe = tool(args, "llama-perplexity")
    if exe is None:
        return None
    out = subprocess.run([str(exe), "-m", str(path), "-f", str(TEXT), "-c", str(args.ctx), "-b", str(args.ctx),
                          "-t", str(args.threads)], capture_output=True, text=True, check=False)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    return float(found.group(1)) if found else None


def llama_bench_tg(args: argparse.Namespace, path: Path) -> float | None:
    exe = tool(args, "llama-bench")
    if exe is None:
        return None
    out = subprocess.run([str(exe), "-m", str(path), "-p", "0", "-n", "64", "-t", str(args.threads), "-r",
                          str(args.runs), "-o", "json"], capture_output=True, text=True, check=False)
    try:
        return round(float(json.loads(out.stdout)[0]["avg_ts"]), 2)
    except (ValueError, KeyError, IndexError):
        return None


def add_bos(path: Path) -> tuple[bool, int | None]:
    import gguf

    fields = gguf.GGUFReader(str(path)).fields

    def value(key: str) -> Any:
        f = fields.get(key)
        return None if f is None else f.parts[f.data[0]][0]

    return bool(value("tokenizer.ggml.add_bos_token")), value("tokenizer.ggml.bos_token_id")


def chunked_perplexity(model: Any, ids: list[int], ctx: int, bos: int | None) -> float:
    """llama-perplexity's figure: chunk c is ids[c ctx : (c + 1) ctx] (its first token replaced by BOS when the
    vocabulary adds one), scored on the tokens after its first half, each given the chunk before it."""
    from parley.local_engine.evaluate import token_logprobs

    first, nll, count = ctx // 2, 0.0, 0
    for c in range(len(ids) // ctx):
        chunk = list(ids[c * ctx : (c + 1) * ctx])
        if bos is not None:
            chunk[0] = bos
        lp = token_logprobs(model, chunk)[first : ctx - 1]  # log p of tokens first + 1 .. ctx - 1
        nll -= float(lp.double().sum())
        count += int(lp.numel())
    return math.exp(nll / count)


def measure(args: argparse.Namespace, path: Path, modes: tuple[str, ...] = ("q8", "q4", "fp32")) -> dict[str, Any]:
    from parley.local_engine.bench import QUESTIONS, EngineBench, chat_ids, open_engine
    from parley.local_engine.gguf_header import layer_block_types

    types = layer_block_types(path)
    r: dict[str, Any] = {"file": path.name, "layer_types": dict(types.most_common())}
    has_bos, bos_id = add_bos(path)
    for mode in modes:
        engine = open_engine(path, mode, threads=args.threads)
        try:
            ids = engine.tokenizer.encode(TEXT.read_text())
            if has_bos and bos_id is not None:
                ids = [int(bos_id), *ids]
            r["tokens"] = len(ids)
            r[f"ppl_{mode}"] = round(chunked_perplexity(engine.model, ids, args.ctx, bos_id if has_bos else None), 4)
            if mode != "fp32" and not args.no_decode:
                rate, _ = EngineBench(engine, runs=args.runs).decode(chat_ids(engine.tokenizer, QUESTIONS[0]), 64)
                r[f"decode_tok_s_{mode}"] = round(rate.median, 2)
        finally:
            engine.close()
    r["ppl_llamacpp"] = llama_perplexity(args, path)
    if r["ppl_llamacpp"] and "ppl_q8" in r:
        r["ppl_q8_vs_llamacpp_pct"] = round(100 * (r["ppl_q8"] / r["ppl_llamacpp"] - 1), 2)
    if not args.no_decode and "q8" in modes:
        r["llamacpp_tg64_tok_s"] = llama_bench_tg(args, path)
    print(f"{path.name}: {json.dumps(r)}", file=sys.stderr, flush=True)
    return r


def main() -> None:
    args = parse()
    notes: list[str] = []
    if args.make:
        make_files(args, notes)
    files = [args.dir / f"{STEM}.{t}.gguf" for t in TYPES]
    present = [f for f in files if f.is_file()]
    notes += [f"skipped {f.name}: not in {args.dir} (make it with --make)" for f in files if not f.is_file()]
    notes += [f"{name} not in {args.llama_bin}: its figures are null" for name in ("llama-perplexity", "llama-bench")
              if tool(args, name) is None]
    import torch

    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    start = time.time()
    results = [measure(args, f) for f in present]
    reference = args.dir / f"{STEM}.f32.gguf"
    if reference.is_file():  # the protocol check: fp32 on both sides over the f32 file should agree closely
        results.append(measure(args, reference, ("fp32",)))
    head = ("file", "layer types", "ppl q8", "ppl q4", "ppl fp32", "ppl llama.cpp", "q8 tok/s", "q4 tok/s",
            "llama tg64")
    rows = [head] + [(r["file"].removeprefix(STEM + "."), " ".join(f"{t}:{n}" for t, n in r["layer_types"].items()),
                      *(str(r.get(k)) for k in ("ppl_q8", "ppl_q4", "ppl_fp32", "ppl_llamacpp", "decode_tok_s_q8",
                                                "decode_tok_s_q4", "llamacpp_tg64_tok_s"))) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(json.dumps({"ctx": args.ctx, "threads": args.threads, "runs": args.runs, "load_avg_start": load,
                      "seconds": round(time.time() - start, 1), "files": results, "notes": notes,
                      "llama_bin": str(args.llama_bin) if shutil.which(str(args.llama_bin / "llama-bench")) else None}))


if __name__ == "__main__":
    main()
