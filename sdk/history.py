"""History processors: what the model is shown of a long conversation.

    from parley.history import drop_old_tool_results, keep_last_turns, trim_to_budget

    agent = Agent(backend, history_processors=[drop_old_tool_results(keep=4), trim_to_budget(0.5)])

A processor is a function of the conversation, sync or async, that may take the run context
first: ``fn(messages) -> messages`` or ``fn(ctx, messages) -> messages`` (two positional
parameters: the context is a `HistoryContext`, a `RunContext` that also knows the request, the
model's context window and how to count tokens). Before each model request the processors run in
order on the conversation *without the agent's instructions* (those are always sent first,
unchanged); what the last one returns is sent. The run's stored history (`RunState.messages`,
`RunResult.messages`, the session) is never changed, and each run of the processors works on its
own copy, so a processor may edit messages in place.

The rules, checked on every processor's output (PydanticAI's processors can orphan a call and
get a provider 400: pydantic-ai #4728, #4827, #7878; here that is impossible):

* the output goes through the history normaliser (`parley._run_history.normalise_history`):
  results are moved directly after the assistant message that made the calls, in call order;
* a processor may drop a call *together with* its result, never one without the other: a tool
  result whose call is not before it, or a call whose result it dropped, raises
  `HistoryProcessorError` naming the processor and the calls, before anything is sent;
* the open batch of the current turn (the latest calls and their results, which the model has
  not seen yet) is never cut: dropping any of it is a `HistoryProcessorError` too;
* the output is a list of `Message`s holding something besides system/developer messages.

The built-ins repair instead of failing: they cut only at turn boundaries (a turn starts at a
user message; the assistant's calls and the tools' results go with it), and they always keep the
*pinned prefix* (the leading system/developer messages and a compaction summary right after them)
and the current turn:

* `keep_last_turns(n)`: the last n turns (the current one counts);
* `keep_last_messages(n)`: at least the last n messages, from the start of the turn the cut falls in;
* `drop_old_tool_results(keep=3, stub=...)`: every tool result but the newest `keep` (and the open
  batch) has its content replaced by a short stub (attachments dropped), the call stays;
* `trim_to_budget(fraction=0.5, window=None)`: the oldest turns go until the request takes at most
  `fraction` of the model's context window (`parley.context_window`: ``models.json`` for hosted
  models, the engine's ``max_model_len`` locally; counted by the local tokenizer where there is
  one, else at about four characters per token).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from typing_extensions import TypeVar

from parley.context import RunContext
from parley.errors import ConfigurationError
from parley.protocol import Message, Role, SummaryPart, ToolResult

if TYPE_CHECKING:
    from parley._run_loop import RunLoop
    from parley.backends.base import ModelRequest
    from parley.context_window import TokenCounter

DepsT = TypeVar("DepsT", default=Any)

HistoryProcessor = Callable[..., "list[Message] | Awaitable[list[Message]]"]
"""``fn(messages)`` or ``fn(ctx, messages)``, sync or async, returning the messages to send."""

DEFAULT_STUB = "[This tool result was removed to save context.]"

__all__ = [
    "DEFAULT_STUB",
    "HistoryContext",
    "HistoryProcessor",
    "drop_old_tool_results",
    "keep_last_messages",
    "keep_last_turns",
    "open_batch_ids",
    "pinned_end",
    "trim_to_budget",
    "turn_starts",
]


class HistoryContext(RunContext[DepsT]):
    """What a processor taking a context sees: the `RunContext`, plus the request being prepared,
    the model's context window and a token counter for the whole request."""

    __slots__ = ("_request", "_head", "_counter", "_window")

    def __init__(
        self,
        loop: RunLoop,
        request: ModelRequest,
        *,
        head: Sequence[Message],
        counter: TokenCounter,
        window: int | None,
    ) -> None:
        super().__init__(loop)
        self._request = request
        self._head = list(head)
        self._counter = counter
        self._window = window

    @property
    def request(self) -> ModelRequest:
        """The request as built before the processors ran (tools, tool choice, output schema...)."""
        return self._request

    @property
    def instructions(self) -> list[Message]:
        """The messages sent before the conversation (the agent's instructions), never processed."""
        return list(self._head)

    @property
    def backend(self) -> Any:
        """The backend the request goes to."""
        return self._loop.agent.backend

    @property
    def window(self) -> int | None:
        """The model's context window in tokens (None when unknown: see `parley.context_window`)."""
        return self._window

    @property
    def exact_count(self) -> bool:
        """`count_tokens` uses the model's own tokenizer (local backends), not an estimate."""
        return self._counter.exact

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Tokens of the request if it held `messages`: instructions and tool definitions included."""
        return self._counter.count([*self._head, *messages], self._request.tools)


# -- the shape of a conversation ----------------------------------------------------------------
def is_summary(message: Message) -> bool:
    return any(isinstance(p, SummaryPart) for p in message.parts)


def is_turn_start(message: Message) -> bool:
    """A user's own message (not a carrier of tool results, not a compaction summary)."""
    return message.role is Role.USER and not message.tool_results and not is_summary(message)


def pinned_end(messages: Sequence[Message]) -> int:
    """Index after the pinned prefix: the leading system/developer messages and a summary right after."""
    index = 0
    while index < len(messages) and messages[index].role in (Role.SYSTEM, Role.DEVELOPER):
        index += 1
    if index < len(messages) and is_summary(messages[index]):
        index += 1
    return index


