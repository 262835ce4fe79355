"""A tiny HF model written as an fp32 GGUF the way llama.cpp's `convert_hf_to_gguf.py` lays each family out.

Per family: the `general.architecture` llama.cpp uses (Mistral is written as `llama`, as llama.cpp does), its
tensor names (`blk.N.attn_q.weight`, `ffn_gate_exps`, `attn_sinks`, ...), the metadata keys its converter
writes (head_dim as `attention.key_length`, expert counts and sizes, sliding window, rope scaling), q/k rows
permuted for llama-arch files (llama.cpp's `LlamaModel.permute`; transformers' GGUF reader undoes it), MoE
experts stacked per layer, gpt-oss's interleaved gate/up split in two, and a byte-level BPE vocabulary.
gpt-oss's expert matrices can be written as MXFP4 (`mxfp4=True`, gguf-py's quantiser, as released gpt-oss
GGUFs carry them); `round_experts_to_mxfp4` first sets the HF model's experts to values MXFP4 holds exactly,
so the HF twin computes what the file holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

# HF model_type -> llama.cpp general.architecture
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe",
             "gpt_oss": "gpt-oss"}

_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "mlp.gate": "ffn_gate_inp", "mlp.router": "ffn_gate_inp", "input_layernorm": "attn_norm",
          "post_attention_layernorm": "ffn_norm"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
        "model.norm.weight": "output_norm.weight"}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: each head's rotary halves interleaved (GPT-J order)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _mxfp4_round_trip(w: np.ndarray) -> np.ndarray:
    """`w` (rows of a multiple of 32 values) through gguf-py's MXFP4 quantiser and back."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    q = quantize(np.ascontiguousarray(w, dtype=np.float32), GGMLQuantizationType.MXFP4)
    return np.asarray(dequantize(q, GGMLQuantizationType.MXFP4)).reshape(w.shape)


def round_experts_to_mxfp4(hf: Any) -> None:
    """Set a gpt-oss model's expert matrices (in place) to their MXFP4 values, in llama.cpp's block layout
    (32 consecutive inputs of one output share a scale)."""
    import torch

    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):  # [E, in, out]
                rows = p.detach().float().numpy().transpose(0, 2, 1)  # [E, out, in]: llama.cpp's rows
                p.copy_(torch.from_numpy(_mxfp4_round_trip(rows).transpose(0, 2, 1).copy()))


def gguf_tensors(hf: Any, arch: str) -> Iterator[tuple[str, np.ndarray]]:
    c = hf.config
    for name, tensor in hf.state_dict().items():
        w = tensor.detach().float().numpy()
        if name in _TOP:
            if name == "lm_head.weight" and getattr(c, "tie_word_embeddings", False):
                continue
            yield _TOP[name], w
            continue
        parts = name.split(".")
        blk, module, kind = f"blk.{parts[2]}", ".".join(parts[3:-1]), parts[-1]
        if module == "mlp.experts":  # stacked experts: HF fuses gate and up, llama.cpp keeps them apart
            if kind == "gate_up_proj" and arch == "gpt-oss":  # [E, H, 2I], gate/up interleaved column by column
                yield f"{blk}.ffn_gate_exps.weight", np.ascontiguousarray(w[:, :, ::2].transpose(0, 2, 1))
                yield f"{blk}.ffn_up_exps.weight", np.ascontiguousarray(w[:, :, 1::2].transpose(0, 2, 1))
            elif kind == "gate_up_proj_bias":
                yield f"{blk}.ffn_gate_exps.bias", np.ascontiguousarray(w[:, ::2])
                yield f"{blk}.ffn_up_exps.bias", np.ascontiguousarray(w[:, 1::2])
            elif kind == "gate_up_proj":  # qwen3 moe: [E, 2I, H], gate first
                half = w.shape[1] // 2
                yield f"{blk}.ffn_gate_exps.weight", np.ascontiguousarray(w[:, :half])
                yield f"{blk}.ffn_up_exps.weight", np.ascontiguousarray(w[:, half:])
            elif kind == "down_proj":
                yield f"{blk}.ffn_down_exps.weight", np.ascontiguousarray(w.transpose(0, 2, 1) if arch == "gpt-oss"
                                                                          else w)
            elif kind == "down_proj_bias":
                yield f"{blk}.ffn_down_exps.bias", w
            else:
                raise ValueError(name)
            continue
        if kind == "sinks":
            yield f"{blk}.attn_sinks.weight", w
            continue
        gguf_module = _LAYER[module]
        if arch == "gpt-oss" and module == "post_attention_layernorm":
            gguf_module = "post_attention_norm"
        if arch == "llama" and kind == "weight" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            w = permute(w, c.num_attention_heads if module == "self_attn.q_proj" else c.num_key_value_heads)
        yield f"{blk}.{gguf_module}.{kind}", w


