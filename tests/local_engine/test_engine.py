"""Engine behaviour on tiny random-weight Llama models: parity with HF, batching, streaming, cancellation,
preemption, deadlines, validation, stop strings, hooks. Fast: no model files."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest

from tests.local_engine.conftest import engine_from_hf, prompts_of, tiny_hf_model

torch = pytest.importorskip("torch")

from parley.local_engine import (  # noqa: E402
    DeadlineUnreachableError,
    EngineConfig,
    EngineError,
    InvalidRequestError,
    QueueFullError,
    RequestAborted,
    SamplingParams,
    StreamDelta,
)

GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


def hf_greedy(hf: Any, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def test_greedy_matches_hf_generate_with_chunked_prefill(tiny_hf: Any, tiny_engine: Any) -> None:
    prompts = prompts_of([1, 3, 17, 64, 100, 150])  # 100 and 150 exceed the 64-token step budget: chunked
    outs = tiny_engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(tiny_hf, prompt, 24)
        assert out.finish_reason == "length" and out.prompt_tokens == len(prompt)


def test_prefill_logits_match_hf(tiny_hf: Any, tiny_engine: Any) -> None:
    prompt = prompts_of([40])[0]
    out = tiny_engine.generate([prompt], SamplingParams(max_tokens=1, logprobs=5))[0]
    with torch.no_grad():
        ref = torch.log_softmax(tiny_hf(torch.tensor([prompt])).logits[0, -1].float(), -1)
    lp = out.logprobs[0]
    for tok, value in lp.top.items():
        assert value == pytest.approx(ref[tok].item(), abs=1e-4)
    assert list(lp.top) == ref.topk(5).indices.tolist()


def test_concurrent_requests_equal_solo_runs(tiny_engine: Any) -> None:
    prompts = prompts_of([2 + 7 * i for i in range(16)], seed=3)
    together = tiny_engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, together, strict=True):
        assert out.token_ids == tiny_engine.generate([prompt], GREEDY)[0].token_ids


def test_seeded_sampling_reproduces_and_is_batch_invariant(tiny_engine: Any) -> None:
    p = SamplingParams(max_tokens=20, temperature=1.0, seed=123, ignore_eos=True)
    prompt = prompts_of([9])[0]
    solo = tiny_engine.generate([prompt], p)[0].token_ids
    assert solo == tiny_engine.generate([prompt], p)[0].token_ids
    crowd = prompts_of([5, 11, 30], seed=9)
    mixed = tiny_engine.generate([crowd[0], prompt, crowd[1], crowd[2]], p)
    assert mixed[1].token_ids == solo
    other = tiny_engine.generate([prompt], SamplingParams(max_tokens=20, temperature=1.0, seed=124, ignore_eos=True))
    assert other[0].token_ids != solo


async def test_stream_yields_deltas_then_a_final_one(tiny_engine: Any) -> None:
    prompt = prompts_of([12])[0]
    deltas: list[StreamDelta] = []
    async for d in tiny_engine.stream(prompt, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1)):
        deltas.append(d)
    assert deltas[-1].finished and deltas[-1].finish_reason == "length"
    assert not any(d.finished for d in deltas[:-1])
    tokens = [t for d in deltas for t in d.token_ids]
    assert tokens == tiny_engine.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    assert all(d.prompt_tokens == 12 for d in deltas)
    assert deltas[0].ttft_s is not None and deltas[0].ttft_s >= 0
    assert sum(len(d.logprobs or ()) for d in deltas) == 6


async def test_cancelling_1000_streams_leaks_no_blocks(tiny_engine: Any) -> None:
    rng = random.Random(0)

    async def consume(i: int) -> None:
        prompt = [rng.randrange(3, 320) for _ in range(rng.randrange(1, 40))]
        stop_after = rng.randrange(0, 6)
        rid = f"cancel-{i}"
        agen = tiny_engine.stream(prompt, SamplingParams(max_tokens=50, ignore_eos=True), request_id=rid)
        seen = 0
        async for _ in agen:
            seen += 1
            if seen >= stop_after:
                break
        await agen.aclose()  # leaving early aborts the request
        if i % 7 == 0:
            tiny_engine.abort(rid)  # aborting an already-finished id is harmless

    for batch in range(10):
        await asyncio.gather(*(consume(batch * 100 + i) for i in range(100)))
    stats = await _settled(tiny_engine)
    assert stats["blocks_used"] == 0 and stats["num_running"] == 0 and stats["num_waiting"] == 0
    out = tiny_engine.generate([prompts_of([10])[0]], GREEDY)[0]  # still serves
    assert len(out.token_ids) == 24


async def _settled(engine: Any) -> dict[str, Any]:
    for _ in range(200):
        stats = engine.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0:
            return stats
        await asyncio.sleep(0.02)
    return engine.stats()


def test_small_pool_preempts_and_outputs_stay_correct(tiny_hf: Any, tiny_engine: Any) -> None:
    prompts = prompts_of([20, 25, 30, 35, 40, 45], seed=5)
    expected = [o.token_ids for o in tiny_engine.generate(prompts, GREEDY)]
    small = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=24, block_size=4, max_num_batched_tokens=64))
    try:
        got = small.generate(prompts, GREEDY)
        assert [o.token_ids for o in got] == expected
        stats = small.stats()
        assert stats["preemptions"] > 0 and stats["blocks_used"] == 0
    finally:
        small.close()


def test_eviction_under_memory_pressure_keeps_outputs_correct(tiny_hf: Any) -> None:
    engine = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=40, block_size=4, max_num_batched_tokens=64))
    try:
        shared = prompts_of([48], seed=11)[0]
        first = engine.generate([shared + [7]], GREEDY)[0]
        for noise in prompts_of([60, 60, 60], seed=12):  # churn the pool: evicts the cached prefix
            engine.generate([noise], GREEDY)
        again = engine.generate([shared + [7]], GREEDY)[0]
        assert engine.stats()["evictions"] > 0
        assert again.token_ids == first.token_ids
    finally:
        engine.close()


def test_prefix_cache_hits_are_reported_and_salted_by_tenant(tiny_engine: Any) -> None:
    prefix = prompts_of([64], seed=21)[0]
    cold = tiny_engine.generate([prefix + [5, 6, 7]], GREEDY, tenant="alice")[0]
    warm = tiny_engine.generate([prefix + [5, 6, 7]], GREEDY, tenant="alice")[0]
    other = tiny_engine.generate([prefix + [5, 6, 7]], GREEDY, tenant="bob")[0]
    assert cold.cached_tokens == 0 and warm.cached_tokens == 64 and other.cached_tokens == 0
    assert warm.token_ids == cold.token_ids == other.token_ids


@pytest.mark.parametrize(
    ("prompt", "params"),
    [
        ([], SamplingParams()),
        ([1] * 1024, SamplingParams()),  # tiny context is 1024
        ([1, 320], SamplingParams()),
        ([1, -1], SamplingParams()),
    ],
)
def test_bad_prompts_are_refused_at_submission(tiny_engine: Any, prompt: list[int], params: SamplingParams) -> None:
    with pytest.raises(InvalidRequestError):
        tiny_engine.generate([prompt], params)


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": math.nan}, {"temperature": -0.5}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_tokens": 0},
     {"top_k": -1}, {"logprobs": -1}],
)
def test_bad_sampling_params_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)


async def test_deadline_refused_at_arrival_with_retry_hint(tiny_engine: Any) -> None:
    tiny_engine.generate(prompts_of([30]), GREEDY)  # measure step times
    with pytest.raises(DeadlineUnreachableError) as info:
        async for _ in tiny_engine.stream(prompts_of([30])[0], SamplingParams(max_tokens=500), deadline_s=1e-6):
            pass
    assert info.value.retry_after_s is not None and info.value.retry_after_s > 0


async def test_request_past_its_deadline_is_dropped(tiny_hf: Any) -> None:
    engine = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=256, block_size=4))  # no step times yet: admitted
    try:
        got = 0
        with pytest.raises(RequestAborted):
            async for d in engine.stream(prompts_of([8])[0], SamplingParams(max_tokens=1000, ignore_eos=True),
                                         deadline_s=0.05):
                got += len(d.token_ids)
        assert got < 1000
        assert (await _settled(engine))["blocks_used"] == 0
    finally:
        engine.close()


def test_bounded_waiting_queue_refuses_overflow(tiny_hf: Any) -> None:
    engine = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=256, block_size=4, max_num_seqs=1, max_waiting=3))
    try:
        loop = asyncio.new_event_loop()
        refused = 0
        streams = []
        for i in range(12):
            try:
                streams.append(engine._submit(prompts_of([8])[0], SamplingParams(max_tokens=200, ignore_eos=True),
                                              lambda item: None, hooks=None, tenant=None, request_id=f"q{i}",
                                              deadline_s=None))
            except QueueFullError as exc:
                refused += 1
                assert exc.retry_after_s is not None
        assert refused >= 12 - 4
        for s in streams:
            engine.abort(s.request_id)
        loop.close()
    finally:
        engine.close()


def test_stop_strings_end_the_request(tiny_engine: Any) -> None:
    prompt = prompts_of([10], seed=4)[0]
    free = tiny_engine.generate([prompt], GREEDY)[0].token_ids
    text = "".join(chr(t) for t in free)
    stop = text[4:6]
    expected_len = next(i for i in range(len(text)) if stop in text[: i + 1]) + 1
    out = tiny_engine.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == free[:expected_len]


class ScriptHook:
    """Forces a fixed token script, then declares itself terminated; masks to even ids otherwise."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.accepted: list[int] = []

    def forced_token(self) -> int | None:
        return self.script[len(self.accepted)] if len(self.accepted) < len(self.script) else None

    def fill_bitmask(self, row: Any) -> bool:
        row.fill_(0x55555555)
        return True

    def accept_token(self, token_id: int) -> None:
        self.accepted.append(token_id)

    def is_terminated(self) -> bool:
        return len(self.accepted) >= len(self.script) + 3


