"""The decoder every family shares: weights in GEMM-ready form and the forward pass over a paged KV cache.

Written for eager CPU speed as much as for clarity: per-layer weights are plain tensors (q/k/v fused into one
matrix, gate/up into another, RMSNorm weights folded in), so a dense layer is ~24 tensor ops with no module
dispatch and no per-layer allocation or view. What a family adds is a branch decided at load, not a cost per
op for the others: q/k/v and output biases ride in the GEMM call, Qwen3's q/k norm is one in-place op on the
step's q/k buffer, attention sinks and sliding windows are arguments of the per-step attention plans
(attention.py), and an MoE layer calls `MoeMlp` (moe.py) instead of the dense SwiGLU.

Eager CPU decode is dominated by per-op dispatch once the weight GEMVs are counted, so:
- the RMSNorm weights are folded into the columns of the matrix that consumes the norm (qkv, gate_up, the
  router and every expert), so a norm is 5 small ops and no weight multiply;
- RoPE is one in-place op on q and k together (rope.py), the attention scale folded into its table;
- keys and values share one cache tensor, `[layers, 2 * kv_heads, slots, head_dim]`, so a step writes them
  with one `index_copy_` and gathers them with one `index_select`;
- residual adds and the SwiGLU product run in place; q/k/v land in one per-step buffer whose views are built
  once per step, not per layer;
- weight matmuls go through `WeightGemm` (oneDNN for fp32 on CPU, see gemm.py), weights prepared at load.

Family files subclass `DecoderModel` and set `arch_type` (their config reader); MoE families also say how
their checkpoint stores experts (`_moe_tensors`). The tensor names are transformers' (`model.layers.N...`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from parley.local_engine.errors import ModelLoadError
from parley.local_engine.models.arch import DecoderArch
from parley.local_engine.models.attention import AttendFn, AttentionBatch, attention_plan
from parley.local_engine.models.fused_decode import FusedDecode
from parley.local_engine.models.gemm import Gemm
from parley.local_engine.models.layers import Checkpoint, rms_normalize, rms_normalize_heads_, swiglu_
from parley.local_engine.models.moe import MoeMlp, MoeWeights
from parley.local_engine.models.rope import RotaryTables, interleave_rope_rows
from parley.local_engine.quant import calibrate, check_quantization, make_gemm
from parley.local_engine.quant4 import GroupGemm, GroupWeight, RowQuant, cat_rows, scale_columns
from parley.local_engine.threads import mkl_set_num_threads_local, omp_set_num_threads


def _noop(_: int) -> None:
    return None


def _add_rms_normalize(residual: torch.Tensor, delta: torch.Tensor, eps: float) -> torch.Tensor:
    """`residual += delta`, then the norm that reads it (what the C++ `add_rms_rows_` does in one call)."""
    residual.add_(delta)
    return rms_normalize(residual, eps)


def _interleave_rows(w: Any, heads: int, head_dim: int) -> Any:
    """`interleave_rope_rows` for a dense weight or for a GGUF's blocks (their rows reindexed)."""
    if isinstance(w, RowQuant):
        return w.rows(interleave_rope_rows(torch.arange(w.shape[0]), heads, head_dim))
    return interleave_rope_rows(w, heads, head_dim)


@dataclass
class MoeTensors:
    """An MoE layer as read from a checkpoint (fp32, CPU), in one layout whatever the family stored:
    router `[E, hidden]`, gate_up `[E, 2I, hidden]` (gate rows, then up rows), down `[E, hidden, I]`."""

    router: torch.Tensor
    router_bias: torch.Tensor | None
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


