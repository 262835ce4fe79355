"""`Reasoning`: one reasoning setting, mapped per backend.

`effort` is a provider-neutral level; `budget_tokens` a hard cap on reasoning tokens. The local
backend enforces the budget with a hook that forces the end-of-reasoning tokens; hosted adapters
map both to their provider's fields (and say which setting the chosen model rejects).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from parley.protocol.chat_template import THINK_END

Effort = Literal["minimal", "low", "medium", "high"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Reasoning:
    effort: Effort | None = None
    budget_tokens: int | None = None
    """At most this many reasoning tokens (local backend: exactly this many, then forced end)."""

    def __post_init__(self) -> None:
        from parley.errors import ConfigurationError

        if self.effort is not None and self.effort not in ("minimal", "low", "medium", "high"):
            raise ConfigurationError(f"Reasoning.effort must be minimal, low, medium or high, not {self.effort!r}")
        if self.budget_tokens is not None and (
            isinstance(self.budget_tokens, bool) or not isinstance(self.budget_tokens, int) or self.budget_tokens < 0
        ):
            raise ConfigurationError(f"Reasoning.budget_tokens must be a non-negative int, not {self.budget_tokens!r}")


DEFAULT_BUDGETS: dict[str, int] = {"minimal": 32, "low": 128, "medium": 512, "high": 2048}
"""Local backend: reasoning tokens allowed per effort level when no `budget_tokens` is given."""


def local_budget(reasoning: Reasoning) -> int:
    """The token budget the local backend enforces for `reasoning`."""
    if reasoning.budget_tokens is not None:
        return reasoning.budget_tokens
    return DEFAULT_BUDGETS[reasoning.effort or "medium"]


class ReasoningBudgetHook:
    """Engine hook: at most `budget` reasoning tokens, then the end-of-reasoning tokens are forced.

    Generation starts inside the reasoning block (the prompt ends with ``<think>``). Every sampled
    token counts as reasoning until the model closes the block itself or the budget is spent; at
    exactly `budget` tokens the hook forces `end_token_ids` (``\\n</think>\\n\\n`` for ChatML
    models) one per step. While reasoning, `stop_token_ids` are masked out: ending the turn inside
    an open reasoning block would leave no answer, so a budget of N means exactly N reasoning
    tokens unless the model ends its reasoning earlier. `reasoning_tokens` excludes the end tokens.

    A natural end is seen when the decoded tail of the reasoning (needs `decode`) contains
    `end_text`; the tokens spelling the marker are then not counted as reasoning.
    """

    def __init__(
        self,
        budget: int,
        end_token_ids: list[int],
        *,
        stop_token_ids: tuple[int, ...] | list[int] = (),
        decode: Callable[[list[int]], str] | None = None,
        end_text: str = THINK_END,
    ) -> None:
        if budget < 0:
            raise ValueError("budget must be >= 0")
        if not end_token_ids:
            raise ValueError("end_token_ids must not be empty")
        self.budget = budget
        self.end_token_ids = list(end_token_ids)
        self.stop_token_ids = tuple(stop_token_ids)
        self.decode = decode
        self.end_text = end_text
        self.reasoning_tokens = 0
        self.phase = "reasoning"
        """``reasoning`` -> ``forcing`` -> ``done``."""
        self.forced_by_budget = False
        self._forced = 0
        self._tail: list[int] = []

    def forced_token(self) -> int | None:
        if self.phase == "reasoning" and self.reasoning_tokens >= self.budget:
            self.phase = "forcing"
            self.forced_by_budget = True
        if self.phase == "forcing":
            return self.end_token_ids[self._forced]
        return None

    def fill_bitmask(self, row: Any) -> bool:
        if self.phase != "reasoning" or not self.stop_token_ids:
            return False
        for token in self.stop_token_ids:
            word, bit = divmod(token, 32)
            if word < row.shape[0]:
                clear = ~(1 << bit) & 0xFFFFFFFF
                row[word] &= clear - 2**32 if clear >= 2**31 else clear  # int32 words are signed
        return True

    def accept_token(self, token_id: int) -> None:
        if self.phase == "forcing":
            self._forced += 1
            if self._forced >= len(self.end_token_ids):
                self.phase = "done"
            return
        if self.phase != "reasoning":
            return
        self.reasoning_tokens += 1
        if self.decode is None:
            return
        self._tail = [*self._tail[-15:], token_id]
        text = self.decode(self._tail)
        if self.end_text in text:
            marker = 0
            while marker < len(self._tail) and self.end_text in self.decode(self._tail[marker + 1 :]):
                marker += 1
            self.reasoning_tokens -= len(self._tail) - marker
            self.phase = "done"

    def is_terminated(self) -> bool:
        return False
