"""What a GGUF file says about its model, checked before and after transformers' GGUF reader converts it.

transformers reads a GGUF's metadata through a fixed key table per architecture and silently skips whatever
the table lacks; its tensor map silently skips tensors it cannot place. Some of what it skips changes the
computation, so `plan` reads the metadata first (cheap: the file is memory-mapped) and, per key:
- supplies what the table misses but the shapes need (`attention.key_length` -> `head_dim` for Qwen3,
  `expert_feed_forward_length` -> `moe_intermediate_size` for Qwen3-MoE) as config overrides for the load;
- translates rope scaling (`rope.scaling.*`: linear, YaRN; llama.cpp's `rope_freqs` factor tensor back to
  llama3 parameters, verified to reproduce every factor) into the config.json the conversion writes;
- refuses, naming it, any architecture parley cannot load through this reader (`mistral`: gguf-py has no
  tensor names for it — llama.cpp writes Mistral as `llama`) and any key it does not understand. After the
  load, `check_loaded` refuses GGUF tensors the reader dropped and model weights it left at their random
  initialisation.
gpt-oss files are not given to transformers' reader at all (it does not map their expert tensors): parley
reads them itself (gguf_gpt_oss.py); `plan` checks their metadata the same way, before any conversion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parley.local_engine.errors import ModelLoadError

# GGUF general.architecture -> the HF model_type transformers' reader builds (and parley serves).
SUPPORTED = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}
DIRECT = {"gpt-oss": "gpt_oss"}  # read by parley itself (gguf_gpt_oss.py), not by transformers' reader
REFUSED = {
    "mistral": "gguf-py names no tensors for a 'mistral' architecture (llama.cpp writes Mistral models as "
    "'llama'), so transformers' GGUF reader cannot load it",
}
# Keys under the architecture's prefix that transformers' table reads (for every supported architecture).
_READ = {"context_length", "block_count", "feed_forward_length", "embedding_length", "rope.freq_base",
         "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "vocab_size"}
_MOE = {"expert_count", "expert_used_count", "expert_feed_forward_length"}
_TOKEN_IDS = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"}
_HANDLED = {"rope.dimension_count", "attention.key_length", "attention.value_length", "rope.scaling.type",
            "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.finetuned"}


@dataclass
class GGUFPlan:
    architecture: str
    model_type: str
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    """Config fields passed to `from_pretrained` (shapes the reader's table does not carry)."""
    rope_parameters: dict[str, Any] | None = None
    """Rope scaling the reader drops, for the converted config.json."""
    tensor_names: list[str] = field(default_factory=list)
    read_here: set[str] = field(default_factory=set)
    """GGUF tensors read by `plan` itself (not by transformers' reader)."""
    direct: Any = None
    """For an architecture parley reads itself (`DIRECT`): its `gguf_gpt_oss.GptOssGGUF`."""


def _value(field_: Any) -> Any:
    value = field_.contents()
    return value.decode() if isinstance(value, bytes) else value


def plan(path: Path) -> GGUFPlan:
    """Read `path`'s metadata; refuse what cannot be loaded faithfully, naming the architecture or key."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        fields = {k: _value(f) for k, f in reader.fields.items()
                  if not k.startswith("tokenizer.") or k in _TOKEN_IDS}
        tensors = {t.name: t for t in reader.tensors}
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: any parse failure
        raise ModelLoadError(f"could not read GGUF {path}: {exc}") from exc
    arch = str(fields.get("general.architecture", ""))
    name = fields.get("general.name")
    if arch == "llama" and name == "mistral":  # transformers then builds a 'mistral' model it cannot map
        arch = "mistral"
    if arch in DIRECT:
        from parley.local_engine import gguf_gpt_oss

        direct = GGUFPlan(arch, DIRECT[arch], tensor_names=list(tensors))
        direct.direct = gguf_gpt_oss.read_config(fields, tensors, path.name)
        return direct
    if arch in REFUSED:
        raise ModelLoadError(f"GGUF {path.name}: architecture {arch!r} is not supported: {REFUSED[arch]}")
    if arch not in SUPPORTED:
        raise ModelLoadError(
            f"GGUF {path.name}: architecture {arch!r} is not supported (supported: "
            f"{', '.join(sorted({*SUPPORTED, *DIRECT}))})"
        )
    p = GGUFPlan(arch, SUPPORTED[arch], tensor_names=list(tensors))
    meta = {k[len(arch) + 1 :]: v for k, v in fields.items() if k.startswith(arch + ".")}
    known = _READ | _HANDLED | (_MOE if arch == "qwen3moe" else set())
    for key in sorted(meta):
        if key not in known and not (key in _MOE and meta[key] == 0):  # a dense file's expert_count = 0
            raise ModelLoadError(f"GGUF {path.name}: metadata key '{arch}.{key}' is not supported")
    heads = int(meta["attention.head_count"]) if "attention.head_count" in meta else 0
    head_dim = int(meta["embedding_length"]) // heads if heads and "embedding_length" in meta else None
    if "attention.key_length" in meta:
        k_len, v_len = int(meta["attention.key_length"]), int(meta.get("attention.value_length", 0) or 0)
        if v_len and v_len != k_len:
            raise ModelLoadError(f"GGUF {path.name}: '{arch}.attention.value_length' {v_len} differs from "
                                 f"'{arch}.attention.key_length' {k_len} (not supported)")
        if k_len != head_dim or _has_head_dim(p.model_type):  # Qwen3's default head_dim is 128, not hidden/heads
            p.load_kwargs["head_dim"] = k_len
        head_dim = k_len
    rot = meta.get("rope.dimension_count")
    if rot is not None and head_dim is not None and int(rot) != head_dim:
        raise ModelLoadError(f"GGUF {path.name}: '{arch}.rope.dimension_count' {rot} is not the head size "
                             f"{head_dim} (partial rotary embeddings are not supported)")
    if arch == "qwen3moe" and "expert_feed_forward_length" in meta:
        p.load_kwargs["moe_intermediate_size"] = int(meta["expert_feed_forward_length"])
    theta = float(meta.get("rope.freq_base", 10000.0))
    kind = str(meta.get("rope.scaling.type", "none"))
    if kind == "linear":
        p.rope_parameters = {"rope_type": "linear", "rope_theta": theta, "factor": float(meta["rope.scaling.factor"])}
    elif kind == "yarn":
        orig = meta.get("rope.scaling.original_context_length")
        if orig is None:
            raise ModelLoadError(f"GGUF {path.name}: YaRN rope scaling without "
                                 f"'{arch}.rope.scaling.original_context_length' is not supported")
        p.rope_parameters = {"rope_type": "yarn", "rope_theta": theta, "factor": float(meta["rope.scaling.factor"]),
                             "original_max_position_embeddings": int(orig)}
    elif kind != "none":
        raise ModelLoadError(f"GGUF {path.name}: '{arch}.rope.scaling.type' {kind!r} is not supported")
    if "rope_freqs.weight" in tensors:
        if p.rope_parameters is not None or head_dim is None:
            raise ModelLoadError(f"GGUF {path.name}: tensor 'rope_freqs.weight' beside rope scaling "
                                 f"{kind!r} is not supported")
        import numpy as np

        factors = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float64).reshape(-1)
        p.rope_parameters = llama3_rope(factors, theta, head_dim, path.name)
        p.read_here.add("rope_freqs.weight")
    return p


def _has_head_dim(model_type: str) -> bool:
    """Whether transformers' config class has a head_dim field (Qwen2's has none: passing one fails)."""
    from transformers import AutoConfig

    return hasattr(AutoConfig.for_model(model_type), "head_dim")


def _llama3_factors(theta: float, head_dim: int, factor: float, lo: float, hi: float, old: float) -> list[float]:
    """llama.cpp's `rope_freqs` for llama3 rope scaling (`LlamaModel.generate_extra_tensors`)."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def llama3_rope(factors: Any, theta: float, head_dim: int, file: str) -> dict[str, Any] | None:
    """Llama-3 rope parameters that reproduce llama.cpp's per-frequency `factors` (None when all are 1).

    The factors fix `factor` (the largest) and, with Llama 3's low/high frequency factors (1 and 4), the
    pretraining context from any smoothed frequency; whatever is chosen is verified against every factor."""
    values = [float(f) for f in factors]
    if len(values) != head_dim // 2:
        raise ModelLoadError(f"GGUF {file}: 'rope_freqs.weight' has {len(values)} factors, not {head_dim // 2}")
    factor = max(values)
    if all(abs(v - 1.0) <= 1e-6 for v in values):
        return None
    lo, hi = 1.0, 4.0
    wavelens = [2 * math.pi * theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    medium = [(w, v) for w, v in zip(wavelens, values, strict=True) if 1 + 1e-6 < v < factor * (1 - 1e-6)]
    if medium:
        w, v = medium[0]
        smooth = (1 / v - 1 / factor) / (1 - 1 / factor)
        old = w * (smooth * (hi - lo) + lo)
    else:  # no smoothed band: any context between the last unscaled and the first scaled wavelength
        last_one = max((w for w, v in zip(wavelens, values, strict=True) if v <= 1 + 1e-6), default=0.0)
        first_scaled = min(w for w, v in zip(wavelens, values, strict=True) if v >= factor * (1 - 1e-6))
        old = math.sqrt(max(last_one * hi, 1e-9) * first_scaled * lo) if last_one else first_scaled * lo * 0.5
    old = float(round(old)) if abs(old - round(old)) < 1e-3 * old else old
    params = {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": lo,
              "high_freq_factor": hi, "original_max_position_embeddings": old}
    again = _llama3_factors(theta, head_dim, factor, lo, hi, old)
    if any(abs(a - b) > 1e-4 * max(abs(b), 1.0) for a, b in zip(again, values, strict=True)):
        raise ModelLoadError(f"GGUF {file}: 'rope_freqs.weight' is not llama3 rope scaling parley can "
                             "reproduce (not supported)")
    if isinstance(old, float) and old.is_integer():
        params["original_max_position_embeddings"] = int(old)
    return params


def check_loaded(p: GGUFPlan, hf: Any, loading_info: dict[str, Any], file: str) -> None:
    """Refuse a conversion that dropped a GGUF tensor or left a model weight at its random initialisation."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    tied = bool(getattr(hf.config, "tie_word_embeddings", False))
    missing = sorted(k for k in loading_info.get("missing_keys", ()) if not (tied and k == "lm_head.weight"))
    if missing:
        raise ModelLoadError(f"GGUF {file} ({p.architecture}): transformers' GGUF reader left {missing[0]!r} "
                             "unset (not in the file, or not mapped)")
    processor = TENSOR_PROCESSORS.get(p.architecture, TensorProcessor)(config=hf.config.to_dict())
    mapped = get_gguf_hf_weights_map(hf, processor)
    for name in p.tensor_names:
        if name in p.read_here:
            continue
        if name not in mapped and name.rsplit(".", 1)[0] not in mapped:
            raise ModelLoadError(f"GGUF {file} ({p.architecture}): tensor {name!r} is not read by transformers' "
                                 f"GGUF reader for a {p.model_type} model (not supported)")
