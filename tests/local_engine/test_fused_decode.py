"""The fused decode step (models/fused_decode.py): every layer of a quantised decode step in one C++ call.

It makes the Python loop's calls in the same order on the same buffers, so a step must give the loop's
hidden states and KV writes bitwise, for every layout the loop handles: several decode groups (rows whose
contexts pad to different lengths), biases, sliding-window layers beside full ones; and it must step aside
where the loop does something it does not (prefill rows, q/k norm, MoE).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from parley.local_engine.config import SamplingParams  # noqa: E402
from parley.local_engine.models.decoder import DecoderModel  # noqa: E402
from parley.local_engine.models.fused_decode import FusedDecode  # noqa: E402
from parley.local_engine.models.registry import architecture  # noqa: E402
from parley.local_engine.runner import ModelRunner  # noqa: E402
from parley.local_engine.scheduler import ScheduledSeq  # noqa: E402
from parley.local_engine.sequence import Sequence  # noqa: E402
from tests.local_engine.families import hf_model, prompts_of  # noqa: E402


def quantized(family: str, quantization: str = "q4", *, head: bool = False) -> DecoderModel:
    hf = hf_model(family)
    cls, arch = architecture(hf.config.to_dict())
    return cls.from_hf_state_dict(arch, hf.state_dict(), torch.device("cpu"), torch.float32,
                                  quantization=quantization, quantize_lm_head=head)


def prefilled(net: DecoderModel, lengths: list[int]) -> tuple[ModelRunner, list[Sequence]]:
    """A runner whose pool holds the prompts of `lengths` (prefilled through the Python loop)."""
    runner = ModelRunner(net, num_blocks=128, block_size=4)
    seqs = []
    free = list(range(128))
    for i, prompt in enumerate(prompts_of(lengths, seed=len(lengths))):
        seq = Sequence(f"s{i}", prompt + [5], SamplingParams())
        seq.block_table = [free.pop() for _ in range(-(-(len(prompt) + 2) // 4))]
        ids, pos, batch, _ = runner.prepare([ScheduledSeq.of(seq, len(prompt))])
        with torch.inference_mode():
            net.forward(ids, pos, runner.kv_cache, batch)
        seq.num_computed_tokens = len(prompt)
        seqs.append(seq)
    return runner, seqs


def step_both_ways(net: DecoderModel, runner: ModelRunner, work: list[ScheduledSeq]) -> tuple[Any, ...]:
    """(hidden, cache, logits) of one step through the Python loop, then through the fused call, from the same
    pool."""
    start = runner.kv_cache.clone()
    results = []
    for fused in (False, None):
        runner.kv_cache.copy_(start)
        net.fused_decode = fused
        ids, pos, batch, _ = runner.prepare(work)
        with torch.inference_mode():
            hidden = net.forward(ids, pos, runner.kv_cache, batch)
            logits = net.compute_logits(hidden)
        results += [hidden.clone(), runner.kv_cache.clone(), logits.clone()]
    return tuple(results)


@pytest.mark.parametrize("family", ["llama3", "llama-biases", "mistral", "qwen2-window"])
@pytest.mark.parametrize(("quantization", "head"), [("q4", True), ("q8", False)])
def test_a_decode_step_is_the_python_loops_bitwise(kernel: Any, family: str, quantization: str, head: bool) -> None:
    net = quantized(family, quantization, head=head)
    runner, seqs = prefilled(net, [3, 70, 150, 9])  # contexts in three padded lengths: three decode groups
    loop_hidden, loop_cache, loop_logits, fused_hidden, fused_cache, fused_logits = step_both_ways(
        net, runner, [ScheduledSeq.of(s, 1) for s in seqs])
    assert isinstance(net.fused_decode, FusedDecode)  # the fused call ran
    assert (net._step_logits is not None) == head  # a quantised head runs in the same call, an fp32 one apart
    assert torch.equal(fused_hidden, loop_hidden)
    assert torch.equal(fused_cache, loop_cache)
    assert torch.equal(fused_logits, loop_logits)
    assert not torch.equal(loop_cache, runner.kv_cache.new_zeros(()).expand_as(loop_cache))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_team_size_changes_no_bit(kernel: Any, threads: int) -> None:
    net = quantized("llama3", head=True)
    runner, seqs = prefilled(net, [5, 33])
    work = [ScheduledSeq.of(s, 1) for s in seqs]
    net.gemm_threads = 1
    expected = step_both_ways(net, runner, work)
    net.gemm_threads = threads
    got = step_both_ways(net, runner, work)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_one_row_alone_is_the_same_as_in_a_batch(kernel: Any) -> None:
    net = quantized("llama3")
    runner, seqs = prefilled(net, [40, 12])
    net.fused_decode = None
    start = runner.kv_cache.clone()
    ids, pos, batch, _ = runner.prepare([ScheduledSeq.of(s, 1) for s in seqs])
    with torch.inference_mode():
        both = net.forward(ids, pos, runner.kv_cache, batch)
    runner.kv_cache.copy_(start)
    ids, pos, batch, _ = runner.prepare([ScheduledSeq.of(seqs[1], 1)])
    with torch.inference_mode():
        alone = net.forward(ids, pos, runner.kv_cache, batch)
    assert torch.equal(alone[0], both[1])


def test_a_step_with_prefill_rows_runs_the_python_loop(kernel: Any) -> None:
    net = quantized("llama3")
    runner, seqs = prefilled(net, [20])
    fresh = Sequence("new", prompts_of([7], seed=9)[0], SamplingParams())
    fresh.block_table = [120, 121]
    ids, pos, batch, _ = runner.prepare([ScheduledSeq.of(seqs[0], 1), ScheduledSeq.of(fresh, 7)])
    assert FusedDecode.of(net) is not None and not FusedDecode.covers(batch, 8)
    ids, pos, batch, _ = runner.prepare([ScheduledSeq.of(seqs[0], 1)])
    assert FusedDecode.covers(batch, 1)


@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe"])
def test_layers_the_fused_call_does_not_make_keep_the_python_loop(kernel: Any, family: str) -> None:
    assert FusedDecode.of(quantized(family)) is None  # q/k norm; experts


def test_fp32_and_int8_models_keep_the_python_loop(kernel: Any) -> None:
    assert FusedDecode.of(quantized("llama3", "int8")) is None
    hf = hf_model("llama3")
    cls, arch = architecture(hf.config.to_dict())
    assert FusedDecode.of(cls.from_hf_state_dict(arch, hf.state_dict(), torch.device("cpu"), torch.float32)) is None
