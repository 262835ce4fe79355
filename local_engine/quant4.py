"""Group-wise quantised weights executed quantised: `EngineConfig(quantization="q4")` and `"q8"`.

**q4** — 4-bit weights in groups of 32 input channels, each group with a scale and minimum (w = d * q + m,
q in 0..15): GGUF's Q4_1 layout; GGUF Q4_0 blocks (w = d * (q - 8)) are the same with m = -8 d (exact in
fp16), Q4_K's sub-blocks of 32 the same with d = super-scale x 6-bit scale and m = -(super-min x 6-bit min).
**q8** — 8-bit weights in groups of 32 (w = d * q, q in -128..127; Q8_0 as stored, Q5_0 as q - 16), optionally
with a minimum (Q5_1, Q5_K: w = d q + m, q in 0..31) or one scale per 16 inputs (Q6_K: w = d sc (q - 32)).
Both run through our own C++ kernel (`q4_kernel.py`, which says why no maintained PyTorch kernel fits):
activations quantised to int8 per group of 32 on the fly, integer dot products with AVX-512 VNNI, per-group
fp32 rescaling. Results are deterministic and bitwise batch invariant.

Scales are fp16 where the file stores them so (the 32-value blocks) and fp32 where the file's scale is a
product (K-quants: an fp16 times a 6- or 8-bit integer needs up to 19 significant bits; fp16 would round it by
up to 2^-11 relative), so every block type runs exactly the values gguf-py dequantises. fp32 scales cost
bandwidth: Q4_K reads 6 bits per weight where fp16 scales would read 5.

Where the weights come from:
- a GGUF file's block tensors (`BLOCK_TYPES`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) are read as raw
  blocks (`gguf.GGUFReader`) and unpacked with integer operations into the kernel's layout, no fp32 round
  trip of the weights (`gguf_weights`); 5- and 6-bit values run in the 8-bit layout. A 4-bit tensor stays
  4-bit in q8 mode (requantising cannot add precision); in q4 mode the others are requantised to 4 bits
  (what q4 asks for). Rows of different types that share one GEMM (a Q4_K_M file's q, k and v) are widened
  to one layout exactly (`RowQuant.widened`);
- any other tensor (HF safetensors, GGUF F16/F32, Q2_K/Q3_K/IQ types, which the loader dequantises) is
  quantised at load: q4 with min/max per group (Q4_1's rule), q8 with max |w| / 127 per group (Q8_0's).

The decoder folds each RMSNorm weight into the columns of the matrix after it; on quantised blocks that
would need requantising, so a quantised weight carries it as `col_scale`, which the kernel multiplies into
the activation before quantising it (free: the activation is read once anyway).

The LM head (tied to the embedding in SmolLM2) stays fp32 by default (the seed document: 4-bit on the output
side took perplexity from 61 to 8,123). With `quantize_lm_head` it runs in the 8-bit group layout, in q4
mode too (SmolLM2's GGUF stores the tied embedding as Q8_0, and requantising its fp32 copy gives back exactly
the file's blocks, tested): measured on SmolLM2, a 4-bit head costs far more perplexity than all the 4-bit
layers together (benchmarks/engine_vs_llamacpp.py prints the three figures).

Without a working C++ compiler (or if the build fails) the engine warns once and runs the same quantised
values dequantised to fp32 through the ordinary GEMM: same weights, fp32 speed, never a crash (and oneDNN's
fp32 GEMM is not bitwise batch invariant, as in fp32 mode). A float matrix whose width is not a multiple of
32 stays fp32 (no GGUF block tensor has such a width).

Measured on this project's 2-core AMD EPYC (AVX-512 VNNI) kind, SmolLM2-135M's 120 layer GEMVs per token
(M = 1, one thread, a busy machine, same process): q4 3.8 ms, q8 4.8 ms, fbgemm dynamic int8 7.3 ms, fp32
oneDNN 23.4 ms; its LM head (576 -> 49152): q8 0.8 ms, fbgemm int8 1.0 ms, fp32 5.3 ms. Perplexity of
benchmarks/data/perplexity.txt (703 tokens): fp32 24.484, q4 24.475, q4 + 8-bit head 24.525, q4 + 4-bit head
26.22 (+7.1 %).
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from parley.local_engine.errors import EngineConfigError
from parley.local_engine.models.gemm import WeightGemm

GROUP = 32
TILE = 16
GROUP_SCHEMES: tuple[str, ...] = ("q4", "q8")
EXTENSION_NAME = "parley_group_gemm_v10"


# ---------------------------------------------------------------- row-major quantised weights
@dataclass
class RowQuant:
    """A weight `[out, in]` quantised per group of 32 along `in`, rows in order (concatenated, permuted and
    column-scaled freely at load, then packed for the kernel).

    bits 4: `q` uint8 `[out, in]` in 0..15 and a minimum `m` (w = d q + m);
    bits 8: `q` int8 `[out, in]` (-128..127), `m` optional (w = d q, or d q + m).
    `d` `[out, in / 32]`, or `[out, in / 16]` for one scale per 16 inputs (Q6_K; 8-bit only); `m`
    `[out, in / 32]` of d's dtype. The scales are fp16 (the block formats of 32: Q4_0 ... Q8_0, as stored), or
    fp32 where the file's scale is a product that fp16 cannot hold (K-quants: super-block scale x 6- or 8-bit
    sub-scale, exact in fp32).
    `col_scale` fp32 `[in]` or None: the effective weight is w * col_scale (a folded norm weight)."""

    bits: int
    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None = None
    col_scale: torch.Tensor | None = None
    source: str = field(default="float")  # "gguf:Q4_1", ... or "float" (quantised at load)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.q.shape[0]), int(self.q.shape[1]))

    @property
    def scale_width(self) -> int:
        """Inputs per scale: 32, or 16 (Q6_K's sub-blocks)."""
        return self.shape[1] // int(self.d.shape[1])

    def dequantize(self) -> torch.Tensor:
        """fp32 `[out, in]` (col_scale included): what the kernel's weights mean. Computed as (q d) + m in
        fp32, the order gguf-py dequantises in, so a file's blocks give back its dequantised tensor bitwise."""
        n, k = self.shape
        width = self.scale_width
        q = self.q.to(torch.float32).view(n, k // width, width)
        w = q * self.d.to(torch.float32)[:, :, None]
        if self.m is not None:
            w = w.view(n, k // GROUP, GROUP) + self.m.to(torch.float32)[:, :, None]
        w = w.reshape(n, k)
        return w if self.col_scale is None else w * self.col_scale

    def rows(self, index: torch.Tensor) -> RowQuant:
        m = None if self.m is None else self.m[index]
        return RowQuant(self.bits, self.q[index], self.d[index], m, self.col_scale, self.source)

    def scale_columns(self, v: torch.Tensor) -> RowQuant:
        v = v.detach().to(torch.float32)
        cs = v if self.col_scale is None else self.col_scale * v
        return RowQuant(self.bits, self.q, self.d, self.m, cs.contiguous(), self.source)

    def widened(self, bits: int, width: int, has_min: bool, dtype: torch.dtype) -> RowQuant:
        """The same weights in a more general layout (8-bit, 16-wide scales, a zero minimum, fp32 scales): every
        step is exact, so rows of different block types can share one GEMM without requantising."""
        q, d, m = self.q, self.d.to(dtype), None if self.m is None else self.m.to(dtype)
        if bits == 8 and self.bits == 4:
            q = q.to(torch.int8)  # 0..15
        if width < self.scale_width:
            d = d.repeat_interleave(self.scale_width // width, dim=1)
        if has_min and m is None:
            m = torch.zeros(self.shape[0], self.shape[1] // GROUP, dtype=dtype)
        return RowQuant(bits, q, d, m, self.col_scale, self.source)


def cat_rows(parts: list[Any]) -> Any:
    """`torch.cat(parts)` for tensors; for `RowQuant`s of one column scale, their rows stacked, widened first
    (exactly, `RowQuant.widened`) where their layouts differ (a Q4_K_M file's q and v rows, say)."""
    if not any(isinstance(p, RowQuant) for p in parts):
        return torch.cat(parts)
    qs = [p for p in parts if isinstance(p, RowQuant)]
    first = qs[0]
    if len(qs) < len(parts) or not all(_same_scale(p.col_scale, first.col_scale) for p in qs):
        # a float among block tensors (rare: a GGUF with an F16 q and Q4 k): quantise them all alike
        return torch.cat([p.dequantize() if isinstance(p, RowQuant) else p for p in parts])
    bits = max(p.bits for p in qs)
    width = min(p.scale_width for p in qs)
    has_min = any(p.m is not None for p in qs)
    dtype = torch.float32 if any(p.d.dtype == torch.float32 for p in qs) else torch.float16
    qs = [p.widened(bits, width, has_min, dtype) for p in qs]
    ms = [p.m for p in qs if p.m is not None]
    sources = dict.fromkeys(p.source for p in qs)  # ordered, distinct
    return RowQuant(bits, torch.cat([p.q for p in qs]), torch.cat([p.d for p in qs]), torch.cat(ms) if ms else None,
                    first.col_scale, "+".join(sources))


def _same_scale(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def scale_columns(w: Any, v: torch.Tensor) -> Any:
    """`w * v` (v broadcast over rows) for a tensor; a `RowQuant` records it as its column scale."""
    return w.scale_columns(v) if isinstance(w, RowQuant) else w * v


def quantize_q4(weight: torch.Tensor) -> RowQuant:
    """Q4_1's rule per group of 32: d = (max - min) / 15, m = min (both fp16), q = round((w - m) / d)."""
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    g = w.reshape(n, k // GROUP, GROUP)
    lo, hi = g.amin(dim=2), g.amax(dim=2)
    d = ((hi - lo) / 15.0).to(torch.float16)
    m = lo.to(torch.float16)
    d32, m32 = d.to(torch.float32), m.to(torch.float32)
    inv = torch.where(d32 > 0, 1.0 / d32, torch.zeros_like(d32))
    q = torch.round((g - m32[:, :, None]) * inv[:, :, None]).clamp_(0, 15).to(torch.uint8)
    return RowQuant(4, q.reshape(n, k), d, m)


def quantize_q8(weight: torch.Tensor) -> RowQuant:
    """Q8_0's rule per group of 32: d = max |w| / 127 (fp16), q = round(w / d)."""
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    g = w.reshape(n, k // GROUP, GROUP)
    d = (g.abs().amax(dim=2) / 127.0).to(torch.float16)
    d32 = d.to(torch.float32)
    inv = torch.where(d32 > 0, 1.0 / d32, torch.zeros_like(d32))
    q = torch.round(g * inv[:, :, None]).clamp_(-127, 127).to(torch.int8)
    return RowQuant(8, q.reshape(n, k), d)


# ---------------------------------------------------------------- GGUF blocks
BLOCK_TYPES: dict[str, tuple[int, int]] = {  # type name -> (values per block, bytes per block)
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}
FOUR_BIT_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K"})  # decoded as 4-bit weights; the others as 8-bit ones


def decode_gguf_blocks(type_name: str, raw: np.ndarray, shape: tuple[int, int]) -> RowQuant:
    """A GGUF tensor's raw block bytes (`uint8 [rows, bytes per row]`, as `GGUFReader` gives them) as a
    `RowQuant` of `shape` `(rows, in)`: integer unpacking, scales copied (fp16) or multiplied out exactly
    (fp32, K-quants), no float round trip of the weights.

    Block layouts (llama.cpp's ggml-common.h, little endian), 32 values: Q4_0 {fp16 d; u8 qs[16]}, w = d (q - 8);
    Q4_1 {fp16 d, m; u8 qs[16]}, w = d q + m; Q5_0 {fp16 d; u32 qh; u8 qs[16]}, w = d (q - 16); Q5_1 {fp16 d, m;
    u32 qh; u8 qs[16]}, w = d q + m; Q8_0 {fp16 d; i8 qs[32]}, w = d q. In these 4/5-bit blocks byte j holds
    element j in its low nibble and element j + 16 in its high one; bit j of qh is element j's fifth bit.
    256-value super-blocks (`_k_quants`): Q4_K, Q5_K {fp16 d, dmin; u8 scales[12]; (Q5_K: u8 qh[32];) u8
    qs[128]}, 8 sub-blocks of 32 with a 6-bit scale and minimum each, w = d sc q - dmin mn; Q6_K {u8 ql[128];
    u8 qh[64]; i8 scales[16]; fp16 d}, 16 sub-blocks of 16, w = d sc (q - 32)."""
    if type_name not in BLOCK_TYPES:
        raise ValueError(f"GGUF type {type_name} has no direct layout here")
    per_block, size = BLOCK_TYPES[type_name]
    n, k = shape
    if k % per_block:
        raise ValueError(f"{type_name} rows of {k} values are not whole blocks of {per_block}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // per_block, size)
    if per_block == 256:
        return _k_quants(type_name, blocks, n, k)
    d = _f16(blocks, 0)
    if type_name == "Q8_0":
        q = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(n, k).copy())
        return RowQuant(8, q, d, source="gguf:Q8_0")
    has_min = type_name in ("Q4_1", "Q5_1")
    m = _f16(blocks, 2) if has_min else None
    start = 4 if has_min else 2
    if type_name in ("Q4_0", "Q4_1"):
        packed = torch.from_numpy(np.ascontiguousarray(blocks[:, :, start:]))  # [n, G, 16]
        q = torch.cat([packed & 0x0F, packed >> 4], dim=2).reshape(n, k)  # elements 0..15, then 16..31
        if m is None:
            m = d * -8.0  # exact: a power-of-two multiple of an fp16 value (finite for any real scale)
        return RowQuant(4, q.contiguous(), d, m, source=f"gguf:{type_name}")
    qh = np.ascontiguousarray(blocks[:, :, start : start + 4]).view("<u4")  # [n, G, 1]
    fifth = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [n, G, 32]
    low = blocks[:, :, start + 4 :]
    q5 = np.concatenate([low & 0x0F, low >> 4], axis=2) | (fifth << 4)  # 0..31
    values = q5.astype(np.int8) - (0 if has_min else 16)
    return RowQuant(8, torch.from_numpy(values.reshape(n, k).copy()), d, m, source=f"gguf:{type_name}")


def _f16(blocks: np.ndarray, at: int) -> torch.Tensor:
    """The fp16 field at byte `at` of every block: `[rows, blocks]`."""
    return torch.from_numpy(np.ascontiguousarray(blocks[:, :, at : at + 2]).view(np.float16)[:, :, 0].copy())


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> (scales, minimums), 8 six-bit values each: sub-blocks 0..3 in the low 6
    bits of bytes 0..3 (scales) and 4..7 (minimums); sub-blocks 4..7 in the nibbles of bytes 8..11 (low:
    scale, high: minimum) plus the top 2 bits of bytes 0..3 (scale) and 4..7 (minimum)."""
    a, b, c = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 6) << 4)], axis=-1)
    mins = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return scales, mins


def _k_quants(type_name: str, blocks: np.ndarray, n: int, k: int) -> RowQuant:
    """Q4_K / Q5_K / Q6_K super-blocks (`blocks` `[n, k / 256, bytes]`): a scale (and minimum) per sub-block
    multiplied out in fp32, exact (an fp16 times an integer of at most 8 bits needs at most 19 bits)."""
    S = k // 256
    if type_name == "Q6_K":
        ql = blocks[:, :, 0:128].reshape(n, S, 2, 2, 32)  # (half, byte column c, l)
        low = np.stack([ql & 0x0F, ql >> 4], axis=3).reshape(n, S, 2, 4, 32)  # (half, 2 nibble + c, l)
        qh = blocks[:, :, 128:192].reshape(n, S, 2, 1, 32)
        high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)) & 3
        q = ((low | (high << 4)).astype(np.int8) - 32).reshape(n, k)
        sc = np.ascontiguousarray(blocks[:, :, 192:208]).view(np.int8).astype(np.float32)  # [n, S, 16]
        d = _f16(blocks, 208).to(torch.float32)[:, :, None] * torch.from_numpy(sc)
        return RowQuant(8, torch.from_numpy(np.ascontiguousarray(q)), d.reshape(n, k // 16).contiguous(),
                        source="gguf:Q6_K")
    d, dmin = _f16(blocks, 0).to(torch.float32), _f16(blocks, 2).to(torch.float32)
    scales, mins = _k_scales(blocks[:, :, 4:16])
    D = (d[:, :, None] * torch.from_numpy(scales.astype(np.float32))).reshape(n, k // GROUP)
    M = (dmin[:, :, None] * torch.from_numpy(mins.astype(np.float32))).reshape(n, k // GROUP)
    start = 16 if type_name == "Q4_K" else 48
    qs = blocks[:, :, start : start + 128].reshape(n, S, 4, 1, 32)  # 32 bytes: sub-blocks 2j (low), 2j + 1 (high)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(n, S, 8, 32)
    if type_name == "Q4_K":
        return RowQuant(4, torch.from_numpy(q.reshape(n, k).copy()), D.contiguous(), (-M).contiguous(),
                        source="gguf:Q4_K")
    qh = blocks[:, :, 16:48].reshape(n, S, 1, 32)  # bit s of byte i: the fifth bit of sub-block s, element i
    fifth = (qh >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    q5 = (q | (fifth << 4)).astype(np.int8).reshape(n, k)
    return RowQuant(8, torch.from_numpy(q5.copy()), D.contiguous(), (-M).contiguous(), source="gguf:Q5_K")


# ---------------------------------------------------------------- packing for the kernel
@dataclass
class GroupWeight:
    """One weight as `GroupGemm` runs it: the kernel's tiles, or (no compiler) a dense fp32 fallback."""

    out_features: int
    in_features: int
    bits: int  # 4 or 8; 32 for a matrix kept fp32 (a width that is not a multiple of 32)
    qs: torch.Tensor | None  # uint8 [T, G, 256 | 512]
    d: torch.Tensor | None  # fp16 or fp32 [T, G, 16] ([T, 2G, 16]: 16-wide scales)
    m: torch.Tensor | None  # [T, G, 16] of d's dtype (4-bit, and 8-bit with a minimum) or empty
    col_scale: torch.Tensor  # fp32 [in] or empty
    dense: Any = None  # the fallback's prepared fp32 weight (WeightGemm form)
    source: str = "float"


def pack(w: RowQuant) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qs, d, m) in the kernel's tile layout (q4_kernel.py); rows padded with zeros to a multiple of 16.
    Scales keep their dtype (fp16 or fp32); 16-wide scales become `[T, 2G, 16]`."""
    n, k = w.shape
    G = k // GROUP
    T = -(-n // TILE)
    pad = T * TILE - n
    q, d, m = w.q, w.d, w.m
    if pad:
        q = torch.cat([q, torch.zeros(pad, k, dtype=q.dtype)])
        d = torch.cat([d, torch.zeros(pad, d.shape[1], dtype=d.dtype)])
        m = None if m is None else torch.cat([m, torch.zeros(pad, G, dtype=m.dtype)])
    if w.bits == 4:
        v = q.view(T, TILE, G, 4, 2, 4)  # (tile, row, group, chunk, low/high half, byte)
        byte = v[:, :, :, :, 0, :] | (v[:, :, :, :, 1, :] << 4)  # (T, row, G, chunk, byte)
        qs = byte.permute(0, 2, 3, 1, 4).reshape(T, G, 256)
    else:
        u = (q.to(torch.int16) + 128).to(torch.uint8).view(T, TILE, G, 8, 4)
        qs = u.permute(0, 2, 3, 1, 4).reshape(T, G, 512)
    dt = d.reshape(T, TILE, d.shape[1]).permute(0, 2, 1).contiguous()
    mt = torch.empty(0, dtype=d.dtype) if m is None else m.view(T, TILE, G).permute(0, 2, 1).contiguous()
    return qs.contiguous(), dt, mt


# ---------------------------------------------------------------- the extension
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def compiler() -> str | None:
    """The C++ compiler torch's extension builder will call (`$CXX`, else `c++`), if it is on PATH."""
    return shutil.which(os.environ.get("CXX", "c++"))


def _build() -> Any:
    from torch.utils.cpp_extension import get_default_build_root, load_inline

    from parley.local_engine import fused_decode_kernel, q4_kernel, row_ops_kernel

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    if not any(root.glob(f"**/{EXTENSION_NAME}*/*.so")):  # a first build takes about a minute on 2 cores
        print(f"parley: compiling the q4/q8 GEMM kernel into {root} (once per machine)", file=sys.stderr, flush=True)
    # cached by torch under $TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions), rebuilt when SOURCE changes
    kernels = (q4_kernel, row_ops_kernel, fused_decode_kernel)
    return load_inline(name=EXTENSION_NAME, cpp_sources=[k.SOURCE for k in kernels],
                       functions=[name for k in kernels for name in k.FUNCTIONS],
                       extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)


@lru_cache(maxsize=1)
def kernel_module() -> tuple[Any, str]:
    """(the compiled extension, "") or (None, why it is unavailable). Built once per machine and cached;
    loaded once per process."""
    if compiler() is None:
        return None, f"no C++ compiler ({os.environ.get('CXX', 'c++')}) on PATH"
    try:
        ext = _build()
        probe = torch.ones(1, GROUP)
        rq = quantize_q8(torch.ones(TILE, GROUP))
        qs, d, m = pack(rq)
        got = ext.group_gemm(probe, qs, d, m, torch.empty(0), 8, True)
        if not torch.allclose(got, torch.full((1, TILE), float(GROUP)), rtol=1e-3):  # fp16 scale 1/127: ~1e-4
            return None, f"the built kernel computed {got[0, :2].tolist()} for a probe whose answer is {GROUP}"
        return ext, ""
    except Exception as exc:  # noqa: BLE001 - compiler errors, missing headers, ninja, ...: fall back, never crash
        first = str(exc).strip().splitlines()
        return None, f"building the C++ kernel failed: {first[0] if first else type(exc).__name__}"


def group_unavailable_reason(scheme: str, device: torch.device, dtype: torch.dtype) -> str | None:
    if scheme == "q4" and (device.type != "cpu" or dtype == torch.bfloat16):
        from parley.local_engine.quant4_cuda import unavailable_reason  # PyTorch's int4 kernel (bf16)

        return unavailable_reason(device, dtype)
    if device.type != "cpu":
        return f"quantization={scheme!r} runs on CPU (q4 also on CUDA); device is {device.type!r}"
    if dtype != torch.float32:
        name = str(dtype).removeprefix("torch.")
        return f"quantization={scheme!r} needs dtype float32 (activations stay fp32); got {name}"
    return None


class GroupGemm:
    """`Gemm` over group-quantised weights (4- or 8-bit, group 32): `prepare(W | RowQuant)`, then
    `gemm(x, prepared, bias)`. A float weight is quantised with `bits`; a `RowQuant` keeps its own bits."""

    def __init__(self, device: torch.device, dtype: torch.dtype, *, bits: int = 4, use_simd: bool = True) -> None:
        why = group_unavailable_reason(f"q{bits}", device, dtype)
        if why is not None:
            raise EngineConfigError(why)
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits}")
        self.bits = bits
        self.use_simd = use_simd
        self.ext, why = kernel_module()
        self._dense = WeightGemm(device, dtype)  # the fallback, and matrices whose width is not a multiple of 32
        if self.ext is None:
            _warn_once(f"parley: the group-quantised kernel is unavailable ({why}); quantization='q4'/'q8' run "
                       "their quantised weights dequantised to fp32 (same values, fp32 speed)")
            self.kernel = f"q{bits}-dequantized-fp32"
        else:
            simd = bool(self.ext.simd_available()) and use_simd
            self.kernel = f"parley-group{GROUP}-{self.ext.simd_name() if simd else 'scalar'}"

    def prepare(self, weight: torch.Tensor | RowQuant) -> GroupWeight:
        if not isinstance(weight, RowQuant) and weight.shape[1] % GROUP:
            # no whole groups (GGUF block tensors always have them): this matrix stays in the engine's dtype
            n, k = weight.shape
            dense = self._dense.prepare(weight.detach().to(torch.float32).contiguous())
            return GroupWeight(n, k, 32, None, None, None, torch.empty(0), dense=dense, source="float (not grouped)")
        rq = weight if isinstance(weight, RowQuant) else (quantize_q4 if self.bits == 4 else quantize_q8)(weight)
        n, k = rq.shape
        cs = torch.empty(0) if rq.col_scale is None else rq.col_scale.contiguous()
        if self.ext is None:
            dense = self._dense.prepare(rq.dequantize().contiguous())
            return GroupWeight(n, k, rq.bits, None, None, None, cs, dense=dense, source=rq.source)
        qs, d, m = pack(rq)
        return GroupWeight(n, k, rq.bits, qs, d, m, cs, source=rq.source)

    def __call__(self, x: torch.Tensor, prepared: GroupWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        w = prepared
        if w.dense is not None:
            out = self._dense(x, w.dense, bias)
            return out
        out = self.ext.group_gemm(x, w.qs, w.d, w.m, w.col_scale, w.bits, self.use_simd)
        if out.shape[1] != w.out_features:
            out = out[:, : w.out_features].contiguous()
        if bias is not None:
            out.add_(bias)
        return out
