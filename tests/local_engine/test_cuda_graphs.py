"""Decode steps from CUDA graphs (cuda_graphs.py). Off a GPU the same static buffers and padding run without a
graph (`capture=False`): rows padded to a batch bucket, contexts to a power of two, pad rows on the scratch
slot. These tests hold that path to the eager step's tokens; benchmarks/gpu_check.sh runs the captured graphs
on a GPU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from parley.local_engine import (  # noqa: E402
    EngineConfig,
    SamplingParams,
    cuda_graphs,  # noqa: E402
)
from parley.local_engine.cuda_graphs import GraphedDecode, batch_bucket, context_bucket  # noqa: E402
from parley.local_engine.errors import EngineConfigError  # noqa: E402
from tests.local_engine.conftest import engine_from_hf, prompts_of  # noqa: E402
from tests.local_engine.test_speculative import repetitive_prompts  # noqa: E402

# adaptive_threads off: a thread count chosen by timing would change low bits between the engines compared
CFG = dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=64, adaptive_threads=False)


def _tokens(engine: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    return [o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=n, min_tokens=n))]


def _graphed(engine: Any) -> GraphedDecode:
    graphs = GraphedDecode(engine.model, scratch_slot=engine.runner.scratch_slot, max_rows=64, capture=False)
    engine.runner.graphs = graphs
    return graphs


@contextmanager
def eager_and_graphed(hf: Any, **config: Any) -> Iterator[tuple[Any, Any, GraphedDecode]]:
    """Two engines over the same weights: one eager, one whose decode steps go through the graphs' buffers."""
    eager = engine_from_hf(hf, EngineConfig(**config))
    graphed = engine_from_hf(hf, EngineConfig(**config))
    try:
        yield eager, graphed, _graphed(graphed)
    finally:
        eager.close()
        graphed.close()


def test_buckets_round_rows_up_and_contexts_to_powers_of_two() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 17, 128)] == [1, 2, 4, 8, 24, 128]
    assert batch_bucket(129) is None
    assert [context_bucket(n) for n in (1, 256, 257, 1000, 5000)] == [256, 256, 512, 1024, 8192]


def test_padded_static_steps_give_the_eager_tokens_across_batch_and_context_buckets(tiny_hf: Any) -> None:
    prompts = prompts_of([3, 17, 40, 250, 9], seed=4)  # one row crosses from the 256 to the 512 context bucket
    with eager_and_graphed(tiny_hf, **CFG) as (eager, graphed, graphs):
        want = _tokens(eager, prompts, 12)
        assert _tokens(graphed, prompts, 12) == want
        assert _tokens(graphed, prompts[:1], 12) == want[:1]  # batch 1, its own bucket
        shapes = graphs.stats()["graphs"]
        assert {L for _, L in shapes} == {256, 512}, shapes  # the long row's context pads to 512, the others' to 256
        assert (1, 256) in shapes and len({B for B, _ in shapes}) >= 2, shapes  # rows padded to several buckets
        assert graphs.stats()["replays"] >= 22