def test_hooks_force_mask_and_terminate(tiny_engine: Any) -> None:
    hook = ScriptHook([11, 13])
    out = tiny_engine.generate([prompts_of([6])[0]], GREEDY, hooks=[hook])[0]
    assert out.token_ids[:2] == [11, 13]
    assert all(t % 2 == 0 for t in out.token_ids[2:])
    assert out.finish_reason == "stop" and len(out.token_ids) == 5
    assert hook.accepted == out.token_ids


class BrokenHook(ScriptHook):
    def __init__(self, mode: str) -> None:
        super().__init__([])
        self.mode = mode

    def fill_bitmask(self, row: Any) -> bool:
        if self.mode == "raise" and len(self.accepted) == 2:
            raise RuntimeError("grammar exploded")
        if self.mode == "empty":
            row.fill_(0)
            return True
        return super().fill_bitmask(row)


@pytest.mark.parametrize("mode", ["raise", "empty"])
async def test_a_broken_hook_fails_only_its_own_request(tiny_engine: Any, mode: str) -> None:
    async def healthy() -> list[int]:
        return [t async for d in tiny_engine.stream(prompts_of([9])[0], GREEDY) for t in d.token_ids]

    async def broken() -> None:
        async for _ in tiny_engine.stream(prompts_of([7])[0], GREEDY, hooks=BrokenHook(mode)):
            pass

    results = await asyncio.gather(healthy(), broken(), return_exceptions=True)
    assert results[0] == tiny_engine.generate([prompts_of([9])[0]], GREEDY)[0].token_ids
    assert isinstance(results[1], EngineError) and "hook" in str(results[1])
    assert (await _settled(tiny_engine))["blocks_used"] == 0