def turn_starts(messages: Sequence[Message], start: int = 0) -> list[int]:
    """Indices (from `start`) where a turn begins."""
    return [i for i in range(start, len(messages)) if is_turn_start(messages[i])]


def open_batch_ids(messages: Sequence[Message]) -> list[str]:
    """Call ids of the open batch: the last assistant message's calls, when only their results follow it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role is Role.ASSISTANT and message.tool_calls:
            return [c.id for c in message.tool_calls]
        if message.role is not Role.TOOL:
            return []
    return []


class _Builtin:
    """A built-in processor: a name for error messages and reprs."""

    name = "processor"

    def __repr__(self) -> str:
        return self.name


def _positive(name: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, not {value!r}")
    return value


# -- built-ins ----------------------------------------------------------------------------------
class keep_last_turns(_Builtin):  # noqa: N801 - used like a function
    """Keep the pinned prefix and the last `n` turns (the current turn is one of them)."""

    def __init__(self, n: int) -> None:
        self.n = _positive("keep_last_turns(n)", n)
        self.name = f"keep_last_turns({n})"

    def __call__(self, messages: list[Message]) -> list[Message]:
        head = pinned_end(messages)
        starts = turn_starts(messages, head)
        if len(starts) <= self.n:
            return messages
        return [*messages[:head], *messages[starts[-self.n] :]]


class keep_last_messages(_Builtin):  # noqa: N801
    """Keep the pinned prefix and at least the last `n` messages: the cut moves back to the start of
    the turn it falls in, so no call is parted from its result and the first message kept is a user's."""

    def __init__(self, n: int) -> None:
        self.n = _positive("keep_last_messages(n)", n)
        self.name = f"keep_last_messages({n})"

    def __call__(self, messages: list[Message]) -> list[Message]:
        head = pinned_end(messages)
        cut = max(head, len(messages) - self.n)
        starts = [s for s in turn_starts(messages, head) if s <= cut]
        cut = starts[-1] if starts else head
        return [*messages[:head], *messages[cut:]]


class drop_old_tool_results(_Builtin):  # noqa: N801
    """Replace the content of every tool result but the newest `keep` (and the open batch's) by `stub`.

    `stub` is the text, or a function of the `ToolResult` returning it. The call and the result's
    id, name and error flag stay (the pair is intact; the model sees the call was made).
    """

    def __init__(self, keep: int = 3, stub: str | Callable[[ToolResult], str] = DEFAULT_STUB) -> None:
        self.keep = _positive("drop_old_tool_results(keep=...)", keep, minimum=0)
        if not isinstance(stub, str) and not callable(stub):
            raise ConfigurationError(f"drop_old_tool_results(stub=...) must be a str or a function, not {stub!r}")
        self.stub = stub
        self.name = f"drop_old_tool_results(keep={keep})"

    def __call__(self, messages: list[Message]) -> list[Message]:
        ids = [r.call_id for m in messages for r in m.tool_results]
        kept = set(open_batch_ids(messages)) | set(ids[len(ids) - self.keep :] if self.keep else [])
        out: list[Message] = []
        for message in messages:
            if not any(r.call_id not in kept for r in message.tool_results):
                out.append(message)
                continue
            parts = [self._stubbed(p) if isinstance(p, ToolResult) and p.call_id not in kept else p
                     for p in message.parts]
            out.append(message.model_copy(update={"parts": parts}))
        return out

    def _stubbed(self, result: ToolResult) -> ToolResult:
        text = self.stub(result) if callable(self.stub) else self.stub
        if result.content == text and not result.attachments:
            return result
        return ToolResult(call_id=result.call_id, name=result.name, content=str(text), is_error=result.is_error)


class trim_to_budget(_Builtin):  # noqa: N801
    """Drop the oldest turns until the request takes at most `fraction` of the context window.

    `window` overrides the model's window (needed when it is unknown: a custom backend, a model
    missing from ``models.json``). The pinned prefix and the current turn always stay, even if
    they alone are over the budget.
    """

    def __init__(self, fraction: float = 0.5, window: int | None = None) -> None:
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
            raise ConfigurationError(f"trim_to_budget(fraction=...) must be in (0, 1], not {fraction!r}")
        if window is not None:
            _positive("trim_to_budget(window=...)", window)
        self.fraction = float(fraction)
        self.window = window
        self.name = f"trim_to_budget({fraction})"

    def __call__(self, ctx: HistoryContext[Any], messages: list[Message]) -> list[Message]:
        window = self.window or ctx.window
        if window is None:
            raise ConfigurationError(
                f"{self.name}: the context window of backend {getattr(ctx.backend, 'name', ctx.backend)!r} is "
                "unknown (not in models.json, no max_model_len); pass trim_to_budget(window=...)"
            )
        budget = int(self.fraction * window)
        if ctx.count_tokens(messages) <= budget:
            return messages
        head = pinned_end(messages)
        starts = turn_starts(messages, head)
        if len(starts) <= 1:
            return messages

        def kept(k: int) -> list[Message]:
            return [*messages[:head], *messages[starts[k] :]]

        low, high = 0, len(starts) - 1  # cutting at starts[high] (the current turn alone) is the most we cut
        while low < high:  # the earliest cut that fits (fewer tokens with every later cut)
            middle = (low + high) // 2
            if ctx.count_tokens(kept(middle)) <= budget:
                high = middle
            else:
                low = middle + 1
        return kept(low)
