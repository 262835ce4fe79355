"""Which model class serves a checkpoint: `model_type` -> family (architectures[] for configs without one).

`build_model` is the one entry point the engine calls: config -> architecture (failing closed, arch.py) ->
weights (missing, misshapen and unused tensors named, layers.py `Checkpoint`).
"""

from __future__ import annotations

from typing import Any

import torch

from parley.local_engine.errors import ModelLoadError
from parley.local_engine.models.arch import DecoderArch
from parley.local_engine.models.decoder import DecoderModel
from parley.local_engine.models.gpt_oss import GptOssModel
from parley.local_engine.models.llama import LlamaModel
from parley.local_engine.models.mistral import MistralModel
from parley.local_engine.models.qwen2 import Qwen2Model
from parley.local_engine.models.qwen3 import Qwen3Model
from parley.local_engine.models.qwen3_moe import Qwen3MoeModel

MODEL_TYPES: dict[str, type[DecoderModel]] = {
    "llama": LlamaModel,
    "mistral": MistralModel,
    "qwen2": Qwen2Model,
    "qwen3": Qwen3Model,
    "qwen3_moe": Qwen3MoeModel,
    "gpt_oss": GptOssModel,
}
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GptOssForCausalLM": "gpt_oss",
}


def model_class(cfg: dict[str, Any]) -> type[DecoderModel]:
    """The family class for a HF config; `ModelLoadError` naming an architecture parley does not serve."""
    kind = str(cfg.get("model_type") or "").lower()
    if not kind:
        known = [_ARCHITECTURES[a] for a in cfg.get("architectures") or () if a in _ARCHITECTURES]
        kind = known[0] if known else ""
    if kind not in MODEL_TYPES:
        raise ModelLoadError(
            f"architecture {kind or cfg.get('architectures')!r} is not supported (parley serves model_type "
            f"{', '.join(MODEL_TYPES)})"
        )
    return MODEL_TYPES[kind]


def architecture(cfg: dict[str, Any]) -> tuple[type[DecoderModel], DecoderArch]:
    """The family class and the architecture it reads from `cfg` (checked before any weight is read)."""
    cls = model_class(cfg)
    return cls, cls.arch_type.from_hf_config(cfg)


def build_model(cfg: dict[str, Any], state: dict[str, torch.Tensor], device: torch.device,
                dtype: torch.dtype) -> DecoderModel:
    cls, arch = architecture(cfg)
    return cls.from_hf_state_dict(arch, state, device, dtype)
