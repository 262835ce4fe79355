"""Block manager: hash-chain prefix caching, tenant isolation, ref counts, LRU eviction, counters."""

from __future__ import annotations

import pytest

from parley.local_engine.block_manager import BlockManager, block_hash, extra_key
from parley.local_engine.config import SamplingParams
from parley.local_engine.sequence import Sequence

BS = 4


def seq(tokens: list[int], tenant: str | None = None, rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams(), tenant=tenant)


def run_prompt(bm: BlockManager, s: Sequence) -> int:
    """Admit `s` with its cached prefix, allocate and 'compute' the rest, register hashes. Returns hit tokens."""
    hits = bm.lookup(s)
    n = s.num_tokens - len(hits) * BS
    assert bm.can_admit(s, hits, n)
    bm.admit(s, hits)
    assert bm.allocate(s, n)
    s.num_computed_tokens = s.num_tokens
    bm.commit(s)
    return len(hits) * BS


def test_hash_chain_depends_on_parent_tokens_and_extra() -> None:
    a = block_hash(None, [1, 2, 3, 4], b"x")
    assert a == block_hash(None, [1, 2, 3, 4], b"x")
    assert a != block_hash(None, [1, 2, 3, 5], b"x")
    assert a != block_hash(None, [1, 2, 3, 4], b"y")
    assert block_hash(a, [5, 6, 7, 8]) != block_hash(None, [5, 6, 7, 8])
    # length-prefixed extra keys: ("ab", "c") and ("a", "bc") differ
    assert extra_key("ab", "c") != extra_key("a", "bc")


def test_shared_prefix_hits_full_blocks_only_and_never_the_last_token() -> None:
    bm = BlockManager(32, BS, model_identity="m")
    first = seq(list(range(10, 20)))  # 10 tokens: 2 full blocks + 2
    assert run_prompt(bm, first) == 0
    second = seq(list(range(10, 20)) + [99])
    assert run_prompt(bm, second) == 8
    # A prompt that is exactly the cached 8 tokens may reuse only 1 block: the last token must be computed.
    exact = seq(list(range(10, 18)))
    assert len(bm.lookup(exact)) == 1
    assert bm.prefix_cache_hits == 8 and bm.prefix_cache_queries == 10 + 11


def test_tenants_and_models_never_share_blocks() -> None:
    bm = BlockManager(32, BS, model_identity="m")
    run_prompt(bm, seq(list(range(12)) + [1], tenant="alice"))
    assert len(bm.lookup(seq(list(range(12)) + [2], tenant="alice"))) == 3
    assert bm.lookup(seq(list(range(12)) + [2], tenant="bob")) == []
    assert bm.lookup(seq(list(range(12)) + [2])) == []
    other_model = BlockManager(32, BS, model_identity="other")
    other_model.hash_to_block = bm.hash_to_block  # even with the same table, hashes differ by model identity
    assert other_model.lookup(seq(list(range(12)) + [2], tenant="alice")) == []


def test_ref_counts_and_free_returns_every_block() -> None:
    bm = BlockManager(16, BS, model_identity="m")
    a = seq(list(range(9)), rid="a")
    run_prompt(bm, a)
    b = seq(list(range(9)), rid="b")
    assert run_prompt(bm, b) == 8
    shared = a.block_table[:2]
    assert shared == b.block_table[:2]
    assert all(bm.blocks[i].ref_count == 2 for i in shared)
    bm.free_sequence(a)
    assert all(bm.blocks[i].ref_count == 1 for i in shared)
    bm.free_sequence(b)
    assert bm.num_free_blocks == 16 and bm.num_used_blocks == 0
    assert all(blk.ref_count == 0 for blk in bm.blocks)


def test_freed_cached_blocks_are_revived_with_their_hash() -> None:
    bm = BlockManager(16, BS, model_identity="m")
    a = seq(list(range(9)))
    run_prompt(bm, a)
    bm.free_sequence(a)
    cached_before = len(bm.hash_to_block)
    b = seq(list(range(9)) + [50])
    assert run_prompt(bm, b) == 8  # revived from the free list, hash kept (nano-vllm 9fa256a regression)
    assert len(bm.hash_to_block) == cached_before
    assert bm.evictions == 0


