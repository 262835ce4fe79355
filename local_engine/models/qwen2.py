"""Qwen2 / Qwen2.5: Llama's layer with biases on q, k and v (not o), tied or untied embeddings.

Sliding windows as transformers applies them: only with `use_sliding_window`, on the layers `layer_types`
marks `sliding_attention` (without `layer_types`: layers from `max_window_layers` on). Released Qwen2.5
checkpoints ship `use_sliding_window: false`, so their `sliding_window` value is inert.
"""

from __future__ import annotations

from typing import Any

from parley.local_engine.models.arch import (
    DecoderArch,
    check_activation,
    positive_window,
    refuse_unimplemented,
    windows_from_layer_types,
)
from parley.local_engine.models.decoder import DecoderModel


def qwen_windows(cfg: dict[str, Any], num_layers: int) -> tuple[int | None, ...]:
    """Per-layer windows of a Qwen2/Qwen3 config (transformers' `__post_init__` rule)."""
    window = positive_window(cfg) if cfg.get("use_sliding_window") else None
    max_window_layers = cfg.get("max_window_layers")
    return windows_from_layer_types(
        cfg, num_layers, window, max_window_layers=None if max_window_layers is None else int(max_window_layers)
    )


QWEN_WINDOW_FIELDS = ("sliding_window", "use_sliding_window", "layer_types")


class Qwen2Arch(DecoderArch):
    family = "Qwen2"

    @classmethod
    def _parse(cls, cfg: dict[str, Any]) -> DecoderArch:
        refuse_unimplemented(cfg, "qwen2", implemented=QWEN_WINDOW_FIELDS)
        check_activation(cfg, "qwen2")
        common = cls.common(cfg)
        return cls(**common, qkv_bias=True, layer_windows=qwen_windows(cfg, common["num_layers"]))


class Qwen2Model(DecoderModel):
    arch_type = Qwen2Arch
