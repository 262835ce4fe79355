"""Measured step costs for deadline admission: what would a request arriving now take to finish?

Two traps shape this module:

- A decode step's cost depends on how many sequences share it, so one average over every step mixes a
  busy period's batch-of-8 steps into the estimate for a request that will run alone. Decode costs are
  kept per batch-size bucket (1, 2, 3-4, 5-8, ...) and an estimate uses the bucket of the batch the new
  request would join.
- Admission control feeds on itself: a refused request runs no steps, so a pessimistic average never gets
  corrected and an idle engine could refuse every deadline request forever. Each estimate therefore decays,
  with the age of its last measurement, toward the best cost ever measured for that bucket; and a bucket
  never measured borrows the nearest measured one, scaled linearly by batch size (optimistic downwards).
  Erring towards admission is the safe side: an admitted request produces a fresh measurement (and is
  dropped at its deadline if it was too optimistic), a refused one produces nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

_ALPHA = 0.2  # EMA weight of a new measurement
HALF_LIFE_S = 5.0  # an estimate unrefreshed this long has moved half way back to its best measured value
PREFILL_MIN_TOKENS = 16  # steps feeding fewer prompt tokens say little about per-token prefill cost


def batch_bucket(batch: int) -> int:
    """Power-of-two ceiling: 1, 2, 4, 8, ... (batch 3 shares the bucket of batch 4)."""
    return 1 if batch <= 1 else 1 << (batch - 1).bit_length()


@dataclass
class _Cost:
    """EMA of one cost, the best value seen, and when it was last measured."""

    ema: float
    best: float
    updated: float

    def record(self, value: float, now: float) -> None:
        self.ema = (1 - _ALPHA) * self.ema + _ALPHA * value
        self.best = min(self.best, value)
        self.updated = now

    def estimate(self, now: float) -> float:
        keep = 0.5 ** (max(now - self.updated, 0.0) / HALF_LIFE_S)
        return self.best + (self.ema - self.best) * keep


class StepTimer:
    """Per-batch-size decode step costs and per-token prefill cost, decaying toward their best when stale.

    Thread-safety: `record` runs on the engine thread, estimates on submitting threads; a dict insert and
    float updates are atomic enough under the GIL for an estimate (never for correctness).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._decode: dict[int, _Cost] = {}  # batch bucket -> cost of one pure-decode step
        self._prefill: _Cost | None = None  # seconds per token in prefill-heavy steps

    def record(self, elapsed: float, num_tokens: int, num_decode: int) -> None:
        now = self.clock()
        if num_decode and num_tokens == num_decode:
            bucket = batch_bucket(num_decode)
            cost = self._decode.get(bucket)
            if cost is None:
                self._decode[bucket] = _Cost(elapsed, elapsed, now)
            else:
                cost.record(elapsed, now)
        elif num_tokens - num_decode >= PREFILL_MIN_TOKENS:
            per = elapsed / num_tokens
            if self._prefill is None:
                self._prefill = _Cost(per, per, now)
            else:
                self._prefill.record(per, now)

    @property
    def measured(self) -> bool:
        return bool(self._decode) or self._prefill is not None

    def decode_step_s(self, batch: int = 1) -> float | None:
        """Estimated seconds of one decode step with `batch` sequences; None before any measurement."""
        if not self._decode:
            return None
        now = self.clock()
        bucket = batch_bucket(batch)
        cost = self._decode.get(bucket)
        if cost is not None:
            return cost.estimate(now)
        nearest = min(self._decode, key=lambda b: (abs(b.bit_length() - bucket.bit_length()), b))
        return self._decode[nearest].estimate(now) * bucket / nearest

    def prefill_token_s(self) -> float | None:
        return None if self._prefill is None else self._prefill.estimate(self.clock())

    def by_batch(self) -> dict[int, float]:
        """Current decode-step estimate of every measured bucket (for stats)."""
        now = self.clock()
        return {b: round(c.estimate(now), 6) for b, c in sorted(self._decode.items())}

    def estimate_s(self, *, batch: int, ahead_tokens: int, prompt_tokens: int, max_tokens: int) -> float | None:
        """Seconds for a request to finish: prefill of everything queued ahead plus its own prompt, then
        `max_tokens` decode steps at the batch size it would join. None before any measurement."""
        if not self.measured:
            return None
        prefill = (self.prefill_token_s() or 0.0) * (ahead_tokens + prompt_tokens)
        return prefill + (self.decode_step_s(batch) or 0.0) * max_tokens
