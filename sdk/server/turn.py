"""A local turn as an HTTP request: the shared `LocalTurn`, with failures in the endpoint's terms.

The routes decode a wire request into a `WireTurn` (a `ModelRequest`, the server-only extras, and
which wire parameter set each request field); `ServerTurn` runs it as the SDK would and turns
every failure into an `ApiError`: what the request got wrong is a 400 naming the client's own
parameter (``response_format.json_schema.schema``, ``max_completion_tokens``...); the engine's
refusals are mapped by their type (`parley.server.errors.engine_error`): a refusal at admission a
429 (`QueueFullError`) or 503 (`DeadlineUnreachableError`) with `retry-after`, a drop mid-way a 503.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from parley.backends.base import ModelRequest
from parley.backends.errors import LocalRequestError
from parley.backends.local.turn import LocalTurn, LogprobChunk, TurnEnd, TurnItem, TurnOptions
from parley.constrained import BackendUnavailableError, Choice, Grammar, Regex
from parley.local_engine.errors import AdmissionError, InvalidRequestError, RequestAborted
from parley.protocol import ProtocolError
from parley.server.context import ServerState
from parley.server.errors import ApiError, ErrorKind, engine_error, invalid

__all__ = ["LogprobChunk", "ServerTurn", "TurnEnd", "WireTurn", "rendering_error"]


@dataclass(frozen=True, kw_only=True)
class WireTurn:
    """A decoded wire request: the turn to run and how to name its fields back to the client."""

    request: ModelRequest
    logprobs: int | None = None
    deadline_s: float | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    """`ModelRequest` field (as `LocalRequestError.field` names it) -> the wire parameter that set it."""
    constraint: Regex | Grammar | Choice | None = None
    """A regex, choice or grammar constraint on the answer (`TurnOptions.constraint`)."""


def rendering_error(exc: ProtocolError) -> ApiError:
    """A conversation the codec cannot render: the client's 400, on the field the error names."""
    return invalid(str(exc), param=getattr(exc, "param", None) or "messages")


class ServerTurn:
    """`LocalTurn` for a route: `await start()`, `async for item in events()`, `close()` always."""

    def __init__(self, state: ServerState, wire: WireTurn, *, arrival: float | None = None) -> None:
        self.wire = wire
        self.logprobs = wire.logprobs
        options = TurnOptions(
            deadline_s=wire.deadline_s,
            arrival=arrival if arrival is not None else time.perf_counter(),
            logprobs=wire.logprobs,
            default_max_tokens=state.config.default_max_tokens,
            default_temperature=1.0,  # the wire formats' default
            constrain_auto_tools=state.config.constrain_auto_tool_calls,
            constraint=wire.constraint,
        )
        try:
            self.turn = LocalTurn(state.engine, state.codec, wire.request, options)
        except LocalRequestError as exc:
            param = wire.params.get(exc.field, exc.field)
            message = str(exc)
            if message.startswith(exc.field):
                message = param + message[len(exc.field) :]
            raise invalid(message, param=param, code=exc.code) from None
        except ProtocolError as exc:
            raise rendering_error(exc) from None
        except InvalidRequestError as exc:
            raise engine_error(exc) from None
        except BackendUnavailableError as exc:  # our installation's fault, not the client's
            raise ApiError(f"structured output is unavailable: {exc}", kind=ErrorKind.INTERNAL) from None
        self.request_id = self.turn.request_id

    @property
    def prompt_tokens(self) -> int:
        return self.turn.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        return self.turn.cached_tokens

    async def start(self) -> None:
        """Submit and wait for the engine's first answer; refusals become 429/503 with `retry-after`."""
        try:
            await self.turn.start()
        except (AdmissionError, RequestAborted, InvalidRequestError) as exc:
            raise engine_error(exc) from None

    async def events(self) -> AsyncIterator[TurnItem]:
        try:
            async for item in self.turn.events():
                yield item
        except RequestAborted as exc:
            raise engine_error(exc) from None

    async def close(self) -> None:
        await self.turn.close()
