"""Load benchmark for `parley serve`: concurrent streaming clients on 127.0.0.1, then a 2x overload with deadlines.

The server runs in its own process (the embedded SmolLM2 on the local engine) so the clients' work
does not share its interpreter. Part 1: N concurrent streaming clients (1, 8, 32), each sending its
share of the requests back to back; figures as vLLM's `bench serve` defines them: TTFT (request
sent -> first content chunk), TPOT ((e2e - TTFT) / (output tokens - 1)), ITL (gaps between content
chunks), E2E, p50/p90/p99, output tokens/s. Part 2: Poisson arrivals at about twice the measured
capacity, each with a 2 s deadline (`x-parley-deadline-s`): the share served in time, the share
refused at arrival (429/503 with retry-after), the share dropped mid-way, and how many served
requests finished late (the point of admission control: none).

    .venv/bin/python benchmarks/serve_load.py [--quick]

Last line: one JSON object (c1/c8/c32 figures, overload shares).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a CPU cache is.",
    "Give three tips for learning to cook.",
    "What is the tallest mountain in Europe?",
    "Describe a rainy afternoon in a city.",
    "Why is the sky blue?",
    "List some uses of a paperclip.",
    "Tell me a fun fact about octopuses.",
    "How do bees make honey?",
    "Summarise the plot of Cinderella.",
    "What makes a good password?",
    "Suggest a name for a bakery.",
]


@dataclass
class Result:
    status: int
    ttft: float | None = None
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str | None = None
    sent_at: float = 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def one_request(
    client: httpx.AsyncClient, prompt: str, max_tokens: int, deadline_s: float | None = None
) -> Result:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-parley-deadline-s": str(deadline_s)} if deadline_s is not None else {}
    start = time.perf_counter()
    result = Result(status=0, sent_at=start)
    last: float | None = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            result.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                result.e2e = time.perf_counter() - start
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = chunk["error"].get("message", "error")
                    continue
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                choices = chunk.get("choices") or []
                if choices and choices[0]["delta"].get("content"):
                    now = time.perf_counter()
                    if result.ttft is None:
                        result.ttft = now - start
                    elif last is not None:
                        result.itl.append(now - last)
                    last = now
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.e2e = time.perf_counter() - start
    return result


async def concurrent_run(base_url: str, concurrency: int, total: int, max_tokens: int) -> tuple[list[Result], float]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(PROMPTS[i % len(PROMPTS)])
    results: list[Result] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:

        async def worker() -> None:
            while not queue.empty():
                prompt = queue.get_nowait()
                results.append(await one_request(client, prompt, max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return results, wall


async def overload_run(
    base_url: str, rate: float, duration_s: float, deadline_s: float, max_tokens: int, seed: int = 7
) -> tuple[list[Result], float]:
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Result]] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        at = 0.0
        i = 0
        while at < duration_s:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one_request(client, PROMPTS[i % len(PROMPTS)], max_tokens, deadline_s)))
            i += 1
            at += rng.expovariate(rate)
        results = list(await asyncio.gather(*tasks))
        wall = time.perf_counter() - start
    return results, wall


def summarise(name: str, results: list[Result], wall: float) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200 and r.error is None and r.ttft is not None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.ttft is not None and r.output_tokens > 1]
    itl = [gap for r in ok for gap in r.itl]
    e2e = [r.e2e for r in ok]
    tokens = sum(r.output_tokens for r in ok)
    row: dict[str, Any] = {
        "name": name,
        "requests": len(results),
        "ok": len(ok),
        "tok_s": tokens / wall,
        "req_s": len(ok) / wall,
        "output_tokens": tokens,
    }
    for metric, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        for q in (50, 90, 99):
            row[f"{metric}_p{q}_s"] = pct(values, q)
    return row


def start_server(port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "parley.server.cli",
        "--port",
        str(port),
        "--served-model-name",
        "smollm2",
        "--log-level",
        "warning",
        "--max-concurrent",
        "4096",
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_healthy(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--deadline-s", type=float, default=2.0)
    parser.add_argument("--overload-s", type=float, default=20.0)
    parser.add_argument("--overload-tokens", type=int, default=4, help="max_tokens of the overload requests")
    args = parser.parse_args()

    from parley.server.runner import free_port

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    proc = start_server(port)
    try:
        wait_healthy(base_url, proc)
        asyncio.run(concurrent_run(base_url, 2, 4, 8))  # warm-up: compile paths, step-time estimates
        rows = []
        for c in (1, 8, 32):
            total = max(c, 4) if args.quick else max(2 * c, 8)
            results, wall = asyncio.run(concurrent_run(base_url, c, total, args.max_tokens))
            rows.append(summarise(f"c{c}", results, wall))
        header = f"{'run':>5} {'ok':>4} {'tok/s':>7} {'req/s':>6}" + "".join(
            f" {m + '_p' + str(q):>10}" for m in ("ttft", "tpot", "itl", "e2e") for q in (50, 90, 99)
        )
        print(header)
        for row in rows:
            print(
                f"{row['name']:>5} {row['ok']:>4} {row['tok_s']:7.1f} {row['req_s']:6.2f}"
                + "".join(f" {row[f'{m}_p{q}_s']:10.3f}" for m in ("ttft", "tpot", "itl", "e2e") for q in (50, 90, 99))
            )

        # capacity for the overload shape: the best request rate whose e2e p90 still meets the deadline
        shape_tokens = args.overload_tokens
        capacity, best_c = 0.0, 1
        first_rate = None
        for c in (1, 2, 4, 8):
            cal, cal_wall = asyncio.run(concurrent_run(base_url, c, max(2 * c, 4), shape_tokens))
            row = summarise(f"cal{c}", cal, cal_wall)
            print(f"  calibration c={c}: {row['req_s']:.2f} req/s, e2e p90 {row['e2e_p90_s']:.2f}s")
            first_rate = row["req_s"] if first_rate is None else first_rate
            if row["e2e_p90_s"] <= args.deadline_s and row["req_s"] > capacity:
                capacity, best_c = row["req_s"], c
        if capacity == 0.0:  # nothing meets the deadline: the single-client rate is the honest capacity
            capacity = first_rate or 0.1
        # one idle request first, so the engine's step-time estimate starts from an unloaded server
        asyncio.run(concurrent_run(base_url, 1, 1, shape_tokens))
        rate = 2.0 * capacity
        duration = 8.0 if args.quick else args.overload_s
        results, wall = asyncio.run(overload_run(base_url, rate, duration, args.deadline_s, shape_tokens))
        served = [r for r in results if r.status == 200 and r.error is None and r.ttft is not None]
        refused = [r for r in results if r.status in (429, 503)]
        dropped = [r for r in results if r.status == 200 and (r.error is not None or r.ttft is None)]
        other = [r for r in results if r.status not in (200, 429, 503)]
        in_time = [r for r in served if r.e2e <= args.deadline_s]
        late = [r for r in served if r.e2e > args.deadline_s]
        n = len(results)
        overload = {
            "capacity_req_s": capacity,
            "offered_req_s": n / wall,
            "requests": n,
            "in_time_share": len(in_time) / n,
            "refused_share": len(refused) / n,
            "dropped_share": len(dropped) / n,
            "other_share": len(other) / n,
            "late_served": len(late),
            "served_e2e_p99_s": pct([r.e2e for r in served], 99),
            "served_e2e_max_s": max((r.e2e for r in served), default=float("nan")),
        }
        print(
            f"\noverload: capacity {capacity:.2f} req/s (c={best_c}, {shape_tokens} tokens), "
            f"offered {n / wall:.2f} req/s for {duration:.0f}s with a {args.deadline_s:.1f}s deadline"
        )
        print(
            f"  requests {n}: in time {len(in_time)} ({overload['in_time_share']:.1%}), refused {len(refused)} "
            f"({overload['refused_share']:.1%}), dropped mid-way {len(dropped)}, other {len(other)}, "
            f"served late {len(late)}; served e2e p99 {overload['served_e2e_p99_s']:.3f}s "
            f"max {overload['served_e2e_max_s']:.3f}s"
        )
        summary: dict[str, Any] = {}
        for row in rows:
            c = row["name"]
            summary.update(
                {
                    f"{c}_tok_s": row["tok_s"],
                    f"{c}_ttft_p50_s": row["ttft_p50_s"],
                    f"{c}_ttft_p99_s": row["ttft_p99_s"],
                    f"{c}_tpot_p50_s": row["tpot_p50_s"],
                    f"{c}_itl_p99_s": row["itl_p99_s"],
                    f"{c}_e2e_p99_s": row["e2e_p99_s"],
                }
            )
        summary.update(
            {
                "overload_capacity_req_s": capacity,
                "overload_offered_req_s": overload["offered_req_s"],
                "overload_in_time_share": overload["in_time_share"],
                "overload_refused_share": overload["refused_share"],
                "overload_dropped_share": overload["dropped_share"],
                "overload_late_served": overload["late_served"],
            }
        )
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()}))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
