"""A GGUF file's Q4_0 / Q4_1 / Q8_0 layer weights read as blocks, for `quantization="q4"` / `"q8"` (quant4.py).

The loader turns a GGUF into a Hugging Face folder of fp32 weights (loader.py; transformers' GGUF reader
dequantises and, for Llama, reorders q/k rows). In a group-quantised mode the engine then replaces each
layer matrix of that state dict with the file's own blocks (`overlay`): `gguf.GGUFReader` gives every
tensor's raw bytes and type, `quant4.decode_gguf_blocks` repacks them without a float round trip. The
mapping from GGUF rows to the state dict's rows is not assumed: each candidate tensor's blocks are
dequantised once and compared bitwise with the fp32 tensor of the folder, as is and under llama.cpp's q/k
row permutation; a tensor that matches neither (an unknown family's convention) keeps the float path
(quantised at load). So a direct load computes exactly what the file holds, or falls back visibly
(`OverlayReport`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from parley.local_engine.quant4 import RowQuant, decode_gguf_blocks

_LAYER = re.compile(r"^blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")
_HF = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight` (dense layer matrices only)."""
    m = _LAYER.match(gguf_name)
    return None if m is None else f"model.layers.{m.group(1)}.{_HF[m.group(2)]}.weight"


def llama_rows(rows: int, heads: int) -> torch.Tensor:
    """Row index turning llama.cpp's q/k row order into transformers' (its GGUF reader's reverse permute)."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(-1)


@dataclass
class OverlayReport:
    direct: dict[str, str] = field(default_factory=dict)  # HF name -> GGUF type loaded as blocks
    skipped: dict[str, str] = field(default_factory=dict)  # HF name -> why it stayed float


def overlay(path: Path, state: dict[str, Any], scheme: str, *, num_heads: int,
            num_kv_heads: int) -> OverlayReport:
    """Replace (in place) the dense layer matrices of `state` by the GGUF file's blocks where the layout maps:
    Q4_0 / Q4_1 in both modes, Q8_0 in q8 mode (in q4 mode a Q8_0 matrix is requantised to 4 bits from fp32)."""
    import gguf

    wanted = {"Q4_0", "Q4_1"} | ({"Q8_0"} if scheme == "q8" else set())
    report = OverlayReport()
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None or name not in state:
            continue
        kind = t.tensor_type.name
        if kind not in wanted:
            report.skipped[name] = f"GGUF type {kind}"
            continue
        ref = state[name]
        if not isinstance(ref, torch.Tensor) or ref.dim() != 2:
            continue
        rows, cols = int(ref.shape[0]), int(ref.shape[1])
        try:
            rq = decode_gguf_blocks(kind, t.data, (rows, cols))
        except ValueError as exc:
            report.skipped[name] = str(exc)
            continue
        matched = _match(rq, ref.to(torch.float32), name, num_heads, num_kv_heads)
        if matched is None:
            report.skipped[name] = "its blocks do not dequantise to the converted tensor"
            continue
        state[name] = matched
        report.direct[name] = kind
    return report


def _match(rq: RowQuant, ref: torch.Tensor, name: str, num_heads: int, num_kv_heads: int) -> RowQuant | None:
    if torch.equal(rq.dequantize(), ref):
        return rq
    heads = num_heads if ".q_proj." in name else num_kv_heads if ".k_proj." in name else 0
    if heads and rq.shape[0] % (2 * heads) == 0:
        permuted = rq.rows(llama_rows(rq.shape[0], heads))
        if torch.equal(permuted.dequantize(), ref):
            return permuted
    return None
