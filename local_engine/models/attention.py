"""Paged attention over the KV pool: the per-step layout the runner builds, and the per-layer attention function.

The pool is one tensor per layer, `[2 * kv_heads, slots, head_dim]` (key heads, then value heads). The runner
passes an `AttentionBatch`: where each new token's K/V goes (`slot_mapping`) and, per attention window, which
cached slots each sequence reads (`AttentionLayout`). Full causal attention is window `None`; a sliding-window
layer of width W gets a layout whose gathers start at position `p - W + 1`, so it never reads KV outside its
window (HF's rule: key position k is visible from query position q when `q - W < k <= q`).

Grouped-query attention is computed by a grouped matmul: the query heads sharing a KV head are laid side by
side, so each cached key/value is read once and KV heads are never repeated. Learned attention sinks
(gpt-oss) add one logit per head to the softmax's denominator and produce no output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PrefillSpan:
    """A sequence feeding several tokens this step: rows [start, end) of the batch."""

    start: int
    end: int
    gather: torch.Tensor  # [ctx] cache slots this span's tokens read (its window's positions, in order)
    mask: torch.Tensor | None  # [n, ctx] additive causal (and window) mask (None when n == 1)


@dataclass
class DecodeGroup:
    """Decode rows whose visible context pads to the same length `L` (a multiple of `DECODE_BUCKET`)."""

    rows: torch.Tensor | None  # [Bg] row indices among the decode rows; None: the range [start, end)
    start: int
    end: int
    gather: torch.Tensor  # [Bg, L] cache slots each row attends to (padded)
    mask: torch.Tensor | None  # [Bg, 1, L] additive mask for the padding (None when none is padded)


DECODE_BUCKET = 64
"""Decode attention pads each row's context to a multiple of this, and batches only rows of one padded length.

