"""vLLM's sampling extensions, one set of fields for every generating route.

Clients written against vLLM send `min_tokens`, `ignore_eos`, `repetition_penalty` and `min_p`
beside OpenAI's or Anthropic's own fields (benchmark tools send `ignore_eos` to get exactly
`max_tokens` back). A strict model refuses them as unknown; mixing this model into a route's
request makes them known, bounded as vLLM bounds them, and carried into `SamplingSettings`.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel, ConfigDict, Field

from parley.backends.base import SamplingSettings
from parley.server.validation import FieldRule

__all__ = ["VllmSampling"]


class VllmSampling(BaseModel):
    """The vLLM fields a request may carry (absent = the engine's defaults: all off)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    min_tokens: int | None = Field(default=None, ge=0)
    """End-of-sequence and stop tokens cannot be chosen before this many tokens are out."""
    ignore_eos: bool | None = None
    """Keep generating past the end-of-sequence (and end-of-turn) token, up to the token limit."""
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=100.0)
    """HF's CTRL penalty over the prompt's and the output's tokens (1 = off)."""
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    """Drop tokens less likely than `min_p` times the most likely one (0 = off)."""

    def check_min_tokens(self, limit: int | None, limit_field: str) -> None:
        """vLLM's rule: `min_tokens` may not exceed the request's token limit."""
        if self.min_tokens is not None and limit is not None and self.min_tokens > limit:
            raise FieldRule("min_tokens", f"must be at most {limit_field} ({limit}), got {self.min_tokens}")

    def settings(
        self,
        base: SamplingSettings,
        *,
        frequency_penalty: float | None = None,
        presence_penalty: float | None = None,
    ) -> SamplingSettings:
        """`base` with these fields (and OpenAI's two penalties, where the route has them) filled in."""
        return replace(
            base,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            repetition_penalty=self.repetition_penalty,
            min_p=self.min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
        )
