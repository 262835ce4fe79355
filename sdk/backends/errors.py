"""Errors of the hosted backends: every remote failure becomes one typed `ModelAPIError`.

    ModelAPIError                (status_code, request_id, retryable, retry_after, provider, body)
    ├── BadRequestError          400/404/413/422: the request itself is wrong; never retried
    ├── AuthenticationError      401/403
    ├── RateLimitError           429 (honours retry-after)
    ├── OverloadedError          529 (Anthropic), 503
    ├── ServerError              other 5xx
    ├── APIConnectionError       no HTTP answer (refused, timeout); status_code None
    ├── StreamError              the stream broke after it started
    │   ├── StreamInterruptedError   connection cut mid-way (usage lost)
    │   └── MalformedStreamError     an event that is not valid JSON / not the provider's shape
    └── AllBackendsFailed        every backend of a `FallbackBackend` failed; `errors` holds each one's

`ReasoningSettingError` (a `ConfigurationError`) says which reasoning setting a model rejects;
`LocalRequestError` (also one) which field of a request the local engine cannot run as asked.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from parley.errors import ConfigurationError, ParleyError


class ModelAPIError(ParleyError):
    """A hosted model API failed; `retryable` says whether the same request may succeed later."""

    default_retryable = False

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        request_id: str | None = None,
        retryable: bool | None = None,
        retry_after: float | None = None,
        provider: str = "",
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.request_id = request_id
        self.retryable = self.default_retryable if retryable is None else retryable
        self.retry_after = retry_after
        self.provider = provider
        self.body = body

    def __str__(self) -> str:
        extra = [f"status {self.status_code}"] if self.status_code is not None else []
        if self.request_id:
            extra.append(f"request id {self.request_id}")
        base = super().__str__()
        return f"{base} ({', '.join(extra)})" if extra else base


class BadRequestError(ModelAPIError):
    """The provider rejected the request as invalid (fix the request; retrying will not help)."""


class AuthenticationError(ModelAPIError):
    """Missing or invalid API key, or no permission for this model."""


class RateLimitError(ModelAPIError):
    default_retryable = True


class OverloadedError(ModelAPIError):
    default_retryable = True


class ServerError(ModelAPIError):
    default_retryable = True


class APIConnectionError(ModelAPIError):
    default_retryable = True


class StreamError(ModelAPIError):
    """The stream started but did not finish properly."""


class StreamInterruptedError(StreamError):
    default_retryable = True


class MalformedStreamError(StreamError):
    """A streamed event could not be understood."""


class AllBackendsFailed(ModelAPIError):
    """Every backend of a `FallbackBackend` failed with an error it may fall through on.

    `errors` lists ``(backend name, exception)`` in the order tried; the last one is also the
    ``__cause__``. `retryable` is true only when every failure was retryable (the same request may
    succeed later), `retry_after` is the shortest wait any of them asked for, and `status_code` is
    the last failure's.
    """

    def __init__(self, message: str, *, errors: list[tuple[str, BaseException]]) -> None:
        api_errors = [exc for _, exc in errors if isinstance(exc, ModelAPIError)]
        waits = [exc.retry_after for exc in api_errors if exc.retry_after is not None]
        last = errors[-1][1] if errors else None
        super().__init__(
            message,
            status_code=last.status_code if isinstance(last, ModelAPIError) else None,
            retryable=bool(errors) and len(api_errors) == len(errors) and all(e.retryable for e in api_errors),
            retry_after=min(waits) if waits else None,
            provider="fallback",
        )
        self.errors = list(errors)


class ReasoningSettingError(ConfigurationError):
    """A reasoning (thinking) setting that the chosen model or provider rejects; the message names it."""


class LocalRequestError(ConfigurationError):
    """A request the local engine cannot run as asked: an invalid or unenforceable schema, a prompt
    past the context, a named tool that is not offered. `field` names the `ModelRequest` field
    (``output_schema``, ``tools[2].parameters``, ``conversation``, ``max_tokens``, ``tool_choice``)
    and `code` says why (``invalid_schema``, ``context_length_exceeded``, ``unknown_tool``), so the
    server can answer a 400 naming its own parameter."""

    def __init__(self, message: str, *, field: str, code: str) -> None:
        super().__init__(message)
        self.field = field
        self.code = code


T = TypeVar("T")
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return max(0.0, parsed.timestamp() - time.time())


def error_from_status(
    status: int,
    body: Any,
    headers: Mapping[str, str],
    *,
    provider: str,
    request_id_header: str = "request-id",
) -> ModelAPIError:
    """The typed error for an HTTP error answer, with the provider's message and request id."""
    lowered = {k.lower(): v for k, v in headers.items()}
    request_id = lowered.get(request_id_header) or lowered.get("x-request-id") or lowered.get("request-id")
    detail = _message_of(body)
    retry_after = parse_retry_after(headers)
    cls: type[ModelAPIError]
    if status == 429:
        cls = RateLimitError
    elif status in (529, 503) or "overloaded" in detail.lower():
        cls = OverloadedError
    elif status in (401, 403):
        cls = AuthenticationError
    elif status >= 500 or status in (408, 409):
        cls = ServerError
    else:
        cls = BadRequestError
    message = f"{provider} API error {status}: {detail}" if detail else f"{provider} API error {status}"
    return cls(message, status_code=status, request_id=request_id, retry_after=retry_after, provider=provider,
               body=body, retryable=status in RETRYABLE_STATUS or cls.default_retryable)


def _message_of(body: Any) -> str:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            kind, text = error.get("type"), error.get("message")
            return f"{kind}: {text}" if kind and text else str(text or kind or error)
        if isinstance(error, str):
            return error
        if "message" in body:
            return str(body["message"])
    if isinstance(body, (str, bytes)):
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return text[:500]
    return ""


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    max_retries: int,
    base_delay: float,
    max_delay: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Run `call`, retrying retryable `ModelAPIError`s with exponential backoff (or ``retry-after``)."""
    attempt = 0
    while True:
        try:
            return await call()
        except ModelAPIError as exc:
            if not exc.retryable or attempt >= max_retries:
                raise
            if exc.retry_after is not None:
                delay = exc.retry_after
            else:
                delay = base_delay * (2**attempt) * (0.5 + random.random() / 2)
            await sleep(min(delay, max_delay))
            attempt += 1
