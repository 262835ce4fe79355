"""Decode steps replayed from CUDA graphs, one per (batch bucket, context bucket): `EngineConfig.cuda_graphs`.

Why: on a GPU a small model's decode step is bound by launching kernels, not by running them. SmolLM2-135M's
step is ~10 kernels per layer, 30 layers, each a few microseconds of GPU work, and Python issuing them one at
a time costs more than the GPU spends (benchmarks/gpu_decode.py measures both ways on the same GPU). A CUDA
graph records the step's kernels once and replays them with one launch.

What is graphed: decode-only steps (every row one token: plain decodes and speculative verify rows) of a model
with one attention layout (every layer full causal, or every layer the same window) and no MoE layers (their
routing has data-dependent shapes), with at most `max_rows` rows. Prefill chunks, mixed steps and larger
batches run eager, as before: a graph is an optimisation of the step the engine already has, never a second
forward pass (the captured code is `DecoderModel.forward` itself).

Static shapes. A graph holds fixed input buffers: B rows (the step's rows rounded up to a bucket of
`BATCH_BUCKETS`) over a context of L slots (the step's longest visible context rounded up to a power of two,
at least `MIN_CONTEXT`). Each step copies its ids, positions, slots, gather lists and padding mask into the
buffers (a handful of small copies) and replays. Pad rows write their K/V to `scratch_slot`, one slot of the
spare block past the pool that the block manager never hands out, and attend to it alone; pad context columns
carry -inf in the mask, as the eager step's padding does. Graphs are captured on first use of their shapes
(one eager warm-up run, then the capture, sharing one memory pool), so start-up costs nothing.

Numerics: a row's attention runs over its graph's L, not over its own multiple of `DECODE_BUCKET`, so its low
bits can depend on its company. The CPU's bitwise batch invariance never held on CUDA anyway (cuBLAS chooses
kernels by batch size); greedy tokens equal the eager step's except at near-ties. `capture=False` runs the same
buffers and padding without a graph, which is how the CPU tests check the padding exactly.

Measured on one H200 (torch 2.11; SmolLM2-135M's shape in bf16; 64-token prompts, 128 new tokens; aggregate
tok/s, benchmarks/gpu_decode.py): batch 1 eager 45, graphed 300 (HF `generate()` 34); batch 16: 1,011 and 3,319
(HF 395); batch 64: 2,174 and 6,129 (HF 2,002). Graphed tokens equalled eager ones in every row (85 of 85);
capturing a graph cost 30-100 ms on its first step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from parley.local_engine.models.attention import AttentionBatch, AttentionLayout, DecodeGroup

BATCH_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
MIN_CONTEXT = 256


def batch_bucket(rows: int) -> int | None:
    """The smallest bucket holding `rows` decode rows (None: more than the largest bucket)."""
    return next((b for b in BATCH_BUCKETS if b >= rows), None)


def context_bucket(length: int) -> int:
    """The context a row of `length` visible slots is padded to: a power of two, at least `MIN_CONTEXT`."""
    size = MIN_CONTEXT
    while size < length:
        size *= 2
    return size


def unsupported_reason(model: Any) -> str | None:
    """Why `model`'s decode step cannot be graphed (None: it can)."""
    if getattr(model, "device", torch.device("cpu")).type != "cuda":
        return "CUDA graphs need a CUDA device"
    layers = getattr(model, "layers", None)
    if not layers:
        return "not a shared-decoder model"
    if any(L.moe is not None for L in layers):
        return "MoE layers route tokens with data-dependent shapes"
    if len(getattr(model, "attention_windows", (None,))) != 1:
        return "layers with different attention windows need one layout each"
    return None


@dataclass
class _Graph:
    """One captured step: its input buffers (B rows over L context slots), the batch that views them, and the
    output the replay writes."""

    ids: torch.Tensor  # [B]
    positions: torch.Tensor  # [B]
    slots: torch.Tensor  # [B]
    gather: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, 1, L] fp32
    batch: AttentionBatch
    graph: Any = None  # torch.cuda.CUDAGraph (None: capture=False)
    out: torch.Tensor | None = None


