"""Llama-architecture forward pass (SmolLM2, TinyLlama, Llama 3.x) over a paged KV cache.

Written for eager CPU speed as much as for clarity: per-layer weights are plain tensors (q/k/v fused
into one matrix, gate/up into another) so a layer is ~25 tensor ops with no module dispatch. Attention
is grouped-query attention computed by a grouped matmul: the query heads sharing a KV head are laid
side by side, so each cached key/value is read once and KV heads are never repeated.

The runner passes an `AttentionBatch` describing where each new token's K/V goes (`slot_mapping`) and
which cached slots each sequence attends to. Another architecture is one more file like this one,
exposing the same `forward` / `compute_logits` / `from_hf_state_dict`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from parley.local_engine.threads import omp_set_num_threads


def _noop(_: int) -> None:
    return None


@dataclass(frozen=True)
class LlamaArch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = None

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> LlamaArch:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        scaling = rope if rope.get("rope_type", "default") not in ("default", None) else None
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
        )


@dataclass
class PrefillSpan:
    """A sequence feeding several tokens this step: rows [start, end) of the batch, at positions p0.."""

    start: int
    end: int
    gather: torch.Tensor  # [ctx] cache slots of every position 0..ctx-1 of this sequence
    mask: torch.Tensor | None  # [n, ctx] additive causal mask (None when n == 1)


@dataclass
class AttentionBatch:
    """Per-step attention layout, shared by all layers. Rows [0, num_decode) are one token per sequence."""

    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    num_decode: int
    decode_gather: torch.Tensor | None  # [B, Lmax] cache slots each decode row attends to (padded)
    decode_mask: torch.Tensor | None  # [B, 1, Lmax] additive mask for padding (None when all lengths equal)
    prefills: list[PrefillSpan]


def _rope_inv_freq(arch: LlamaArch) -> torch.Tensor:
    dim = arch.head_dim
    inv = 1.0 / (arch.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    sc = arch.rope_scaling
    if sc and sc.get("rope_type") == "llama3":  # Llama 3.1+ frequency-dependent scaling
        factor = float(sc["factor"])
        low, high = float(sc.get("low_freq_factor", 1.0)), float(sc.get("high_freq_factor", 4.0))
        old_ctx = float(sc.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        low_wl, high_wl = old_ctx / low, old_ctx / high
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        mid = (wavelen <= low_wl) & (wavelen >= high_wl)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif sc and sc.get("rope_type") == "linear":
        inv = inv / float(sc["factor"])
    elif sc:
        raise NotImplementedError(f"rope scaling {sc.get('rope_type')!r} is not supported")
    return inv.to(torch.float32)


class LlamaModel:
    """Weights + forward. Not an nn.Module: no hooks, no parameter registry, just tensors on one device."""

    def __init__(self, arch: LlamaArch, weights: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype):
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.embed = weights["embed"]
        self.lm_head = weights["lm_head"]
        self.norm = weights["norm"]
        self.layers: list[dict[str, torch.Tensor]] = weights["layers"]  # type: ignore[assignment]
        self.q_size = arch.num_heads * arch.head_dim
        self.kv_size = arch.num_kv_heads * arch.head_dim
        self.scale = 1.0 / math.sqrt(arch.head_dim)
        self.gemm_threads: int | None = None  # CPU threads for weight GEMMs (None: the caller's setting)
        # cos/sin table in the model dtype, as HF applies RoPE ([pos, head_dim], halves duplicated).
        inv = _rope_inv_freq(arch)
        t = torch.arange(arch.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos_table = emb.cos().to(device=device, dtype=dtype)
        sin = emb.sin()
        sin[:, : arch.head_dim // 2] *= -1  # [-sin, sin]: rotate_half's sign folded into the table
        self.signed_sin_table = sin.to(device=device, dtype=dtype)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_hf_state_dict(
        cls, arch: LlamaArch, sd: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype
    ) -> LlamaModel:
        def get(name: str) -> torch.Tensor:
            if name not in sd:
                raise KeyError(f"weight {name!r} missing from the checkpoint")
            return sd[name].to(device=device, dtype=dtype).contiguous()

        layers = []
        for i in range(arch.num_layers):
            p = f"model.layers.{i}."
            layers.append(
                {
                    "ln1": get(p + "input_layernorm.weight"),
                    "qkv": torch.cat(
                        [get(p + "self_attn.q_proj.weight"), get(p + "self_attn.k_proj.weight"),
                         get(p + "self_attn.v_proj.weight")], dim=0
                    ).contiguous(),
                    "o": get(p + "self_attn.o_proj.weight"),
                    "ln2": get(p + "post_attention_layernorm.weight"),
                    "gate_up": torch.cat(
                        [get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], dim=0
                    ).contiguous(),
                    "down": get(p + "mlp.down_proj.weight"),
                }
            )
        embed = get("model.embed_tokens.weight")
        if arch.tie_word_embeddings or "lm_head.weight" not in sd:
            lm_head = embed
        else:
            lm_head = get("lm_head.weight")
        weights: dict[str, Any] = {
            "embed": embed, "lm_head": lm_head, "norm": get("model.norm.weight"), "layers": layers
        }
        return cls(arch, weights, device, dtype)

    def new_kv_cache(self, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Preallocated pool: [layers, kv_heads, slots, head_dim] for keys and for values.

        Head-major so a sequence's gathered keys for one KV head are contiguous `[ctx, head_dim]` rows, the
        layout a batched matmul reads without copying.
        """
        a = self.arch
        shape = (a.num_layers, a.num_kv_heads, num_slots, a.head_dim)
        return (torch.zeros(shape, device=self.device, dtype=self.dtype),
                torch.zeros(shape, device=self.device, dtype=self.dtype))

    def kv_bytes_per_token(self) -> int:
        a = self.arch
        return 2 * a.num_layers * a.num_kv_heads * a.head_dim * torch.empty((), dtype=self.dtype).element_size()

    # ------------------------------------------------------------------ forward
    def _rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.arch.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] for the T new tokens; writes their K/V into the cache.

        On CPU, small steps (decode) run everything but the weight matmuls on one OpenMP thread: the
        fork/join of a parallel region for a tiny op (bmm, softmax, norms) costs more than the op, badly so
        on a loaded machine (see `threads.py`). The GEMMs get `gemm_threads`.
        """
        a = self.arch
        T = input_ids.shape[0]
        H, KVH, D = a.num_heads, a.num_kv_heads, a.head_dim
        half = D // 2
        qs, kvs = self.q_size, self.kv_size
        omp = omp_set_num_threads() if self.device.type == "cpu" else None
        entry_threads = torch.get_num_threads()
        threads = self.gemm_threads or entry_threads
        toggle = omp is not None and threads > 1 and T <= 64
        set_threads: Callable[[int], None] = omp or _noop
        if omp is not None:
            omp(1 if toggle else threads)
        cos = self.cos_table.index_select(0, positions).unsqueeze(1)  # [T, 1, D]
        sin = self.signed_sin_table.index_select(0, positions).unsqueeze(1)
        residual = self.embed.index_select(0, input_ids)
        h = self._rms_norm(residual, self.layers[0]["ln1"])
        n_layers = len(self.layers)
        for li, w in enumerate(self.layers):
            if toggle:
                set_threads(threads)
            qkv = F.linear(h, w["qkv"])
            if toggle:
                set_threads(1)
            # RoPE on q and k together: x*cos + rotate_half(x)*sin, with rotate_half(x)*sin computed as
            # roll(x, D/2) * [-sin, sin] (same products, one op fewer).
            qk = qkv[:, : qs + kvs].view(T, H + KVH, D)
            qk = qk * cos + torch.roll(qk, half, dims=-1) * sin
            v = qkv[:, qs + kvs :].view(T, KVH, D)
            attn = self._attention(qk[:, :H], qk[:, H:], v, k_cache[li], v_cache[li], batch)
            if toggle:
                set_threads(threads)
            o = F.linear(attn, w["o"])
            if toggle:
                set_threads(1)
            residual = residual + o
            h = self._rms_norm(residual, w["ln2"])
            if toggle:
                set_threads(threads)
            gu = F.linear(h, w["gate_up"])
            if toggle:
                set_threads(1)
            inter = gu.shape[-1] // 2
            act = F.silu(gu[:, :inter]) * gu[:, inter:]
            if toggle:
                set_threads(threads)
            down = F.linear(act, w["down"])
            if toggle:
                set_threads(1)
            residual = residual + down
            if li + 1 < n_layers:
                h = self._rms_norm(residual, self.layers[li + 1]["ln1"])
        if omp is not None:
            omp(entry_threads)
        return residual

    def _attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        """Store this step's k/v in the layer's cache ([KVH, slots, D]) and attend; returns [T, H*D]."""
        a = self.arch
        H, KVH, D = a.num_heads, a.num_kv_heads, a.head_dim
        G = H // KVH
        scale = self.scale
        nd = batch.num_decode
        kc.index_copy_(1, batch.slot_mapping, k.transpose(0, 1))
        vc.index_copy_(1, batch.slot_mapping, v.transpose(0, 1))
        outs = []
        if nd:
            # Batched decode as one grouped matmul over (kv head, sequence): the G query heads of a KV head
            # share its gathered keys/values, read once; KV heads are never repeated.
            gather = batch.decode_gather
            assert gather is not None
            B, L = gather.shape
            kg = kc.index_select(1, gather.view(-1)).view(KVH * B, L, D)
            vg = vc.index_select(1, gather.view(-1)).view(KVH * B, L, D)
            qd = q[:nd].reshape(B, KVH, G, D)
            qd = qd.view(KVH * B, G, D) if B == 1 else qd.transpose(0, 1).reshape(KVH * B, G, D)
            scores = torch.bmm(qd, kg.transpose(1, 2))
            if batch.decode_mask is not None:
                scores = scores.view(KVH, B, G, L).add_(batch.decode_mask).view(KVH * B, G, L)
            probs = torch.softmax(scores.mul_(scale), dim=-1, dtype=torch.float32).to(vg.dtype)
            od = torch.bmm(probs, vg)  # [KVH*B, G, D]
            od = od.view(B, H * D) if B == 1 else od.view(KVH, B, G, D).transpose(0, 1).reshape(B, H * D)
            outs.append(od)
        for span in batch.prefills:
            n = span.end - span.start
            ctx = span.gather.shape[0]
            kg = kc.index_select(1, span.gather)  # [KVH, ctx, D]
            vg = vc.index_select(1, span.gather)
            qp = q[span.start : span.end].reshape(n, KVH, G, D).permute(1, 2, 0, 3).reshape(KVH, G * n, D)
            scores = torch.bmm(qp, kg.transpose(1, 2)).view(KVH, G, n, ctx).mul_(scale)
            if span.mask is not None:
                scores = scores.add_(span.mask)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(vg.dtype)
            o = torch.bmm(probs.view(KVH, G * n, ctx), vg).view(KVH, G, n, D)
            outs.append(o.permute(2, 0, 1, 3).reshape(n, H * D))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given rows of final hidden states (masks and sampling work in fp32)."""
        return F.linear(self._rms_norm(hidden, self.norm), self.lm_head).float()
