"""Qwen3 (dense): Llama's layer with a per-head RMSNorm on q and k (over head_dim, before RoPE), no q/k/v
biases unless `attention_bias` (then on q, k, v and o), and Qwen2's sliding-window rule."""

from __future__ import annotations

from typing import Any

from parley.local_engine.models.arch import DecoderArch, check_activation, refuse_unimplemented
from parley.local_engine.models.decoder import DecoderModel
from parley.local_engine.models.qwen2 import QWEN_WINDOW_FIELDS, qwen_windows


class Qwen3Arch(DecoderArch):
    family = "Qwen3"

    @classmethod
    def _parse(cls, cfg: dict[str, Any]) -> DecoderArch:
        refuse_unimplemented(cfg, "qwen3", implemented=(*QWEN_WINDOW_FIELDS, "attention_bias"))
        check_activation(cfg, "qwen3")
        common = cls.common(cfg, default_head_dim=128)  # Qwen3Config's default
        bias = bool(cfg.get("attention_bias", False))
        return cls(**common, qkv_bias=bias, o_bias=bias, qk_norm=True,
                   layer_windows=qwen_windows(cfg, common["num_layers"]))


class Qwen3Model(DecoderModel):
    arch_type = Qwen3Arch
