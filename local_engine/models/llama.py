"""Llama-architecture forward pass (SmolLM2, TinyLlama, Llama 3.x) over a paged KV cache.

Written for eager CPU speed as much as for clarity: per-layer weights are plain tensors (q/k/v fused
into one matrix, gate/up into another, norm weights folded in) so a layer is 24 tensor ops with no module
dispatch and no per-layer allocation or view (see `LlamaModel`). Attention
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

from parley.local_engine.errors import ModelLoadError
from parley.local_engine.models.gemm import WeightGemm
from parley.local_engine.threads import mkl_set_num_threads_local, omp_set_num_threads


def _noop(_: int) -> None:
    return None


_ROPE_TYPES = ("linear", "llama3")  # besides "default": what `_rope_inv_freq` implements


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
        """The architecture a HF `config.json` describes; `ModelLoadError` naming the field it cannot use."""
        try:
            arch = cls._from_hf_config(cfg)
        except KeyError as exc:
            raise ModelLoadError(f"config.json has no {exc.args[0]!r} (a Llama config needs it)") from exc
        except (TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
            raise ModelLoadError(f"config.json has a value parley cannot use: {exc}") from exc
        sizes = {"vocab_size": arch.vocab_size, "hidden_size": arch.hidden_size, "num_hidden_layers": arch.num_layers,
                 "num_attention_heads": arch.num_heads, "num_key_value_heads": arch.num_kv_heads,
                 "intermediate_size": arch.intermediate_size, "head_dim": arch.head_dim,
                 "max_position_embeddings": arch.max_position_embeddings}
        bad = next((name for name, value in sizes.items() if value < 1), None)
        if bad is not None:
            raise ModelLoadError(f"config.json: {bad} must be >= 1, got {sizes[bad]}")
        if arch.num_heads % arch.num_kv_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads ({arch.num_heads}) is not a multiple of num_key_value_heads "
                f"({arch.num_kv_heads})"
            )
        return arch

    @classmethod
    def _from_hf_config(cls, cfg: dict[str, Any]) -> LlamaArch:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        field = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
        rope = cfg.get(field) or {}
        if not isinstance(rope, dict):
            raise ModelLoadError(f"config.json: {field} must be an object, got {rope!r}")
        theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        kind = rope.get("rope_type", rope.get("type", "default"))
        scaling = rope if kind not in ("default", None) else None
        if scaling is not None:
            if kind not in _ROPE_TYPES:
                raise ModelLoadError(
                    f"config.json: {field}.rope_type {kind!r} is not supported (supported: default, "
                    f"{', '.join(_ROPE_TYPES)})"
                )
            if "factor" not in scaling:
                raise ModelLoadError(f"config.json: {field} of rope_type {kind!r} needs a 'factor'")
            scaling = {**scaling, "rope_type": kind}
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
        raise ModelLoadError(f"rope scaling {sc.get('rope_type')!r} is not supported (supported: {_ROPE_TYPES})")
    return inv.to(torch.float32)


def _interleave_rope_rows(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Reorder each head's output rows from HF's halves layout (i pairs with i + D/2) to adjacent pairs.

    RoPE then becomes one complex multiply over `[..., D/2, 2]` views. Attention is unchanged: scores are
    dot products over the head dim, and q and k get the same permutation.
    """
    half = head_dim // 2
    order = torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).reshape(-1)
    return w.view(heads, head_dim, -1)[:, order].reshape(heads * head_dim, -1)


