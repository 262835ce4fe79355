"""A compiled decode step on CPU: `EngineConfig(compile=True)`, torch.compile with Inductor's C++ backend.

Eager CPU decode of a 135M model is dominated, after the weight GEMVs, by launching ~25 small ops per layer
from Python (norms, RoPE, the KV write and gather, attention's softmax, SwiGLU, the int8 GEMM's scaling), each a
few microseconds of dispatch for a few hundred floats of work. Compiling the whole decode step turns the work
between two GEMMs into a handful of fused C++ loops.

What is compiled: the decode-only step (every row one token: plain decodes and speculative verify rows) of the
shared decoder, for models with full causal attention and dense MLPs (no sliding windows, attention sinks or
MoE layers: those keep the eager step), in fp32 (oneDNN or int8 weights). The weight GEMMs stay the kernels the
model already uses, called through custom ops (`parley::packed_linear`, an int handle naming a prepared weight,
because Dynamo cannot trace fbgemm's packed weights or oneDNN tensors): the compiled graph holds the int8
GEMM's scaling ops, fused with the norms around them, and calls the kernel itself as an extern.

The KV write and the gather of a layer's cached keys/values are one custom op (`parley::kv_append_gather`)
registered as pure although it writes the pool: a mutation declared to the compiler would have it clone the
whole KV pool to functionalise the write. Nothing else in the graph reads the pool, and each call's output
feeds that layer's attention, so data dependencies order it exactly as eager code does.

Shapes: dynamic (`dynamic=True`): the context length changes every step and the batch with every admission,
so one graph serves every batch size >= 2 and one batch size 1 (Dynamo specialises on 1): recompiles are
bounded by construction, with no padding. Compilation happens when the engine starts (a warm-up on a scratch
slot) and is reported (`compile_s` in `engine.stats()`); Inductor's on-disk graph cache makes later processes
on the machine faster to start. When no C++ compiler is on PATH, or compiling fails, the engine warns once and
runs the eager step: never an error.

Measured (SmolLM2-135M int8 with int8 LM head, 1 thread, a shared 2-core machine at load ~2.5, same run):
compiling took 352 s cold and 86 s with Inductor's cache warm, and the compiled step decoded 62-70 tok/s against
72-86 tok/s eager, with identical tokens. It is slower because each weight GEMM and KV gather is a Python custom
op (~150 per step, each a dispatcher round trip into Python), which costs what the fused elementwise loops save.
So it is off by default; the way forward is the GEMMs as C++ ops Inductor calls directly (fbgemm's packed weights
as graph constants), not more fusion.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from parley.local_engine.models.attention import AttentionBatch
from parley.local_engine.models.gemm import WeightGemm
from parley.local_engine.quant import Int8Gemm, Int8Weight
from parley.local_engine.threads import omp_set_num_threads

_WEIGHTS: dict[int, tuple[Any, Any, Any]] = {}  # handle -> (gemm, prepared weight, the model: its gemm_threads)
_NEXT = itertools.count()


@torch.library.custom_op("parley::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    """`x @ W.T` for the weight registered under `handle` (int8: `x` is already scaled and padded)."""
    gemm, w, model = _WEIGHTS[handle]
    threads = model.gemm_threads or 1  # read per call: the engine may choose 1 thread for small steps
    omp = omp_set_num_threads() if threads > 1 else None
    if omp is not None:
        omp(threads)
    try:
        if isinstance(w, Int8Weight):
            return torch.ops.quantized.linear_dynamic.default(x, w.packed, gemm.reduce_range)
        return gemm(x, w)
    finally:
        if omp is not None:
            omp(1)


@packed_linear.register_fake
def _packed_linear_fake(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))


@torch.library.custom_op("parley::kv_append_gather", mutates_args=())
def kv_append_gather(kv_cache: torch.Tensor, layer: int, slots: torch.Tensor, kv_new: torch.Tensor,
                     gather: torch.Tensor) -> torch.Tensor:
    """Write the step's K/V `[2*KVH, T, D]` into layer `layer` of the pool at `slots`, then return the cached
    K/V `[2*KVH, len(gather), D]` at `gather` (see the module docstring for why it is declared pure)."""
    cache = kv_cache[layer]
    cache.index_copy_(1, slots, kv_new)
    return cache.index_select(1, gather)


@kv_append_gather.register_fake
def _kv_append_gather_fake(kv_cache: torch.Tensor, layer: int, slots: torch.Tensor, kv_new: torch.Tensor,
                           gather: torch.Tensor) -> torch.Tensor:
    return kv_cache.new_empty((kv_cache.shape[1], gather.shape[0], kv_cache.shape[3]))


def cpp_compiler() -> str | None:
    """The C++ compiler Inductor would run (`$CXX`, else g++ / c++ / clang++ on PATH), or None."""
    candidates = [os.environ.get("CXX") or "", "g++", "c++", "clang++"]
    return next((p for p in (shutil.which(c) for c in candidates if c) if p), None)


def unsupported_reason(model: Any) -> str | None:
    """Why `model`'s decode step cannot be compiled here (None: it can)."""
    if getattr(model, "device", torch.device("cpu")).type != "cpu":
        return "the compiled decode step is for CPU"
    if getattr(model, "dtype", None) != torch.float32:
        return "the compiled decode step runs fp32 (and int8) models"
    layers = getattr(model, "layers", None)
    if not layers or not getattr(model, "complex_rope", False):
        return "not a shared-decoder model"
    if any(L.window is not None or L.sinks is not None or L.moe is not None for L in layers):
        return "sliding windows, attention sinks and MoE layers keep the eager step"
    if not all(isinstance(g, (WeightGemm, Int8Gemm)) for g in (model.gemm, model.head_gemm)):
        return "only fp32 and int8 GEMMs are compiled (q4/q8 run parley's own C++ kernel, eager)"
    if cpp_compiler() is None:
        return "no C++ compiler on PATH (Inductor's CPU backend needs one: install g++ or set $CXX)"
    return None


