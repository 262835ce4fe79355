"""Compaction: when a conversation nears the model's context window, summarise its oldest part.

    agent = Agent(backend, compaction=Compaction(at=0.8, keep_last_turns=2))

Before each model request the request's size is counted (`parley.context_window`: exactly with
a local backend's tokenizer, else about four characters per token). When it passes `at` (a
fraction of the model's context window, never an absolute count), the oldest turns are
summarised by a model (`backend`, default the agent's own) and the request is sent as::

    [instructions] [pinned prefix] [summary] [the last `keep_last_turns` turns]

The rules:

* the *pinned prefix* is byte-identical before and after: the agent's instructions, the leading
  system/developer messages, and every message up to the last one carrying a cache breakpoint
  (``Message.cache``), so the provider's prompt cache (Anthropic breakpoints on tools and system)
  and the local engine's prefix cache still hit on it; tool definitions are untouched too;
* the cut falls on a turn boundary (a user message): a tool call and its result are summarised
  together or kept together, and the current turn is never summarised;
* the summary is a `SummaryPart` (a kind of text every codec renders) in a user message right
  after the pinned prefix; it is rebuilt from the same text each request, so later requests
  share the new prefix too;
* the summariser is asked with the same instructions, prefix and tools as the agent's requests
  (``tool_choice="none"``), so its own request reads the cached prefix; its usage is added to the
  run's (it counts against `UsageLimits`, not against `max_turns`);
* compaction is recorded in `RunState.compaction` (`CompactionRecord`: the summary and the range
  of messages it replaces, with a digest of them), and the state is checkpointed at once: a resume,
  in any process, sends the same summary instead of asking for it again. A record whose messages
  changed (the digest no longer matches) is dropped and compaction decided afresh. When the
  conversation grows past `at` again, the old summary and the next turns are summarised together.

**Provider-native compaction** (on by default; ``Compaction(native=False)`` always uses the
summariser above): when the agent's backend compacts
server-side (``backend.capabilities.native_compaction``: `AnthropicBackend` on the models whose
``models.json`` entry says ``compaction``, `OpenAIBackend(api="responses")` on OpenAI), no
summary is asked for here; each request carries `NativeCompaction` with the same threshold, ``at``
of the window in tokens (Anthropic: ``context_management.edits`` ``[{"type": "compact_20260112",
"trigger": {"type": "input_tokens", "value": N}}]`` with the ``compact-2026-01-12`` beta;
OpenAI: ``context_management: [{"type": "compaction", "compact_threshold": N}]``), and a changed
`prompt` goes as Anthropic's ``instructions``. The provider's compaction comes back as a
`CompactionPart` in the assistant message, which is its record (in `RunState.messages` and in
the session, like any part), and is sent back verbatim; the provider ignores what precedes it.
Without the capability (another backend, a model without it, a `FallbackBackend` with any
backend lacking it) the summariser above is used, as if ``native`` were off.

The run's stored history is never changed: `RunState.messages` and `RunResult.messages` keep
every message; only what is sent is compacted. History processors (`parley.history`) run after
compaction, on the compacted conversation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from parley.backends.base import Backend, ModelRequest, NativeCompaction, SamplingSettings
from parley.context_window import TokenCounter
from parley.errors import CompactionError, ConfigurationError
from parley.history import pinned_end, turn_starts
from parley.protocol import Conversation, Message, Role, SummaryPart
from parley.run_state import CompactionRecord

if TYPE_CHECKING:
    from parley._run_loop import RunLoop

DEFAULT_SUMMARY_PROMPT = (
    "Summarise the conversation above so that it can be continued from your summary alone: the user's "
    "goals, requests and constraints; decisions taken; facts learned from tool results (names, numbers, "
    "ids, errors); what is done and what is still open. Write plain notes. Do not call tools."
)
SUMMARY_HEADER = "Summary of the earlier conversation (older messages were compacted):"

__all__ = ["DEFAULT_SUMMARY_PROMPT", "SUMMARY_HEADER", "Compaction", "CompactionRecord", "summary_message"]


@dataclass(frozen=True)
class Compaction:
    """Summarise the oldest turns when a request passes `at` of the context window (module docstring).

    `keep_last_turns`: turns kept verbatim after the summary (the current turn counts).
    `backend`: the model that summarises (None: the agent's own). `window`: the context window in
    tokens when the backend's is unknown (`parley.context_window`). `prompt`: the instruction
    appended to the summariser's request. `max_summary_tokens`: its output cap (None: the backend's default).
    `native`: use the provider's server-side compaction when the agent's backend has it (module docstring);
    False: always summarise here (e.g. to keep the summary in your own history and sessions).
    """

    at: float = 0.8
    keep_last_turns: int = 2
    backend: Backend | None = None
    window: int | None = None
    prompt: str = DEFAULT_SUMMARY_PROMPT
    max_summary_tokens: int | None = None
    native: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.at, bool) or not isinstance(self.at, int | float) or not 0 < self.at <= 1:
            raise ConfigurationError(
                f"Compaction(at=...) is a fraction of the context window in (0, 1], not {self.at!r}"
            )
        for name in ("keep_last_turns", "window", "max_summary_tokens"):
            value = getattr(self, name)
            if value is None and name != "keep_last_turns":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"Compaction({name}=...) must be a positive int, not {value!r}")
        if self.backend is not None and not isinstance(self.backend, Backend):
            raise ConfigurationError(
                f"Compaction(backend=...) must implement parley.backends.Backend, not {type(self.backend).__name__}"
            )
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ConfigurationError("Compaction(prompt=...) must be a non-empty str")
        if not isinstance(self.native, bool):
            raise ConfigurationError(f"Compaction(native=...) must be a bool, not {self.native!r}")

    def native_request(self, backend: Backend, window: int | None) -> NativeCompaction | None:
        """What to ask `backend` for when it compacts server-side (None: use the summariser)."""
        if not self.native or not backend.capabilities.native_compaction:
            return None
        if window is None:
            raise ConfigurationError(
                f"Compaction needs the model's context window, and backend {backend.name!r} has none known "
                "(not in models.json, no max_model_len): pass Compaction(window=...)"
            )
        instructions = None if self.prompt == DEFAULT_SUMMARY_PROMPT else self.prompt
        return NativeCompaction(trigger_tokens=max(1, int(self.at * window)), instructions=instructions)


def summary_message(summary: str) -> Message:
    """The user message that stands in for the summarised messages (the same bytes for the same summary)."""
    return Message(role=Role.USER, parts=[SummaryPart(text=f"{SUMMARY_HEADER}\n\n{summary}")])


def digest(messages: Sequence[Message]) -> str:
    hasher = hashlib.sha256()
    for message in messages:
        hasher.update(message.model_dump_json().encode())
        hasher.update(b"\n")
    return hasher.hexdigest()


def compacted(record: CompactionRecord | None, body: list[Message]) -> list[Message]:
    """`body` as sent under `record` (unchanged without one)."""
    if record is None:
        return body
    return [*body[: record.start], summary_message(record.summary), *body[record.through :]]


def still_valid(record: CompactionRecord, body: list[Message]) -> bool:
    return 0 <= record.start < record.through <= len(body) and digest(body[: record.through]) == record.digest


def plan_cut(body: list[Message], record: CompactionRecord | None, keep_last_turns: int) -> tuple[int, int] | None:
    """(start, through): the messages ``body[start:through]`` to summarise, or None when nothing may be."""
    marks = [i for i, m in enumerate(body) if m.cache is not None]
    if record is not None:
        start, done = record.start, record.through
    else:
        protected = max(pinned_end(body), marks[-1] + 1 if marks else 0)
        first = turn_starts(body, protected)
        if not first:
            return None
        start = done = first[0]
    starts = turn_starts(body, start)
    if len(starts) <= keep_last_turns:
        return None
    through = starts[-keep_last_turns]
    inside = [i for i in marks if done <= i < through]  # a breakpoint is never summarised away
    if inside:
        through = max(s for s in starts if s <= inside[0]) if any(s <= inside[0] for s in starts) else start
    if through <= done:
        return None
    return start, through


async def compact(
    loop: RunLoop,
    compaction: Compaction,
    head: list[Message],
    body: list[Message],
    request: ModelRequest,
    counter: TokenCounter,
    window: int | None,
) -> list[Message]:
    """The conversation to send (after the instructions `head`), compacting first when it is due."""
    state = loop.state
    record = state.compaction
    if record is not None and not still_valid(record, body):
        record = state.compaction = None
    view = compacted(record, body)
    if window is None:
        raise ConfigurationError(
            f"Compaction needs the model's context window, and backend {loop.agent.backend.name!r} has none known "
            "(not in models.json, no max_model_len): pass Compaction(window=...)"
        )
    tokens = counter.count([*head, *view], request.tools)
    if tokens <= compaction.at * window:
        return view
    cut = plan_cut(body, record, compaction.keep_last_turns)
    if cut is None:
        return view
    start, through = cut
    text = await _summarise(loop, compaction, head, body, record, start, through, request)
    state.compaction = record = CompactionRecord(
        summary=text,
        start=start,
        through=through,
        digest=digest(body[:through]),
        turn=state.turn,
        tokens_before=tokens,
        backend=(compaction.backend or loop.agent.backend).name,
        count=(record.count + 1) if record is not None else 1,
    )
    view = compacted(record, body)
    record.tokens_after = counter.count([*head, *view], request.tools)
    await loop.checkpoint()
    return view


async def _summarise(
    loop: RunLoop,
    compaction: Compaction,
    head: list[Message],
    body: list[Message],
    record: CompactionRecord | None,
    start: int,
    through: int,
    request: ModelRequest,
) -> str:
    agent, state = loop.agent, loop.state
    backend = compaction.backend or agent.backend
    earlier = [summary_message(record.summary)] if record is not None else []
    resume = record.through if record is not None else start
    messages = [*head, *body[:start], *earlier, *body[resume:through], Message.user(compaction.prompt)]
    summary_request = ModelRequest(
        conversation=Conversation(messages=messages),
        tools=list(request.tools),
        tool_choice="none",
        cache=request.cache,
        tenant=request.tenant,
        sampling=SamplingSettings(max_tokens=compaction.max_summary_tokens),
    )
    agent.usage_limits.check_before_request(state.usage)
    if loop.tracer is None:
        response = await backend.generate(summary_request)
    else:  # its own chat span: the run's usage is the sum of its chat spans
        response = await loop.tracer.turn(backend, summary_request, None, state, purpose="compaction")
    state.usage = state.usage + response.usage
    agent.usage_limits.check_after_response(state.usage)
    text = "\n".join(m.text for m in response.messages if m.role is Role.ASSISTANT and m.text).strip()
    if not text:
        raise CompactionError(
            f"compaction: the summariser ({backend.name}) gave no text for messages {start}..{through - 1} "
            f"(finish_reason={response.finish_reason!r})"
        )
    return text
