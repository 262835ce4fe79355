"""Paged KV block allocation with prefix caching by hash chain. Torch-free.

The KV pool is `num_blocks` fixed-size blocks. A sequence's block table maps its token positions to
blocks. A *full* block whose keys/values are computed gets a hash
`H(parent hash, block tokens, extra)`, where `extra` (model identity + the request's tenant salt) enters
the first block only: since every later hash chains through it, a block is never shared across weights
or tenants. Later requests whose prompts start with the same full blocks reuse them (ref counted).

Free blocks live in one LRU order: unhashed blocks are reused first, cached (hashed) blocks are evicted
oldest-first, and a cached block freed by its last user keeps its hash until reused ("revived"
otherwise). At lookup, at most `(prompt_len - 1) // block_size` blocks can hit, so the last prompt
token is always computed (its logits are needed). Counters are monotonic, in tokens.

A model whose every layer attends through a sliding window (`window`: the widest) never reads again a block
that lies wholly before the window of a sequence's next token: `release_outside_window` returns such blocks
to the pool as the sequence advances (its table keeps `FREED` in their place, so positions still index it).
A released block keeps its hash only while its keys/values are intact: it waits in the free list like any
cached block and loses its hash when reused, so a later request never reads overwritten KV as a prefix.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from parley.local_engine.sequence import Sequence

FREED = -1
"""A block-table entry whose block was released because no later token of the sequence reads it."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None
    token_ids: tuple[int, ...] = field(default_factory=tuple)


def block_hash(parent: bytes | None, token_ids: list[int] | tuple[int, ...], extra: bytes = b"") -> bytes:
    """Stable (not Python `hash()`, which is salted per process) 16-byte hash of one block in a chain."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent if parent is not None else b"\x00" * 16)
    h.update(len(extra).to_bytes(4, "little"))
    h.update(extra)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def extra_key(model_identity: str, tenant: str | None) -> bytes:
    """Length-prefixed so ("ab", "c") and ("a", "bc") never collide."""
    parts = [model_identity.encode(), (tenant or "").encode()]
    return b"".join(len(p).to_bytes(4, "little") + p for p in parts)


def release_window(windows: tuple[int | None, ...] | None) -> int | None:
    """The window past which a model's blocks may be released: the widest when every layer has one, else None."""
    if not windows or any(w is None for w in windows):
        return None
    return max(w for w in windows if w is not None)