class CompiledDecode:
    """The decode step of one model, compiled. `__call__` returns hidden states, or None for a step it does not
    take (prefill chunks); `ok` is False once it has fallen back to eager (with one warning)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.ok = True
        self.compile_s = 0.0
        a = model.arch
        self.H, self.KVH, self.D = a.num_heads, a.num_kv_heads, a.head_dim
        self.handles: list[int] = []
        self.layers = [self._register(L) for L in model.layers]
        cis_q, cis_k = model.rope.cis_q, model.rope.cis_k
        self.rope = torch.stack([cis_q.real, cis_q.imag, cis_k.real, cis_k.imag])  # [4, pos, D/2]
        self._fn: Callable[..., torch.Tensor] = torch.compile(self._step, dynamic=True, fullgraph=True)

    def _register(self, L: Any) -> dict[str, Any]:
        model = self.model
        out: dict[str, Any] = {"qkv_bias": L.qkv_bias, "o_bias": L.o_bias, "gate_up_bias": L.gate_up_bias,
                               "down_bias": L.down_bias, "qk_norm": L.qk_norm}
        for name in ("qkv", "o", "gate_up", "down"):
            w = getattr(L, name)
            handle = next(_NEXT)
            _WEIGHTS[handle] = (model.gemm, w, model)
            self.handles.append(handle)
            smooth = w.inv_smooth if isinstance(w, Int8Weight) else None
            out[name] = (handle, self._out_features(w), smooth, isinstance(w, Int8Weight))
        return out

    def close(self) -> None:
        """Forget the weights registered for the custom ops (the engine is closing)."""
        self.ok = False
        for handle in self.handles:
            _WEIGHTS.pop(handle, None)
        self.handles.clear()

    @staticmethod
    def _out_features(w: Any) -> int:
        if isinstance(w, Int8Weight):
            return w.out_features
        return int(w.size(0)) if w.is_mkldnn else int(w.shape[1])  # oneDNN keeps [out, in]; torch.mm's W.T

    # ------------------------------------------------------------------ the traced step
    @staticmethod
    def _linear(x: torch.Tensor, spec: tuple[int, int, torch.Tensor | None, bool],
                bias: torch.Tensor | None) -> torch.Tensor:
        handle, out_features, smooth, int8 = spec
        if not int8:
            y = packed_linear(x, handle, out_features)
        else:  # Int8Gemm's scaling, traced (and fused); see quant.py
            xs = x if smooth is None else x * smooth
            amax = xs.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
            ones = torch.ones_like(amax)
            buf = torch.cat([xs / amax, ones, -ones], dim=1)
            y = packed_linear(buf, handle, out_features) * amax
        return y if bias is None else y + bias

    def _step(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
              gather: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        model, a = self.model, self.model.arch
        H, KVH, D = self.H, self.KVH, self.D
        G, half = H // KVH, D // 2
        B, L = gather.shape
        eps, inter = a.rms_norm_eps, a.intermediate_size
        qs, kvs = H * D, KVH * D
        rope = self.rope.index_select(1, positions)  # [4, B, D/2]
        qc, qsn, kc, ksn = rope[0][:, None], rope[1][:, None], rope[2][:, None], rope[3][:, None]
        flat = gather.reshape(-1)
        residual = model.embed.index_select(0, input_ids)
        for i, W in enumerate(self.layers):
            h = residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + eps)
            qkv = self._linear(h, W["qkv"], W["qkv_bias"])
            q = qkv[:, :qs].reshape(B, H, D)
            k = qkv[:, qs : qs + kvs].reshape(B, KVH, D)
            v = qkv[:, qs + kvs :].reshape(B, KVH, D)
            if W["qk_norm"] is not None:
                qn, kn = W["qk_norm"][:H], W["qk_norm"][H:]
                q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * qn
                k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * kn
            q2, k2 = q.reshape(B, H, half, 2), k.reshape(B, KVH, half, 2)  # adjacent pairs (see rope.py)
            q = torch.stack([q2[..., 0] * qc - q2[..., 1] * qsn, q2[..., 0] * qsn + q2[..., 1] * qc], -1)
            k = torch.stack([k2[..., 0] * kc - k2[..., 1] * ksn, k2[..., 0] * ksn + k2[..., 1] * kc], -1)
            kv_new = torch.cat([k.reshape(B, KVH, D), v], dim=1).transpose(0, 1)  # [2*KVH, B, D]
            kvg = kv_append_gather(kv_cache, i, slots, kv_new, flat)  # [2*KVH, B*L, D]
            kg = kvg[:KVH].reshape(KVH * B, L, D)
            vg = kvg[KVH:].reshape(KVH * B, L, D)
            qd = q.reshape(B, KVH, G, D).transpose(0, 1).reshape(KVH * B, G, D)
            scores = torch.bmm(qd, kg.transpose(1, 2)).reshape(KVH, B, G, L) + mask
            probs = torch.softmax(scores, dim=-1).reshape(KVH * B, G, L)
            attn = torch.bmm(probs, vg).reshape(KVH, B, G, D).transpose(0, 1).reshape(B, H * D)
            residual = residual + self._linear(attn, W["o"], W["o_bias"])
            h = residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + eps)
            gu = self._linear(h, W["gate_up"], W["gate_up_bias"])
            act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
            residual = residual + self._linear(act, W["down"], W["down_bias"])
        return residual

    # ------------------------------------------------------------------ entry points
    def _run(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
             gather: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, L = gather.shape
        m = torch.zeros(1, B, 1, L) if mask is None else mask.view(1, B, 1, L)
        omp = omp_set_num_threads()
        entry = torch.get_num_threads()
        if omp is not None:
            omp(1)  # fused elementwise loops on one thread; the GEMM op raises it (as the eager step does)
        try:
            return self._fn(input_ids, positions, kv_cache, slots, gather, m)
        finally:
            if omp is not None:
                omp(entry)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                 batch: AttentionBatch) -> torch.Tensor | None:
        if not self.ok or len(batch.layouts) != 1 or None not in batch.layouts:
            return None
        layout = batch.layouts[None]
        if layout.prefills or layout.decode_gather is None:
            return None
        return self._run(input_ids, positions, kv_cache, batch.slot_mapping, layout.decode_gather,
                         layout.decode_mask)

    def warm_up(self, kv_cache: torch.Tensor, scratch_slot: int) -> bool:
        """Compile for batch 1 and batch >= 2 now (on a slot no sequence holds). False: fell back to eager."""
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                for b in (1, 2):
                    slots = torch.full((b,), scratch_slot, dtype=torch.long)
                    gather = torch.full((b, 3), scratch_slot, dtype=torch.long)
                    self._run(torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.long), kv_cache, slots,
                              gather, None)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: warn once and run eager
            self.ok = False
            warnings.warn(f"parley: the compiled decode step is off ({type(exc).__name__}: {str(exc)[:300]}); "
                          "running the eager step", RuntimeWarning, stacklevel=2)
        self.compile_s = time.perf_counter() - t0
        return self.ok


def compiled_decode(model: Any) -> CompiledDecode | None:
    """A `CompiledDecode` for `model`, or None after one warning saying why it runs eager."""
    why = unsupported_reason(model)
    if why is not None:
        warnings.warn(f"parley: EngineConfig.compile is on but the decode step runs eager: {why}", RuntimeWarning,
                      stacklevel=3)
        return None
    return CompiledDecode(model)
