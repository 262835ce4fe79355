"""Test doubles for the `Backend` protocol: `ScriptedBackend` and `FunctionBackend`.

Agent tests should not need a model. `ScriptedBackend` plays a fixed list of turns (text,
reasoning, tool calls, usage) and fails loudly, with a typed error, when the agent asks for more
turns than were scripted or when a turn's `expect` check rejects the request it was given.
`FunctionBackend` lets a callable decide each turn from the request (useful when the reply depends
on the conversation, e.g. after a resume in another process). Both record every request they
receive in `.requests` so tests can assert on what the model was shown.

    backend = ScriptedBackend([
        ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})]),
        "It is 4 °C in Oslo.",
    ])
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from parley.backends.base import BackendCapabilities, ModelRequest, ModelResponse
from parley.errors import ScriptExhaustedError, ScriptMismatchError
from parley.protocol import (
    Event,
    Message,
    MessageEnd,
    ReasoningDelta,
    ReasoningPart,
    Role,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
    UsageEvent,
)

_call_ids = itertools.count(1)


def call(name: str, arguments: dict[str, Any] | str | None = None, *, id: str | None = None) -> ToolCall:
    """A scripted tool call; the id defaults to a fresh ``call_<n>``."""
    args = arguments if arguments is not None else {}
    text = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"))
    return ToolCall(id=id or f"call_{next(_call_ids)}", name=name, arguments=text)


@dataclass(kw_only=True)
class ScriptedTurn:
    """One model turn: optional reasoning, text and tool calls, and the usage to report.

    `expect(request)` may check the request the agent sent; returning False or raising an
    AssertionError turns into `ScriptMismatchError`. `usage=None` reports a deterministic estimate
    (one token per whitespace-separated word) so usage limits can be tested.
    """

    text: str | None = None
    reasoning: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    usage: Usage | None = None
    finish_reason: str | None = None
    expect: Callable[[ModelRequest], bool | None] | None = None

    def to_response(self, request: ModelRequest, model: str) -> ModelResponse:
        parts: list[Any] = []
        if self.reasoning is not None:
            parts.append(ReasoningPart(text=self.reasoning))
        if self.text is not None:
            parts.append(TextPart(text=self.text))
        parts.extend(self.tool_calls)
        message = Message(role=Role.ASSISTANT, parts=parts)
        usage = self.usage if self.usage is not None else estimate_usage(request, message)
        finish = self.finish_reason or ("tool_calls" if self.tool_calls else "stop")
        return ModelResponse(messages=[message], usage=usage, finish_reason=finish, model=model)


TurnLike = ScriptedTurn | ModelResponse | str
"""A scripted turn; a bare string is a final text answer."""


def estimate_usage(request: ModelRequest, message: Message) -> Usage:
    """One token per word: deterministic, cheap, good enough to exercise token limits."""
    prompt = sum(len(part_text(p).split()) for m in request.conversation for p in m.parts)
    output = sum(len(part_text(p).split()) for p in message.parts)
    reasoning = len(message.reasoning.split())
    return Usage(input_tokens=prompt, output_tokens=output, reasoning_tokens=reasoning, requests=1)


def part_text(part: Any) -> str:
    kind = part.kind
    if kind in ("text", "summary", "reasoning"):
        return str(part.text)
    if kind == "tool_call":
        return f"{part.name} {part.arguments}"
    if kind in ("image", "document"):
        return ""  # media carry no text a script could match
    return str(part.content)


def response_events(response: ModelResponse) -> list[Event]:
    """The stream a real backend would have produced for `response` (deltas, then ends, then usage)."""
    events: list[Event] = []
    index = 0
    for message in response.messages:
        for part in message.parts:
            if isinstance(part, ReasoningPart) and part.text:
                events.append(ReasoningDelta(text=part.text))
            elif isinstance(part, TextPart) and part.text:
                events.append(TextDelta(text=part.text, channel=message.channel))
            elif isinstance(part, ToolCall):
                events.append(ToolCallStart(index=index, id=part.id, name=part.name))
                events.append(ToolCallDelta(index=index, arguments_delta=part.arguments))
                events.append(ToolCallEnd(index=index, call=part))
                index += 1
        events.append(MessageEnd(message=message, finish_reason=response.finish_reason))
    events.append(UsageEvent(usage=response.usage))
    return events


class _TestBackend:
    """What both doubles share: identity, capabilities, request log, streaming from `generate`."""

    def __init__(self, *, name: str, capabilities: BackendCapabilities | None) -> None:
        self._name = name
        self._capabilities = capabilities or BackendCapabilities(reasoning=True)
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._capabilities

    async def generate(self, request: ModelRequest) -> ModelResponse:  # pragma: no cover - overridden
        raise NotImplementedError

    async def stream(self, request: ModelRequest) -> AsyncIterator[Event]:
        response = await self.generate(request)
        for event in response_events(response):
            yield event


def _as_response(turn: TurnLike, request: ModelRequest, model: str, where: str) -> ModelResponse:
    if isinstance(turn, str):
        turn = ScriptedTurn(text=turn)
    if isinstance(turn, ModelResponse):
        return turn
    if isinstance(turn, ScriptedTurn):
        if turn.expect is not None:
            try:
                ok = turn.expect(request)
            except AssertionError as exc:
                raise ScriptMismatchError(f"{where}: the request did not match the expectation: {exc}") from exc
            if ok is False:
                raise ScriptMismatchError(f"{where}: the request did not match the expectation")
        return turn.to_response(request, model)
    raise ScriptMismatchError(
        f"{where}: a turn must be a ScriptedTurn, ModelResponse or str, not {type(turn).__name__}"
    )


class ScriptedBackend(_TestBackend):
    """Plays `turns` in order, one per model request.

    Raises `ScriptExhaustedError` when asked for a turn beyond the script, and
    `ScriptMismatchError` when a turn's `expect` rejects the request. `remaining` says how many
    turns are left (assert it is 0 at the end of a test to catch unused turns).
    """

    def __init__(
        self,
        turns: Iterable[TurnLike],
        *,
        name: str = "scripted",
        capabilities: BackendCapabilities | None = None,
    ) -> None:
        super().__init__(name=name, capabilities=capabilities)
        self._turns: list[TurnLike] = list(turns)
        self._position = 0

    @property
    def remaining(self) -> int:
        return len(self._turns) - self._position

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if self._position >= len(self._turns):
            raise ScriptExhaustedError(
                f"ScriptedBackend {self.name!r} was asked for turn {self._position + 1} "
                f"but the script holds {len(self._turns)} turn(s)"
            )
        turn = self._turns[self._position]
        self._position += 1
        return _as_response(turn, request, self.name, f"scripted turn {self._position}")


TurnFunction = Callable[[ModelRequest], "TurnLike | Awaitable[TurnLike]"]


class FunctionBackend(_TestBackend):
    """A callable decides each turn: ``fn(request) -> ScriptedTurn | ModelResponse | str`` (or awaitable)."""

    def __init__(
        self,
        fn: TurnFunction,
        *,
        name: str = "function",
        capabilities: BackendCapabilities | None = None,
    ) -> None:
        super().__init__(name=name, capabilities=capabilities)
        self._fn = fn
        self.calls = 0

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        self.calls += 1
        turn = self._fn(request)
        if inspect.isawaitable(turn):
            turn = await turn
        return _as_response(turn, request, self.name, f"function turn {self.calls}")
