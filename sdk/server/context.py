"""Request plumbing shared by the endpoints: state, authentication, bounded body reading, error rendering.

`endpoint(dialect)` wraps a route so that every `ApiError` is rendered in that endpoint's
documented shape, and anything unexpected is logged and returned as a 500 in the same shape (never
a bare traceback, never a 500 for something the client sent). It also counts requests by status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from parley.backends.local.engine_port import EnginePort
from parley.backends.local.family import PromptFamily
from parley.server.config import ServerConfig
from parley.server.errors import ApiError, Dialect, ErrorKind, invalid
from parley.server.metrics import Metrics
from parley.server.tenants import api_key_from_headers
from parley.server.validation import parse_json_object

log = logging.getLogger("parley.server")

Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class ServerState:
    """Everything a route needs, stored on `app.state.parley`."""

    engine: EnginePort
    codec: PromptFamily
    config: ServerConfig
    metrics: Metrics
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, name: str) -> None:
        if self.config.serves(name) or name == self.engine.model_id:
            return
        raise ApiError(
            f"the model {name!r} does not exist; this server serves {self.config.model_name!r} (see GET /v1/models)",
            kind=ErrorKind.NOT_FOUND,
            param="model",
            code="model_not_found",
        )


def state_of(request: Request) -> ServerState:
    state: ServerState = request.app.state.parley
    return state


def arrival_of(request: Request) -> float:
    """When the request reached the server (`time.perf_counter()`)."""
    arrival: float = getattr(request.state, "arrival", time.perf_counter())
    return arrival


def tenant_of(request: Request) -> str:
    """Authenticate the caller: its tenant, or a 401 (checked before the body is read)."""
    return state_of(request).config.tenants.tenant_for(api_key_from_headers(request.headers))


def deadline_from(request: Request, body_value: float | None) -> float | None:
    """The request's deadline in seconds from arrival: body field, else `x-parley-deadline-s` header."""
    state = state_of(request)
    value = body_value
    header = request.headers.get("x-parley-deadline-s")
    if value is None and header is not None:
        try:
            value = float(header)
        except ValueError:
            raise invalid(f"header x-parley-deadline-s must be a number of seconds, not {header!r}") from None
        if not 0.0 < value < float("inf"):
            raise invalid(f"header x-parley-deadline-s must be a positive finite number, not {header!r}")
    if value is None:
        return None
    return min(value, state.config.max_deadline_s)


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object: 413 past the size limit (checked before and while reading), 400 if not JSON."""
    limit = state_of(request).config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(f"request body is {declared} bytes; the limit is {limit}", kind=ErrorKind.TOO_LARGE)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(f"request body exceeds the limit of {limit} bytes", kind=ErrorKind.TOO_LARGE)
        chunks.append(chunk)
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype not in ("application/json", "") and not ctype.endswith("+json"):
        raise invalid(f"content-type must be application/json, not {ctype!r}")
    return parse_json_object(b"".join(chunks))


def error_response(error: ApiError, dialect: Dialect) -> JSONResponse:
    return JSONResponse(error.body(dialect), status_code=error.status, headers=error.headers())


def endpoint(dialect: Dialect, name: str) -> Callable[[Handler], Handler]:
    """Render errors in `dialect`'s shape, bound concurrency, and count requests by status."""

    def wrap(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            request.state.arrival = time.perf_counter()  # TTFT and deadlines count from here
            state = state_of(request)
            metrics = state.metrics
            if metrics.in_flight >= state.config.max_concurrent:
                response: Response = error_response(
                    ApiError(
                        f"the server is handling {metrics.in_flight} requests, its limit; retry later",
                        kind=ErrorKind.RATE_LIMIT,
                        code="too_many_requests",
                        retry_after_s=state.config.retry_after_s,
                    ),
                    dialect,
                )
                metrics.inc("requests_refused_total", endpoint=name, reason="concurrency")
            else:
                metrics.request_started()
                lease: _Lease | None = _Lease(metrics)
                try:
                    response = await handler(request)
                    if isinstance(response, StreamingResponse) and lease is not None:
                        _hold_until_streamed(response, lease)
                        lease = None
                except ApiError as exc:
                    response = error_response(exc, dialect)
                    if exc.status in (429, 503):
                        metrics.inc("requests_refused_total", endpoint=name, reason=exc.code or "admission")
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("internal error while serving %s", name)
                    response = error_response(
                        ApiError("internal server error; the request was not completed", kind=ErrorKind.INTERNAL),
                        dialect,
                    )
                finally:
                    if lease is not None:
                        lease.release()
            metrics.inc("requests_total", endpoint=name, status=str(response.status_code))
            return response

        return run

    return wrap


class _Lease:
    """One in-flight slot, released exactly once (by the stream's end or by the response's background task)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.metrics.request_finished()


def _hold_until_streamed(response: StreamingResponse, lease: _Lease) -> None:
    """Keep the slot until the stream ends; the background task also runs when the client went away early."""
    body = response.body_iterator

    async def released() -> AsyncIterator[Any]:
        try:
            async for chunk in body:
                yield chunk
        finally:
            lease.release()

    previous = response.background

    async def after() -> None:
        try:
            if previous is not None:
                await previous()
        finally:
            lease.release()

    response.body_iterator = released()
    response.background = BackgroundTask(after)


async def until_disconnect(request: Request) -> None:
    """Returns when the client goes away (used to cancel non-streaming generations)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_or_cancel_on_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work`, cancelling it if the client disconnects first (so the engine request is aborted)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
        raise ApiError("client disconnected", kind=ErrorKind.INVALID_REQUEST, status=499)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
