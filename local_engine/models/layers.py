"""Small shared pieces of the decoder: RMSNorm without its weight (folded into the next GEMM), the SwiGLU
variants, and reading a checkpoint's tensors with names, shapes and leftovers checked."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from parley.local_engine.errors import ModelLoadError


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps), HF's order of operations (in fp32 for half types, as HF does). The norm's
    weight is not applied: it is folded into the columns of the matrix that reads the result."""
    if x.dtype != torch.float32:
        xf = x.float()
        return (xf * xf.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()).to(x.dtype)
    return x * x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()


def rms_normalize_heads_(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """Per-head RMSNorm in place over the last dim of `x` [T, heads, D], times `weight` [heads, D] (Qwen3's q/k
    norm, one weight for the query heads and one for the key heads)."""
    if x.dtype != torch.float32:
        xf = x.float()
        x.copy_((xf * xf.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()).to(x.dtype) * weight)
        return
    x.mul_(x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()).mul_(weight)


def swiglu_(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    """silu(gate) * up, in place in the gate half of `gate_up` [T, 2 * inter]; returns that half."""
    gate = gate_up[:, :inter]
    F.silu(gate, inplace=True).mul_(gate_up[:, inter:])
    return gate


def clamped_swiglu_(gate_up: torch.Tensor, inter: int, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's SwiGLU: gate clamped above at `limit`, up clamped to [-limit, limit],
    (up + 1) * gate * sigmoid(alpha * gate). In place in the gate half; returns it."""
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    gate.clamp_(max=limit)
    up.clamp_(-limit, limit).add_(1.0)
    gate.mul_(torch.sigmoid(gate * alpha)).mul_(up)
    return gate


_ALWAYS_IGNORED = (re.compile(r"(^|\.)rotary_emb\.inv_freq$"),)  # a buffer old exports carry, recomputed here


class Checkpoint:
    """A state dict read tensor by tensor: `ModelLoadError` names a missing or misshapen tensor, and `finish()`
    names tensors nobody read (a checkpoint with weights parley would ignore computes something else)."""

    def __init__(self, sd: dict[str, torch.Tensor], *, ignore: Iterable[str] = ()) -> None:
        self.sd = sd
        self.used: set[str] = set()
        self.ignore = [*_ALWAYS_IGNORED, *(re.compile(p) for p in ignore)]

    def has(self, name: str) -> bool:
        return name in self.sd

    def raw(self, name: str) -> torch.Tensor:
        if name not in self.sd:
            raise ModelLoadError(f"weight {name!r} missing from the checkpoint")
        self.used.add(name)
        return self.sd[name]

    def take(self, name: str, shape: tuple[int, ...], *, as_stored: bool = False) -> torch.Tensor:
        """The tensor `name` in fp32 (or its stored dtype), checked against the shape the config implies."""
        t = self.raw(name)
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"weight {name!r} has shape {tuple(t.shape)}; config.json implies {shape}")
        # a non-tensor is already in a kernel's form (quant4.RowQuant: a GGUF's blocks), passed through as is
        return t if as_stored or not isinstance(t, torch.Tensor) else t.to(dtype=torch.float32)

    def skip(self, name: str) -> None:
        """Mark `name` as deliberately unused (e.g. an LM head identical to the tied embedding)."""
        self.used.add(name)

    def finish(self) -> None:
        left = sorted(k for k in self.sd if k not in self.used and not any(p.search(k) for p in self.ignore))
        if left:
            more = f" (and {len(left) - 3} more)" if len(left) > 3 else ""
            raise ModelLoadError(
                f"the checkpoint has weights this config does not use: {', '.join(map(repr, left[:3]))}{more} "
                "(a config field parley does not read, or the wrong config.json)"
            )