class GraphedDecode:
    """The decode step of one model from CUDA graphs. `__call__` returns hidden states `[rows, hidden]`, or None
    for a step it does not take (it then runs eager)."""

    def __init__(self, model: Any, *, scratch_slot: int, max_rows: int, capture: bool = True) -> None:
        self.model = model
        self.scratch_slot = scratch_slot
        self.max_rows = min(max_rows, BATCH_BUCKETS[-1])
        self.capture = capture
        self.window = model.attention_windows[0] if getattr(model, "attention_windows", None) else None
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.replays = 0
        self.pool: Any = torch.cuda.graph_pool_handle() if capture else None

    def stats(self) -> dict[str, Any]:
        return {"graphs": sorted(self.graphs), "replays": self.replays}

    def close(self) -> None:
        self.graphs.clear()

    # ------------------------------------------------------------------ one step
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                 batch: AttentionBatch) -> torch.Tensor | None:
        layout = batch.layouts.get(self.window)
        if layout is None or len(batch.layouts) != 1 or layout.prefills:
            return None
        rows = layout.num_decode
        if layout.decode_groups:
            groups = layout.decode_groups
        elif layout.decode_gather is not None:
            groups = [DecodeGroup(None, 0, rows, layout.decode_gather, layout.decode_mask)]
        else:
            return None
        B = batch_bucket(rows)
        if B is None or rows > self.max_rows:
            return None
        L = context_bucket(max(int(g.gather.shape[1]) for g in groups))
        g = self.graphs.get((B, L))
        if g is None:
            g = self._capture(B, L, kv_cache)
            self.graphs[(B, L)] = g
        self._fill(g, input_ids, positions, batch.slot_mapping, groups, rows)
        if g.graph is not None:
            g.graph.replay()
        else:
            g.out = self.model.forward(g.ids, g.positions, kv_cache, g.batch)
        self.replays += 1
        assert g.out is not None
        return g.out[:rows]

    def _fill(self, g: _Graph, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
              groups: list[DecodeGroup], rows: int) -> None:
        """The step's inputs into the graph's buffers; rows past `rows` become pad rows on the scratch slot."""
        g.ids[:rows].copy_(ids)
        g.positions[:rows].copy_(positions)
        g.slots[:rows].copy_(slots)
        if rows < g.ids.shape[0]:
            g.ids[rows:].zero_()
            g.positions[rows:].zero_()
            g.slots[rows:].fill_(self.scratch_slot)
        g.gather.fill_(self.scratch_slot)
        mask = g.mask.view(g.mask.shape[0], -1)
        mask.fill_(float("-inf"))
        mask[rows:, 0] = 0.0  # a pad row attends to the scratch slot alone
        for group in groups:
            width = int(group.gather.shape[1])
            if group.rows is None:
                g.gather[group.start : group.end, :width].copy_(group.gather)
                if group.mask is None:
                    mask[group.start : group.end, :width].zero_()
                else:
                    mask[group.start : group.end, :width].copy_(group.mask.view(-1, width))
            else:
                g.gather[:, :width].index_copy_(0, group.rows, group.gather)
                values = (torch.zeros_like(group.gather, dtype=mask.dtype) if group.mask is None
                          else group.mask.view(-1, width))
                mask[:, :width].index_copy_(0, group.rows, values)

    def _capture(self, B: int, L: int, kv_cache: torch.Tensor) -> _Graph:
        """Buffers for B rows over L slots, one eager warm-up on the scratch slot, then (capture) the graph."""
        dev = kv_cache.device
        ids = torch.zeros(B, dtype=torch.long, device=dev)
        positions = torch.zeros(B, dtype=torch.long, device=dev)
        slots = torch.full((B,), self.scratch_slot, dtype=torch.long, device=dev)
        gather = torch.full((B, L), self.scratch_slot, dtype=torch.long, device=dev)
        mask = torch.full((B, 1, L), float("-inf"), dtype=torch.float32, device=dev)
        mask[:, 0, 0] = 0.0
        layout = AttentionLayout(num_decode=B, decode_gather=gather, decode_mask=mask, prefills=[],
                                 decode_groups=[DecodeGroup(None, 0, B, gather, mask)])
        batch = AttentionBatch(slot_mapping=slots, layouts={self.window: layout})
        g = _Graph(ids, positions, slots, gather, mask, batch)
        if not self.capture:
            return g
        stream = torch.cuda.Stream(device=dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):  # warm-up off the capture: lazy cuBLAS/allocator set-up happens here
            self.model.forward(ids, positions, kv_cache, batch)
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            g.out = self.model.forward(ids, positions, kv_cache, batch)
        g.graph = graph
        return g
