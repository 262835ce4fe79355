"""gpt-oss (openai/gpt-oss-20b, -120b): a mixture of experts with attention sinks and alternating windows.

- Attention: biases on q, k, v and o (`attention_bias`); one learned sink logit per head joins each softmax
  row's denominator (attention.py); `layer_types` alternates `sliding_attention` (window `sliding_window`,
  128) and `full_attention`; YaRN rope (factor 32 over 4096 positions, no truncation).
- MoE (moe.py): router with a bias; the top `num_experts_per_tok` logits, softmax over those; experts are
  the clamped SwiGLU `(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)` with `g = min(gate, limit)`,
  with biases. Checkpoints interleave gate and up columns (`gate_up_proj[..., ::2]` is the gate) and store
  `[experts, in, out]`; loading reorders both into the shared `[experts, out, in]` gate-then-up layout.
- MXFP4 checkpoints (the released ones: `quantization_config.quant_method == "mxfp4"`, expert weights as
  `*_blocks` of packed e2m1 pairs plus `*_scales` of power-of-two exponents per 32 values) are dequantised
  at load to the engine's dtype; the values are exact in bf16 and fp32.
"""

from __future__ import annotations

from typing import Any

import torch

from parley.local_engine.errors import ModelLoadError
from parley.local_engine.models.arch import (
    DecoderArch,
    MoeSpec,
    positive_window,
    refuse_unimplemented,
    windows_from_layer_types,
)
from parley.local_engine.models.decoder import DecoderModel, MoeTensors
from parley.local_engine.models.layers import Checkpoint

# GptOssConfig's rope when a config gives none.
_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096}
_FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


class GptOssArch(DecoderArch):
    family = "gpt-oss"

    @classmethod
    def _parse(cls, cfg: dict[str, Any]) -> DecoderArch:
        refuse_unimplemented(
            cfg, "gpt_oss",
            implemented=("sliding_window", "layer_types", "attention_bias", "num_local_experts", "num_experts",
                         "quantization_config"),
        )
        quant = cfg.get("quantization_config")
        if quant and (not isinstance(quant, dict) or quant.get("quant_method") != "mxfp4"):
            method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
            raise ModelLoadError(f"config.json: quantization_config (quant_method {method!r}) is not supported "
                                 "for gpt_oss models (mxfp4 is)")
        if not (cfg.get("rope_parameters") or cfg.get("rope_scaling")):
            cfg = {**cfg, "rope_parameters": _DEFAULT_ROPE}
        common = cls.common(cfg, default_theta=150000.0, default_head_dim=64, default_eps=1e-5)
        n = common["num_layers"]
        window = positive_window(cfg) if "sliding_window" in cfg else 128
        if "layer_types" not in cfg or cfg["layer_types"] is None:
            cfg = {**cfg, "layer_types": ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]}
        bias = bool(cfg.get("attention_bias", True))
        moe = MoeSpec(
            num_experts=int(cfg.get("num_local_experts") or cfg.get("num_experts") or 128),
            top_k=int(cfg.get("num_experts_per_tok", 4)), intermediate_size=common["intermediate_size"],
            router="topk_softmax", router_bias=True, expert_bias=True, activation="clamped_swiglu",
            swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)), swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
        )
        return cls(**common, qkv_bias=bias, o_bias=bias, attention_sinks=True,
                   layer_windows=windows_from_layer_types(cfg, n, window), moe=moe)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`[..., rows, groups, 16]` packed e2m1 bytes (low nibble first) and `[..., rows, groups]` biased exponents
    -> fp32 `[..., rows, groups * 32]`: each value is its e2m1 code's value times 2^(scale - 127)."""
    lut = torch.tensor(_FP4_E2M1, dtype=torch.float32)
    b = blocks.to(torch.uint8).to(torch.int64)
    pairs = torch.stack((lut[b & 0x0F], lut[b >> 4]), dim=-1)  # [..., rows, groups, 16, 2]
    values = pairs.reshape(*blocks.shape[:-1], 32)
    exponents = (scales.to(torch.int32) - 127).unsqueeze(-1)
    return torch.ldexp(values, exponents).reshape(*blocks.shape[:-2], -1)


class GptOssModel(DecoderModel):
    arch_type = GptOssArch

    def _moe_tensors(self, ck: Checkpoint, prefix: str) -> MoeTensors:
        spec = self.arch.moe
        assert spec is not None
        E, inter, hidden = spec.num_experts, spec.intermediate_size, self.arch.hidden_size
        e = prefix + "experts."
        gate_up = self._expert_matrix(ck, e + "gate_up_proj", E, hidden, 2 * inter)  # [E, 2I, hidden], interleaved
        down = self._expert_matrix(ck, e + "down_proj", E, inter, hidden)  # [E, hidden, I]
        gate_up_bias = ck.take(e + "gate_up_proj_bias", (E, 2 * inter))
        return MoeTensors(
            router=ck.take(prefix + "router.weight", (E, hidden)),
            router_bias=ck.take(prefix + "router.bias", (E,)),
            gate_up=torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1),  # gate rows, then up rows
            gate_up_bias=torch.cat([gate_up_bias[:, 0::2], gate_up_bias[:, 1::2]], dim=1),
            down=down,
            down_bias=ck.take(e + "down_proj_bias", (E, hidden)),
        )

    @staticmethod
    def _expert_matrix(ck: Checkpoint, name: str, E: int, n_in: int, n_out: int) -> torch.Tensor:
        """Experts' `x @ W` weights `[E, in, out]` (or their MXFP4 blocks) as `[E, out, in]` fp32."""
        if ck.has(name):
            return ck.take(name, (E, n_in, n_out)).transpose(1, 2)
        if n_in % 32:
            raise ModelLoadError(f"weight {name!r}: MXFP4 needs the input size ({n_in}) to be a multiple of 32")
        groups = n_in // 32
        blocks = ck.take(name + "_blocks", (E, n_out, groups, 16), as_stored=True)
        scales = ck.take(name + "_scales", (E, n_out, groups), as_stored=True)
        return dequantize_mxfp4(blocks, scales)