Why: a reduction over the context (the softmax's sum, probabilities x values) rounds differently when its
length changes, so a row padded to a longer neighbour's length gets other low bits than alone. That is
harmless in fp32, but an int8 mode quantises activations, and a 1e-9 difference that lands on a rounding
boundary becomes a whole quantisation step: measured on SmolLM2 int8, 2 of 16 concurrent greedy requests
parted from their solo runs at token 26, and speculative verify rows differed from plain decode by up to 1.0
in the logits. Padded to its own bucket, a row's attention is computed on the same shapes and values alone,
batched, or as one row of a speculative verify, so it is bitwise the same."""


@dataclass
class AttentionLayout:
    """What one attention window reads this step. Rows [0, num_decode) are one token per sequence."""

    num_decode: int
    decode_gather: torch.Tensor | None  # [B, L] slots of every decode row when one group holds them all, else None
    decode_mask: torch.Tensor | None  # [B, 1, L] its padding mask (None when nothing is padded)
    prefills: list[PrefillSpan]
    decode_groups: list[DecodeGroup] = field(default_factory=list)


@dataclass
class AttentionBatch:
    """Per-step attention layout, shared by all layers: one `AttentionLayout` per window (None = full)."""

    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    layouts: dict[int | None, AttentionLayout] = field(default_factory=dict)

    # The full-attention layout's fields, for callers that predate windows.
    @property
    def num_decode(self) -> int:
        return next(iter(self.layouts.values())).num_decode

    @property
    def prefills(self) -> list[PrefillSpan]:
        return self.layouts[None].prefills


AttendFn = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """softmax over the last dim in fp32; with sinks, as if each row had one more logit `sink` (dropped after).

    p_i = e^s_i / (sum_j e^s_j + e^sink) = softmax(s)_i * sigmoid(logsumexp(s) - sink).
    """
    exact = scores.dtype in (torch.float32, torch.float64)
    p = torch.softmax(scores, -1) if exact else torch.softmax(scores, -1, torch.float32)
    if sinks is not None:
        lse = torch.logsumexp(scores if exact else scores.float(), -1, keepdim=True)
        p.mul_(torch.sigmoid(lse.sub_(sinks)))
    return p if p.dtype == out_dtype else p.to(out_dtype)


def _decode_group_plan(q: torch.Tensor, group: DecodeGroup, *, H: int, KVH: int, D: int, kernel: Any) -> AttendFn:
    """Attention of one decode group as one grouped matmul over (kv head, row): the G query heads of a KV head
    share its gathered keys/values, read once; KV heads are never repeated. With `kernel` (the quantised modes'
    C++ extension, row_ops_kernel.py), one call that reads the pool through the gather list instead of 4-5 ATen
    ops; its numerics are per row too (same alone, batched, or as a speculative verify row)."""
    G = H // KVH
    dev, dt = q.device, q.dtype
    gather = group.gather
    B, L = gather.shape
    if kernel is not None:
        mask2d = torch.empty(0) if group.mask is None else group.mask.reshape(B, L).contiguous()
        q_rows = q[group.start : group.end] if group.rows is None else None
        index = group.rows

        def decode_attention_kernel(kvc: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
            qr = q_rows if q_rows is not None else q.index_select(0, index)  # type: ignore[arg-type]
            s = torch.empty(0) if sinks is None else sinks.contiguous()
            out: torch.Tensor = kernel.decode_attention(qr, kvc, gather, mask2d, s, KVH, True)
            return out

        return decode_attention_kernel
    flat = gather.reshape(-1)
    kvg = torch.empty(2 * KVH, B * L, D, device=dev, dtype=dt)
    kg_t = kvg[:KVH].view(KVH * B, L, D).transpose(1, 2)
    vg = kvg[KVH:].view(KVH * B, L, D)
    mask = group.mask
    od = torch.empty(KVH * B, G, D, device=dev, dtype=dt)
    rows = group.rows
    qg = q[group.start : group.end] if rows is None else None
    qd_one = qg.view(KVH, G, D) if qg is not None and B == 1 else None
    out_one = od.view(1, H * D) if B == 1 else None

    def decode_attention(kvc: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
        torch.index_select(kvc, 1, flat, out=kvg)
        if qd_one is not None:
            qd = qd_one
        else:
            qr = qg if qg is not None else q.index_select(0, rows)  # type: ignore[arg-type]
            qd = qr.reshape(B, KVH, G, D).transpose(0, 1).reshape(KVH * B, G, D)
        scores = torch.bmm(qd, kg_t)
        if mask is not None:
            scores = scores.view(KVH, B, G, L).add_(mask).view(KVH * B, G, L)
        if sinks is None:
            probs = softmax_with_sinks(scores, None, dt)
        else:
            probs = softmax_with_sinks(scores.view(KVH, B, G, L), sinks.view(KVH, 1, G, 1), dt)
        torch.bmm(probs.view(KVH * B, G, L), vg, out=od)
        if out_one is not None:
            return out_one
        return od.view(KVH, B, G, D).transpose(0, 1).reshape(B, H * D)

    return decode_attention


def attention_plan(
    q: torch.Tensor, layout: AttentionLayout, *, num_heads: int, num_kv_heads: int, head_dim: int,
    kernel: Any = None,
) -> AttendFn:
    """A per-layer attention function `(layer cache [2*KVH, slots, D], sinks [KVH, G] or None) -> [T, H*D]`.

    `q` is the step's query view `[T, H*D]`, already rotated and scaled by 1/sqrt(head_dim). Buffers and views
    that do not depend on the layer are made here, once per step. `kernel`: see `_decode_group_plan`.
    """
    H, KVH, D = num_heads, num_kv_heads, head_dim
    G = H // KVH
    nd = layout.num_decode
    dev, dt = q.device, q.dtype

    decode: AttendFn | None = None
    if nd:
        groups = layout.decode_groups or [
            DecodeGroup(None, 0, nd, layout.decode_gather, layout.decode_mask)  # type: ignore[arg-type]
        ]
        plans = [_decode_group_plan(q, g, H=H, KVH=KVH, D=D, kernel=kernel) for g in groups]
        if len(plans) == 1 and groups[0].rows is None and groups[0].start == 0 and groups[0].end == nd:
            decode = plans[0]
        else:
            out = torch.empty(nd, H * D, device=dev, dtype=dt)

            def grouped(kvc: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
                for g, plan in zip(groups, plans, strict=True):
                    og = plan(kvc, sinks)
                    if g.rows is None:
                        out[g.start : g.end] = og
                    else:
                        out.index_copy_(0, g.rows, og)
                return out

            decode = grouped
        if not layout.prefills:
            return decode

    spans = layout.prefills

    def attend(kvc: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
        outs = [] if decode is None else [decode(kvc, sinks)]
        for span in spans:
            n = span.end - span.start
            ctx = span.gather.shape[0]
            kvg_p = kvc.index_select(1, span.gather)  # [2*KVH, ctx, D]
            kg, vg_p = kvg_p[:KVH], kvg_p[KVH:]
            qp = q[span.start : span.end].reshape(n, KVH, G, D).permute(1, 2, 0, 3).reshape(KVH, G * n, D)
            scores = torch.bmm(qp, kg.transpose(1, 2)).view(KVH, G, n, ctx)
            if span.mask is not None:
                scores = scores.add_(span.mask)
            probs = softmax_with_sinks(scores, None if sinks is None else sinks.view(KVH, G, 1, 1), dt)
            o = torch.bmm(probs.view(KVH, G * n, ctx), vg_p).view(KVH, G, n, D)
            outs.append(o.permute(2, 0, 1, 3).reshape(n, H * D))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    return attend
