"""Sliding-window attention (Mistral, Qwen2 with use_sliding_window, gpt-oss's alternating layers): sequences
far longer than the window match HF, the window changes the answer (so ignoring it is caught), windowed
layers never read keys/values outside their window, and the engine counts the blocks they skip. A model whose
every layer is windowed returns those blocks to the pool as a sequence decodes (and counts them)."""

from __future__ import annotations

import math

import pytest

from tests.local_engine.families import (
    FAMILIES,
    WINDOW,
    engine_of,
    greedy,
    hf_greedy,
    hf_logits,
    hf_model,
    logits_every_position,
    our_model,
    parity,
    prompts_of,
)

torch = pytest.importorskip("torch")

from parley.local_engine import Engine, SamplingParams  # noqa: E402
from parley.local_engine.models.decoder import DecoderModel  # noqa: E402
from parley.local_engine.runner import ModelRunner  # noqa: E402
from parley.local_engine.scheduler import ScheduledSeq, SchedulerOutput  # noqa: E402
from parley.local_engine.sequence import Sequence  # noqa: E402

WINDOWED = ["mistral", "qwen2-window", "qwen3-moe-window", "gpt-oss"]


@pytest.mark.parametrize("family", WINDOWED)
def test_sequences_far_longer_than_the_window_match_hf(family: str) -> None:
    hf = hf_model(family)
    engine = engine_of(our_model(hf))
    try:
        prompts = prompts_of([6 * WINDOW, 2 * WINDOW + 3], seed=11)
        outs = engine.generate(prompts, greedy(32))
        assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 32) for p in prompts]
        assert engine.stats()["window_blocks_skipped"] > 0
    finally:
        engine.close()


@pytest.mark.parametrize("family", WINDOWED)
def test_the_window_changes_the_logits(family: str) -> None:
    """HF without the window, on the same weights, differs from HF with it: our match is not by luck."""
    hf = hf_model(family)
    f = FAMILIES[family]
    unwindowed_cfg = hf.config.to_dict() | {"sliding_window": 100_000}  # longer than anything: no window
    twin = f.model(f.config(**unwindowed_cfg)).eval()
    twin.load_state_dict(hf.state_dict())
    prompt = prompts_of([5 * WINDOW], seed=12)[0]
    ours = logits_every_position(our_model(hf), prompt, [len(prompt)])
    _, with_window = parity(ours, hf_logits(hf, prompt))
    _, without_window = parity(ours[WINDOW:], hf_logits(twin, prompt)[WINDOW:])
    assert with_window <= 1e-4 < 1e-2 < without_window


def poisoned_run(net: DecoderModel, prompt: list[int], chunks: list[int], poison: bool) -> torch.Tensor:
    """Logits of `chunks` through a private pool; with `poison`, before each chunk every windowed layer's
    keys/values at positions no later token can see (< first position - window + 1) are set to NaN."""
    windows = net.arch.layer_windows
    runner = ModelRunner(net, num_blocks=64, block_size=4)
    seq = Sequence("p", prompt, SamplingParams())
    seq.block_table = list(range(63, 63 - 2 * math.ceil(len(prompt) / 4), -2))
    rows = []
    with torch.inference_mode():
        for n in chunks:
            start = seq.num_computed_tokens
            dead = max(start - WINDOW + 1, 0)
            if poison and dead:
                slots = runner._slots(seq.block_table, 0, dead)
                for layer, window in enumerate(windows):
                    if window is not None:
                        runner.kv_cache[layer].index_fill_(1, slots, float("nan"))
            ids, pos, batch, _ = runner.prepare([ScheduledSeq.of(seq, n)])
            rows.append(net.compute_logits(net.forward(ids, pos, runner.kv_cache, batch)))
            seq.num_computed_tokens += n
    return torch.cat(rows)


@pytest.mark.parametrize("family", WINDOWED)
def test_windowed_layers_never_read_kv_outside_their_window(family: str) -> None:
    net = our_model(hf_model(family))
    prompt = prompts_of([40], seed=13)[0]
    chunks = [17, 11, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]  # a chunk, a chunk after a poisoned prefix, decodes
    clean = poisoned_run(net, prompt, chunks, poison=False)
    dirty = poisoned_run(net, prompt, chunks, poison=True)
    assert torch.isfinite(dirty).all()
    assert torch.equal(clean, dirty)


def test_full_attention_models_skip_nothing() -> None:
    engine = engine_of(our_model(hf_model("llama3")))
    try:
        engine.generate(prompts_of([40], seed=14), greedy(8))
        assert engine.stats()["window_blocks_skipped"] == 0
    finally:
        engine.close()


# -- all-windowed models free their blocks --------------------------------------------------------------
def held_blocks_per_decode(engine: Engine) -> list[int]:
    """Record, at every scheduled decode, how many blocks its sequence holds (after the step's allocation)."""
    held: list[int] = []
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        out = schedule()
        held.extend(engine.block_manager.num_held_blocks(it.seq) for it in out.items if it.is_decode)
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    return held


