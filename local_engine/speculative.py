"""Speculative decoding without a draft model: prompt lookup (n-gram) drafts, verified in one forward.

Tool arguments and structured answers repeat their prompt (a JSON object echoing a document's fields, code
quoting the question). For a running sequence the drafter looks for the most recent earlier occurrence of its
last n tokens (n from `max_ngram` down to `min_ngram`) anywhere in prompt + output, and proposes the tokens
that followed it. The scheduler gives the draft the step's leftover token budget (`Scheduler.schedule`): the
sequence's last token and its k drafted tokens run as k + 1 decode rows of one forward (row j attends to the
cache up to position p + j, the drafts' keys and values written in the same step), so the GEMMs read the weights
once for all of them.

Verification (core.py) samples the k + 1 rows in order exactly as plain decoding samples one row per step: the
hook is asked for its mask/forced token, then told the chosen token, the stop rules apply, and the request's own
random stream gives one draw per token. The drafted token j is accepted when the token sampled at row j equals
it; the first mismatch is emitted (it is the real next token) and ends the draft. So:

- greedy requests get exactly the tokens of non-speculative greedy decoding, and sampled requests exactly the
  tokens non-speculative sampling draws from the same seed (same draws in the same order): the distribution is
  preserved because the procedure *is* the non-speculative one, with some forwards merged. (Acceptance of a
  drafted token then happens with probability p(token), the rate of rejection sampling against a point-mass
  draft.) Equality is up to floating-point rounding of the verify forward, which reads the same cache through
  the same decode attention as a batch of sequences would: the engine's batch-invariance level.
- a grammar hook only ever sees accepted tokens; a drafted token its mask forbids cannot be sampled, so the draft
  ends there and the masked sample is emitted; a forced (jump-forward) token that equals the draft continues it.

Rejected drafts leave keys/values in cache slots past the sequence's computed length; those slots belong to the
sequence's own unshared blocks and are overwritten when the positions are computed for real; only blocks whose
every position is accepted are committed to the prefix cache.

Switching itself off: each sequence keeps a moving average of the fraction of drafted tokens accepted; the draft
length follows it (`num_tokens` x acceptance, at least 1), and below `min_acceptance` drafting stops for a pause
that doubles each time (8, 16, ... 256 steps), then tries again, so prose (few long repeats) pays little and a
JSON echo turns speculation back on when it starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.local_engine.config import SPECULATION_METHODS
from parley.local_engine.sequence import Sequence

__all__ = ["SPECULATION_METHODS", "NgramDrafter"]


@dataclass
class _DraftState:
    """Per-sequence drafter state (kept on the `Sequence`)."""

    index: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> end position of its last occurrence
    indexed: int = 0  # n-grams ending before this position are in `index`
    acceptance: float = 0.6  # moving average of accepted / drafted (a neutral start: no evidence either way)
    pause: int = 0  # steps left without drafting
    next_pause: int = 8
    drafted: int = 0
    accepted: int = 0


class NgramDrafter:
    """Prompt-lookup drafts for the scheduler, and the acceptance bookkeeping that switches them off."""

    def __init__(self, num_tokens: int = 4, *, max_ngram: int = 4, min_ngram: int = 2,
                 min_acceptance: float = 0.3, max_pause: int = 256) -> None:
        if num_tokens < 1 or min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError("need num_tokens >= 1 and 1 <= min_ngram <= max_ngram")
        self.num_tokens = num_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.min_acceptance = min_acceptance
        self.max_pause = max_pause
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.verify_steps = 0
        self.paused_sequences = 0  # times a sequence's drafting was switched off for low acceptance

    @staticmethod
    def _state(seq: Sequence) -> _DraftState:
        state = seq.draft_state
        if state is None:
            state = seq.draft_state = _DraftState()
        assert isinstance(state, _DraftState)
        return state

    def _update_index(self, state: _DraftState, tokens: list[int]) -> None:
        """Index every n-gram that ends before the last token (so a lookup finds an *earlier* occurrence)."""
        end = len(tokens) - 1
        for pos in range(state.indexed, end):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if pos + 1 >= n:
                    state.index[tuple(tokens[pos + 1 - n : pos + 1])] = pos
        state.indexed = max(state.indexed, end)

    def propose(self, seq: Sequence, room: int) -> list[int]:
        """Up to `min(num_tokens, room)` drafted tokens to follow `seq.token_ids` (may be empty)."""
        state = self._state(seq)
        if state.pause > 0:
            state.pause -= 1
            return []
        tokens = seq.token_ids
        self._update_index(state, tokens)
        # Draft length follows the acceptance: a long draft where drafts are being accepted (JSON echoing the
        # prompt), a short one where they are not, so a failed verify costs little.
        k = min(max(1, round(self.num_tokens * state.acceptance)), room)
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            pos = state.index.get(tuple(tokens[-n:]))
            if pos is not None:
                return tokens[pos + 1 : pos + 1 + k]
        return []

    def record(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """After verification: `accepted` of `drafted` tokens were right. May pause drafting for `seq`."""
        if drafted <= 0:
            return
        state = self._state(seq)
        self.verify_steps += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        state.drafted += drafted
        state.accepted += accepted
        state.acceptance = 0.7 * state.acceptance + 0.3 * (accepted / drafted)
        if state.acceptance < self.min_acceptance:
            state.pause = state.next_pause
            state.next_pause = min(2 * state.next_pause, self.max_pause)
            state.acceptance = 0.6  # a fresh start after the pause
            self.paused_sequences += 1
        elif accepted == drafted:
            state.next_pause = 8  # doing well: the next switch-off starts short again

    def stats(self) -> dict[str, int | float]:
        rate = self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0
        return {"spec_verify_steps": self.verify_steps, "spec_drafted_tokens": self.drafted_tokens,
                "spec_accepted_tokens": self.accepted_tokens, "spec_acceptance_rate": round(rate, 4),
                "spec_pauses": self.paused_sequences}
