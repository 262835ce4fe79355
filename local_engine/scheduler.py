"""Iteration-level continuous batching with chunked prefill and preemption by recompute. Torch-free.

Every step gets a token budget (`max_num_batched_tokens`). Running sequences are served first —
decodes (one token each) before prefill chunks, so streaming latency does not wait on a long prompt —
then waiting sequences are admitted FCFS while the budget, the sequence cap and the KV pool allow.
Admission stops at a sequence whose next uncached block another sequence computes in the same step:
next step it reads that block from the prefix cache, so a burst sharing a system prompt computes it once.
A prompt longer than the remaining budget is prefilled in chunks across steps, mixed with decodes.

When a running sequence needs a block and none is free, the most recently admitted running sequence is
preempted: its blocks are returned and it goes back to the head of the queue, to be recomputed (its
prompt and output so far become the new prefill; the prefix cache usually gives much of it back).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from parley.local_engine.block_manager import BlockManager
from parley.local_engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: feed `num_new_tokens` tokens starting at its computed length."""

    seq: Sequence
    num_new_tokens: int
    start: int  # position of the first new token (== seq.num_computed_tokens at scheduling)
    samples: bool = False  # the chunk reaches the sequence's last token, so the step yields its next token
    draft: tuple[int, ...] = ()  # speculative tokens fed after the last token (num_new_tokens = 1 + len(draft))

    @property
    def is_decode(self) -> bool:
        """One token per row of the decode path: a plain decode, or a decode verifying a draft."""
        return self.num_new_tokens == 1 or bool(self.draft)

    @classmethod
    def of(cls, seq: Sequence, num_new_tokens: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        return cls(seq, num_new_tokens, start, start + num_new_tokens == seq.num_tokens)


@dataclass
class SchedulerOutput:
    items: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)  # could not proceed at all (pool too small)

    @property
    def num_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.items)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_batched_tokens: int = 512,
        max_num_seqs: int = 64,
        max_model_len: int = 8192,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.drafter: Callable[[Sequence, int], list[int]] | None = None
        """Speculative drafts (speculative.py): `drafter(seq, room)` -> at most `room` tokens to verify after
        `seq`'s last token. Drafts use only the budget and free blocks left once everything else is scheduled."""
        self.draft_max_batch = 1 << 30
        """Drafts only in steps with at most this many decoding sequences (`EngineConfig.speculative_max_batch`)."""

    # ------------------------------------------------------------------ queue management
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take `seq` out of the queues and return its blocks at once (finish, abort, deadline)."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.block_manager.free_sequence(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free_sequence(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        scheduled: dict[int, ScheduledSeq] = {}

        # Decodes first (latency), then chunks of prompts already in flight; both in admission order.
        order = [s for s in self.running if s.num_uncomputed_tokens == 1] + [
            s for s in self.running if s.num_uncomputed_tokens > 1
        ]
        for seq in order:
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            while not bm.allocate(seq, n):
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    # Alone and still no room: the pool cannot hold this sequence. End it rather than spin.
                    self.finish(seq, "length")
                    out.finished.append(seq)
                    break
                item = scheduled.pop(id(victim), None)
                if item is not None:
                    out.items.remove(item)
                    budget += item.num_new_tokens
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            item = ScheduledSeq.of(seq, n)
            scheduled[id(seq)] = item
            out.items.append(item)
            budget -= n

        # Admit waiting sequences FCFS; none jumps the queue, and none is admitted right after a preemption.
        # A sequence whose next uncached block is being computed in this very step by one admitted before it
        # (a burst of requests with one system prompt) waits a step and then reads that block from the cache.
        pending: set[bytes] = set()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            hits = bm.lookup(seq)
            if pending and len(hits) < len(seq.block_hashes) and seq.block_hashes[len(hits)] in pending:
                break
            n = min(seq.num_tokens - len(hits) * bm.block_size, budget)
            if not bm.can_admit(seq, hits, n):
                break
            if bm.enable_prefix_caching:
                full_after_step = min((len(hits) * bm.block_size + n) // bm.block_size, len(seq.block_hashes))
                pending.update(seq.block_hashes[len(hits) : full_after_step])
            bm.admit(seq, hits)
            allocated = bm.allocate(seq, n)
            assert allocated
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            item = ScheduledSeq.of(seq, n)
            out.items.append(item)
            budget -= n
        if self.drafter is not None and budget > 0 and not out.preempted:
            self._attach_drafts(out, budget)
        return out

    def _attach_drafts(self, out: SchedulerOutput, budget: int) -> None:
        """Give decodes speculative tokens from the leftover budget, in scheduling order, never preempting."""
        assert self.drafter is not None
        decodes = sum(1 for item in out.items if item.num_new_tokens == 1 and item.samples)
        if decodes > self.draft_max_batch:  # a big batch is compute-bound: verifying drafts would cost, not pay
            return
        bm, bs = self.block_manager, self.block_manager.block_size
        for item in out.items:
            if budget <= 0:
                break
            seq = item.seq
            if item.num_new_tokens != 1 or not item.samples:
                continue
            # Room: the budget, the request's remaining output (emitting k + 1 tokens at most), the context.
            room = min(budget, seq.params.max_tokens - seq.num_output_tokens - 1, self.max_model_len - seq.num_tokens)
            if room <= 0:
                continue
            draft = self.drafter(seq, room)[:room]
            if not draft:
                continue
            if not bm.allocate(seq, 1 + len(draft)):  # no free block for all of it: what the table already holds
                draft = draft[: len(seq.block_table) * bs - seq.num_computed_tokens - 1]
                if not draft:
                    continue
            item.draft = tuple(draft)
            item.num_new_tokens = 1 + len(draft)
            budget -= len(draft)

    def postprocess(self, out: SchedulerOutput) -> None:
        """Mark the step's tokens computed and register newly full blocks in the prefix cache."""
        for item in out.items:
            seq = item.seq
            # A verified draft's tokens count once accepted (the engine advances them and commits again).
            seq.num_computed_tokens = item.start + (1 if item.draft else item.num_new_tokens)
            self.block_manager.commit(seq)
            self.block_manager.release_outside_window(seq)  # all-windowed models: blocks no token reads again

    def append_token(self, seq: Sequence, token_id: int, eos_token_ids: frozenset[int]) -> str | None:
        """Record a generated token; return the finish reason it causes, if any (the caller finishes it)."""
        seq.token_ids.append(token_id)
        p = seq.params
        n_out = seq.num_output_tokens
        if n_out >= p.min_tokens:
            if token_id in p.stop_token_ids or (not p.ignore_eos and token_id in eos_token_ids):
                return "stop"
        if n_out >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def stats(self) -> dict[str, int]:
        return {"num_running": len(self.running), "num_waiting": len(self.waiting), "preemptions": self.num_preemptions}
