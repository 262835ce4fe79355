"""Server-sent events and the per-request latency figures both streaming dialects share.

OpenAI streams are bare `data:` lines ending with `data: [DONE]`; Anthropic streams name each
event (`event: message_start` ... `event: message_stop`). Proxies must not buffer either, hence
`SSE_HEADERS`.
"""

from __future__ import annotations

import json
from typing import Any

from parley.server.metrics import Metrics
from parley.server.turn import TurnEnd

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def sse_data(payload: dict[str, Any]) -> str:
    """One unnamed event (OpenAI style)."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def sse_event(name: str, payload: dict[str, Any]) -> str:
    """One named event (Anthropic style); the payload's `type` repeats the name, as Anthropic's does."""
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def observe_end(metrics: Metrics, end: TurnEnd) -> None:
    """Record a finished turn's tokens and latencies."""
    metrics.inc("prompt_tokens_total", end.prompt_tokens)
    metrics.inc("cached_prompt_tokens_total", end.cached_tokens)
    metrics.inc("generation_tokens_total", end.output_tokens)
    if end.ttft_s is not None:
        metrics.observe("time_to_first_token_seconds", end.ttft_s)
        if end.output_tokens > 1:
            metrics.observe("time_per_output_token_seconds", (end.e2e_s - end.ttft_s) / (end.output_tokens - 1))
    metrics.observe("e2e_request_latency_seconds", end.e2e_s)
