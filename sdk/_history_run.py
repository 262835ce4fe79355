"""Shaping the history of each model request: compaction, then the history processors.

The run loop calls `shape_history(loop, request)` right after building a request, when the agent
has processors or compaction (`Agent(history_processors=..., compaction=...)`). The request's
conversation is split into the instructions (sent first, never processed) and the conversation
proper; compaction (`parley.compaction`) may replace its oldest turns by a summary; then each
processor runs on a copy, and its output is checked (`check_output`: a call never without its
result, the open batch whole) and normalised before the next one sees it. The stored history is
never touched. See `parley.history` for the rules users rely on.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from parley._run_history import NOT_RUN, normalise_history, recorded_for
from parley.compaction import Compaction, compact, compacted, still_valid
from parley.context_window import TokenCounter, context_window
from parley.errors import ConfigurationError, HistoryProcessorError
from parley.history import HistoryContext, HistoryProcessor, open_batch_ids
from parley.protocol import Conversation, Message, Role, ToolResult

if TYPE_CHECKING:
    from parley._run_loop import RunLoop
    from parley.backends.base import ModelRequest


def history_options(
    processors: Sequence[HistoryProcessor], compaction: Compaction | None
) -> tuple[tuple[HistoryProcessor, ...], Compaction | None]:
    """Check `Agent(history_processors=..., compaction=...)` when the agent is made."""
    if callable(processors):
        processors = [processors]
    out = tuple(processors)
    for processor in out:
        if not callable(processor):
            raise ConfigurationError(f"history_processors holds {processor!r}, which is not callable")
        takes_context(processor)  # fails now on a shape it cannot be called with
    if compaction is not None and not isinstance(compaction, Compaction):
        raise ConfigurationError(f"compaction must be a parley.compaction.Compaction, not {type(compaction).__name__}")
    return out, compaction


def processor_name(processor: Any) -> str:
    name = getattr(processor, "name", None)
    if isinstance(name, str):
        return name
    return str(getattr(processor, "__qualname__", None) or getattr(processor, "__name__", None)
               or type(processor).__name__)


def takes_context(processor: Any) -> bool:
    """``fn(ctx, messages)`` (two positional parameters) or ``fn(messages)`` (one)."""
    try:
        signature = inspect.signature(processor)
    except (TypeError, ValueError):
        return False
    params = [p for p in signature.parameters.values()
              if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is inspect.Parameter.empty]
    if len(required) > 2 or any(
        p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
        for p in signature.parameters.values()
    ):
        raise ConfigurationError(
            f"history processor {processor_name(processor)} must take (messages) or (ctx, messages), not {signature}"
        )
    if len(required) == 2 or (not required and len(params) >= 2):
        return True
    if len(required) == 1 or params or any(
        p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values()
    ):
        return False
    raise ConfigurationError(
        f"history processor {processor_name(processor)} must take (messages) or (ctx, messages), not {signature}"
    )


async def shape_history(loop: RunLoop, request: ModelRequest) -> ModelRequest:
    """`request` with its conversation compacted and processed (the stored history is not changed)."""
    agent = loop.agent
    messages = request.conversation.messages
    size = len(loop.history) + len(loop.state.messages)
    head, body = list(messages[: len(messages) - size]), list(messages[len(messages) - size :])
    counter = TokenCounter(agent.backend, reasoning=request.reasoning)
    compaction: Compaction | None = agent.compaction
    window = context_window(agent.backend, compaction.window if compaction is not None else None)
    native = compaction.native_request(agent.backend, window) if compaction is not None else None
    if native is not None:  # the provider compacts: a summary this run wrote earlier still applies
        request = dataclasses.replace(request, native_compaction=native)
        record = loop.state.compaction
        body = compacted(record, body) if record is not None and still_valid(record, body) else body
    elif compaction is not None:
        body = await compact(loop, compaction, head, body, request, counter, window)
    if agent.history_processors:
        ctx: HistoryContext[Any] = HistoryContext(loop, request, head=head, counter=counter, window=window)
        body = await run_processors(agent.history_processors, body, ctx)
    return dataclasses.replace(request, conversation=Conversation(messages=[*head, *body]))


async def run_processors(
    processors: Sequence[HistoryProcessor], messages: list[Message], ctx: HistoryContext[Any]
) -> list[Message]:
    current = [m.model_copy(deep=True) for m in messages]  # processors may edit in place: never the stored ones
    for processor in processors:
        name = processor_name(processor)
        given = list(current)
        out = processor(ctx, given) if takes_context(processor) else processor(given)
        if inspect.isawaitable(out):
            out = await out
        current = check_output(name, current, out)
    return current


def check_output(name: str, before: list[Message], out: Any) -> list[Message]:
    """`out` normalised, or `HistoryProcessorError` naming the processor (see `parley.history`)."""
    if not isinstance(out, list | tuple):
        raise HistoryProcessorError(
            f"history processor {name} returned {type(out).__name__}, not a list of Messages", processor=name
        )
    for index, message in enumerate(out):
        if not isinstance(message, Message):
            raise HistoryProcessorError(
                f"history processor {name} returned a {type(message).__name__} at [{index}], not a Message",
                processor=name,
            )
    out = list(out)
    answered_before = {r.call_id for m in before for r in m.tool_results}
    called: dict[str, str] = {}
    orphans: list[ToolResult] = []
    answered: set[str] = set()
    for message in out:
        for call in message.tool_calls:
            called.setdefault(call.id, call.name)
        for result in message.tool_results:
            if result.call_id not in called:
                orphans.append(result)
            answered.add(result.call_id)
    if orphans:
        ids = [r.call_id for r in orphans]
        shown = ", ".join(f"{r.call_id!r} ({r.name})" for r in orphans[:5])
        raise HistoryProcessorError(
            f"history processor {name} returned the result of call(s) {shown} without the call before it: "
            "drop a call and its result together (or use a built-in of parley.history, which cut at turn "
            "boundaries)",
            processor=name, call_ids=ids,
        )
    halves = [cid for cid in called if cid in answered_before and cid not in answered]
    if halves:
        shown = ", ".join(f"{cid!r} ({called[cid]})" for cid in halves[:5])
        raise HistoryProcessorError(
            f"history processor {name} returned call(s) {shown} without their result(s): drop a call and its "
            "result together",
            processor=name, call_ids=halves,
        )
    batch = open_batch_ids(before)
    cut = [cid for cid in batch if cid not in called or cid not in answered]
    if cut:
        raise HistoryProcessorError(
            f"history processor {name} cut the open batch of the current turn (call(s) {cut}): the model has "
            "not seen those results yet, so they are always sent",
            processor=name, call_ids=cut,
        )
    if not any(m.role not in (Role.SYSTEM, Role.DEVELOPER) for m in out):
        raise HistoryProcessorError(
            f"history processor {name} returned no conversation to send (only system/developer messages or none)",
            processor=name,
        )
    repaired, still_open = normalise_history(out)
    if still_open:  # a last call that never had a result (nor before): shown as never run, never executed
        found = recorded_for(still_open, out)
        for call in still_open:
            result = found.get(call.id) or ToolResult(call_id=call.id, name=call.name, content=NOT_RUN, is_error=True)
            repaired.append(Message(role=Role.TOOL, parts=[result], name=result.name))
    return repaired
