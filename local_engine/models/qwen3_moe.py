"""Qwen3-MoE (Qwen3-30B-A3B, ...): Qwen3's attention (q/k norm) with a mixture of experts in place of the MLP.

Routing (moe.py): softmax over all experts' router logits, the top `num_experts_per_tok`, renormalised to sum
to 1 when `norm_topk_prob`. Experts are SwiGLUs of `moe_intermediate_size`, without biases or a shared
expert. Layers listed in `mlp_only_layers`, or off the `decoder_sparse_step` grid, are dense SwiGLUs of
`intermediate_size`. A sliding window (only with `use_sliding_window`) applies to every layer, as in
transformers' Qwen3-MoE (which has no `layer_types`).

Checkpoints store experts one by one (`mlp.experts.E.gate_proj.weight`, what `save_pretrained` writes and
the hub holds); transformers 5's in-memory state dict fuses them (`mlp.experts.gate_up_proj`). Both load.
"""

from __future__ import annotations

from typing import Any

import torch

from parley.local_engine.errors import ModelLoadError
from parley.local_engine.models.arch import (
    DecoderArch,
    MoeSpec,
    check_activation,
    positive_window,
    refuse_unimplemented,
)
from parley.local_engine.models.decoder import DecoderModel, MoeTensors
from parley.local_engine.models.layers import Checkpoint


class Qwen3MoeArch(DecoderArch):
    family = "Qwen3-MoE"

    @classmethod
    def _parse(cls, cfg: dict[str, Any]) -> DecoderArch:
        refuse_unimplemented(
            cfg, "qwen3_moe",
            implemented=("sliding_window", "use_sliding_window", "attention_bias", "num_experts", "num_local_experts",
                         "moe_intermediate_size", "layer_types"),
        )
        check_activation(cfg, "qwen3_moe")
        common = cls.common(cfg)
        n = common["num_layers"]
        window = positive_window(cfg) if cfg.get("use_sliding_window") else None
        types = cfg.get("layer_types")
        if types is not None and any(t != ("sliding_attention" if window else "full_attention") for t in types):
            raise ModelLoadError(f"config.json: layer_types {types!r} is not supported for qwen3_moe models")
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        step = int(cfg.get("decoder_sparse_step", 1))
        if step < 1:
            raise ModelLoadError(f"config.json: decoder_sparse_step must be >= 1, got {step}")
        dense_only = {int(i) for i in cfg.get("mlp_only_layers") or ()}
        sparse = tuple(i not in dense_only and experts > 0 and (i + 1) % step == 0 for i in range(n))
        moe = MoeSpec(
            num_experts=max(experts, 1), top_k=int(cfg.get("num_experts_per_tok", 8)),
            intermediate_size=int(cfg.get("moe_intermediate_size", 768)), router="softmax_topk",
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        )
        bias = bool(cfg.get("attention_bias", False))
        return cls(**common, qkv_bias=bias, o_bias=bias, qk_norm=True,
                   layer_windows=(window,) * n if window is not None else (),
                   moe=moe if any(sparse) else None, moe_layers=sparse)


class Qwen3MoeModel(DecoderModel):
    arch_type = Qwen3MoeArch

    def _moe_tensors(self, ck: Checkpoint, prefix: str) -> MoeTensors:
        spec = self.arch.moe
        assert spec is not None
        E, inter, hidden = spec.num_experts, spec.intermediate_size, self.arch.hidden_size
        router = ck.take(prefix + "gate.weight", (E, hidden))
        fused = prefix + "experts.gate_up_proj"
        if ck.has(fused):
            gate_up = ck.take(fused, (E, 2 * inter, hidden))
            down = ck.take(prefix + "experts.down_proj", (E, hidden, inter))
        else:
            e = prefix + "experts.{}."
            gate_up = torch.stack([
                torch.cat([ck.take(e.format(j) + "gate_proj.weight", (inter, hidden)),
                           ck.take(e.format(j) + "up_proj.weight", (inter, hidden))])
                for j in range(E)
            ])
            down = torch.stack([ck.take(e.format(j) + "down_proj.weight", (hidden, inter)) for j in range(E)])
        return MoeTensors(router=router, router_bias=None, gate_up=gate_up, gate_up_bias=None, down=down,
                          down_bias=None)
