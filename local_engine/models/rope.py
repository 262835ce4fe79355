"""Rotary position embeddings: the rope types a config may name, their frequencies, and the per-step rotation.

`RopeSpec.from_hf_config` reads `rope_parameters` (transformers 5) or `rope_scaling` (older configs) and refuses
what it does not implement, naming the field. Frequencies follow transformers' formulas (`modeling_rope_utils`).

Two layouts of the rotation, chosen at load by `DecoderModel`:
- fp32/fp64: each head's q/k rows are reordered to adjacent pairs (`interleave_rope_rows`), so RoPE is one
  in-place complex multiply over `[..., D/2, 2]` views, with the 1/sqrt(head_dim) attention scale (and YaRN's
  attention factor) folded into the tables;
- bf16/fp16 (no complex type): HF's rotate-half form with cos/sin tables in the model dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from parley.local_engine.errors import ModelLoadError

ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# Keys of a rope dict that the types above read (anything else that changes the computation is refused).
_KNOWN_KEYS = {
    "rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate", "attention_factor", "mscale",
    "mscale_all_dim", "partial_rotary_factor",
}


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    kind: str = "default"
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], *, default_theta: float = 10000.0) -> RopeSpec:
        name = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
        rope = cfg.get(name) or {}
        if not isinstance(rope, dict):
            raise ModelLoadError(f"config.json: {name} must be an object, got {rope!r}")
        if rope and all(isinstance(v, dict) for v in rope.values()):
            raise ModelLoadError(f"config.json: {name} per layer type ({sorted(rope)}) is not supported")
        theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or default_theta)
        kind = str(rope.get("rope_type", rope.get("type")) or "default")
        if kind not in ROPE_TYPES:
            raise ModelLoadError(
                f"config.json: {name}.rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
            )
        unknown = sorted(set(rope) - _KNOWN_KEYS)
        if unknown:
            raise ModelLoadError(f"config.json: {name}.{unknown[0]} is not supported (rope_type {kind!r})")
        partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
        if partial is not None and float(partial) != 1.0:
            raise ModelLoadError(f"config.json: partial_rotary_factor {partial} is not supported (only 1.0)")
        params = {k: v for k, v in rope.items() if k not in ("rope_type", "type", "rope_theta")}
        if kind in ("llama3", "yarn"):
            # As transformers does: a top-level original_max_position_embeddings wins (Phi-3 style configs);
            # llama3 falls back to max_position_embeddings. A YaRN config that names no pretraining length is
            # refused rather than guessed.
            top = cfg.get("original_max_position_embeddings")
            fallback = cfg.get("max_position_embeddings") if kind == "llama3" else None
            orig = top or params.get("original_max_position_embeddings") or fallback
            if orig is None:
                raise ModelLoadError(
                    f"config.json: {name}.rope_type {kind!r} is not supported without an "
                    "'original_max_position_embeddings'"
                )
            params["original_max_position_embeddings"] = orig
        needs = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
                 "yarn": ("factor",)}
        for key in needs.get(kind, ()):
            if params.get(key) is None:
                raise ModelLoadError(f"config.json: {name} of rope_type {kind!r} needs a {key!r}")
        return cls(theta=theta, kind=kind, params=params if kind != "default" else {})

    def frequencies(self, head_dim: int) -> tuple[torch.Tensor, float]:
        """Inverse frequencies `[head_dim / 2]` and the factor applied to cos/sin (YaRN's mscale).

        Computed in fp64 and rounded once to fp32 (transformers computes in fp32; the two differ in the last
        bit of some frequencies, and the correctly rounded ones measured closer to HF's logits on SmolLM2).
        """
        dim, p = head_dim, self.params
        inv = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        factor = 1.0
        if self.kind == "linear":
            inv = inv / float(p["factor"])
        elif self.kind == "llama3":
            inv = _llama3(inv, p)
        elif self.kind == "yarn":
            inv, factor = _yarn(self.theta, dim, p)
        return inv.to(torch.float32), factor


def _llama3(inv: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1+: long wavelengths divided by `factor`, short ones kept, a smooth blend between."""
    factor = float(p["factor"])
    low, high = float(p["low_freq_factor"]), float(p["high_freq_factor"])
    old_ctx = float(p["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = old_ctx / low, old_ctx / high
    scaled = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    mid = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return torch.where(mid, smoothed, scaled)


def _yarn(base: float, dim: int, p: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071): interpolate low frequencies, extrapolate high ones, linear ramp between."""
    factor = float(p["factor"])
    old_ctx = float(p["original_max_position_embeddings"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = float(p.get("beta_fast") or 32), float(p.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_ctx / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention_factor)


def interleave_rope_rows(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Reorder each head's output rows (or bias entries) from HF's halves layout (i pairs with i + D/2) to
    adjacent pairs, so RoPE becomes one complex multiply. Attention is unchanged: scores are dot products over
    the head dim, and q and k get the same permutation."""
    half = head_dim // 2
    order = torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).reshape(-1)
    return w.reshape(heads, head_dim, -1)[:, order].reshape(w.shape)


def complex_of(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


class RotaryTables:
    """Per-position rotation tables for q (carrying the attention scale) and k, built once at load."""

    def __init__(
        self, spec: RopeSpec, *, head_dim: int, num_heads: int, num_kv_heads: int, max_positions: int,
        scale: float, complex_form: bool, device: torch.device, dtype: torch.dtype,
    ) -> None:
        self.head_dim, self.num_heads, self.num_kv_heads = head_dim, num_heads, num_kv_heads
        self.complex_form = complex_form
        self.scale = scale
        inv, factor = spec.frequencies(head_dim)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)  # [pos, D/2]
        if complex_form:
            cis = torch.polar(torch.full_like(freqs, factor), freqs)
            self.cis_k = cis.to(device=device, dtype=complex_of(dtype))
            self.cis_q = (cis * scale).to(device=device, dtype=complex_of(dtype))
        else:
            # cos/sin in the model dtype, as HF applies RoPE ([pos, head_dim], halves duplicated).
            emb = torch.cat((freqs, freqs), dim=-1)
            self.cos = (emb.cos() * factor).to(device=device, dtype=dtype)
            sin = emb.sin() * factor
            sin[:, : head_dim // 2] *= -1  # [-sin, sin]: rotate_half's sign folded into the table
            self.signed_sin = sin.to(device=device, dtype=dtype)

    def complex_table(self, positions: torch.Tensor) -> torch.Tensor:
        """`[T, H + KVH, D/2]` complex: the rotation of each q head (scaled) and k head at each position."""
        T, H, KVH, half = positions.shape[0], self.num_heads, self.num_kv_heads, self.head_dim // 2
        cq = self.cis_q.index_select(0, positions).unsqueeze(1).expand(T, H, half)
        ck = self.cis_k.index_select(0, positions).unsqueeze(1).expand(T, KVH, half)
        return torch.cat((cq, ck), dim=1)

    def rotation(self, qk: torch.Tensor, positions: torch.Tensor) -> Callable[[], None]:
        """RoPE in place over `qk` ([T, (H + KVH) * D], a view of the step's qkv buffer); q is also scaled.

        Tables and views are built here once per step; the returned closure runs once per layer.
        """
        T = positions.shape[0]
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        n, half = H + KVH, D // 2
        if self.complex_form:
            table = self.complex_table(positions)
            qk_c = torch.view_as_complex(qk.view(T, n, half, 2))

            def rotate_complex() -> None:
                qk_c.mul_(table)

            return rotate_complex
        # bf16/fp16: x*cos + rotate_half(x)*sin, with rotate_half(x)*sin as roll(x, D/2) * [-sin, sin].
        cos = self.cos.index_select(0, positions).unsqueeze(1)  # [T, 1, D]
        sin = self.signed_sin.index_select(0, positions).unsqueeze(1)
        x = qk.view(T, n, D)
        q = x[:, :H]
        scale = self.scale

        def rotate() -> None:
            x.copy_(x * cos + torch.roll(x, half, dims=-1) * sin)
            q.mul_(scale)

        return rotate
