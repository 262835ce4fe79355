"""Errors of `parley.tools`.

Two audiences: the programmer defining tools (`ToolDefinitionError`, raised at decoration time) and
the model calling them (`ToolArgumentError`, `RetryableToolError`), whose messages travel back to the
model as `is_error` tool results — so those messages are short, stable and carry no host detail.

    ToolError
    ├── ToolDefinitionError     a function cannot become a tool (bad signature, contradictory options)
    ├── ToolArgumentError       the model's arguments were rejected (JSON or schema); `code` says why
    └── RetryableToolError      raised by a tool: a transient failure worth retrying (idempotent tools)
"""

from __future__ import annotations

from typing import Literal

from parley._root import ParleyError

ArgumentErrorCode = Literal[
    "too_large",
    "not_json",
    "duplicate_key",
    "non_finite_number",
    "too_deep",
    "not_object",
    "invalid_string",
    "schema",
]


class ToolError(ParleyError):
    """Base class of tool errors."""


class ToolDefinitionError(ToolError):
    """A function cannot be turned into a tool (unsupported parameter, contradictory options, bad name)."""


class ToolArgumentError(ToolError):
    """The arguments of a tool call were rejected before anything ran.

    `code` is a stable machine-readable reason; `str(error)` is a short message safe to show the model
    (it names the offending field and the expectation, never a host path, traceback or secret).
    """

    def __init__(self, message: str, *, code: ArgumentErrorCode, tool: str | None = None) -> None:
        super().__init__(message)
        self.code: ArgumentErrorCode = code
        self.tool = tool


class RetryableToolError(ToolError):
    """Raise from a tool to say "this failure is transient; trying again may succeed".

    The executor retries only idempotent tools, and only on errors that are retryable: this class, or
    any exception whose `retryable` attribute is true (e.g. a `SandboxError` with `retryable=True`).
    `retry_after_s` (optional) asks for at least that long a pause before the next attempt.
    """

    retryable = True

    def __init__(self, message: str = "transient failure", *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def is_retryable(error: BaseException) -> bool:
    """Whether `error` is marked retryable (`RetryableToolError` or a true `retryable` attribute)."""
    return getattr(error, "retryable", False) is True
