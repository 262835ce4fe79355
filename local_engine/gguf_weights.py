"""A GGUF file's quantised layer weights read as blocks, for `quantization="q4"` / `"q8"` (quant4.py).

The loader turns a GGUF into a Hugging Face folder of fp32 weights (loader.py; transformers' GGUF reader
dequantises and, for Llama, reorders q/k rows). In a group-quantised mode the engine then replaces each
layer matrix of that state dict with the file's own blocks (`overlay`): `gguf_header.tensor_arrays` gives every
tensor's raw bytes and type, `quant4.decode_gguf_blocks` repacks them without a float round trip. The
mapping from GGUF rows to the state dict's rows is not assumed: each candidate tensor's blocks are
dequantised once and compared bitwise with the fp32 tensor of the folder, as is and under llama.cpp's q/k
row permutation; a tensor that matches neither (an unknown family's convention) keeps the float path
(quantised at load). So a direct load computes exactly what the file holds, or falls back visibly
(`OverlayReport`).

Which types load as blocks: in q8 mode every type `quant4.BLOCK_TYPES` lists (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q5_K, Q6_K; 4-bit ones stay 4-bit), so a Q4_K_M / Q5_K_M / Q6_K file, whose matrices mix these, runs
entirely on its own blocks; in q4 mode the 4-bit ones (Q4_0, Q4_1, Q4_K), the rest requantised to 4 bits
from fp32 (what q4 asks for). Other types (Q2_K, Q3_K, the IQ formats, F16/F32) are quantised at load, and the
report says so. llama.cpp's quantiser writes a K-quant only for rows that are whole 256-value super-blocks
and falls back to Q5_0 / Q5_1 / Q8_0 for others (SmolLM2's 576-wide matrices), hence the 32-value types here.

Measured (benchmarks/kquants.py, llama-perplexity's protocol: 128-token chunks of benchmarks/data/perplexity.txt,
the second half of each scored; on the f32 source file parley 23.3154, llama.cpp 23.3152): SmolLM2-135M
Q4_K_M q8 mode 24.159 vs llama.cpp 24.078 (+0.34 %), Q5_K_M 25.964 vs 26.273 (-1.18 %), Q6_K 23.606 vs
23.596 (+0.04 %); in q4 mode, which requantises those files' Q5_0 / Q5_1 / Q8_0 matrices, 34.4-39.8.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from parley.local_engine.errors import ModelLoadError
from parley.local_engine.quant4 import BLOCK_TYPES, FOUR_BIT_TYPES, RowQuant, decode_gguf_blocks

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


def loadable_types(scheme: str) -> frozenset[str]:
    """The GGUF types `overlay` loads as blocks in `scheme` ("q4": the 4-bit ones; "q8": all of BLOCK_TYPES)."""
    return FOUR_BIT_TYPES if scheme == "q4" else frozenset(BLOCK_TYPES)


def overlay(path: Path, state: dict[str, Any], scheme: str, *, num_heads: int,
            num_kv_heads: int) -> OverlayReport:
    """Replace (in place) the dense layer matrices of `state` by the GGUF file's blocks where the layout maps
    (`loadable_types(scheme)`); the report names each matrix left to the float path and why. A file gguf's
    reader cannot read (cut, damaged header) is a `ModelLoadError` naming it."""
    from parley.local_engine.gguf_header import tensor_arrays

    wanted = loadable_types(scheme)
    report = OverlayReport()
    try:
        tensors = tensor_arrays(path)  # the header read by hand: GGUFReader parses every string (seconds)
    except (ValueError, OSError, KeyError, IndexError, TypeError) as exc:  # gguf's reader on a damaged file
        raise ModelLoadError(f"cannot read the quantised blocks of {path}: {exc}") from exc
    for info, data in tensors:
        name = hf_name(info.name)
        if name is None or name not in state:
            continue
        kind = info.type_name
        if kind not in wanted:
            why = f"requantised to 4 bits in q4 mode (q8 mode loads {kind} as blocks)" if kind in BLOCK_TYPES \
                else "no block layout here (quantised at load)"
            report.skipped[name] = f"GGUF type {kind}: {why}"
            continue
        ref = state[name]
        if not isinstance(ref, torch.Tensor) or ref.dim() != 2:
            continue
        rows, cols = int(ref.shape[0]), int(ref.shape[1])
        try:
            rq = decode_gguf_blocks(kind, data, (rows, cols))
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
