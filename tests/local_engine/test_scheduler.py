"""Scheduler: continuous batching, chunked prefill under a token budget, preemption by recompute. No model."""

from __future__ import annotations

from parley.local_engine.block_manager import BlockManager
from parley.local_engine.config import SamplingParams
from parley.local_engine.scheduler import Scheduler
from parley.local_engine.sequence import Sequence, SequenceStatus

BS = 4
EOS = frozenset({2})


def make(num_blocks: int = 64, budget: int = 16, max_seqs: int = 8) -> Scheduler:
    bm = BlockManager(num_blocks, BS, model_identity="m")
    return Scheduler(bm, max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=4096)


def seq(rid: str, n: int, max_tokens: int = 8, start: int = 10) -> Sequence:
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def step(sched: Scheduler, token: int = 7) -> list[tuple[str, int, bool]]:
    """One fake step: every sampling item gets `token`; finished sequences are removed."""
    out = sched.schedule()
    sched.postprocess(out)
    for item in out.items:
        if item.samples:
            reason = sched.append_token(item.seq, token, EOS)
            if reason:
                sched.finish(item.seq, reason)
    return [(it.seq.request_id, it.num_new_tokens, it.samples) for it in out.items]


def test_long_prompt_is_prefilled_in_chunks_within_the_budget() -> None:
    sched = make(budget=16)
    sched.add(seq("a", 40))
    assert step(sched) == [("a", 16, False)]
    assert step(sched) == [("a", 16, False)]
    assert step(sched) == [("a", 8, True)]
    assert step(sched) == [("a", 1, True)]


def test_decodes_and_prefill_chunks_share_a_step() -> None:
    sched = make(budget=16)
    sched.add(seq("a", 5))
    step(sched)  # a prefilled, sampled its first token
    sched.add(seq("b", 30, start=100))
    items = step(sched)
    assert items == [("a", 1, True), ("b", 15, False)]  # decode first, the rest of the budget to b's chunk
    assert sum(n for _, n, _ in items) <= 16


def test_waiting_requests_are_admitted_fcfs_up_to_max_num_seqs() -> None:
    sched = make(budget=64, max_seqs=2)
    for r in "abc":
        sched.add(seq(r, 4, start=ord(r) * 10))
    assert [r for r, _, _ in step(sched)] == ["a", "b"]
    assert [s.request_id for s in sched.waiting] == ["c"]


def test_requests_finish_at_max_tokens_and_return_their_blocks() -> None:
    sched = make()
    sched.add(seq("a", 6, max_tokens=3))
    for _ in range(3):
        step(sched)
    assert not sched.has_work()
    assert sched.block_manager.num_used_blocks == 0


def test_eos_and_stop_ids_finish_unless_ignored() -> None:
    sched = make()
    s = Sequence("a", [5, 6], SamplingParams(max_tokens=10, stop_token_ids=(9,)))
    assert sched.append_token(s, 2, EOS) == "stop"
    s2 = Sequence("b", [5, 6], SamplingParams(max_tokens=10, stop_token_ids=(9,)))
    assert sched.append_token(s2, 9, EOS) == "stop"
    s3 = Sequence("c", [5, 6], SamplingParams(max_tokens=10, ignore_eos=True))
    assert sched.append_token(s3, 2, EOS) is None


def test_out_of_blocks_preempts_the_newest_sequence_and_recomputes_it() -> None:
    sched = make(num_blocks=8, budget=64)  # 32 token slots: each alone fits (28 tokens), both do not
    a, b = seq("a", 8, max_tokens=20), seq("b", 8, max_tokens=20, start=100)
    sched.add(a)
    sched.add(b)
    step(sched)  # both prefilled: 2 blocks each, 2 free
    preempted_seen = False
    for _ in range(30):
        out_before = sched.num_preemptions
        step(sched)
        if sched.num_preemptions > out_before:
            preempted_seen = True
            assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
            assert b.num_output_tokens > 0  # its output so far is kept and recomputed later
        if not sched.has_work():
            break
    assert preempted_seen
    assert a.is_finished and b.is_finished
    assert a.num_output_tokens == 20 and b.num_output_tokens == 20
    assert sched.block_manager.num_used_blocks == 0


def test_a_lone_sequence_that_outgrows_the_pool_ends_instead_of_spinning() -> None:
    sched = make(num_blocks=2, budget=64)  # 8 token slots
    s = seq("a", 6, max_tokens=100)
    sched.add(s)
    for _ in range(10):
        step(sched)
    assert s.is_finished and s.finish_reason == "length"
    assert sched.block_manager.num_used_blocks == 0


def test_finish_while_waiting_or_running_frees_everything() -> None:
    sched = make(budget=8)
    a, b = seq("a", 20), seq("b", 4, start=200)
    sched.add(a)
    sched.add(b)
    step(sched)  # a partially prefilled, b waiting
    sched.finish(a, "abort")
    sched.finish(b, "abort")
    assert not sched.has_work()
    assert sched.block_manager.num_used_blocks == 0
    assert a.finish_reason == "abort"


def test_prefix_cache_hits_skip_computation_on_admission() -> None:
    sched = make(budget=64)
    first = seq("a", 13, max_tokens=1)
    sched.add(first)
    step(sched)
    second = seq("b", 13, max_tokens=1)
    sched.add(second)
    items = step(sched)
    assert items == [("b", 1, True)]  # 12 tokens (3 blocks) cached, only the last prompt token computed
    assert second.num_cached_tokens == 12


def with_prefix(rid: str, prefix: list[int], tail: int, tenant: str | None = None) -> Sequence:
    ids = prefix + [200 + ord(rid[0]) * 7 + i for i in range(tail)]
    return Sequence(rid, ids, SamplingParams(max_tokens=2, ignore_eos=True), tenant=tenant)


def test_a_burst_sharing_a_prefix_computes_it_once() -> None:
    """Requests arriving together with one system prompt: the first computes the shared blocks, the others
    wait one step and read them from the cache instead of computing them again in the same step."""
    sched = make(budget=64)
    prefix = list(range(50, 58))  # two full blocks of 4
    burst = [with_prefix(r, prefix, 3) for r in "abc"]
    for s in burst:
        sched.add(s)
    assert step(sched) == [("a", 11, True)]
    assert step(sched) == [("a", 1, True), ("b", 3, True), ("c", 3, True)]
    assert [s.num_cached_tokens for s in burst] == [0, 8, 8]


def test_a_burst_without_a_shared_block_is_admitted_in_one_step() -> None:
    sched = make(budget=64)
    short_prefix = [50, 51, 52]  # shorter than a block: nothing to share
    for r in "ab":
        sched.add(with_prefix(r, short_prefix, 3))
    assert [r for r, _, _ in step(sched)] == ["a", "b"]


def test_other_tenants_never_wait_for_a_prefix_they_cannot_share() -> None:
    sched = make(budget=64)
    prefix = list(range(50, 58))
    sched.add(with_prefix("a", prefix, 3, tenant="t1"))
    sched.add(with_prefix("b", prefix, 3, tenant="t2"))
    assert [r for r, _, _ in step(sched)] == ["a", "b"]