@dataclass
class LayerWeights:
    """One decoder layer, prepared for `WeightGemm` and on the model's device."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    qk_norm: torch.Tensor | None  # [H + KVH, D]: q_norm for the query heads, k_norm for the key heads
    sinks: torch.Tensor | None  # [KVH, G] fp32 attention-sink logits
    window: int | None  # sliding window (None: full causal attention)
    gate_up: torch.Tensor | None  # dense SwiGLU (None on an MoE layer)
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor | None
    down_bias: torch.Tensor | None
    moe: MoeMlp | None


class DecoderModel:
    """Weights + forward. Not an nn.Module: no hooks, no parameter registry, just tensors on one device."""

    arch_type: ClassVar[type[DecoderArch]] = DecoderArch
    ignored_tensors: ClassVar[tuple[str, ...]] = ()  # regexes of checkpoint tensors the family may leave unread

    def __init__(
        self, arch: DecoderArch, device: torch.device, dtype: torch.dtype, *, quantization: str | None = None,
        quantize_lm_head: bool = False,
    ) -> None:
        """An empty model (no weights yet): `from_hf_state_dict` builds loaded ones.

        `quantization` ("int8", see quant.py) is how the layer weights are stored and run; the LM head keeps
        the model's dtype unless `quantize_lm_head`."""
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.quantization = check_quantization(quantization, field="quantization")
        self.quantize_lm_head = bool(quantize_lm_head and self.quantization)
        # Weight matrices exist only in the form the GEMM kernel takes (see gemm.py); no dense copies are kept,
        # except the embedding table, which the LM head may share (tied) but is looked up densely.
        self.gemm: Gemm = make_gemm(device, dtype, self.quantization)
        self.head_gemm: Gemm = make_gemm(device, dtype, self.quantization if self.quantize_lm_head else None,
                                         head=True)
        self.q_size = arch.num_heads * arch.head_dim
        self.kv_size = arch.num_kv_heads * arch.head_dim
        self.scale = 1.0 / math.sqrt(arch.head_dim)
        self.complex_rope = dtype in (torch.float32, torch.float64)
        self.gemm_threads: int | None = None  # CPU threads for weight GEMMs (None: the caller's setting)
        # decode steps in one C++ call where the model allows (fused_decode.py); None: not decided yet, False: the
        # Python loop always (set it so to compare the two)
        self.fused_decode: FusedDecode | bool | None = None
        self._step_logits: tuple[torch.Tensor, torch.Tensor] | None = None  # (the fused step's hidden, logits)
        # the quantised group modes run their residual adds and norms in C++ too (row_ops_kernel.py: one call
        # where ATen takes six); fp32 and int8 keep ATen's ops and so HF's order of operations
        self.row_ops: Any = self.gemm.ext if isinstance(self.gemm, GroupGemm) and self.gemm.ext is not None else None
        self.rope = RotaryTables(
            arch.rope, head_dim=arch.head_dim, num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads,
            max_positions=arch.max_position_embeddings, scale=self.scale, complex_form=self.complex_rope,
            device=device, dtype=dtype,
        )
        windows = arch.layer_windows or (None,) * arch.num_layers
        self.attention_windows: tuple[int | None, ...] = tuple(dict.fromkeys(windows))
        """The distinct windows the layers use (None = full causal); the runner builds one layout per window."""
        self.layers: list[LayerWeights] = []
        self.embed = torch.empty(0)
        self.lm_head = torch.empty(0)
        self.norm = torch.empty(0)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_hf_state_dict(
        cls, arch: DecoderArch, sd: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype, *,
        quantization: str | None = None, quantize_lm_head: bool = False, calibration_ids: list[int] | None = None,
    ) -> DecoderModel:
        """The model from transformers' tensor names; `ModelLoadError` names a missing, misshapen or unused one.

        With `quantization`, the weights are packed after one calibration prefill of `calibration_ids`
        (`quant.calibration_ids(tokenizer)`; None: seeded pseudo-random ids)."""
        model = cls(arch, device, dtype, quantization=quantization, quantize_lm_head=quantize_lm_head)
        ck = Checkpoint(sd, ignore=cls.ignored_tensors)
        model.layers = [model._load_layer(ck, i) for i in range(arch.num_layers)]
        a = arch
        model.embed = model._put(ck.take("model.embed_tokens.weight", (a.vocab_size, a.hidden_size)))
        if arch.tie_word_embeddings:
            ck.skip("lm_head.weight")  # transformers' state dicts list the tied head too
            model.lm_head = model.head_gemm.prepare(model.embed)
        else:
            head = ck.take("lm_head.weight", (a.vocab_size, a.hidden_size))
            model.lm_head = model.head_gemm.prepare(model._put(head))
        model.norm = model._put(ck.take("model.norm.weight", (a.hidden_size,)))
        ck.finish()
        if model.quantization is not None:
            calibrate(model, calibration_ids)  # activation ranges from one short prefill, then pack (quant.py)
        return model

    def _put(self, w: torch.Tensor) -> torch.Tensor:
        return w.to(device=self.device, dtype=self.dtype).contiguous()

    def _prep(self, w: Any) -> torch.Tensor:
        """`w` (a tensor, or a `RowQuant` of a GGUF's blocks in q4/q8 mode) in the GEMM's prepared form."""
        ready: Any = w if isinstance(w, RowQuant) else self._put(w)
        return self.gemm.prepare(ready)

    def _load_layer(self, ck: Checkpoint, i: int) -> LayerWeights:
        a = self.arch
        H, KVH, D, hidden = a.num_heads, a.num_kv_heads, a.head_dim, a.hidden_size
        p = f"model.layers.{i}."
        q = ck.take(p + "self_attn.q_proj.weight", (H * D, hidden))
        k = ck.take(p + "self_attn.k_proj.weight", (KVH * D, hidden))
        v = ck.take(p + "self_attn.v_proj.weight", (KVH * D, hidden))
        bias = None
        if a.qkv_bias:
            qb = ck.take(p + "self_attn.q_proj.bias", (H * D,))
            kb = ck.take(p + "self_attn.k_proj.bias", (KVH * D,))
            vb = ck.take(p + "self_attn.v_proj.bias", (KVH * D,))
        if self.complex_rope:  # rows (and biases, norm weights) to the adjacent-pairs layout RoPE runs in
            q, k = _interleave_rows(q, H, D), _interleave_rows(k, KVH, D)
            if a.qkv_bias:
                qb, kb = interleave_rope_rows(qb, H, D), interleave_rope_rows(kb, KVH, D)
        if a.qkv_bias:
            bias = self._put(torch.cat([qb, kb, vb]))
        ln1 = ck.take(p + "input_layernorm.weight", (hidden,))
        qk_norm = None
        if a.qk_norm:
            qn = ck.take(p + "self_attn.q_norm.weight", (D,))
            kn = ck.take(p + "self_attn.k_norm.weight", (D,))
            if self.complex_rope:
                qn, kn = interleave_rope_rows(qn, 1, D), interleave_rope_rows(kn, 1, D)
            qk_norm = self._put(torch.cat([qn.expand(H, D), kn.expand(KVH, D)]))
        sinks = None
        if a.attention_sinks:
            sinks = ck.take(p + "self_attn.sinks", (H,)).view(KVH, H // KVH).to(self.device).contiguous()
        o = ck.take(p + "self_attn.o_proj.weight", (hidden, H * D))
        o_bias = self._put(ck.take(p + "self_attn.o_proj.bias", (hidden,))) if a.o_bias else None
        ln2 = ck.take(p + "post_attention_layernorm.weight", (hidden,))
        windows = a.layer_windows
        layer = LayerWeights(
            qkv=self._prep(scale_columns(cat_rows([q, k, v]), ln1)), qkv_bias=bias, o=self._prep(o), o_bias=o_bias,
            qk_norm=qk_norm, sinks=sinks, window=windows[i] if windows else None,
            gate_up=None, gate_up_bias=None, down=None, down_bias=None, moe=None,
        )
        if a.moe is not None and (not a.moe_layers or a.moe_layers[i]):
            layer.moe = self._load_moe(ck, p + "mlp.", ln2)
            return layer
        inter = a.intermediate_size
        gate_up = cat_rows([ck.take(p + "mlp.gate_proj.weight", (inter, hidden)),
                            ck.take(p + "mlp.up_proj.weight", (inter, hidden))])
        layer.gate_up = self._prep(scale_columns(gate_up, ln2))
        layer.down = self._prep(ck.take(p + "mlp.down_proj.weight", (hidden, inter)))
        if a.mlp_bias:
            layer.gate_up_bias = self._put(torch.cat([ck.take(p + "mlp.gate_proj.bias", (inter,)),
                                                      ck.take(p + "mlp.up_proj.bias", (inter,))]))
            layer.down_bias = self._put(ck.take(p + "mlp.down_proj.bias", (hidden,)))
        return layer

    def _load_moe(self, ck: Checkpoint, prefix: str, norm_weight: torch.Tensor) -> MoeMlp:
        spec = self.arch.moe
        assert spec is not None
        t = self._moe_tensors(ck, prefix)
        E = spec.num_experts
        w = MoeWeights(
            router=self._prep(t.router * norm_weight),
            router_bias=None if t.router_bias is None else self._put(t.router_bias),
            gate_up=[self._prep(t.gate_up[e] * norm_weight) for e in range(E)],
            gate_up_bias=None if t.gate_up_bias is None else [self._put(t.gate_up_bias[e]) for e in range(E)],
            down=[self._prep(t.down[e]) for e in range(E)],
            down_bias=None if t.down_bias is None else [self._put(t.down_bias[e]) for e in range(E)],
        )
        return MoeMlp(spec, w, self.gemm)

    def _moe_tensors(self, ck: Checkpoint, prefix: str) -> MoeTensors:
        """How the family's checkpoint stores an MoE layer (MoE families override this)."""
        raise ModelLoadError(f"{type(self).__name__} has no mixture-of-experts layers")

    # ------------------------------------------------------------------ cache
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

    @property
    def layer_weights(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
        """(qkv, o, gate_up, down) per layer, as the GEMMs take them (gate_up/down None on MoE layers)."""
        return [(L.qkv, L.o, L.gate_up, L.down) for L in self.layers]

    # ------------------------------------------------------------------ forward
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        """Hidden states [T, hidden] for the T new tokens; writes their K/V into the cache.

        Every layer puts q/k/v into the same per-step buffer, so the views over it (q, the q/k for RoPE and
        q/k norm, the new K/V) and the attention plans (one per window) are built once per step.

        On CPU, small steps (decode) run everything but the weight matmuls on one thread (OpenMP and MKL):
        the fork/join of a parallel region for a tiny op (bmm, softmax, norms) costs more than the op, badly
        so on a loaded machine (see `threads.py`). The GEMMs get `gemm_threads`.
        """
        a = self.arch
        T = input_ids.shape[0]
        entry_threads = torch.get_num_threads()
        threads = self.gemm_threads or entry_threads
        self._step_logits = None
        fused = self._fused_step(batch, T)
        if fused is not None:  # every layer in one C++ call (fused_decode.py), the same operations
            residual = self.embed.index_select(0, input_ids)
            qkv = torch.empty(T, self.q_size + 2 * self.kv_size, device=self.device, dtype=self.dtype)
            residual, logits = fused.run(residual, self.row_ops.rms_rows(residual, a.rms_norm_eps), qkv,
                                         self.rope.complex_table(positions), batch, kv_cache, threads)
            self._step_logits = None if logits is None else (residual, logits)
            return residual
        H, KVH, D = a.num_heads, a.num_kv_heads, a.head_dim
        qs, kvs = self.q_size, self.kv_size
        omp = omp_set_num_threads() if self.device.type == "cpu" else None
        toggle = omp is not None and threads > 1 and T <= 64
        many: Callable[[int], None] = omp if (omp is not None and toggle) else _noop
        if omp is not None:
            omp(1 if toggle else threads)
        # attention's batched matmuls run in MKL: one thread on small steps, also when the GEMMs were given one
        # (the engine may choose so for decode, threads.py `DecodeThreads`) while the process-wide count is higher
        mkl = mkl_set_num_threads_local() if (toggle or (omp is not None and threads == 1 < entry_threads)) else None
        if mkl is not None:
            mkl(1)
        eps, inter, gemm = a.rms_norm_eps, a.intermediate_size, self.gemm
        qkv = torch.empty(T, qs + 2 * kvs, device=self.device, dtype=self.dtype)
        kv_new = qkv[:, qs:].view(T, 2 * KVH, D).transpose(0, 1)  # [2*KVH, T, D], the cache's layout
        qk = qkv[:, : qs + kvs]
        qk_heads = qk.view(T, H + KVH, D)
        rotate = self.rope.rotation(qk, positions)
        q = qkv[:, :qs]
        attends: dict[int | None, AttendFn] = {
            w: attention_plan(q, layout, num_heads=H, num_kv_heads=KVH, head_dim=D, kernel=self.row_ops)
            for w, layout in batch.layouts.items()
        }
        slots = batch.slot_mapping
        residual = self.embed.index_select(0, input_ids)
        rows = self.row_ops
        add_norm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = (
            partial(_add_rms_normalize, eps=eps)
            if rows is None
            else lambda res, delta: rows.add_rms_rows_(res, delta, eps)  # pybind: no keyword arguments
        )
        h = rows.rms_rows(residual, eps) if rows is not None else rms_normalize(residual, eps)
        last = len(self.layers) - 1
        for i, (kvc, L) in enumerate(zip(kv_cache.unbind(0), self.layers, strict=True)):
            many(threads)
            qkv.copy_(gemm(h, L.qkv, L.qkv_bias))  # into the buffer the step's q/k/v views look at
            many(1)
            if L.qk_norm is not None:
                rms_normalize_heads_(qk_heads, L.qk_norm, eps)
            rotate()
            kvc.index_copy_(1, slots, kv_new)
            attn = attends[L.window](kvc, L.sinks)
            many(threads)
            o = gemm(attn, L.o, L.o_bias)
            many(1)
            h = add_norm(residual, o)
            if L.moe is not None:
                mlp = L.moe(h, many, threads)
            else:
                assert L.gate_up is not None and L.down is not None
                many(threads)
                gu = gemm(h, L.gate_up, L.gate_up_bias)
                many(1)
                act = swiglu_(gu, inter) if rows is None else rows.swiglu_rows(gu, inter)
                many(threads)
                mlp = gemm(act, L.down, L.down_bias)
                many(1)
            if i == last:
                residual.add_(mlp)
            else:
                h = add_norm(residual, mlp)  # the next layer's input norm
        if omp is not None:
            omp(entry_threads)
        if mkl is not None:
            mkl(0)  # back to the process-wide count
        return residual

    def _fused_step(self, batch: AttentionBatch, rows: int) -> FusedDecode | None:
        """The fused decode step where it covers this step (decided per model at the first step)."""
        fused = self.fused_decode
        if fused is None:
            fused = self.fused_decode = FusedDecode.of(self) or False
        if not isinstance(fused, FusedDecode):
            return None
        return fused if fused.covers(batch, rows) else None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given rows of final hidden states (masks and sampling work in fp32)."""
        if self._step_logits is not None and hidden is self._step_logits[0]:
            return self._step_logits[1]  # every row's, made by the fused step with the same operations
        head = self.lm_head
        if self.row_ops is not None and isinstance(head, GroupWeight) and head.dense is None and head.qs is not None:
            # the quantised head's input: the row ops' norm, as the fused decode step makes it
            h = self.row_ops.rms_weighted_rows(hidden.contiguous(), self.norm, self.arch.rms_norm_eps)
        else:
            h = F.rms_norm(hidden, (hidden.shape[-1],), self.norm, self.arch.rms_norm_eps)
        threads = self.gemm_threads
        omp = omp_set_num_threads() if self.device.type == "cpu" else None
        if omp is None or not threads:
            return self.head_gemm(h, self.lm_head).float()
        entry = torch.get_num_threads()  # the engine thread runs its bookkeeping on one thread (threads.py)
        omp(threads)
        try:
            return self.head_gemm(h, self.lm_head).float()
        finally:
            omp(entry)
