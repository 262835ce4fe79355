"""Mixture-of-experts layers (Qwen3-MoE, gpt-oss): a step computes only the experts its tokens chose, tokens
that chose different experts give what they give alone, and gpt-oss's MXFP4 expert weights are dequantised
at load exactly as transformers does."""

from __future__ import annotations

from typing import Any

import pytest

from tests.local_engine.families import (
    engine_of,
    greedy,
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
from parley.local_engine.models.gpt_oss import dequantize_mxfp4  # noqa: E402
from parley.local_engine.models.moe import MoeMlp  # noqa: E402
from parley.local_engine.models.registry import build_model  # noqa: E402
from parley.local_engine.runner import ModelRunner  # noqa: E402
from parley.local_engine.scheduler import ScheduledSeq  # noqa: E402
from parley.local_engine.sequence import Sequence  # noqa: E402

MOE = ["qwen3-moe", "gpt-oss"]


def moe_layers(net: DecoderModel) -> list[MoeMlp]:
    return [layer.moe for layer in net.layers if layer.moe is not None]


class Routing:
    """Records the expert ids each MoE layer's router picks (one [T, k] tensor per call)."""

    def __init__(self, net: DecoderModel, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[int, list[torch.Tensor]] = {}
        for mlp in moe_layers(net):
            route = mlp.route

            def recording(logits: Any, mlp: MoeMlp = mlp, route: Any = route) -> Any:
                weights, ids = route(logits)
                self.calls.setdefault(id(mlp), []).append(ids.clone())
                return weights, ids

            monkeypatch.setattr(mlp, "route", recording)


def prefilled(net: DecoderModel, prompts: list[list[int]]) -> tuple[ModelRunner, list[Sequence]]:
    """Each prompt but its last token prefilled alone into a private pool."""
    runner = ModelRunner(net, num_blocks=128, block_size=4)
    seqs = []
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            seq = Sequence(f"s{i}", p, SamplingParams())
            seq.block_table = list(range(16 * i, 16 * i + 16))
            ids, pos, batch, _ = runner.prepare([ScheduledSeq.of(seq, len(p) - 1)])
            net.forward(ids, pos, runner.kv_cache, batch)
            seq.num_computed_tokens = len(p) - 1
            seqs.append(seq)
    return runner, seqs


def decode(net: DecoderModel, runner: ModelRunner, seqs: list[Sequence]) -> torch.Tensor:
    """One batched decode step of every sequence's last prompt token (repeatable: nothing advances)."""
    with torch.inference_mode():
        ids, pos, batch, _ = runner.prepare([ScheduledSeq.of(s, 1) for s in seqs])
        return net.compute_logits(net.forward(ids, pos, runner.kv_cache, batch))


def decode_step(net: DecoderModel, prompts: list[list[int]]) -> torch.Tensor:
    return decode(net, *prefilled(net, prompts))


@pytest.mark.parametrize("family", MOE)
def test_a_decode_step_runs_only_the_experts_its_tokens_chose(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    net = our_model(hf_model(family))
    runner, seqs = prefilled(net, prompts_of([9, 14], seed=21))
    routing = Routing(net, monkeypatch)
    before = {id(m): m.experts_run for m in moe_layers(net)}
    clean = decode(net, runner, seqs)
    hidden = net.arch.hidden_size
    for mlp in moe_layers(net):
        chosen = set(routing.calls[id(mlp)][0].reshape(-1).tolist())  # 2 tokens x top_k
        assert len(chosen) < mlp.spec.num_experts
        assert mlp.experts_run - before[id(mlp)] == len(chosen)  # each chosen expert ran once, no other
        inter = mlp.spec.intermediate_size
        for e in set(range(mlp.spec.num_experts)) - chosen:  # poison the others: nothing may read them
            mlp.w.gate_up[e] = mlp.gemm.prepare(torch.full((2 * inter, hidden), float("nan")))
            mlp.w.down[e] = mlp.gemm.prepare(torch.full((hidden, inter), float("nan")))
    dirty = decode(net, runner, seqs)
    assert torch.isfinite(dirty).all() and torch.equal(dirty, clean)


@pytest.mark.parametrize("family", MOE)
def test_tokens_choosing_different_experts_match_their_solo_runs(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    net = our_model(hf_model(family))
    prompts = prompts_of([4, 7, 12, 19, 26, 31], seed=22)
    solo = [decode_step(net, [p]) for p in prompts]
    routing = Routing(net, monkeypatch)
    batched = decode_step(net, prompts)
    step = [calls[-1] for calls in routing.calls.values()]
    # some pair of tokens in the batched step picked disjoint experts in some layer
    assert any(not set(ids[a].tolist()) & set(ids[b].tolist())
               for ids in step for a in range(len(prompts)) for b in range(a))
    for row, alone in enumerate(solo):
        assert torch.allclose(batched[row], alone[0], rtol=0, atol=1e-5)
    monkeypatch.undo()
    engine = engine_of(net)
    try:
        together = [o.token_ids for o in engine.generate(prompts, greedy(16))]
        assert together == [engine.generate([p], greedy(16), tenant=f"solo{i}")[0].token_ids
                            for i, p in enumerate(prompts)]
    finally:
        engine.close()


def test_mxfp4_dequantisation_equals_transformers() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 40, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(110, 140, (3, 40, 4), dtype=torch.uint8, generator=g)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    assert torch.equal(dequantize_mxfp4(blocks, scales), theirs.transpose(1, 2))


def test_an_mxfp4_gpt_oss_checkpoint_loads_and_matches_hf() -> None:
    """Experts stored as MXFP4 blocks + scales (as the released gpt-oss checkpoints are) load dequantised;
    HF given the same dequantised weights computes the same logits."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf = hf_model("gpt-oss")
    cfg = hf.config.to_dict() | {"quantization_config": {"quant_method": "mxfp4"}}
    g = torch.Generator().manual_seed(1)
    state = {k: v for k, v in hf.state_dict().items() if not k.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    E, hidden, inter = 8, 64, 128
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            for name, n_out, n_in in (("gate_up_proj", 2 * inter, hidden), ("down_proj", hidden, inter)):
                blocks = torch.randint(0, 256, (E, n_out, n_in // 32, 16), dtype=torch.uint8, generator=g)
                scales = torch.randint(122, 127, (E, n_out, n_in // 32), dtype=torch.uint8, generator=g)
                getattr(layer.mlp.experts, name).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
                state[f"model.layers.{i}.mlp.experts.{name}_blocks"] = blocks
                state[f"model.layers.{i}.mlp.experts.{name}_scales"] = scales
    net = build_model(cfg, state, torch.device("cpu"), torch.float32)
    prompt = prompts_of([30], seed=23)[0]
    abs_diff, rel_diff = parity(logits_every_position(net, prompt, [20, 10]), hf_logits(hf, prompt))
    assert rel_diff <= 1e-4, (abs_diff, rel_diff)
