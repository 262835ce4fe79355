"""A gpt-oss GGUF read here, not by transformers' GGUF reader (which does not map its expert tensors).

llama.cpp's layout (`convert_hf_to_gguf.py` `GptOssModel`; gguf-py `MODEL_ARCH.GPT_OSS`, architecture
`gpt-oss`), turned back into the Hugging Face `GptOssForCausalLM` state dict and config.json that
`models/gpt_oss.py` loads:

- tensors: `token_embd`, `output_norm`, `output` (absent: tied to the embedding, as llama.cpp falls back);
  per layer `attn_norm` / `post_attention_norm` (HF `input_layernorm` / `post_attention_layernorm`),
  `attn_q/k/v/output` with biases (no q/k row permutation: gpt-oss is not written as a llama model),
  `attn_sinks.weight` (HF `self_attn.sinks`), the router `ffn_gate_inp` weight and bias, and the experts
  `ffn_gate_exps` / `ffn_up_exps` `[E, I, H]` (HF's `gate_up_proj` `[E, H, 2I]` split into its interleaved
  even (gate) and odd (up) columns, transposed), `ffn_down_exps` `[E, H, I]` (HF `[E, I, H]`, transposed),
  each with a bias. Every tensor of the file must be one of these and every one of these must be there.
- MXFP4 experts (`ffn_*_exps.weight` of GGML type MXFP4, as released GGUFs carry them) are repacked, without
  a float round trip, into HF's `*_blocks` / `*_scales` (the same e8m0 exponent per 32 values; llama.cpp
  stores a block's 16 bytes as elements j (low nibble) and j + 16 (high nibble), HF as 2k and 2k + 1), so
  the folder stays MXFP4 and the model dequantises it at load. Other tensors: F32, F16 and BF16 kept as
  they are; any other GGML type dequantised by `gguf.quants.dequantize` to fp32.
- metadata (`gpt-oss.*`): the sizes; `expert_count`, `expert_used_count`, `expert_feed_forward_length`
  (HF `intermediate_size`, which gpt-oss uses for its experts only); `attention.sliding_window`; YaRN from
  `rope.scaling.type` / `.factor` / `.original_context_length` (and `.yarn_beta_fast` / `.yarn_beta_slow`
  where a file has them; llama.cpp's defaults, 32 and 1, are gpt-oss's). A key not in this list is refused,
  naming it, as is any value parley cannot use.

What the format does not say, taken from llama.cpp's own hard-coded gpt-oss graph (`LLM_ARCH_OPENAI_MOE`),
which is also what the gpt-oss checkpoints use:
- the SwiGLU clamp limit: llama.cpp has no metadata field for it and hard-codes 7.0 (with alpha 1.702) in
  its `swiglu_oai` experts; gpt-oss's `swiglu_limit` is 7.0. Used as such: a file from a model with
  another limit cannot say so, and would compute differently in llama.cpp too;
- which layers slide: llama.cpp sets `swa_pattern` 2 for gpt-oss, i.e. layer 0 sliding, layer 1 full,
  alternating — HF's `layer_types` `["sliding_attention", "full_attention", ...]` (released gpt-oss
  configs). A file's `attention.sliding_window_pattern` is accepted only if it says the same;
- routing: softmax over the top-k router logits (`SOFTMAX_WEIGHT`), no renormalisation or scale;
- YaRN `truncate`: gpt-oss's configs say false (the correction range is not rounded) and that is used, so
  the model computes what HF transformers computes on the original checkpoint. (ggml rounds that range
  outward, floor/ceil, so llama.cpp's own rope differs slightly at the band edges.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parley.local_engine.errors import ModelLoadError

ARCH = "gpt-oss"
SWIGLU_LIMIT = 7.0  # llama.cpp's hard-coded value (no GGUF key); gpt-oss's own
SWIGLU_ALPHA = 1.702
_KEYS = {
    "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.dimension_count",
    "rope.freq_base", "attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count",
    "expert_feed_forward_length", "attention.sliding_window", "attention.sliding_window_pattern",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.finetuned",
    "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "vocab_size",
}
_REQUIRED = ("embedding_length", "block_count", "attention.head_count", "attention.layer_norm_rms_epsilon",
             "expert_count", "expert_used_count", "attention.sliding_window")
# llama.cpp name -> HF name, per layer (weights and biases alike)
_LAYER = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
          "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate_inp": "mlp.router"}


@dataclass
class GptOssGGUF:
    config: dict[str, Any]
    """The HF config.json (a `GptOssConfig`'s fields)."""
    tensors: dict[str, Any] = field(default_factory=dict)
    """GGUF tensor name -> the reader's tensor (read by `state_dict`)."""


def _int(meta: dict[str, Any], key: str, file: str) -> int:
    value = meta[key]
    if isinstance(value, list | tuple) or isinstance(value, bool):
        raise ModelLoadError(f"GGUF {file}: '{ARCH}.{key}' = {value!r} is not supported (one integer expected; "
                             "per-layer values are not)")
    return int(value)


def read_config(fields: dict[str, Any], tensors: dict[str, Any], file: str) -> GptOssGGUF:
    """The HF config a gpt-oss GGUF's metadata describes; `ModelLoadError` naming a key it cannot use."""
    meta = {k[len(ARCH) + 1 :]: v for k, v in fields.items() if k.startswith(ARCH + ".")}
    for key in sorted(meta):
        if key not in _KEYS:
            raise ModelLoadError(f"GGUF {file}: metadata key '{ARCH}.{key}' is not supported")
    for key in _REQUIRED:
        if key not in meta:
            raise ModelLoadError(f"GGUF {file}: metadata key '{ARCH}.{key}' is missing (a gpt-oss file needs it)")
    hidden, layers = _int(meta, "embedding_length", file), _int(meta, "block_count", file)
    heads = _int(meta, "attention.head_count", file)
    kv_heads = _int(meta, "attention.head_count_kv", file) if "attention.head_count_kv" in meta else heads
    head_dim = _int(meta, "attention.key_length", file) if "attention.key_length" in meta else hidden // heads
    if "attention.value_length" in meta and _int(meta, "attention.value_length", file) != head_dim:
        raise ModelLoadError(f"GGUF {file}: '{ARCH}.attention.value_length' differs from the key length "
                             f"{head_dim} (not supported)")
    if "rope.dimension_count" in meta and _int(meta, "rope.dimension_count", file) != head_dim:
        raise ModelLoadError(f"GGUF {file}: '{ARCH}.rope.dimension_count' is not the head size {head_dim} "
                             "(partial rotary embeddings are not supported)")
    if "expert_feed_forward_length" in meta:
        inter = _int(meta, "expert_feed_forward_length", file)
    elif "feed_forward_length" in meta:
        inter = _int(meta, "feed_forward_length", file)
    else:
        raise ModelLoadError(f"GGUF {file}: metadata key '{ARCH}.expert_feed_forward_length' is missing")
    if "feed_forward_length" in meta and _int(meta, "feed_forward_length", file) != inter:
        raise ModelLoadError(f"GGUF {file}: '{ARCH}.feed_forward_length' differs from "
                             f"'{ARCH}.expert_feed_forward_length' {inter} (gpt-oss has experts only: not supported)")
    window = _int(meta, "attention.sliding_window", file)
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if "attention.sliding_window_pattern" in meta:
        pattern = meta["attention.sliding_window_pattern"]
        same = pattern == 2 if not isinstance(pattern, list | tuple) else (
            [bool(p) for p in pattern] == [t == "sliding_attention" for t in layer_types])
        if not same:
            raise ModelLoadError(f"GGUF {file}: '{ARCH}.attention.sliding_window_pattern' = {pattern!r} is not "
                                 "gpt-oss's (every other layer sliding, from layer 0): not supported")
    theta = float(meta.get("rope.freq_base", 150000.0))
    kind = str(meta.get("rope.scaling.type", "none"))
    rope: dict[str, Any]
    if kind == "yarn":
        for key in ("rope.scaling.factor", "rope.scaling.original_context_length"):
            if key not in meta:
                raise ModelLoadError(f"GGUF {file}: YaRN rope scaling without '{ARCH}.{key}' is not supported")
        rope = {"rope_type": "yarn", "rope_theta": theta, "factor": float(meta["rope.scaling.factor"]),
                "original_max_position_embeddings": _int(meta, "rope.scaling.original_context_length", file),
                "beta_fast": float(meta.get("rope.scaling.yarn_beta_fast", 32.0)),
                "beta_slow": float(meta.get("rope.scaling.yarn_beta_slow", 1.0)), "truncate": False}
    elif kind == "none":
        extra = sorted(k for k in meta if k.startswith("rope.scaling.") and k != "rope.scaling.type")
        if extra:
            raise ModelLoadError(f"GGUF {file}: '{ARCH}.{extra[0]}' without YaRN rope scaling is not supported")
        rope = {"rope_type": "default", "rope_theta": theta}
    else:
        raise ModelLoadError(f"GGUF {file}: '{ARCH}.rope.scaling.type' {kind!r} is not supported (yarn is)")
    if "token_embd.weight" not in tensors:
        raise ModelLoadError(f"GGUF {file} ({ARCH}): tensor 'token_embd.weight' is missing")
    vocab = int(tensors["token_embd.weight"].shape[-1])
    if "vocab_size" in meta and _int(meta, "vocab_size", file) != vocab:
        raise ModelLoadError(f"GGUF {file}: '{ARCH}.vocab_size' is not the embedding's {vocab} rows")

    def token(key: str) -> int | None:
        value = fields.get(f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    cfg: dict[str, Any] = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": vocab,
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "max_position_embeddings": _int(meta, "context_length", file) if "context_length" in meta else 131072,
        "rms_norm_eps": float(meta["attention.layer_norm_rms_epsilon"]),
        "num_local_experts": _int(meta, "expert_count", file),
        "num_experts_per_tok": _int(meta, "expert_used_count", file),
        "sliding_window": window, "layer_types": layer_types, "rope_parameters": rope,
        "swiglu_limit": SWIGLU_LIMIT, "swiglu_alpha": SWIGLU_ALPHA, "attention_bias": True,
        "hidden_act": "silu", "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": token("bos_token_id"), "eos_token_id": token("eos_token_id"),
        "pad_token_id": token("padding_token_id"),
    }
    return GptOssGGUF(cfg, dict(tensors))


def _array(t: Any, file: str) -> np.ndarray:
    """A GGUF tensor as a float numpy array in its numpy shape (F32/F16/BF16 as stored, others dequantised)."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    shape = tuple(int(n) for n in reversed(list(t.shape)))
    kind = t.tensor_type
    if kind == Q.BF16:
        return np.asarray(t.data).view(np.uint16).reshape(shape)  # bf16 bits; made a tensor in `_torch`
    if kind in (Q.F32, Q.F16):
        return np.asarray(t.data).reshape(shape)
    try:
        return np.asarray(dequantize(np.asarray(t.data), kind), dtype=np.float32).reshape(shape)
    except (NotImplementedError, ValueError) as exc:
        raise ModelLoadError(f"GGUF {file} ({ARCH}): tensor {t.name!r} of type {kind.name} cannot be "
                             f"dequantised: {exc}") from exc


def _torch(a: np.ndarray, bf16: bool) -> Any:
    import torch

    t = torch.from_numpy(np.array(a))  # a copy: the reader's arrays are a read-only memory map
    return t.view(torch.bfloat16) if bf16 else t


def mxfp4_to_hf(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp MXFP4 rows `[..., blocks * 17]` (per block: e8m0 exponent, then 16 bytes holding elements j
    in the low and j + 16 in the high nibble) -> HF `(blocks [..., groups, 16], scales [..., groups])`, HF's
    bytes holding elements 2k (low nibble) and 2k + 1 (high)."""
    blocks = raw.reshape(*raw.shape[:-1], -1, 17)
    scales, qs = blocks[..., 0], blocks[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [..., groups, 32] in element order
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(packed), np.ascontiguousarray(scales)


def state_dict(g: GptOssGGUF, file: str) -> dict[str, Any]:
    """The HF `GptOssForCausalLM` state dict of the file's tensors; sets `quantization_config` on `g.config`
    when the experts stay MXFP4. `ModelLoadError` names a missing, misshapen or unknown tensor."""
    import torch
    from gguf import GGMLQuantizationType as Q

    c = g.config
    E, H, inter = c["num_local_experts"], c["hidden_size"], c["intermediate_size"]
    q_rows, kv_rows = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    tensors, used = g.tensors, set()

    def get(name: str, shape: tuple[int, ...]) -> Any:
        if name not in tensors:
            raise ModelLoadError(f"GGUF {file} ({ARCH}): tensor {name!r} is missing")
        t = tensors[name]
        got = tuple(int(n) for n in reversed(list(t.shape)))
        if got != shape:
            raise ModelLoadError(f"GGUF {file} ({ARCH}): tensor {name!r} has shape {got}; the metadata implies "
                                 f"{shape}")
        used.add(name)
        return t

    def dense(name: str, shape: tuple[int, ...]) -> Any:
        t = get(name, shape)
        return _torch(_array(t, file), t.tensor_type == Q.BF16)

    def floats(name: str, shape: tuple[int, ...]) -> np.ndarray:
        return np.asarray(dense(name, shape).float().numpy())

    sd: dict[str, Any] = {"model.embed_tokens.weight": dense("token_embd.weight", (c["vocab_size"], H)),
                          "model.norm.weight": dense("output_norm.weight", (H,))}
    if not c["tie_word_embeddings"]:
        sd["lm_head.weight"] = dense("output.weight", (c["vocab_size"], H))
    shapes = {"attn_norm": (H,), "post_attention_norm": (H,), "attn_q": (q_rows, H), "attn_k": (kv_rows, H),
              "attn_v": (kv_rows, H), "attn_output": (H, q_rows), "ffn_gate_inp": (E, H)}
    packed = False
    for i in range(c["num_hidden_layers"]):
        blk, hf = f"blk.{i}.", f"model.layers.{i}."
        for name, shape in shapes.items():
            sd[f"{hf}{_LAYER[name]}.weight"] = dense(f"{blk}{name}.weight", shape)
            if name not in ("attn_norm", "post_attention_norm"):
                sd[f"{hf}{_LAYER[name]}.bias"] = dense(f"{blk}{name}.bias", (shape[0],))
        sd[f"{hf}self_attn.sinks"] = dense(f"{blk}attn_sinks.weight", (c["num_attention_heads"],))
        e = f"{hf}mlp.experts."
        gate, up = get(f"{blk}ffn_gate_exps.weight", (E, inter, H)), get(f"{blk}ffn_up_exps.weight", (E, inter, H))
        down = get(f"{blk}ffn_down_exps.weight", (E, H, inter))
        if gate.tensor_type == up.tensor_type == Q.MXFP4:  # HF rows: gate and up interleaved
            g_blocks, g_scales = mxfp4_to_hf(np.asarray(gate.data))
            u_blocks, u_scales = mxfp4_to_hf(np.asarray(up.data))
            sd[e + "gate_up_proj_blocks"] = torch.from_numpy(np.stack([g_blocks, u_blocks], 2).reshape(
                E, 2 * inter, *g_blocks.shape[2:]))
            sd[e + "gate_up_proj_scales"] = torch.from_numpy(np.stack([g_scales, u_scales], 2).reshape(
                E, 2 * inter, -1))
            packed = True
        else:
            gu = np.empty((E, H, 2 * inter), dtype=np.float32)
            gu[:, :, 0::2] = floats(gate.name, (E, inter, H)).transpose(0, 2, 1)
            gu[:, :, 1::2] = floats(up.name, (E, inter, H)).transpose(0, 2, 1)
            sd[e + "gate_up_proj"] = torch.from_numpy(gu)
        if down.tensor_type == Q.MXFP4:
            d_blocks, d_scales = mxfp4_to_hf(np.asarray(down.data))
            sd[e + "down_proj_blocks"], sd[e + "down_proj_scales"] = torch.from_numpy(d_blocks), torch.from_numpy(
                d_scales)
            packed = True
        else:
            sd[e + "down_proj"] = torch.from_numpy(np.ascontiguousarray(floats(down.name, (E, H, inter))
                                                                        .transpose(0, 2, 1)))
        gu_bias = np.empty((E, 2 * inter), dtype=np.float32)
        gu_bias[:, 0::2] = floats(f"{blk}ffn_gate_exps.bias", (E, inter))
        gu_bias[:, 1::2] = floats(f"{blk}ffn_up_exps.bias", (E, inter))
        sd[e + "gate_up_proj_bias"] = torch.from_numpy(gu_bias)
        sd[e + "down_proj_bias"] = dense(f"{blk}ffn_down_exps.bias", (E, H))
    left = sorted(set(tensors) - used)
    if left:
        raise ModelLoadError(f"GGUF {file} ({ARCH}): tensor {left[0]!r} is not part of a gpt-oss model "
                             "(not supported)")
    if packed:
        c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    return sd


def convert(path: Path, folder: Path, g: GptOssGGUF) -> None:
    """Write `path` (a gpt-oss GGUF, its metadata read into `g` by `read_config`) as a HF folder at `folder`:
    model.safetensors, config.json, generation_config.json and the tokenizer (transformers' GGUF tokenizer
    converter; its config reader fails on gpt-oss files, its tokenizer builder does not)."""
    import json

    import transformers
    from safetensors.torch import save_file

    sd = state_dict(g, path.name)
    if g.config["tie_word_embeddings"]:
        sd.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(g.config, indent=2))
    gen = {k: g.config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if g.config[k] is not None}
    transformers.GenerationConfig(**gen).save_pretrained(str(folder))
    try:
        tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                   local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers' GGUF tokenizer converter: any failure
        raise ModelLoadError(f"GGUF {path.name}: cannot build its tokenizer: {exc}") from exc
    tok.save_pretrained(str(folder))
