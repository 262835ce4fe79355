"""Model runner: turns a scheduled step into tensors, runs the forward pass, returns fp32 logits.

Owns the preallocated KV pool (one tensor, `[layers, 2 * kv_heads, (blocks + 1) * block_size, head_dim]`:
key heads then value heads), so a step allocates only its activations. The one block past the block manager's
`blocks` is never handed out: warm-ups and the padding rows of a CUDA graph write there (`scratch_slot`).
A token at position p of a sequence lives in slot `block_table[p // block_size] * block_size + p % block_size`.

A model with sliding-window layers gets one attention layout per window: a window-W layout gathers only
positions `p - W + 1 .. p`, so the blocks wholly before a sequence's window are never read by those layers;
`window_blocks_skipped` counts them (per sequence and step, once per window). When some layer attends to
everything they stay allocated (a block holds every layer's KV); when every layer is windowed the block manager
releases them (`BlockManager.release_outside_window`), and their table entries (`FREED`) are never read here.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from parley.local_engine.models.attention import (
    DECODE_BUCKET,
    AttentionBatch,
    AttentionLayout,
    DecodeGroup,
    PrefillSpan,
)
from parley.local_engine.scheduler import ScheduledSeq


class CausalLM(Protocol):
    """What the runner needs of a model file (see models/llama.py)."""

    device: torch.device
    dtype: torch.dtype

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def new_kv_cache(self, num_slots: int) -> torch.Tensor: ...

    def kv_bytes_per_token(self) -> int: ...


_FULL: tuple[int | None, ...] = (None,)


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int) -> None:
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = model.device
        self.kv_cache = model.new_kv_cache((num_blocks + 1) * block_size)
        self.scratch_slot = num_blocks * block_size  # the spare block's first slot (see the module docstring)
        bs = block_size
        self._offsets = np.arange(bs, dtype=np.int64)
        # The distinct attention windows of the model's layers (None = full causal attention).
        self.windows: tuple[int | None, ...] = getattr(model, "attention_windows", _FULL) or _FULL
        self.window_blocks_skipped = 0
        self.compiled: Any = None  # a compile.CompiledDecode, set by the engine when EngineConfig.compile is on
        self.graphs: Any = None  # a cuda_graphs.GraphedDecode, set by the engine on CUDA (EngineConfig.cuda_graphs)

    def _slot_array(self, block_table: list[int], start: int, end: int) -> np.ndarray:
        """Cache slots of positions [start, end) of a sequence (int64). numpy, not torch: a step builds one
        per decode row, and numpy's calls on a few hundred ints cost about a microsecond where torch's cost
        several (measured: the runner's input preparation was ~4 % of a q4 decode step)."""
        bs = self.block_size
        first, last = start // bs, (end - 1) // bs + 1
        table = np.asarray(block_table[first:last], dtype=np.int64)
        slots = (table[:, None] * bs + self._offsets).reshape(-1)
        return slots[start - first * bs : end - first * bs]

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """`_slot_array` as a CPU tensor."""
        return torch.from_numpy(self._slot_array(block_table, start, end))

    def prepare(self, items: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch, list[int]]:
        """Inputs for one step. Decode rows come first (batched decode attention), then prefill chunks.

        A decode verifying a speculative draft (`item.draft`) is 1 + k decode rows: its last token and the k
        drafted tokens at the next positions, row j attending to the cache up to its own position (the drafts'
        keys/values are written in this step before attention reads them).

        Returns input ids, positions, the attention layout (one per window), and for each item the row whose
        logits it samples from (-1 when the item is a non-final prefill chunk); a verifying item samples from
        the 1 + k rows ending there.
        """
        decode = [i for i, it in enumerate(items) if it.is_decode]
        prefill = [i for i, it in enumerate(items) if not it.is_decode]
        ids: list[int] = []
        pos: list[int] = []
        rows = [-1] * len(items)
        row = 0
        for i in decode + prefill:
            it = items[i]
            p, n = it.start, it.num_new_tokens
            if it.draft:
                ids.append(it.seq.token_ids[p])
                ids.extend(it.draft)
            else:
                ids.extend(it.seq.token_ids[p : p + n])
            pos.extend(range(p, p + n))
            row += n
            if it.samples:  # a 1-token chunk in the middle of a prompt samples nothing
                rows[i] = row - 1
        bs = self.block_size
        decode_slots = [
            items[i].seq.block_table[q // bs] * bs + q % bs
            for i in decode
            for q in range(items[i].start, items[i].start + items[i].num_new_tokens)
        ]
        slots = [torch.tensor(decode_slots, dtype=torch.long)] + [
            self._slots(items[i].seq.block_table, items[i].start, items[i].start + items[i].num_new_tokens)
            for i in prefill
        ]
        layouts = {w: self._layout(items, decode, prefill, w) for w in self.windows}
        dev = self.device
        batch = AttentionBatch(slot_mapping=torch.cat(slots).to(dev), layouts=layouts)
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        positions = torch.tensor(pos, dtype=torch.long, device=dev)
        return input_ids, positions, batch, rows

    def _first_visible(self, start: int, window: int | None, *, count: bool = True) -> int:
        """The first position a token at `start` (and so every later one in its chunk) may attend to."""
        if window is None:
            return 0
        first = max(start - window + 1, 0)
        if count:
            self.window_blocks_skipped += first // self.block_size
        return first

    def _layout(
        self, items: list[ScheduledSeq], decode: list[int], prefill: list[int], window: int | None
    ) -> AttentionLayout:
        dev = self.device
        gathers: list[np.ndarray] = []
        for i in decode:
            it = items[i]
            for j in range(it.num_new_tokens):  # one row per token (1 + len(draft) when verifying)
                q = it.start + j
                first = self._first_visible(q, window, count=j == 0)
                gathers.append(self._slot_array(it.seq.block_table, first, q + 1))
        decode_gather = decode_mask = None
        groups: list[DecodeGroup] = []
        if decode:
            # Rows are batched by their context padded to a multiple of DECODE_BUCKET, so a row's attention is
            # the same computation whatever it is batched with (attention.py, DECODE_BUCKET).
            by_length: dict[int, list[int]] = {}
            for r, row_slots in enumerate(gathers):
                by_length.setdefault(-(-row_slots.shape[0] // DECODE_BUCKET) * DECODE_BUCKET, []).append(r)
            for L, members in by_length.items():
                group_slots = np.zeros((len(members), L), dtype=np.int64)
                padding = np.zeros((len(members), 1, L), dtype=np.float32)
                padded = False
                for b, r in enumerate(members):
                    n = gathers[r].shape[0]
                    group_slots[b, :n] = gathers[r]
                    if n < L:
                        padding[b, 0, n:] = -np.inf
                        padded = True
                contiguous = members == list(range(members[0], members[0] + len(members)))
                groups.append(DecodeGroup(
                    rows=None if contiguous else torch.tensor(members, device=dev), start=members[0],
                    end=members[-1] + 1, gather=torch.from_numpy(group_slots).to(dev),
                    mask=torch.from_numpy(padding).to(dev) if padded else None,
                ))
            if len(groups) == 1:
                decode_gather, decode_mask = groups[0].gather, groups[0].mask
        spans: list[PrefillSpan] = []
        row = len(gathers)
        for i in prefill:
            it = items[i]
            p, n = it.start, it.num_new_tokens
            first = self._first_visible(p, window)
            g = self._slots(it.seq.block_table, first, p + n)
            if window is None:
                # Causal mask: new token j (position p+j) sees cached positions 0..p+j.
                mask = torch.full((n, p + n), float("-inf"), dtype=torch.float32).triu_(p + 1)
            else:
                # ... and, in a window, only keys k with p+j - window < k.
                q_pos = torch.arange(p, p + n).unsqueeze(1)
                k_pos = torch.arange(first, p + n).unsqueeze(0)
                visible = (k_pos <= q_pos) & (k_pos > q_pos - window)
                mask = torch.zeros(n, p + n - first).masked_fill_(~visible, float("-inf"))
            spans.append(PrefillSpan(row, row + n, g.to(dev), mask.to(dev)))
            row += n
        return AttentionLayout(num_decode=len(gathers), decode_gather=decode_gather, decode_mask=decode_mask,
                               prefills=spans, decode_groups=groups)

    @torch.inference_mode()
    def run(self, items: list[ScheduledSeq]) -> tuple[torch.Tensor | None, list[int]]:
        """fp32 logits [N, vocab] for the items that sample this step, and each item's row in them (-1: none).

        A verifying item (`len(item.draft) == k`) owns the k + 1 logits rows ending at its row."""
        input_ids, positions, batch, rows = self.prepare(items)
        hidden = None
        fast = self.compiled if self.compiled is not None else self.graphs
        if fast is not None:  # decode-only steps (compile.py, cuda_graphs.py); None: this step runs eager
            hidden = fast(input_ids, positions, self.kv_cache, batch)
        if hidden is None:
            hidden = self.model.forward(input_ids, positions, self.kv_cache, batch)
        wanted: list[int] = []
        out_rows: list[int] = []
        for it, r in zip(items, rows, strict=True):
            if r < 0:
                out_rows.append(-1)
                continue
            wanted.extend(range(r - len(it.draft), r + 1))  # a verifying item: its 1 + k rows
            out_rows.append(len(wanted) - 1)
        if not wanted:
            return None, out_rows
        sel = hidden if len(wanted) == hidden.shape[0] else hidden[torch.tensor(wanted, device=hidden.device)]
        return self.model.compute_logits(sel), out_rows
