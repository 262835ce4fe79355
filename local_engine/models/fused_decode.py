"""The quantised modes' decode step as one C++ call (fused_decode_kernel.py), and the rule for when it applies.

`FusedDecode.of(model)` decides once, at the first forward, whether the model can take it: the group kernel
runs every layer matrix (q4/q8 on CPU with the extension built), the layers are dense, and none has a q/k
norm (those run ATen ops the C++ loop does not make). Each step then asks `covers(batch, rows)`: only decode
rows (a prefill span runs the Python loop), and no more rows than the Python loop would run its small ops on
one thread for. The per-layer lists are flattened once; a step adds only its decode groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from parley.local_engine.models.attention import AttentionBatch
from parley.local_engine.quant4 import GroupGemm, GroupWeight

if TYPE_CHECKING:
    from parley.local_engine.models.decoder import DecoderModel

MAX_ROWS = 64
"""Steps of up to this many rows run fused (the Python loop's threshold for one-thread small ops)."""

_NONE = torch.empty(0)


class _ModelHandle:
    """The C++ side's copy of a model's constant arguments (`fused_model`), freed when the last holder goes (a
    shallow copy of a FusedDecode, as a profiler's wrapper makes, shares it)."""

    def __init__(self, ext: Any, model_id: int) -> None:
        self.ext, self.id = ext, model_id

    def __del__(self) -> None:
        self.ext.fused_model_free(self.id)


class FusedDecode:
    """The flattened per-layer arguments of `decode_layers`, built once per model."""

    def __init__(self, model: DecoderModel, ext: Any, gemm: GroupGemm) -> None:
        self.ext = ext
        self.arch = model.arch
        self.use_simd = gemm.use_simd
        self.weights: list[torch.Tensor] = []
        self.meta: list[int] = []
        self.biases: list[torch.Tensor] = []
        self.sinks: list[torch.Tensor] = []
        windows = model.attention_windows
        self.layer_layout: list[int] = []
        for layer in model.layers:
            mats: list[GroupWeight] = [layer.qkv, layer.o, layer.gate_up, layer.down]  # type: ignore[list-item]
            for w in mats:
                assert w.qs is not None and w.d is not None and w.m is not None
                self.weights += [w.qs, w.d, w.m, w.col_scale]
            self.meta += [w.bits for w in mats] + [w.out_features for w in mats]
            self.biases += [_NONE if b is None else b for b in
                            (layer.qkv_bias, layer.o_bias, layer.gate_up_bias, layer.down_bias)]
            self.sinks.append(_NONE if layer.sinks is None else layer.sinks.contiguous())
            self.layer_layout.append(windows.index(layer.window))
        self.windows = windows
        # the LM head in the same parallel region, where it runs in the group kernel (an fp32 head stays apart)
        head = model.lm_head
        self.head: list[torch.Tensor] = []
        self.head_bits = self.vocab = 0
        if isinstance(head, GroupWeight) and head.dense is None and head.qs is not None:
            assert head.d is not None and head.m is not None
            self.head = [head.qs, head.d, head.m, head.col_scale]
            self.head_bits, self.vocab = head.bits, head.out_features
        self.norm = model.norm
        a = model.arch
        # the constant arguments, checked and unpacked once in C++: a step passes this handle
        self.model = _ModelHandle(ext, ext.fused_model(
            self.weights, self.meta, self.biases, self.sinks, self.layer_layout, a.hidden_size, a.num_heads,
            a.num_kv_heads, a.head_dim, a.intermediate_size, a.rms_norm_eps, self.head, self.head_bits, self.vocab,
            self.norm,
        ))

    @classmethod
    def of(cls, model: DecoderModel) -> FusedDecode | None:
        """The fused step for `model`, or None where a layer needs what only the Python loop does."""
        gemm = model.gemm
        if model.row_ops is None or not isinstance(gemm, GroupGemm) or not hasattr(model.row_ops, "decode_layers"):
            return None
        if model.device.type != "cpu" or not model.complex_rope or model.dtype != torch.float32:
            return None
        for layer in model.layers:
            if layer.moe is not None or layer.qk_norm is not None:
                return None
            for w in (layer.qkv, layer.o, layer.gate_up, layer.down):
                if not isinstance(w, GroupWeight) or w.dense is not None or w.qs is None:
                    return None
        return cls(model, model.row_ops, gemm)

    @staticmethod
    def covers(batch: AttentionBatch, rows: int) -> bool:
        return rows <= MAX_ROWS and all(not layout.prefills for layout in batch.layouts.values())

    def groups_of(self, batch: AttentionBatch) -> tuple[list[torch.Tensor], list[int]]:
        """This step's decode groups, flattened: (rows, gather, mask) tensors and (layout, start, end)."""
        tensors: list[torch.Tensor] = []
        meta: list[int] = []
        for index, window in enumerate(self.windows):
            layout = batch.layouts[window]
            groups = layout.decode_groups or []
            if not groups:
                gather = layout.decode_gather
                assert gather is not None
                B, L = gather.shape
                mask = _NONE if layout.decode_mask is None else layout.decode_mask.reshape(B, L).contiguous()
                tensors += [_NONE, gather, mask]
                meta += [index, 0, layout.num_decode]
                continue
            for g in groups:
                B, L = g.gather.shape
                mask = _NONE if g.mask is None else g.mask.reshape(B, L).contiguous()
                tensors += [_NONE if g.rows is None else g.rows, g.gather, mask]
                meta += [index, g.start, g.end]
        return tensors, meta

    def run(
        self, residual: torch.Tensor, h: torch.Tensor, qkv: torch.Tensor, rope: torch.Tensor,
        batch: AttentionBatch, kv_cache: torch.Tensor, threads: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(hidden states, the logits of every row or None when the head runs apart). The GEMMs get `threads`;
        the caller's OpenMP thread count is the same afterwards."""
        groups, group_meta = self.groups_of(batch)
        out: list[torch.Tensor] = self.ext.decode_layers(
            self.model.id, residual, h, qkv, rope, batch.slot_mapping, kv_cache, groups, group_meta, threads,
            self.use_simd,
        )
        return out[0], (out[1] if len(out) > 1 else None)
