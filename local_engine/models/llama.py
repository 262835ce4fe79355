"""Llama (SmolLM2, TinyLlama, Llama 2/3.x): the shared decoder as it is, with Llama's optional biases.

Llama 3.1+ long-context checkpoints use rope type `llama3` (rope.py). `attention_bias` puts a bias on q, k, v
and o; `mlp_bias` on gate, up and down. A `sliding_window` or non-full `layer_types` is refused: transformers'
Llama has none, so a config naming one is not a Llama config parley can serve faithfully.
"""

from __future__ import annotations

from typing import Any

from parley.local_engine.models.arch import DecoderArch, check_activation, refuse_unimplemented
from parley.local_engine.models.attention import AttentionBatch, PrefillSpan
from parley.local_engine.models.decoder import DecoderModel

__all__ = ["AttentionBatch", "LlamaArch", "LlamaModel", "PrefillSpan"]


class LlamaArch(DecoderArch):
    family = "Llama"

    @classmethod
    def _parse(cls, cfg: dict[str, Any]) -> DecoderArch:
        # pretraining_tp: transformers 5 ignores it (slicing the matmuls was only ever a summation order).
        refuse_unimplemented(cfg, "llama", implemented=("attention_bias", "mlp_bias", "pretraining_tp"))
        check_activation(cfg, "llama")
        bias = bool(cfg.get("attention_bias", False))
        return cls(**cls.common(cfg), qkv_bias=bias, o_bias=bias, mlp_bias=bool(cfg.get("mlp_bias", False)))


class LlamaModel(DecoderModel):
    arch_type = LlamaArch
