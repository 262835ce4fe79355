"""Deadline admission estimates: keyed by the batch a request would join, and never stuck high while idle.

Regression: after a busy period (two clients decoding together), an idle engine kept refusing short
deadline requests forever, because the single step-time average stayed at the busy value and refused
requests run no steps to correct it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.local_engine.conftest import engine_from_hf

torch = pytest.importorskip("torch")

from parley.local_engine import EngineConfig, SamplingParams  # noqa: E402
from parley.local_engine.step_timer import HALF_LIFE_S, StepTimer, batch_bucket  # noqa: E402


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_batch_buckets_are_powers_of_two() -> None:
    assert [batch_bucket(b) for b in (0, 1, 2, 3, 4, 5, 8, 9, 64)] == [1, 1, 2, 4, 4, 8, 8, 16, 64]


def test_stale_costs_decay_toward_the_best_measured() -> None:
    clock = FakeClock()
    timer = StepTimer(clock)
    for _ in range(5):
        timer.record(0.05, 1, 1)
    for _ in range(30):  # the machine got busy
        timer.record(0.5, 1, 1)
    busy = timer.decode_step_s(1)
    assert busy is not None and busy > 0.45
    clock.now += HALF_LIFE_S
    half = timer.decode_step_s(1)
    assert half is not None and half == pytest.approx(0.05 + (busy - 0.05) / 2)
    clock.now += 10 * HALF_LIFE_S
    assert timer.decode_step_s(1) == pytest.approx(0.05, rel=0.01)


def test_an_unmeasured_batch_size_borrows_the_nearest_scaled() -> None:
    timer = StepTimer(FakeClock())
    assert timer.estimate_s(batch=1, ahead_tokens=0, prompt_tokens=10, max_tokens=8) is None
    timer.record(0.4, 4, 4)
    assert timer.decode_step_s(1) == pytest.approx(0.1)
    assert timer.decode_step_s(3) == pytest.approx(0.4)
    assert timer.decode_step_s(8) == pytest.approx(0.8)
    timer.record(0.32, 32, 0)  # prefill: 0.01 s per token
    assert timer.estimate_s(batch=4, ahead_tokens=5, prompt_tokens=5, max_tokens=10) == pytest.approx(0.1 + 4.0)


def test_idle_engine_admits_short_deadline_requests_after_a_busy_period(tiny_hf: Any) -> None:
    engine = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=256, block_size=4))
    clock = FakeClock()
    engine.timer.clock = clock
    real_run = engine.runner.run

    def run(items: Any) -> Any:  # forced step costs: alone 50 ms, two together 300 ms (a loaded machine)
        decodes = sum(1 for it in items if it.num_new_tokens == 1)
        prefill_tokens = sum(it.num_new_tokens for it in items if it.num_new_tokens > 1)
        clock.now += 0.001 * prefill_tokens + {0: 0.0, 1: 0.05}.get(decodes, 0.3)
        return real_run(items)

    engine.runner.run = run
    try:
        prompt = list(range(10, 30))
        engine.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True))  # solo warm-up
        engine.generate([prompt, prompt[::-1]], SamplingParams(max_tokens=30, ignore_eos=True))  # 2 clients
        assert engine.stats()["decode_step_s_by_batch"][2] > 0.29
        # The old single average sat at ~0.3 s/step: 8 tokens "needed" 2.4 s and every request was refused.

        async def one() -> int:
            n = 0
            async for d in engine.stream(prompt, SamplingParams(max_tokens=8, ignore_eos=True), deadline_s=2.0):
                n += len(d.token_ids)
            return n

        for _ in range(3):  # idle now: each 8-token request alone takes ~0.4 s, well inside 2 s
            assert asyncio.run(one()) == 8
        est = engine.stats()["decode_step_s"]
        assert est == pytest.approx(0.05, rel=0.05)
    finally:
        engine.close()