def test_bf16_runs_and_agrees_with_hf_bf16(tiny_hf: Any) -> None:
    import copy

    hf_bf16 = copy.deepcopy(tiny_hf).to(torch.bfloat16)
    engine = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=256, block_size=4), dtype=torch.bfloat16)
    try:
        prompts = [prompts_of([20], seed=s)[0] for s in range(6)]
        outs = engine.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
        agree = sum(o.token_ids[:2] == hf_greedy(hf_bf16, p, 2) for p, o in zip(prompts, outs, strict=True))
        assert agree >= 5  # bf16 rounding differs by kernel; near-ties may flip
    finally:
        engine.close()


async def test_closed_engine_refuses_work(tiny_hf: Any) -> None:
    engine = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=64, block_size=4))
    engine.close()
    with pytest.raises(EngineError):
        engine.generate([[5, 6]], GREEDY)


def test_other_architecture_sizes_work() -> None:
    # multi-query attention (1 KV head) and no tied embeddings
    hf = tiny_hf_model(seed=1, num_key_value_heads=1, tie_word_embeddings=False)
    engine = engine_from_hf(hf, EngineConfig(num_kv_blocks=64, block_size=8))
    try:
        prompt = prompts_of([21], seed=2)[0]
        assert engine.generate([prompt], GREEDY)[0].token_ids == hf_greedy(hf, prompt, 24)
    finally:
        engine.close()


async def test_cancelling_the_consumer_task_aborts_the_request(tiny_engine: Any) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in tiny_engine.stream(prompts_of([10])[0], SamplingParams(max_tokens=900, ignore_eos=True)):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = await _settled(tiny_engine)
    assert stats["blocks_used"] == 0 and stats["num_running"] == 0
