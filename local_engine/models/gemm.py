"""Weight matmuls (`x @ W.T`) for the model files, with each weight prepared once for the kernel that runs it.

Why not plain `torch.mm`: on CPU, PyTorch sends fp32 matmuls to MKL, and MKL's sgemm/sgemv run far below
the memory bandwidth on AMD processors (it picks its code path by vendor, not by instruction set). Measured
on this project's 2-core AMD EPYC (AVX-512) machines, SmolLM2-135M's 30 layers + LM head at batch 1: 45.7 ms
through MKL, 29.1 ms through oneDNN; the 113 MB LM head alone 9.8 vs 4.7 ms; batch 16: 69 vs 48 ms. oneDNN
chooses kernels from the CPU's feature flags and takes the weight in its own tensor type, prepared once here
rather than on every call.

Numerics: both compute the same fp32 dot products, accumulated in a different order, so results differ in
the last bits (~1e-5 relative), as two BLAS libraries do; parity with HF transformers stays at the level the
engine's tests check (prefill logits ~1e-4, token ids equal except at near-ties).

bf16 already goes through oneDNN in PyTorch (no gain measured), and GPUs use cuBLAS: both take `torch.mm`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class Gemm(Protocol):
    """What the model files call for a weight matmul: `WeightGemm` here, `Int8Gemm` in quant.py."""

    kernel: str

    def prepare(self, weight: torch.Tensor) -> Any: ...

    def __call__(self, x: torch.Tensor, prepared: Any, bias: torch.Tensor | None = None) -> torch.Tensor: ...


def _onednn_usable(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    try:  # a build can report oneDNN yet lack the op: probe once on a tiny case
        w = torch.ones(2, 3)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 3), w.to_mkldnn(), None, "none", [], "")
        return bool(torch.equal(out, torch.full((1, 2), 3.0)))
    except (RuntimeError, AttributeError):
        return False


class WeightGemm:
    """`prepare(W)` once at load, then `gemm(x, prepared, bias=None) -> x @ W.T (+ bias)` (a new dense tensor)."""

    def __init__(self, device: torch.device, dtype: torch.dtype, *, prefer_onednn: bool = True) -> None:
        self.onednn = prefer_onednn and _onednn_usable(device, dtype)
        self.kernel = "onednn" if self.onednn else "torch.mm"

    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight `[out, in]` in the form `__call__` takes (for torch.mm: its transposed view, no copy)."""
        return weight.to_mkldnn() if self.onednn else weight.t()

    def __call__(self, x: torch.Tensor, prepared: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, prepared, bias, "none", [], "")
        if bias is not None:
            return torch.addmm(bias, x, prepared)
        return torch.mm(x, prepared)