def test_pad_rows_write_only_the_scratch_slot(tiny_hf: Any) -> None:
    """One decode step of 3 rows (the graph has 4: one pad row), run eager and from the graph's buffers on two
    copies of the same pool: the rows' hidden states and every slot but the scratch slot come out the same."""
    from parley.local_engine.runner import ModelRunner
    from parley.local_engine.scheduler import ScheduledSeq
    from parley.local_engine.sequence import Sequence

    net = engine_from_hf(tiny_hf, EngineConfig(**CFG))
    try:
        runner = ModelRunner(net.model, num_blocks=8, block_size=4)
        seqs = []
        for i, prompt in enumerate(prompts_of([6, 7, 8], seed=1)):
            seq = Sequence(f"r{i}", prompt, SamplingParams())
            seq.block_table = [2 * i, 2 * i + 1, 6 + i // 2][: -(-(len(prompt) + 1) // 4)]
            seqs.append(seq)
        with torch.inference_mode():
            runner.run([ScheduledSeq(s, s.num_tokens, 0, True) for s in seqs])  # prefill all three
            step = [ScheduledSeq(s, 1, s.num_tokens - 1, True) for s in seqs]  # re-feed each last token
            input_ids, positions, batch, _ = runner.prepare(step)
            pool = runner.kv_cache
            eager_pool, graph_pool = pool.clone(), pool.clone()
            want = net.model.forward(input_ids, positions, eager_pool, batch)
            graphs = GraphedDecode(net.model, scratch_slot=runner.scratch_slot, max_rows=8, capture=False)
            got = graphs(input_ids, positions, graph_pool, batch)
        assert got is not None and graphs.stats()["graphs"] == [(4, 256)]
        assert torch.allclose(got, want, atol=1e-5)
        scratch = runner.scratch_slot
        assert torch.allclose(graph_pool[:, :, :scratch], eager_pool[:, :, :scratch], atol=1e-5)
        assert not torch.equal(graph_pool[:, :, scratch], pool[:, :, scratch])  # the pad row wrote here ...
        assert torch.equal(graph_pool[:, :, scratch + 1 :], pool[:, :, scratch + 1 :])  # ... and nowhere else
    finally:
        net.close()


def test_speculative_verify_rows_replay_too(tiny_hf: Any) -> None:
    prompts = repetitive_prompts(4)  # n-gram drafts from the first step, verified as 1 + k decode rows each
    spec = dict(CFG, speculation="ngram", speculative_tokens=4, speculative_max_batch=64)
    with eager_and_graphed(tiny_hf, **spec) as (eager, graphed, graphs):
        assert _tokens(graphed, prompts, 16) == _tokens(eager, prompts, 16)
        assert graphed.stats()["spec_verify_steps"] > 0
        assert max(rows for rows, _ in graphs.stats()["graphs"]) >= 8  # 4 requests, each 1 + k verify rows


def test_steps_a_graph_does_not_take_run_eager(tiny_hf: Any) -> None:
    engine = engine_from_hf(tiny_hf, EngineConfig(**CFG))
    try:
        graphs = GraphedDecode(engine.model, scratch_slot=engine.runner.scratch_slot, max_rows=2, capture=False)
        engine.runner.graphs = graphs
        out = _tokens(engine, prompts_of([5, 6, 7], seed=2), 8)
        assert all(len(t) == 8 for t in out)
        # the three requests decode together in 3-row steps, over max_rows: those run eager. (A request the
        # engine picked up a step before the others may decode in a step of 1 or 2 rows, which may replay.)
        stats = graphs.stats()
        assert all(rows <= 2 for rows, _ in stats["graphs"])
        assert stats["replays"] <= engine.stats()["steps"] - 5  # at least the last 5 decode steps ran eager
    finally:
        engine.close()


def test_cpu_engines_and_moe_models_are_not_graphed(tiny_hf: Any) -> None:
    engine = engine_from_hf(tiny_hf, EngineConfig(**CFG))
    try:
        assert engine.runner.graphs is None and engine.stats()["cuda_graphs"] is None
        assert "graphs" not in engine.mode
        assert cuda_graphs.unsupported_reason(engine.model) == "CUDA graphs need a CUDA device"
    finally:
        engine.close()
    with pytest.raises(EngineConfigError, match=r"EngineConfig\.cuda_graphs"):
        EngineConfig(cuda_graphs="on")  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (benchmarks/gpu_check.sh runs this on one)")
@pytest.mark.parametrize("quantization", [None, "q4"])
def test_captured_graphs_on_cuda_give_the_eager_tokens(tiny_hf: Any, quantization: str | None) -> None:
    from parley.local_engine import Engine
    from parley.local_engine.models.llama import LlamaArch, LlamaModel
    from tests.local_engine.conftest import ByteTokenizer

    arch = LlamaArch.from_hf_config(tiny_hf.config.to_dict())

    def engine(graphs: bool) -> Any:
        net = LlamaModel.from_hf_state_dict(arch, tiny_hf.state_dict(), torch.device("cuda"), torch.bfloat16,
                                            quantization=quantization)
        return Engine.from_model(net, ByteTokenizer(), model_id="tiny-cuda", eos_token_ids=frozenset({2}),
                                 config=EngineConfig(**CFG, cuda_graphs=graphs))

    prompts = prompts_of([3, 17, 40, 250, 9], seed=4)
    eager, graphed = engine(False), engine(True)
    try:
        assert graphed.runner.graphs is not None and "graphs" in graphed.mode
        want = _tokens(eager, prompts, 24)
        got = _tokens(graphed, prompts, 24)
        same = sum(a == b for a, b in zip(got, want, strict=True))
        assert same >= 4, (got, want)  # bf16: a near-tie may part one row; captured graphs replay the eager kernels
        stats = graphed.stats()["cuda_graphs"]
        assert stats["replays"] >= 20 and stats["graphs"], stats
    finally:
        eager.close()
        graphed.close()
