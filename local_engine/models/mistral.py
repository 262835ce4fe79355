"""Mistral: Llama's layer with a sliding window on every layer when the config has one (Mistral 7B v0.1:
4096; later versions set `sliding_window: null`). A sliding-window layer reads only the last `sliding_window`
positions' keys and values (attention.py), never the blocks before them.

transformers' Mistral ignores `layer_types` (Ministral's alternating layers need their own model), so a
Mistral config whose `layer_types` disagrees with one window for every layer is refused, not guessed.
"""

from __future__ import annotations

from typing import Any

from parley.local_engine.errors import ModelLoadError
from parley.local_engine.models.arch import DecoderArch, check_activation, positive_window, refuse_unimplemented
from parley.local_engine.models.decoder import DecoderModel


class MistralArch(DecoderArch):
    family = "Mistral"

    @classmethod
    def _parse(cls, cfg: dict[str, Any]) -> DecoderArch:
        refuse_unimplemented(cfg, "mistral", implemented=("sliding_window", "layer_types"))
        check_activation(cfg, "mistral")
        common = cls.common(cfg)
        window = positive_window(cfg)
        types = cfg.get("layer_types")
        want = "sliding_attention" if window is not None else "full_attention"
        if types is not None and any(t != want for t in types):
            raise ModelLoadError(
                f"config.json: layer_types {types!r} is not supported for mistral models (transformers' Mistral "
                f"gives every layer {'the sliding window' if window else 'full attention'}; Ministral is another "
                "architecture)"
            )
        windows = (window,) * common["num_layers"] if window is not None else ()
        return cls(**common, layer_windows=windows)


class MistralModel(DecoderModel):
    arch_type = MistralArch
