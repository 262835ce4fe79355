"""Prometheus text exposition for `GET /metrics`, without a client library.

Counters only grow (hit rate = rate(hits) / rate(queries) over any window, the lesson of SGLang's
gauge that reset after decode); latency is in histograms with fixed buckets. Engine counters
(prefix-cache queries/hits in tokens, blocks, queue depth) are read from `engine.stats()` at scrape
time, so they cannot drift from the engine's own ledger.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "parley"

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1


class Metrics:
    """The server's counters and histograms; thread-safe (uvicorn's loop and test threads both touch it)."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._histograms: dict[str, Histogram] = {
            "time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
            "time_per_output_token_seconds": Histogram(TPOT_BUCKETS),
            "e2e_request_latency_seconds": Histogram(E2E_BUCKETS),
        }
        self._help: dict[str, str] = {
            "requests_total": "HTTP requests by endpoint and status code.",
            "prompt_tokens_total": "Prompt tokens of served requests (cached ones included).",
            "generation_tokens_total": "Generated tokens.",
            "cached_prompt_tokens_total": "Prompt tokens served from the prefix cache.",
            "requests_refused_total": "Requests refused by admission control (queue full or deadline).",
            "requests_aborted_total": "Requests cancelled because the client went away.",
            "time_to_first_token_seconds": "Arrival to first generated token.",
            "time_per_output_token_seconds": "Mean time per output token after the first, per request.",
            "e2e_request_latency_seconds": "Arrival to last token.",
        }
        self._in_flight = 0
        self._stats = stats

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + amount

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self._histograms[name].observe(value)

    def counter(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0.0)

    def request_started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def request_finished(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def render(self) -> str:
        """The whole exposition, text format 0.0.4."""
        lines: list[str] = []
        with self._lock:
            names = sorted({name for name, _ in self._counters} | {"requests_total"})
            for name in names:
                lines += [f"# HELP {PREFIX}_{name} {self._help.get(name, name)}", f"# TYPE {PREFIX}_{name} counter"]
                for (metric, labels), value in sorted(self._counters.items()):
                    if metric == name:
                        lines.append(f"{PREFIX}_{name}{_labels(labels)} {_number(value)}")
            for name, hist in self._histograms.items():
                lines += [f"# HELP {PREFIX}_{name} {self._help[name]}", f"# TYPE {PREFIX}_{name} histogram"]
                for bound, count in zip(hist.buckets, hist.counts, strict=True):
                    lines.append(f'{PREFIX}_{name}_bucket{{le="{_number(bound)}"}} {count}')
                lines.append(f'{PREFIX}_{name}_bucket{{le="+Inf"}} {hist.n}')
                lines.append(f"{PREFIX}_{name}_sum {_number(hist.total)}")
                lines.append(f"{PREFIX}_{name}_count {hist.n}")
            in_flight = self._in_flight
        lines += _engine_lines(self._stats() if self._stats else {}, in_flight)
        return "\n".join(lines) + "\n"


# engine.stats() key -> (exposed name, type, help). Unknown numeric keys are exposed as gauges.
_ENGINE_KEYS: dict[str, tuple[str, str, str]] = {
    "prefix_cache_queries": ("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache."),
    "prefix_cache_hits": ("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache."),
    "evictions": ("kv_block_evictions_total", "counter", "Cached KV blocks evicted for reuse."),
}
_QUEUE_KEYS = ("num_waiting", "waiting", "queue_depth", "waiting_requests")
_RUNNING_KEYS = ("num_running", "running", "running_requests")


def _engine_lines(stats: Mapping[str, Any], in_flight: int) -> list[str]:
    lines: list[str] = []
    seen: set[str] = set()

    def emit(name: str, kind: str, help_text: str, value: float) -> None:
        if name in seen:
            return
        seen.add(name)
        lines.extend(
            [
                f"# HELP {PREFIX}_{name} {help_text}",
                f"# TYPE {PREFIX}_{name} {kind}",
                f"{PREFIX}_{name} {_number(value)}",
            ]
        )

    numeric = {k: float(v) for k, v in stats.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    for key, (name, kind, help_text) in _ENGINE_KEYS.items():
        emit(name, kind, help_text, numeric.get(key, 0.0))
    queue = next((numeric[k] for k in _QUEUE_KEYS if k in numeric), None)
    emit("queue_depth", "gauge", "Requests waiting for admission to the running batch.", queue or 0.0)
    running = next((numeric[k] for k in _RUNNING_KEYS if k in numeric), None)
    if running is not None:
        emit("running_requests", "gauge", "Requests in the running batch.", running)
    emit("http_requests_in_flight", "gauge", "Requests the server is handling now.", float(in_flight))
    for key in sorted(numeric):
        if key in _ENGINE_KEYS or key in _QUEUE_KEYS or key in _RUNNING_KEYS:
            continue
        emit("engine_" + _sanitize(key), "gauge", f"engine.stats()[{key!r}]", numeric[key])
    threads = stats.get("decode_threads")
    if isinstance(threads, Mapping) and threads:  # the GEMM threads the engine chose per decode batch size
        name = f"{PREFIX}_engine_decode_threads"
        lines += [f"# HELP {name} Threads a decode step's weight GEMMs run on, per batch-size bucket (probed).",
                  f"# TYPE {name} gauge"]
        lines += [f'{name}{{batch_bucket="{bucket}"}} {_number(float(count))}' for bucket, count in threads.items()]
    return lines


def _sanitize(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)


def parse_exposition(text: str) -> dict[str, float]:
    """Sample name (with labels) -> value; for tests and the benchmark."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        values[name] = float(value)
    return values
