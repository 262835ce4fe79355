"""`quantization="q4"` on CUDA: 4-bit groups through PyTorch's int4 weight-only kernel, not a kernel of ours.

The kernel is `aten._weight_int4pack_mm` (the "tinygemm" kernel that gpt-fast and torchao run; bf16
activations, sm80 or newer). It computes w = (q - 8) * scale + zero per group of `GROUP` inputs, and a
`RowQuant` of 4-bit groups means w = d q + m with q in 0..15 (GGUF Q4_0, Q4_1, Q4_K as loaded), so
scale = d and zero = m + 8 d: a file's blocks run as they are, nothing requantised. A folded norm weight
(`col_scale`) multiplies the activations before the product.

What stays dense, in the model's dtype (the blocks dequantised: the same values): 8-bit groups (Q8_0, Q6_K),
matrices whose shape the kernel does not take (rows a multiple of 8, columns a multiple of 32), and the LM
head (`head=True`; 4 bits on the output side cost the most perplexity, quant4.py). So q4 on CUDA is "4-bit
layers, bf16 head", where the CPU's q4 has an 8-bit head.

Packing. The CUDA op takes two 4-bit values per byte; which nibble holds the even column is checked once per
device by a probe product against the dequantised weights (`_nibble_order`), so a PyTorch release that flips
it gives a clear `EngineConfigError`, not wrong logits. The CPU twin (`_for_cpu` ops, int32 values) runs the
same scale/zero rule and is what the tests exercise off a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from parley.local_engine.errors import EngineConfigError
from parley.local_engine.quant4 import GROUP, RowQuant, quantize_q4


@dataclass
class Int4Weight:
    """One weight as `Int4Gemm` runs it: the kernel's packed form, or `dense` (`[in, out]`, model dtype)."""

    out_features: int
    in_features: int
    packed: torch.Tensor | None
    scales_zeros: torch.Tensor | None  # [in / GROUP, out, 2] (scale, zero), the activations' dtype
    col_scale: torch.Tensor | None  # [in], the activations' dtype
    dense: torch.Tensor | None = None
    source: str = "float"


def unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why q4 cannot run on `device` in `dtype` through the int4 kernel (None: it can)."""
    if dtype != torch.bfloat16:
        return f"q4 on {device.type} runs bf16 activations; got {str(dtype).removeprefix('torch.')}"
    op = "_weight_int4pack_mm" if device.type == "cuda" else "_weight_int4pack_mm_for_cpu"
    if not hasattr(torch.ops.aten, op):
        return f"this PyTorch build has no aten.{op}"
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return "PyTorch's int4 kernel needs a GPU of compute capability 8.0 or newer"
    return None


def _inner_k_tiles(k: int) -> int | None:
    """The kernel's k tiling for `k` columns (8, 4 or 2 tiles of 16), or None when none divides `k`."""
    return next((t for t in (8, 4, 2) if k % (t * 16) == 0), None)


def _scales_zeros(rq: RowQuant, dtype: torch.dtype) -> torch.Tensor:
    n, k = rq.shape
    d = rq.d.to(torch.float32)
    m = rq.m.to(torch.float32) if rq.m is not None else torch.zeros(n, k // GROUP)
    return torch.stack([d, m + 8.0 * d], dim=-1).transpose(0, 1).contiguous().to(dtype)


def _pack(q: torch.Tensor, device: torch.device, tiles: int, high_even: bool) -> torch.Tensor:
    """`q` (uint8 [n, k], 0..15) in the kernel's packed layout on `device`."""
    values = q.to(torch.int32)
    if device.type != "cuda":
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(values.to(device), tiles)
    even, odd = values[:, ::2], values[:, 1::2]
    pairs = (even << 4 | odd) if high_even else (odd << 4 | even)
    return torch.ops.aten._convert_weight_to_int4pack(pairs.to(torch.uint8).to(device), tiles)


def _matmul(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, packed, GROUP, scales_zeros)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_zeros)


@lru_cache(maxsize=8)
def _nibble_order(device: torch.device, dtype: torch.dtype) -> bool:
    """True when the even column goes in the high nibble on `device` (found by a probe; CPU: unused)."""
    if device.type != "cuda":
        return True
    gen = torch.Generator().manual_seed(0)
    rq = quantize_q4(torch.randn(64, 128, generator=gen))
    x = torch.randn(4, 128, generator=gen).to(dtype)
    want = x.float() @ rq.dequantize().t()
    sz = _scales_zeros(rq, dtype).to(device)
    for high_even in (True, False):
        got = _matmul(x.to(device), _pack(rq.q, device, 4, high_even), sz).float().cpu()
        if torch.allclose(got, want, rtol=0.05, atol=0.05 * float(want.abs().max())):
            return high_even
    raise EngineConfigError("PyTorch's int4 kernel gave a wrong product on a probe matrix; q4 cannot run on CUDA")


class Int4Gemm:
    """`Gemm` for q4 on CUDA (and its CPU twin in tests): `prepare(W | RowQuant)`, then `gemm(x, prepared, bias)`.
    A float weight is quantised to 4-bit groups (Q4_1's rule); `head=True` keeps every matrix dense."""

    def __init__(self, device: torch.device, dtype: torch.dtype, *, head: bool = False) -> None:
        why = unavailable_reason(device, dtype)
        if why is not None:
            raise EngineConfigError(why)
        self.device, self.dtype, self.head = device, dtype, head
        self.kernel = "dense" if head else f"aten-int4pack-group{GROUP}"

    def prepare(self, weight: torch.Tensor | RowQuant) -> Int4Weight:
        rq = weight if isinstance(weight, RowQuant) else None
        n, k = (int(weight.shape[0]), int(weight.shape[1]))
        tiles = _inner_k_tiles(k)
        four_bit = not self.head and n % 8 == 0 and tiles is not None and (rq is None or rq.bits == 4)
        source = rq.source if rq is not None else "float"
        if not four_bit:
            w = rq.dequantize() if rq is not None else weight
            dense = w.to(device=self.device, dtype=self.dtype).t().contiguous()  # type: ignore[union-attr]
            return Int4Weight(n, k, None, None, None, dense=dense, source=source)
        if rq is None:
            rq = quantize_q4(weight)  # type: ignore[arg-type]
        assert tiles is not None
        packed = _pack(rq.q, self.device, tiles, _nibble_order(self.device, self.dtype))
        cs = None if rq.col_scale is None else rq.col_scale.to(device=self.device, dtype=self.dtype)
        sz = _scales_zeros(rq, self.dtype).to(self.device)
        return Int4Weight(n, k, packed, sz, cs, source=source)

    def __call__(self, x: torch.Tensor, prepared: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        w = prepared
        if w.dense is not None:
            return torch.mm(x, w.dense) if bias is None else torch.addmm(bias, x, w.dense)
        assert w.packed is not None and w.scales_zeros is not None
        xs = x if w.col_scale is None else x * w.col_scale
        out: torch.Tensor = _matmul(xs.contiguous(), w.packed, w.scales_zeros)
        return out if bias is None else out.add_(bias)