def write_gguf(hf: Any, path: Path, *, name: str, arch: str | None = None, vocab_size: int | None = None,
               mxfp4: bool = False, blocks: dict[str, tuple[Any, np.ndarray]] | None = None) -> int:
    """`hf` as an fp32 GGUF at `path` (gpt-oss's expert matrices as MXFP4 if `mxfp4`; a tensor named in
    `blocks` written as the given (GGMLQuantizationType, raw block bytes) instead of `hf`'s values); returns the
    end-of-sequence token id (the vocabulary's last)."""
    import pytest
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    gguf = pytest.importorskip("gguf")
    c = hf.config
    arch = arch or GGUF_ARCH[c.model_type]
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    rope = dict(c.rope_parameters or {})
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if arch == "llama":
        w.add_vocab_size(c.vocab_size)
        w.add_rope_dimension_count(head_dim)
    experts = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(getattr(c, "moe_intermediate_size", None) or c.intermediate_size)
    if arch == "gpt-oss":
        w.add_sliding_window(c.sliding_window)
    kind = rope.get("rope_type", "default")
    if kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    elif kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if mxfp4 else gguf.LlamaFileType.ALL_F32)

    n_vocab = vocab_size or c.vocab_size
    byte_symbols = list(bytes_to_unicode().values())
    tokens, merges = list(byte_symbols), []
    for a in byte_symbols[65:91]:
        for b in byte_symbols[97:123]:
            if len(tokens) < n_vocab - 2:
                tokens.append(a + b)
                merges.append(f"{a} {b}")
    tokens += ["<|endoftext|>", "<|im_end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre({"llama": "llama-bpe", "gpt-oss": "gpt-4o"}.get(arch, "qwen2"))
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 2) + [3, 3])
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)

    if kind == "llama3":  # llama.cpp bakes llama3 rope scaling into a per-frequency factor tensor
        inv = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
        wavelen = 2 * np.pi / inv
        old, lo, hi = rope["original_max_position_embeddings"], rope["low_freq_factor"], rope["high_freq_factor"]
        smooth = (old / wavelen - lo) / (hi - lo)
        factors = np.where(wavelen < old / hi, 1.0,
                           np.where(wavelen > old / lo, rope["factor"], 1 / ((1 - smooth) / rope["factor"] + smooth)))
        w.add_tensor("rope_freqs.weight", factors.astype(np.float32))
    for tensor_name, array in gguf_tensors(hf, arch):
        if blocks and tensor_name in blocks:
            qtype, raw = blocks[tensor_name]
            w.add_tensor(tensor_name, raw, raw_dtype=qtype)
        elif mxfp4 and tensor_name.endswith("_exps.weight"):
            q = gguf.quants.quantize(array, gguf.GGMLQuantizationType.MXFP4)
            assert np.array_equal(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.MXFP4).reshape(array.shape),
                                  array), f"{tensor_name}: not MXFP4 values (round_experts_to_mxfp4 first)"
            w.add_tensor(tensor_name, q, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            w.add_tensor(tensor_name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return len(tokens) - 1
