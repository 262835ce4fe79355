"""HTTP errors of `parley serve`, rendered in each endpoint's documented shape.

Every failure a client can see is an `ApiError`: a status, a provider-neutral `kind`, a message and
(when one field is to blame) the `param` path naming it. The routes render it as OpenAI's
``{"error": {"message", "type", "param", "code"}}`` or Anthropic's
``{"type": "error", "error": {"type", "message"}}``, so a client's own error classes work unchanged.
Bad input is always a 4xx; only a real fault inside the server is a 500, in the same shape.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Literal

from parley._root import ParleyError
from parley.local_engine.errors import (
    AdmissionError,
    DeadlineUnreachableError,
    InvalidRequestError,
    QueueFullError,
    RequestAborted,
)

Dialect = Literal["openai", "anthropic"]


class ErrorKind(str, Enum):
    """What went wrong, independent of the wire dialect (each maps to one status and two type names)."""

    INVALID_REQUEST = "invalid_request"
    AUTHENTICATION = "authentication"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    RATE_LIMIT = "rate_limit"
    OVERLOADED = "overloaded"
    INTERNAL = "internal"


_STATUS = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.AUTHENTICATION: 401,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.RATE_LIMIT: 429,
    ErrorKind.OVERLOADED: 503,
    ErrorKind.INTERNAL: 500,
}

# OpenAI's `type` strings (openai-python maps statuses to exception classes, the type is informative).
_OPENAI_TYPE = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.AUTHENTICATION: "authentication_error",
    ErrorKind.NOT_FOUND: "invalid_request_error",
    ErrorKind.TOO_LARGE: "invalid_request_error",
    ErrorKind.RATE_LIMIT: "rate_limit_error",
    ErrorKind.OVERLOADED: "server_overloaded",
    ErrorKind.INTERNAL: "server_error",
}

# Anthropic's documented error types (docs: "Errors").
_ANTHROPIC_TYPE = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.AUTHENTICATION: "authentication_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.TOO_LARGE: "request_too_large",
    ErrorKind.RATE_LIMIT: "rate_limit_error",
    ErrorKind.OVERLOADED: "overloaded_error",
    ErrorKind.INTERNAL: "api_error",
}


class ServeError(ParleyError):
    """Base class of `parley.server` errors."""


class ApiError(ServeError):
    """A failure to report to an HTTP client: status, kind, message and the offending field."""

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind = ErrorKind.INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        self.status = status if status is not None else _STATUS[kind]

    def body(self, dialect: Dialect) -> dict[str, Any]:
        """The JSON error object in the endpoint's documented shape."""
        if dialect == "anthropic":
            return {"type": "error", "error": {"type": _ANTHROPIC_TYPE[self.kind], "message": self.message}}
        return {
            "error": {
                "message": self.message,
                "type": _OPENAI_TYPE[self.kind],
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        """`retry-after` (whole seconds, at least 1, as RFC 9110 wants) when the client may come back."""
        if self.retry_after_s is None:
            return {}
        seconds = self.retry_after_s if math.isfinite(self.retry_after_s) else 60.0
        return {"retry-after": str(max(1, math.ceil(seconds)))}

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.kind.value}, {self.message!r}, param={self.param!r})"


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """Shorthand for a 400 naming `param`."""
    return ApiError(message, kind=ErrorKind.INVALID_REQUEST, param=param, code=code)


EngineRefusal = AdmissionError | RequestAborted | InvalidRequestError
"""The engine errors that are answers to the client, not faults of the server."""


def engine_error(exc: EngineRefusal) -> ApiError:
    """The HTTP answer to an engine refusal, chosen by the error's type (never by its message).

    A full queue is a 429 and an unreachable deadline a 503, both with `retry-after`; any other
    admission refusal a 503; a request dropped mid-way (past its deadline, aborted) a 503; an
    invalid prompt or sampling setting a 400.
    """
    if isinstance(exc, AdmissionError):
        kind, code = ErrorKind.OVERLOADED, None
        if isinstance(exc, QueueFullError):
            kind, code = ErrorKind.RATE_LIMIT, "queue_full"
        elif isinstance(exc, DeadlineUnreachableError):
            code = "deadline_unreachable"
        retry = exc.retry_after_s if exc.retry_after_s is not None else 1.0
        return ApiError(f"request refused at admission: {exc}", kind=kind, code=code, retry_after_s=retry)
    if isinstance(exc, RequestAborted):
        return ApiError(f"request dropped: {exc}", kind=ErrorKind.OVERLOADED, retry_after_s=1.0)
    return invalid(str(exc))
