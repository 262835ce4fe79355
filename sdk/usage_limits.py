"""`UsageLimits`: caps on what one agent run may spend.

The request cap is checked *before* each model request (so a run never makes the request that
would exceed it); token and cost caps are checked *after* each response, when the provider has
said what it cost, and the tool-call cap before a batch of calls runs. A cap that is hit raises
`UsageLimitExceeded` naming the limit, the value reached and the usage so far. Limits count the
whole run, resumes included (the usage lives in the `RunState`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from parley.errors import ConfigurationError, UsageLimitExceeded
from parley.protocol import Usage


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageLimits:
    request_limit: int | None = 50
    """At most this many model requests."""
    input_tokens_limit: int | None = None
    """Every prompt token, cached or not."""
    output_tokens_limit: int | None = None
    total_tokens_limit: int | None = None
    tool_calls_limit: int | None = None
    cost_limit: Decimal | None = None
    """A run whose cost is unknown (no price for the model) is never stopped by this cap."""

    def __post_init__(self) -> None:
        for name in ("request_limit", "input_tokens_limit", "output_tokens_limit", "total_tokens_limit"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigurationError(f"UsageLimits.{name} must be a non-negative int or None, not {value!r}")
        if self.tool_calls_limit is not None and (
            isinstance(self.tool_calls_limit, bool) or not isinstance(self.tool_calls_limit, int)
        ):
            raise ConfigurationError(
                f"UsageLimits.tool_calls_limit must be an int or None, not {self.tool_calls_limit!r}"
            )
        if self.cost_limit is not None and not isinstance(self.cost_limit, (Decimal, int)):
            raise ConfigurationError("UsageLimits.cost_limit must be a Decimal (money is never a float)")

    def check_before_request(self, usage: Usage) -> None:
        if self.request_limit is not None and usage.requests + 1 > self.request_limit:
            raise UsageLimitExceeded(
                f"the next model request would exceed request_limit={self.request_limit}",
                limit="request_limit",
                value=usage.requests + 1,
                usage=usage,
            )

    def check_after_response(self, usage: Usage) -> None:
        checks = (
            ("input_tokens_limit", self.input_tokens_limit, usage.prompt_tokens),
            ("output_tokens_limit", self.output_tokens_limit, usage.output_tokens),
            ("total_tokens_limit", self.total_tokens_limit, usage.total_tokens),
        )
        for name, limit, value in checks:
            if limit is not None and value > limit:
                raise UsageLimitExceeded(f"{name}={limit} exceeded ({value})", limit=name, value=value, usage=usage)
        if self.cost_limit is not None and usage.cost is not None and usage.cost > self.cost_limit:
            raise UsageLimitExceeded(
                f"cost_limit={self.cost_limit} exceeded ({usage.cost})",
                limit="cost_limit",
                value=usage.cost,
                usage=usage,
            )

    def check_tool_calls(self, tool_calls_so_far: int, usage: Usage) -> None:
        if self.tool_calls_limit is not None and tool_calls_so_far > self.tool_calls_limit:
            raise UsageLimitExceeded(
                f"tool_calls_limit={self.tool_calls_limit} exceeded ({tool_calls_so_far})",
                limit="tool_calls_limit",
                value=tool_calls_so_far,
                usage=usage,
            )
