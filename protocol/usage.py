"""`Usage`: one normalised token ledger for every backend.

`input_tokens` counts only *uncached* prompt tokens, so that
`input_tokens + cache_read_tokens + cache_write_tokens` is the whole prompt whatever the
provider (Anthropic reports them this way; OpenAI's `prompt_tokens` includes the cached ones and
must be split by the adapter, never added twice). Usages add up across requests.

`cache_read_tokens` is ``None`` when the server said nothing about its cache (vLLM without
``--enable-prompt-tokens-details``, a llama.cpp stream without usage): "no reads" and "not reported"
are different answers, and a sum over requests is unknown as soon as one of them is, like `cost`.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Usage(BaseModel):
    """Token counts (and cost when the price is known) for one or more requests."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: int = 0
    """Prompt tokens neither read from nor written to a cache."""
    cache_read_tokens: int | None = 0
    """Prompt tokens read from a cache; None: the server did not report its cache (unknown, not 0)."""
    cache_write_tokens: int = 0
    """All cache writes; the TTL split (where reported) is in the two fields below."""
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    output_tokens: int = 0
    """Generated tokens, reasoning included."""
    reasoning_tokens: int = 0
    """The part of `output_tokens` spent reasoning."""
    requests: int = 0
    cost: Decimal | None = None
    """Total price; None when any request's price is unknown (never a guess)."""
    raw: list[dict[str, Any]] = Field(default_factory=list)
    """The providers' own usage objects, one per request, kept for audit."""

    @property
    def prompt_tokens(self) -> int:
        """Every prompt token, cached or not."""
        return self.input_tokens + (self.cache_read_tokens or 0) + self.cache_write_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        cost = _sum_or_unknown(self.cost, other.cost, self.requests, other.requests)
        mine, theirs = self.cache_read_tokens, other.cache_read_tokens
        read = None if mine is None or theirs is None else mine + theirs  # only a server's silence gives None
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            cache_read_tokens=read,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cache_write_5m_tokens=self.cache_write_5m_tokens + other.cache_write_5m_tokens,
            cache_write_1h_tokens=self.cache_write_1h_tokens + other.cache_write_1h_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            requests=self.requests + other.requests,
            cost=cost,
            raw=[*self.raw, *other.raw],
        )


def _sum_or_unknown(mine: Decimal | None, theirs: Decimal | None, my_requests: int,
                    their_requests: int) -> Decimal | None:
    """A cost that is unknown once a part with requests behind it is unknown (an empty usage adds nothing)."""
    if my_requests == 0:
        return theirs
    if their_requests == 0:
        return mine
    return None if mine is None or theirs is None else mine + theirs