class LlamaModel:
    """Weights + forward. Not an nn.Module: no hooks, no parameter registry, just tensors on one device.

    Eager CPU decode is dominated by per-op dispatch once the weight GEMVs are counted, so the layer is
    arranged to launch as few ops as possible (~24 per layer):
    - the RMSNorm weights are folded into the columns of the matrix that consumes the norm (qkv, gate_up),
      so a norm is 5 small ops (HF's formula: x * rsqrt(mean(x^2) + eps)) and no weight multiply;
    - in fp32/fp64, RoPE is one in-place complex multiply on q and k together (rows reordered at load,
      see `_interleave_rope_rows`), and the 1/sqrt(head_dim) attention scale rides in the q half of the
      rotation table; bf16/fp16 (no complex type) use the rotate-half form;
    - keys and values share one cache tensor, `[layers, 2 * kv_heads, slots, head_dim]`, so a step writes
      them with one `index_copy_` and gathers them with one `index_select`;
    - residual adds and the SwiGLU product run in place; q/k/v land in one per-step buffer whose views
      (heads, RoPE pairs, the new K/V) are built once per step, not per layer;
    - weight matmuls go through `WeightGemm` (oneDNN for fp32 on CPU, see gemm.py), weights prepared at load.
    """

    def __init__(self, arch: LlamaArch, weights: dict[str, Any], device: torch.device, dtype: torch.dtype):
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.embed = weights["embed"]
        self.norm = weights["norm"]
        # Weight matrices exist only in the form the GEMM kernel takes (see gemm.py); no dense copies are kept,
        # except the embedding table, which the LM head may share (tied) but is looked up densely.
        self.gemm = WeightGemm(device, dtype)
        prep = self.gemm.prepare
        self.layer_weights: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = [
            (prep(w["qkv"]), prep(w["o"]), prep(w["gate_up"]), prep(w["down"])) for w in weights["layers"]
        ]
        self.lm_head = self.gemm.prepare(weights["lm_head"])
        self.q_size = arch.num_heads * arch.head_dim
        self.kv_size = arch.num_kv_heads * arch.head_dim
        self.scale = 1.0 / math.sqrt(arch.head_dim)
        self.complex_rope = bool(weights.get("complex_rope", False))
        self.gemm_threads: int | None = None  # CPU threads for weight GEMMs (None: the caller's setting)
        inv = _rope_inv_freq(arch)
        t = torch.arange(arch.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv)  # [pos, D/2]
        if self.complex_rope:
            cis = torch.polar(torch.ones_like(freqs), freqs)
            self.cis_k = cis.to(device=device, dtype=_complex_of(dtype))
            self.cis_q = (cis * self.scale).to(device=device, dtype=_complex_of(dtype))
        else:
            # cos/sin in the model dtype, as HF applies RoPE ([pos, head_dim], halves duplicated).
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
        H, KVH, D = arch.num_heads, arch.num_kv_heads, arch.head_dim
        hidden, inter, vocab = arch.hidden_size, arch.intermediate_size, arch.vocab_size
        shapes = {
            "self_attn.q_proj.weight": (H * D, hidden), "self_attn.k_proj.weight": (KVH * D, hidden),
            "self_attn.v_proj.weight": (KVH * D, hidden), "self_attn.o_proj.weight": (hidden, H * D),
            "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden),
            "mlp.down_proj.weight": (hidden, inter), "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,), "model.embed_tokens.weight": (vocab, hidden),
            "lm_head.weight": (vocab, hidden), "model.norm.weight": (hidden,),
        }

        def get(name: str) -> torch.Tensor:
            if name not in sd:
                raise KeyError(f"weight {name!r} missing from the checkpoint")
            want = shapes.get(name) or shapes.get(name.split(".", 3)[-1])
            if want is not None and tuple(sd[name].shape) != want:
                raise ModelLoadError(
                    f"weight {name!r} has shape {tuple(sd[name].shape)}; config.json implies {want}"
                )
            return sd[name].to(dtype=torch.float32)

        def put(w: torch.Tensor) -> torch.Tensor:
            return w.to(device=device, dtype=dtype).contiguous()

        complex_rope = dtype in (torch.float32, torch.float64) and arch.head_dim % 2 == 0
        layers = []
        for i in range(arch.num_layers):
            p = f"model.layers.{i}."
            q, k = get(p + "self_attn.q_proj.weight"), get(p + "self_attn.k_proj.weight")
            if complex_rope:
                q, k = _interleave_rope_rows(q, H, D), _interleave_rope_rows(k, KVH, D)
            qkv = torch.cat([q, k, get(p + "self_attn.v_proj.weight")], dim=0)
            gate_up = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], dim=0)
            # Fold each RMSNorm's weight into the columns of the matrix that reads the normalised vector.
            layers.append(
                {
                    "qkv": put(qkv * get(p + "input_layernorm.weight")),
                    "o": put(get(p + "self_attn.o_proj.weight")),
                    "gate_up": put(gate_up * get(p + "post_attention_layernorm.weight")),
                    "down": put(get(p + "mlp.down_proj.weight")),
                }
            )
        embed = put(get("model.embed_tokens.weight"))
        if arch.tie_word_embeddings or "lm_head.weight" not in sd:
            lm_head = embed
        else:
            lm_head = put(get("lm_head.weight"))
        weights: dict[str, Any] = {
            "embed": embed, "lm_head": lm_head, "norm": put(get("model.norm.weight")), "layers": layers,
            "complex_rope": complex_rope,
        }
        return cls(arch, weights, device, dtype)

    def new_kv_cache(self, num_slots: int) -> torch.Tensor:
        """Preallocated pool `[layers, 2 * kv_heads, slots, head_dim]`: key heads, then value heads.

        Head-major so a sequence's gathered keys for one KV head are contiguous `[ctx, head_dim]` rows, the
        layout a batched matmul reads without copying.
        """
        a = self.arch
        shape = (a.num_layers, 2 * a.num_kv_heads, num_slots, a.head_dim)
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    def kv_bytes_per_token(self) -> int:
        a = self.arch
        return 2 * a.num_layers * a.num_kv_heads * a.head_dim * torch.empty((), dtype=self.dtype).element_size()

    # ------------------------------------------------------------------ forward
    def _normalized(self, x: torch.Tensor) -> torch.Tensor:
        """x * rsqrt(mean(x^2) + eps), HF's order of operations (in fp32, as HF does for half types); the norm
        weight is folded into the next GEMM."""
        if x.dtype != torch.float32:
            xf = x.float()
            return (xf * xf.pow(2).mean(-1, keepdim=True).add_(self.arch.rms_norm_eps).rsqrt_()).to(x.dtype)
        r = x.pow(2).mean(-1, keepdim=True).add_(self.arch.rms_norm_eps).rsqrt_()
        return x * r

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        """Hidden states [T, hidden] for the T new tokens; writes their K/V into the cache.

        Every layer puts q/k/v into the same per-step buffer, so the views over it (q, the complex q/k for
        RoPE, the new K/V) are built once per step, not once per layer.

        On CPU, small steps (decode) run everything but the weight matmuls on one thread (OpenMP and MKL):
        the fork/join of a parallel region for a tiny op (bmm, softmax, norms) costs more than the op, badly
        so on a loaded machine (see `threads.py`). The GEMMs get `gemm_threads`.
        """
        a = self.arch
        T = input_ids.shape[0]
        KVH, D = a.num_kv_heads, a.head_dim
        qs, kvs = self.q_size, self.kv_size
        omp = omp_set_num_threads() if self.device.type == "cpu" else None
        entry_threads = torch.get_num_threads()
        threads = self.gemm_threads or entry_threads
        toggle = omp is not None and threads > 1 and T <= 64
        many: Callable[[int], None] = omp if (omp is not None and toggle) else _noop
        if omp is not None:
            omp(1 if toggle else threads)
        mkl = mkl_set_num_threads_local() if toggle else None  # attention's batched matmuls run in MKL
        if mkl is not None:
            mkl(1)
        dev, dt = self.device, self.dtype
        inter = a.intermediate_size
        qkv = torch.empty(T, qs + 2 * kvs, device=dev, dtype=dt)
        kv_new = qkv[:, qs:].view(T, 2 * KVH, D).transpose(0, 1)  # [2*KVH, T, D], the cache's layout
        rotate = self._rotation(qkv, positions)
        attend = self._attention_plan(qkv, batch)
        normalized, gemm = self._normalized, self.gemm
        slots = batch.slot_mapping
        residual = self.embed.index_select(0, input_ids)
        for kvc, (w_qkv, w_o, w_gate_up, w_down) in zip(kv_cache.unbind(0), self.layer_weights, strict=True):
            h = normalized(residual)
            many(threads)
            qkv.copy_(gemm(h, w_qkv))  # into the buffer the step's q/k/v views look at (a few KB in decode)
            many(1)
            rotate()
            kvc.index_copy_(1, slots, kv_new)
            attn = attend(kvc)
            many(threads)
            o = gemm(attn, w_o)
            many(1)
            residual.add_(o)
            h = normalized(residual)
            many(threads)
            gu = gemm(h, w_gate_up)
            many(1)
            gate = gu[:, :inter]
            F.silu(gate, inplace=True).mul_(gu[:, inter:])
            many(threads)
            down = gemm(gate, w_down)
            many(1)
            residual.add_(down)
        if omp is not None:
            omp(entry_threads)
        if mkl is not None:
            mkl(0)  # back to the process-wide count
        return residual

    def _rotation(self, qkv: torch.Tensor, positions: torch.Tensor) -> Callable[[], None]:
        """RoPE for this step's q and k, in place inside the qkv buffer (tables and views built once per step)."""
        a = self.arch
        T = positions.shape[0]
        n, D, half = a.num_heads + a.num_kv_heads, a.head_dim, a.head_dim // 2
        qk = qkv[:, : self.q_size + self.kv_size]
        if self.complex_rope:
            cq = self.cis_q.index_select(0, positions).unsqueeze(1).expand(T, a.num_heads, half)
            ck = self.cis_k.index_select(0, positions).unsqueeze(1).expand(T, a.num_kv_heads, half)
            table = torch.cat((cq, ck), dim=1)  # [T, H + KVH, D/2]
            qk_c = torch.view_as_complex(qk.view(T, n, half, 2))

            def rotate_complex() -> None:
                qk_c.mul_(table)

            return rotate_complex
        # bf16/fp16: x*cos + rotate_half(x)*sin, with rotate_half(x)*sin as roll(x, D/2) * [-sin, sin].
        cos = self.cos_table.index_select(0, positions).unsqueeze(1)  # [T, 1, D]
        sin = self.signed_sin_table.index_select(0, positions).unsqueeze(1)
        x = qk.view(T, n, D)
        q = x[:, : a.num_heads]
        scale = self.scale

        def rotate() -> None:
            x.copy_(x * cos + torch.roll(x, half, dims=-1) * sin)
            q.mul_(scale)

        return rotate

    def _attention_plan(self, qkv: torch.Tensor, batch: AttentionBatch) -> Callable[[torch.Tensor], torch.Tensor]:
        """A per-layer attention function over the layer's cache `[2*KVH, slots, D]`, returning [T, H*D].

        q arrives already scaled by 1/sqrt(head_dim). Buffers and views that do not depend on the layer are
        made here, once per step.
        """
        a = self.arch
        H, KVH, D = a.num_heads, a.num_kv_heads, a.head_dim
        G = H // KVH
        nd = batch.num_decode
        q = qkv[:, : self.q_size]
        fp32 = self.dtype == torch.float32
        dev, dt = self.device, self.dtype

        def softmax(scores: torch.Tensor) -> torch.Tensor:
            return torch.softmax(scores, -1) if fp32 else torch.softmax(scores, -1, torch.float32).to(dt)

        decode: Callable[[torch.Tensor], torch.Tensor] | None = None
        if nd:
            # Batched decode as one grouped matmul over (kv head, sequence): the G query heads of a KV head
            # share its gathered keys/values, read once; KV heads are never repeated.
            gather = batch.decode_gather
            assert gather is not None
            B, L = gather.shape
            flat = gather.reshape(-1)
            kvg = torch.empty(2 * KVH, B * L, D, device=dev, dtype=dt)
            kg_t = kvg[:KVH].view(KVH * B, L, D).transpose(1, 2)
            vg = kvg[KVH:].view(KVH * B, L, D)
            mask = batch.decode_mask
            od = torch.empty(KVH * B, G, D, device=dev, dtype=dt)
            qd_one = q[:1].view(KVH, G, D) if B == 1 else None
            out_one = od.view(1, H * D) if B == 1 else None

            def decode_attention(kvc: torch.Tensor) -> torch.Tensor:
                torch.index_select(kvc, 1, flat, out=kvg)
                if qd_one is not None:
                    qd = qd_one
                else:
                    qd = q[:nd].reshape(B, KVH, G, D).transpose(0, 1).reshape(KVH * B, G, D)
                scores = torch.bmm(qd, kg_t)
                if mask is not None:
                    scores = scores.view(KVH, B, G, L).add_(mask).view(KVH * B, G, L)
                torch.bmm(softmax(scores), vg, out=od)
                if out_one is not None:
                    return out_one
                return od.view(KVH, B, G, D).transpose(0, 1).reshape(B, H * D)

            decode = decode_attention
            if not batch.prefills:
                return decode

        def attend(kvc: torch.Tensor) -> torch.Tensor:
            outs = [] if decode is None else [decode(kvc)]
            for span in batch.prefills:
                n = span.end - span.start
                ctx = span.gather.shape[0]
                kvg_p = kvc.index_select(1, span.gather)  # [2*KVH, ctx, D]
                kg, vg_p = kvg_p[:KVH], kvg_p[KVH:]
                qp = q[span.start : span.end].reshape(n, KVH, G, D).permute(1, 2, 0, 3).reshape(KVH, G * n, D)
                scores = torch.bmm(qp, kg.transpose(1, 2)).view(KVH, G, n, ctx)
                if span.mask is not None:
                    scores = scores.add_(span.mask)
                o = torch.bmm(softmax(scores).view(KVH, G * n, ctx), vg_p).view(KVH, G, n, D)
                outs.append(o.permute(2, 0, 1, 3).reshape(n, H * D))
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

        return attend

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given rows of final hidden states (masks and sampling work in fp32)."""
        h = F.rms_norm(hidden, (hidden.shape[-1],), self.norm, self.arch.rms_norm_eps)
        threads = self.gemm_threads
        omp = omp_set_num_threads() if self.device.type == "cpu" else None
        if omp is None or not threads:
            return self.gemm(h, self.lm_head).float()
        entry = torch.get_num_threads()  # the engine thread runs its bookkeeping on one thread (threads.py)
        omp(threads)
        try:
            return self.gemm(h, self.lm_head).float()
        finally:
            omp(entry)


def _complex_of(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64
