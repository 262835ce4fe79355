"""One request's state inside the engine: its tokens, KV block table and progress. Torch-free.

A sequence's token list is prompt + output. `num_computed_tokens` counts tokens whose keys/values sit
in the KV cache; the scheduler feeds the model `token_ids[num_computed_tokens:]` in chunks, so prefill,
chunked prefill, decode and recompute-after-preemption are one mechanism.
"""

from __future__ import annotations

import enum
import time
from typing import Any

from parley.local_engine.config import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Mutable per-request state, owned by the engine thread once submitted."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        hook: Any = None,
        tenant: str | None = None,
        deadline: float | None = None,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.hook = hook
        self.tenant = tenant
        self.deadline = deadline  # absolute time.monotonic() value, or None
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # hash chain of this sequence's full blocks, grown lazily
        self.num_computed_tokens = 0
        self.num_cached_tokens: int | None = None  # prefix-cache hit at first admission (reported)
        self.num_preemptions = 0
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.generator: Any = None  # the sampler's per-request random stream
        self.logprobs: list[Any] = []
        self.num_emitted = 0  # output tokens already handed to the consumer
        self.error: str | None = None  # set when this request must fail (e.g. its hook raised)
        self.counted_waiting = False  # engine bookkeeping: counts toward the bounded admission queue
        self.draft_state: Any = None  # the speculative drafter's per-request state (speculative.py)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, status={self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
