"""Continuous batching through `parley serve` vs the engine alone: 16 concurrent requests x 48 tokens.

One run, side by side, same engine mode, same prompts (rendered by the server's own codec), greedy:

* **engine stream**: 16 `Engine.stream` iterators on one asyncio loop, in this process;
* **engine batch**: the same 16 through `Engine.generate`;
* **HTTP**: the same 16 as streaming chat completions (httpx, 127.0.0.1) against the app of
  `parley serve` running under uvicorn in its own process (this file, `--serve PORT`), so the
  clients' work does not share the server's interpreter.

Both engines stay loaded; while one side runs the other is idle (its step thread blocks on its
queue), and the sides alternate for `--rounds` rounds so a machine whose load drifts biases none.
Figures are aggregate output tokens / wall seconds, best of the rounds and their median; the output
token counts of every side are printed and must agree (greedy, same prompt ids, same stop ids), so
the ratio compares equal work. `min_tokens`/`ignore_eos` would force equal lengths, but the
prompts below already run to `max_tokens` on the embedded model; the counts say so.

    .venv/bin/python benchmarks/serve_batching.py [--quantization q4] [--rounds 3] [--requests 16] [--tokens 48]

Last line: one JSON object (engine_stream_tok_s, engine_batch_tok_s, http_tok_s, http_vs_engine ratios, load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

PROMPTS = [
    "Write a long story about a dragon who learns to bake bread.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a long walk through a busy city market in the morning.",
    "Write a detailed essay about the history of the printing press.",
    "Tell a long story about a sailor lost at sea for many days.",
    "Explain at length why the seasons change over the year.",
    "Write a long letter to a friend about your summer holiday.",
    "Describe in detail how to plant and care for a vegetable garden.",
]


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


# -- the server process ------------------------------------------------------------------------------
def serve(port: int, quantization: str | None) -> None:
    """Run the `parley serve` app on 127.0.0.1:`port` (the server side of this benchmark)."""
    import uvicorn

    from parley.local_engine import Engine
    from parley.server.app import create_app
    from parley.server.config import ServerConfig

    engine = Engine.from_pretrained(quantization=quantization)
    app = create_app(engine, config=ServerConfig(model_name="smollm2", max_concurrent=4096))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


def start_server(port: int, quantization: str | None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, __file__, "--serve", str(port)]
    if quantization:
        cmd += ["--quantization", quantization]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_healthy(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"server exited with {proc.returncode}:\n{err[-3000:]}")
        try:
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("server did not become healthy")


# -- the three sides ---------------------------------------------------------------------------------
async def http_side(base_url: str, n: int, tokens: int) -> tuple[int, float]:
    """n concurrent streaming chat completions; (output tokens from usage, wall seconds)."""
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:

        async def one(i: int) -> int:
            body = {"model": "smollm2", "messages": _messages(i), "max_tokens": tokens, "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True}}
            used = 0
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"usage":{' in line:
                        used = int(json.loads(line[6:])["usage"]["completion_tokens"])
            return used

        await asyncio.gather(*(one(i) for i in range(min(n, 2))))  # a warm connection pool, as a real client has
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(n)))
        return sum(counts), time.perf_counter() - start


async def stream_side(engine: Any, prompts: list[list[int]], params: Any) -> tuple[int, float]:
    async def one(ids: list[int]) -> int:
        count = 0
        async for delta in engine.stream(ids, params):
            count += len(delta.token_ids)
        return count

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(ids) for ids in prompts))
    return sum(counts), time.perf_counter() - start


def batch_side(engine: Any, prompts: list[list[int]], params: Any) -> tuple[int, float]:
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    return sum(len(o.token_ids) for o in outs), time.perf_counter() - start


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of process `pid`, by thread id (Linux /proc; else empty)."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    tick = os.sysconf("SC_CLK_TCK")
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quantization", default=None, help="engine mode on both sides (default: the engine's)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.quantization)
        return 0

    from parley.backends.local.codec import codec_for
    from parley.local_engine import Engine, SamplingParams
    from parley.protocol import openai as openai_wire
    from parley.server.runner import free_port

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    proc = start_server(port, args.quantization)
    try:
        engine = Engine.from_pretrained(quantization=args.quantization)
        codec = codec_for(engine.tokenizer)
        prompts = [
            codec.render(openai_wire.decode_request({"messages": _messages(i)})[0], [], reasoning=None)
            for i in range(args.requests)
        ]
        params = SamplingParams(max_tokens=args.tokens, temperature=0.0, stop_token_ids=codec.stop_token_ids)
        wait_healthy(base_url, proc)
        mode = engine.stats().get("quantization") or "fp32"
        print(f"mode {mode}, {args.requests} x {args.tokens} tokens, {args.rounds} rounds, load {_load()}")
        engine.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up both sides
        asyncio.run(http_side(base_url, 2, 4))
        figures: dict[str, list[float]] = {"engine_stream": [], "engine_batch": [], "http": []}
        counts: dict[str, set[int]] = {k: set() for k in figures}
        cpu: dict[str, list[float]] = {"loop": [], "engine": [], "client": []}  # CPU ms per output token (HTTP)
        for r in range(args.rounds):
            for name in figures:
                if name == "engine_stream":
                    n, wall = asyncio.run(stream_side(engine, prompts, params))
                elif name == "engine_batch":
                    n, wall = batch_side(engine, prompts, params)
                else:
                    before, t0 = thread_cpu_s(proc.pid), os.times()
                    n, wall = asyncio.run(http_side(base_url, args.requests, args.tokens))
                    after, t1 = thread_cpu_s(proc.pid), os.times()
                    if after:  # the server's event loop is its main thread; the engine and its GEMM threads the rest
                        cpu["loop"].append((after[proc.pid] - before.get(proc.pid, 0.0)) / n * 1e3)
                        cpu["engine"].append(
                            sum(v - before.get(t, 0.0) for t, v in after.items() if t != proc.pid) / n * 1e3
                        )
                    cpu["client"].append((t1.user + t1.system - t0.user - t0.system) / n * 1e3)
                figures[name].append(n / wall)
                counts[name].add(n)
                print(f"  round {r + 1} {name:>13}: {n} tokens in {wall:.2f} s = {n / wall:6.1f} tok/s")
        engine.close()
        best = {k: max(v) for k, v in figures.items()}
        median = {k: statistics.median(v) for k, v in figures.items()}
        print(f"\n{'side':>13} {'best tok/s':>11} {'median':>8} {'tokens':>8}")
        for k in figures:
            print(f"{k:>13} {best[k]:11.1f} {median[k]:8.1f} {'/'.join(str(c) for c in sorted(counts[k])):>8}")
        ratio_stream = best["http"] / best["engine_stream"]
        ratio_batch = best["http"] / best["engine_batch"]
        print(f"HTTP / engine stream {ratio_stream:.2f}, HTTP / engine batch {ratio_batch:.2f}; load {_load()}")
        cpu_ms = {k: round(statistics.median(v), 3) for k, v in cpu.items() if v}
        print(f"HTTP CPU ms per output token (median): server event loop {cpu_ms.get('loop', float('nan')):.3f}, "
              f"server engine threads {cpu_ms.get('engine', float('nan')):.3f}, client {cpu_ms['client']:.3f}")
        summary = {
            "mode": mode, "requests": args.requests, "tokens": args.tokens, "rounds": args.rounds,
            **{f"{k}_tok_s": round(v, 1) for k, v in best.items()},
            **{f"{k}_median_tok_s": round(v, 1) for k, v in median.items()},
            "http_vs_engine_stream": round(ratio_stream, 3), "http_vs_engine_batch": round(ratio_batch, 3),
            "output_tokens": {k: sorted(v) for k, v in counts.items()},
            **{f"http_{k}_cpu_ms_per_token": v for k, v in cpu_ms.items()}, "load": _load(),
        }
        print(json.dumps(summary))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
