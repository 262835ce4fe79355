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
    """A model's fused decode step: its constant arguments handed to C++ once, and each step's decode groups."""

    def __init__(self, model: DecoderModel, ext: Any, gemm: GroupGemm) -> None:
        self.ext = ext
        self.use_simd = gemm.use_simd
        weights: list[torch.Tensor] = []
        meta: list[int] = []
        biases: list[torch.Tensor] = []
        sinks: list[torch.Tensor] = []
        layer_layout: list[int] = []
        self.windows = model.attention_windows
        for layer in model.layers:
            mats: list[GroupWeight] = [layer.qkv, layer.o, layer.gate_up, layer.down]  # type: ignore[list-item]
            for w in mats:
                assert w.qs is not None and w.d is not None and w.m is not None
                weights += [w.qs, w.d, w.m, w.col_scale]
            meta += [w.bits for w in mats] + [w.out_features for w in mats]
            biases += [_NONE if b is None else b for b in
                       (layer.qkv_bias, layer.o_bias, layer.gate_up_bias, layer.down_bias)]
            sinks.append(_NONE if layer.sinks is None else layer.sinks.contiguous())
            layer_layout.append(self.windows.index(layer.window))
        # the LM head in the same parallel region, where it runs in the group kernel (an fp32 head stays apart)
        head = model.lm_head
        head_parts: list[torch.Tensor] = []
        head_bits = vocab = 0
        if isinstance(head, GroupWeight) and head.dense is None and head.qs is not None:
            assert head.d is not None and head.m is not None
            head_parts = [head.qs, head.d, head.m, head.col_scale]
            head_bits, vocab = head.bits, head.out_features
        a = model.arch
        # the constant arguments, checked and unpacked once in C++ (which holds them): a step passes this handle
        self.model = _ModelHandle(ext, ext.fused_model(
            weights, meta, biases, sinks, layer_layout, a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim,
            a.intermediate_size, a.rms_norm_eps, head_parts, head_bits, vocab, model.norm,
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