def test_lru_evicts_unreferenced_cached_blocks_oldest_first_and_uncached_blocks_go_first() -> None:
    bm = BlockManager(6, BS, model_identity="m")
    old = seq([1] * 8 + [7], rid="old")  # 2 cached blocks + 1 partial
    run_prompt(bm, old)
    bm.free_sequence(old)
    new = seq([2] * 8 + [7], rid="new")
    run_prompt(bm, new)
    bm.free_sequence(new)
    assert bm.evictions == 0  # 6 blocks: the partial (uncached) blocks were reused first
    hog = seq([3] * 8 + [7], rid="hog")
    # Needs 3 blocks: the uncached one, a never-used one, then the least recently used cached block,
    # which is the *leaf* of the older prefix (blocks are freed leaf-first, so roots outlive leaves).
    run_prompt(bm, hog)
    assert bm.evictions == 1
    assert len(bm.lookup(seq([2] * 8 + [9]))) == 2  # the newer prefix survived whole
    assert len(bm.lookup(seq([1] * 8 + [9]))) == 1  # the older one lost its leaf block


def test_allocation_fails_cleanly_when_the_pool_is_exhausted() -> None:
    bm = BlockManager(2, BS, model_identity="m")
    s = seq(list(range(12)))
    bm.admit(s, [])
    assert not bm.allocate(s, 12)
    assert s.block_table == [] and bm.num_free_blocks == 2
    assert bm.allocate(s, 8)
    assert bm.num_free_blocks == 0


def test_prefix_caching_can_be_disabled() -> None:
    bm = BlockManager(16, BS, model_identity="m", enable_prefix_caching=False)
    run_prompt(bm, seq(list(range(9))))
    assert run_prompt(bm, seq(list(range(9)))) == 0
    assert bm.stats()["blocks_cached"] == 0


@pytest.mark.parametrize("num_blocks", [0, -1])
def test_bad_pool_sizes_are_rejected(num_blocks: int) -> None:
    with pytest.raises(ValueError):
        BlockManager(num_blocks, BS)


def test_a_windowed_manager_releases_blocks_wholly_before_the_next_tokens_window() -> None:
    from parley.local_engine.block_manager import FREED, release_window

    assert release_window((8, 8)) == 8 and release_window((4, 8)) == 8
    assert release_window((8, None)) is None and release_window(()) is None and release_window(None) is None
    bm = BlockManager(16, BS, model_identity="m", window=6)
    assert bm.blocks_to_hold(1000, 8) == -(-(6 - 1 + 8) // BS) + 1 and bm.blocks_to_hold(5, 8) == 2
    assert BlockManager(16, BS).blocks_to_hold(1000, 8) == 250
    a = seq(list(range(100, 114)), rid="a")  # 14 tokens
    run_prompt(bm, a)  # next token at position 14 sees 9..14: blocks 0 and 1 (positions 0..7) are dead
    b = seq(list(range(100, 111)), rid="b")  # shares a's first two blocks
    assert run_prompt(bm, b) == 8
    used = bm.num_used_blocks
    assert bm.release_outside_window(a) == 2 and a.block_table[:2] == [FREED, FREED]
    assert bm.num_used_blocks == used and bm.num_held_blocks(a) == 2  # b still holds the shared two
    assert bm.release_outside_window(a) == 0  # nothing new is dead
    assert bm.release_outside_window(b) == 1  # b's next token (11) sees 6..11: only block 0 is dead
    assert bm.num_used_blocks == used - 1 and bm.window_blocks_freed == 3
    # Released blocks keep their hashes while untouched: the same prompt hits them again.
    assert len(bm.lookup(seq(list(range(100, 114)), rid="c"))) == 3
    bm.commit(a)  # FREED entries are skipped
    bm.free_sequence(a)
    bm.free_sequence(b)
    assert bm.num_used_blocks == 0 and bm.stats()["window_blocks_freed"] == 3
    # Reused blocks lose their hashes: a lookup never reads overwritten KV.
    hog = seq(list(range(500, 500 + 16 * BS - 1)), rid="hog")
    assert bm.allocate(hog, hog.num_tokens)
    assert bm.lookup(seq(list(range(100, 114)), rid="d")) == []


def test_a_windowed_manager_does_not_claim_prefix_hits_before_the_window() -> None:
    from parley.local_engine.block_manager import FREED

    bm = BlockManager(16, BS, model_identity="m", window=6)
    run_prompt(bm, seq(list(range(100, 117)), rid="a"))  # 4 full blocks cached
    b = seq(list(range(100, 117)) + [5, 6], rid="b")
    hits = bm.lookup(b)
    assert len(hits) == 4  # 16 cached tokens; the first new token (16) sees 11..16: blocks 0 and 1 are dead
    used = bm.num_used_blocks
    bm.admit(b, hits)
    assert b.block_table[:2] == [FREED, FREED] and b.block_table[2:] == hits[2:]
    assert b.num_computed_tokens == 16 and bm.num_used_blocks == used  # a still holds them all
    assert bm.blocks[hits[0]].ref_count == 1 and bm.blocks[hits[2]].ref_count == 2
