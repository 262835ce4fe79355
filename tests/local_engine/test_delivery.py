"""Delivery across the thread boundary: a step's items reach an event loop in one wakeup, unread deltas merge."""

from __future__ import annotations

import asyncio
from typing import Any

from parley.local_engine import EngineConfig, SamplingParams
from parley.local_engine.delivery import LoopSink, Outbox, merge_deltas
from parley.local_engine.outputs import GenerationOutput, StreamDelta, TokenLogprob
from tests.local_engine.conftest import prompts_of


def _delta(tokens: tuple[int, ...], *, finished: bool = False, ttft: float | None = None,
           logprobs: tuple[TokenLogprob, ...] | None = None) -> StreamDelta:
    return StreamDelta("r", tokens, finished, "length" if finished else None, 5, 0, ttft,
                       tpot_s=0.01 if finished else None, logprobs=logprobs)


async def test_n_streams_get_one_wakeup_per_step_not_one_per_token(tiny_engine: Any) -> None:
    n, tokens = 8, 12

    async def consume(prompt: list[int]) -> list[int]:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True)
        return [t async for d in tiny_engine.stream(prompt, params) for t in d.token_ids]

    prompts = prompts_of([6 + i for i in range(n)], seed=3)
    got = await asyncio.gather(*(consume(p) for p in prompts))
    core = tiny_engine._core
    assert got == [o.token_ids for o in tiny_engine.generate(prompts, SamplingParams(max_tokens=tokens,
                                                                                       ignore_eos=True))]
    # generate() used its own queue; every stream item (n*tokens deltas, n outputs) came in <= one wakeup per step
    assert core.outbox.wakeups <= core.steps
    assert core.outbox.wakeups < n * tokens / 2


async def test_unread_deltas_merge_into_one() -> None:
    sink = LoopSink(asyncio.get_running_loop())
    a, b = TokenLogprob(7, -0.5), TokenLogprob(8, -1.5)
    sink.put(_delta((7,), ttft=0.2, logprobs=(a,)))
    sink.put(_delta((8, 9), logprobs=(b,)))
    sink.put(_delta((10,), finished=True))
    output = GenerationOutput("r", [7, 8, 9, 10], "length", 5, 0)
    sink.put(output)
    assert list(sink.items) == [
        StreamDelta("r", (7, 8, 9, 10), True, "length", 5, 0, 0.2, tpot_s=0.01, logprobs=(a, b)), output,
    ]


def test_a_finished_delta_is_never_merged_into() -> None:
    merged = merge_deltas(_delta((1,)), _delta((2,), finished=True))
    assert merged.token_ids == (1, 2) and merged.finished and merged.logprobs is None


async def test_a_waiting_consumer_wakes_on_put_and_after_its_timeout() -> None:
    loop = asyncio.get_running_loop()
    sink = LoopSink(loop)
    waiting = asyncio.ensure_future(sink.wait(30.0))
    await asyncio.sleep(0)
    sink(_delta((4,)))  # from "another thread": call_soon_threadsafe
    await asyncio.wait_for(waiting, 5)
    assert [d.token_ids for d in sink.items] == [(4,)]
    sink.items.clear()
    await asyncio.wait_for(sink.wait(0.01), 5)  # nothing came: returns so the caller can check the engine
    assert not sink.items and sink.waiter is None


def test_items_for_a_closed_loop_report_their_requests_gone() -> None:
    loop = asyncio.new_event_loop()
    sink = LoopSink(loop)
    loop.close()
    outbox = Outbox()
    outbox.put(sink, _delta((1,)), "req-1")
    outbox.put(sink, _delta((2,)), "req-1")
    gone: list[str] = []
    outbox.flush(gone.append)
    assert gone == ["req-1"] and outbox.wakeups == 0 and not outbox


async def test_a_stream_interval_batches_the_middle_of_a_stream_never_its_first_or_last_token(
    tiny_hf: Any,
) -> None:
    """With `stream_interval_s` the event loop is woken at most that often (the hand-over competes with the
    step's threads for the cores); the first token (TTFT) and the last one (the answer's end) go at once."""
    from tests.local_engine.conftest import engine_from_hf

    tokens = 24
    prompt = prompts_of([6], seed=4)[0]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)

    async def run(interval: float) -> tuple[list[tuple[int, ...]], int, int]:
        engine = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=64, block_size=4, stream_interval_s=interval))
        try:
            deltas = []
            async for delta in engine.stream(prompt, params):
                deltas.append(delta.token_ids)
                await asyncio.sleep(0)
            return deltas, engine._core.outbox.wakeups, engine._core.steps
        finally:
            engine.close()

    every_step, woken_each, steps = await run(0.0)
    batched, woken_batched, _ = await run(1.0)  # longer than the whole stream
    assert [t for d in batched for t in d] == [t for d in every_step for t in d]
    assert woken_each >= steps - 1
    assert len(batched[0]) == 1  # the first token alone, at once
    assert woken_batched <= 3  # first token, then the rest with the last one
    assert len(batched) <= 3


def test_a_stream_interval_outside_zero_to_one_second_is_refused() -> None:
    import pytest

    from parley.local_engine.errors import EngineConfigError

    for bad in (-0.1, 2, "fast", True):
        with pytest.raises(EngineConfigError, match="stream_interval_s"):
            EngineConfig(stream_interval_s=bad)  # type: ignore[arg-type]
