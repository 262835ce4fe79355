"""`Reasoning`: one reasoning setting, mapped per backend.

`effort` is a provider-neutral level; `budget_tokens` a hard cap on reasoning tokens. The local
backend enforces the budget with a hook that forces the end-of-reasoning tokens; hosted adapters
map both to their provider's fields (and say which setting the chosen model rejects).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
