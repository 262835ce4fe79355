"""What the engine hands back: a finished generation, and the per-step deltas of a stream. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of the chosen token and the top alternatives (token id -> logprob), from fp32 logits."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamDelta:
    """Tokens new since the previous delta, plus the request's figures so far.

    `cached_tokens` are prompt tokens served from the prefix cache; `ttft_s` is submission -> first token;
    `tpot_s` (time per output token after the first) is set on the final delta.
    """

    request_id: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: FinishReason | None
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    tpot_s: float | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class GenerationOutput:
    """A finished request: every output token and the figures."""

    request_id: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None = None
    tpot_s: float | None = None
    logprobs: list[TokenLogprob] | None = None