@pytest.mark.parametrize("family", ["mistral", "qwen3-moe-window"])
def test_a_long_decode_of_an_all_windowed_model_holds_only_its_window(family: str) -> None:
    hf = hf_model(family)
    engine = engine_of(our_model(hf))
    try:
        assert engine.block_manager.window == WINDOW
        held = held_blocks_per_decode(engine)
        prompts = prompts_of([10, 3 * WINDOW + 1], seed=21)
        outs = engine.generate(prompts, greedy(48))
        assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 48) for p in prompts]
        assert held and max(held) <= math.ceil(WINDOW / 4) + 1, max(held)
        stats = engine.stats()
        assert stats["window_blocks_freed"] >= 2 * (10 + 48 - WINDOW) // 4 - 2
        assert stats["blocks_used"] == 0 and stats["preemptions"] == 0
    finally:
        engine.close()


def test_a_pool_too_small_for_the_sequence_but_big_enough_for_its_window_completes_without_preemption() -> None:
    hf = hf_model("mistral")
    prompts = prompts_of([10, 7], seed=22)
    tokens = 10 + 64  # 19 blocks of 4 for the longer one; its window needs at most 3 (+ a prefill chunk's)
    engine = engine_of(our_model(hf), num_kv_blocks=12, max_num_batched_tokens=8)
    try:
        outs = engine.generate(prompts, greedy(64))
        assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 64) for p in prompts]
        assert all(o.finish_reason == "length" for o in outs)
        assert engine.stats()["preemptions"] == 0 and -(-tokens // 4) > 12
    finally:
        engine.close()
    # The same pool under full attention cannot hold the sequence: the freeing is what made it fit.
    full = engine_of(our_model(hf_model("llama3")), num_kv_blocks=12, max_num_batched_tokens=8)
    try:
        outs = full.generate(prompts, greedy(64))
        assert full.stats()["preemptions"] > 0 or any(len(o.token_ids) < 64 for o in outs)
        assert full.stats()["window_blocks_freed"] == 0
    finally:
        full.close()


def test_freed_blocks_serve_a_later_prefix_only_while_their_kv_is_intact() -> None:
    """A released block keeps its hash while it waits in the pool untouched: in a roomy pool the second turn
    (first prompt + its answer + more) reads the first turn's released blocks back from the prefix cache. In a
    tight pool they were reused (their hashes dropped with it), so it hits nothing. Both match HF."""
    hf = hf_model("mistral")
    first = prompts_of([13], seed=23)[0]
    for blocks, hits in ((64, True), (10, False)):
        engine = engine_of(our_model(hf), num_kv_blocks=blocks, max_num_batched_tokens=8)
        try:
            answer = engine.generate([first], greedy(40))[0].token_ids
            assert answer == hf_greedy(hf, first, 40)
            s = engine.stats()
            assert s["window_blocks_freed"] > 0 and (s["evictions"] > 0) is not hits
            second = first + answer + prompts_of([3], seed=24)[0]
            out = engine.generate([second], greedy(16))[0]
            assert out.token_ids == hf_greedy(hf, second, 16)
            hit = engine.stats()["prefix_cache_hits"] - s["prefix_cache_hits"]
            assert (hit == (len(second) - 1) // 4 * 4) if hits else hit == 0, hit
        finally:
            engine.close()


def test_a_cached_prefix_longer_than_the_pool_costs_a_windowed_model_only_its_window() -> None:
    """A second turn whose cached prefix fills nearly the whole pool is admitted: the hits before its window
    are not claimed (claiming them all would not fit beside its new blocks, and it would wait forever)."""
    hf = hf_model("mistral")
    engine = engine_of(our_model(hf), num_kv_blocks=11, max_num_batched_tokens=8)
    try:
        first = prompts_of([41], seed=5)[0]
        answer = engine.generate([first], greedy(1))[0].token_ids
        second = first + answer + prompts_of([20], seed=6)[0]
        bm = engine.block_manager
        probe = Sequence("probe", second, SamplingParams())
        hits = bm.lookup(probe)
        assert len(hits) == 10 and bm.can_admit(probe, hits, 8)  # checked here: a regression would hang below
        before = engine.stats()["prefix_cache_hits"]
        out = engine.generate([second], greedy(4))[0]
        assert out.token_ids == hf_greedy(hf, second, 4)
        assert engine.stats()["prefix_cache_hits"] - before == 40
    finally:
        engine.close()


@pytest.mark.parametrize("family", ["gpt-oss", "qwen2-window"])
def test_a_model_with_a_full_attention_layer_frees_nothing(family: str) -> None:
    engine = engine_of(our_model(hf_model(family)))
    try:
        assert engine.block_manager.window is None
        engine.generate(prompts_of([40], seed=25), greedy(8))
        assert engine.stats()["window_blocks_freed"] == 0 and engine.stats()["window_blocks_skipped"] > 0
    finally:
        engine.close()