class BlockManager:
    """Allocates KV blocks to sequences and keeps the prefix cache."""

    def __init__(
        self, num_blocks: int, block_size: int, *, model_identity: str = "", enable_prefix_caching: bool = True,
        window: int | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.model_identity = model_identity
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # head = reused next
        self.hash_to_block: dict[bytes, int] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # prompt tokens served from cache
        self.evictions = 0  # cached blocks overwritten for reuse
        self.window = window
        """Every layer's attention window (the widest), or None when some layer attends to everything."""
        self.window_blocks_freed = 0  # blocks returned early: wholly outside every layer's window

    # ------------------------------------------------------------------ hashing
    def _ensure_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        bs = self.block_size
        extra = extra_key(self.model_identity, seq.tenant)
        while len(seq.block_hashes) < num_full_blocks:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if i else None
            seq.block_hashes.append(block_hash(parent, seq.token_ids[i * bs : (i + 1) * bs], extra if i == 0 else b""))

    # ------------------------------------------------------------------ lookup / admission
    def lookup(self, seq: Sequence) -> list[int]:
        """Block ids of the cached prefix of `seq` (never including the last token). Does not claim them."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        cacheable = (seq.num_tokens - 1) // bs
        self._ensure_hashes(seq, cacheable)
        hits: list[int] = []
        for i in range(cacheable):
            bid = self.hash_to_block.get(seq.block_hashes[i])
            if bid is None:
                break
            block = self.blocks[bid]
            if block.token_ids != tuple(seq.token_ids[i * bs : (i + 1) * bs]):  # collision guard
                break
            hits.append(bid)
        return hits

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_to_hold(self, num_tokens: int, max_chunk: int) -> int:
        """The most blocks a sequence of `num_tokens` holds at once, fed at most `max_chunk` tokens a step
        (with a `window`: the window before a chunk's first token, the chunk, and one block of misalignment)."""
        if self.window is None:
            return self.blocks_needed(num_tokens)
        return min(self.blocks_needed(num_tokens), self.blocks_needed(self.window - 1 + max_chunk) + 1)

    def _dead_hits(self, hits: list[int]) -> int:
        """With a `window`, how many of the prefix hits lie wholly before the window of the first new token:
        they are not claimed (`FREED` in the table), so a long cached prefix costs only its window."""
        if self.window is None:
            return 0
        return min(max(len(hits) * self.block_size - self.window + 1, 0) // self.block_size, len(hits))

    def can_admit(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> bool:
        """Whether claiming `hits` and allocating room for `num_new_tokens` more tokens fits in the pool."""
        revived = sum(1 for bid in hits[self._dead_hits(hits) :] if self.blocks[bid].ref_count == 0)
        cached = len(hits) * self.block_size
        new_blocks = self.blocks_needed(cached + num_new_tokens) - len(hits)
        return revived + new_blocks <= len(self.free)

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Claim the cached prefix blocks for `seq` (which holds no blocks yet) and count the lookup."""
        assert not seq.block_table, "admit() expects a sequence without blocks"
        dead = self._dead_hits(hits)
        seq.block_table.extend([FREED] * dead)
        for bid in hits[dead:]:
            block = self.blocks[bid]
            if block.ref_count == 0:
                del self.free[bid]
            block.ref_count += 1
            seq.block_table.append(bid)
        cached = len(hits) * self.block_size
        seq.num_computed_tokens = cached
        self.prefix_cache_queries += seq.num_tokens
        self.prefix_cache_hits += cached
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = cached

    # ------------------------------------------------------------------ growth
    def _take_free_block(self) -> int:
        bid, _ = self.free.popitem(last=False)
        block = self.blocks[bid]
        if block.hash is not None:
            if self.hash_to_block.get(block.hash) == bid:
                del self.hash_to_block[block.hash]
            block.hash = None
            block.token_ids = ()
            self.evictions += 1
        block.ref_count = 1
        return bid

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow `seq`'s block table to hold `num_new_tokens` more computed tokens; False (nothing taken) if full."""
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > len(self.free):
            return False
        for _ in range(need):
            seq.block_table.append(self._take_free_block())
        return True

    def commit(self, seq: Sequence) -> None:
        """Register the hashes of `seq`'s blocks that became full and computed (call after a step)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        self._ensure_hashes(seq, full)
        for i in range(full):
            if seq.block_table[i] == FREED:
                continue
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                continue
            h = seq.block_hashes[i]
            if h in self.hash_to_block:  # same content computed concurrently elsewhere: keep the first copy
                continue
            block.hash = h
            block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            self.hash_to_block[h] = block.block_id

    def _release(self, bid: int) -> None:
        block = self.blocks[bid]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {bid} ref count went negative"
        if block.ref_count == 0:
            self.free[bid] = None  # cached: tail of the LRU (evicted last)
            if block.hash is None:
                self.free.move_to_end(bid, last=False)  # uncached: reuse first

    def free_sequence(self, seq: Sequence) -> None:
        """Return every block of `seq` at once: leaf blocks first so shared roots are evicted last."""
        for bid in reversed(seq.block_table):
            if bid != FREED:
                self._release(bid)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def release_outside_window(self, seq: Sequence) -> int:
        """With a `window`, return the blocks of `seq` wholly before the window of its next token (position
        `num_computed_tokens`: no later token reads them); how many were released. Call after `commit`."""
        if self.window is None:
            return 0
        dead = min(max(seq.num_computed_tokens - self.window + 1, 0) // self.block_size, len(seq.block_table))
        first = dead
        while first > 0 and seq.block_table[first - 1] != FREED:  # back to the ones released before
            first -= 1
        for i in range(first, dead):  # oldest first: in the LRU, older cached blocks are evicted first
            self._release(seq.block_table[i])
            seq.block_table[i] = FREED
        self.window_blocks_freed += dead - first
        return dead - first

    def num_held_blocks(self, seq: Sequence) -> int:
        """Blocks `seq` holds now (its table less the entries released outside the window)."""
        return sum(1 for bid in seq.block_table if bid != FREED)

    # ------------------------------------------------------------------ figures
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def stats(self) -> dict[str, int]:
        return {
            "blocks_total": self.num_blocks,
            "blocks_used": self.num_used_blocks,
            "blocks_free": self.num_free_blocks,
            "blocks_cached": len(self.hash_to_block),
            "block_size": self.block_size,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "evictions": self.evictions,
            "window_blocks_freed": self.window_blocks_freed,
        }
