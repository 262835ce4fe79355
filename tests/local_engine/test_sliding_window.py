"""Sliding-window attention (Mistral, Qwen2 with use_sliding_window, gpt-oss's alternating layers): sequences
far longer than the window match HF, the window changes the answer (so ignoring it is caught), windowed
layers never read keys/values outside their window, and the engine counts the blocks they skip."""

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

from parley.local_engine import SamplingParams  # noqa: E402
from parley.local_engine.models.decoder import DecoderModel  # noqa: E402
from parley.local_engine.runner import ModelRunner  # noqa: E402
from parley.local_engine.scheduler import ScheduledSeq  # noqa: E402
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
