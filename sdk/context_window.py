"""How big a model's context is, and how many tokens a request takes of it.

History trimming (`parley.history.trim_to_budget`) and compaction (`parley.compaction`) take
their thresholds as *fractions of the model's context window*, never as absolute token counts, so
one setting means the same thing on a 2k-token local model and a 200k-token hosted one.

The window (`context_window`), first found wins:

1. an explicit ``window=`` (passed by the caller to the processor or `Compaction`);
2. a ``context_window`` attribute on the backend (any custom backend or test double may set one);
3. the local engine's ``max_model_len`` (`LocalBackend`, whatever engine it drives);
4. ``context_window`` in ``models.json`` for hosted models (`AnthropicBackend`, `OpenAIBackend`);
5. for a `FallbackBackend`, the smallest window of its backends (a request must fit each one).

Token counts (`TokenCounter`): with a local backend, the request is rendered by the model's own
codec and tokenizer, so the count is exact (the prompt the engine would see). Anywhere else the
count is an estimate: about four characters per token over the text, arguments and results, plus
four tokens per message for the role markers, and a flat 1,000 tokens per image or document.
Estimates are for thresholds, not billing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from parley.protocol import (
    Conversation,
    DocumentPart,
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from parley.protocol.errors import ProtocolError
from parley.reasoning import Reasoning

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
MEDIA_TOKENS = 1000


def context_window(backend: Any, window: int | None = None) -> int | None:
    """The backend's context length in tokens (see the module docstring), or None when unknown."""
    if window is not None:
        return window
    own = getattr(backend, "context_window", None)
    if isinstance(own, int) and not isinstance(own, bool):
        return own
    inner = getattr(backend, "backends", None)
    if isinstance(inner, Sequence) and inner and not isinstance(inner, str | bytes):
        windows = [context_window(b) for b in inner]
        known = [w for w in windows if w is not None]
        return min(known) if known else None
    if _is_local(backend):
        limit = getattr(backend.engine, "max_model_len", None)
        if isinstance(limit, int):
            return limit
    info = getattr(backend, "info", None)
    if isinstance(info, dict) and isinstance(info.get("context_window"), int):
        return int(info["context_window"])
    return None


def _is_local(backend: Any) -> bool:
    from parley.backends.local.backend import LocalBackend

    # or anything shaped like one (a wrapper exposing the engine and the codec)
    return isinstance(backend, LocalBackend) or (hasattr(backend, "engine") and hasattr(backend, "codec"))


class TokenCounter:
    """Counts the tokens a request takes: exactly with a local backend's codec, else an estimate.

    `exact` says which (see the module docstring for the estimate).
    """

    def __init__(self, backend: Any, *, reasoning: Reasoning | None = None) -> None:
        self.backend = backend
        self.reasoning = reasoning
        self._codec: Any = None
        if _is_local(backend):
            try:
                self._codec = backend.codec
            except Exception:  # no tokenizer at hand: estimate instead of failing the run
                self._codec = None
        self.exact = self._codec is not None

    def count(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> int:
        """Tokens of a request holding `messages` (instructions included, if they are among them) and `tools`."""
        if self._codec is not None:
            try:
                return len(self._codec.render(Conversation(messages=list(messages)), list(tools),
                                              reasoning=self.reasoning))
            except ProtocolError:  # e.g. an image for a text-only model: the request itself will say so
                pass
        return estimate_tokens(messages, tools)


def estimate_tokens(messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> int:
    """About four characters per token (see the module docstring)."""
    total = sum(estimate_message_tokens(m) for m in messages)
    for spec in tools:
        chars = len(spec.name) + len(spec.description or "") + len(json.dumps(spec.parameters or {}))
        total += _tokens(chars) + MESSAGE_OVERHEAD_TOKENS
    return total


def estimate_message_tokens(message: Message) -> int:
    chars = 0
    media = 0
    for part in message.parts:
        if isinstance(part, TextPart | ReasoningPart):
            chars += len(part.text)
        elif isinstance(part, ToolCall):
            chars += len(part.name) + len(part.arguments)
        elif isinstance(part, ToolResult):
            chars += len(part.name) + len(part.content)
            media += len(part.attachments)
        elif isinstance(part, ImagePart | DocumentPart):
            media += 1
    return _tokens(chars) + MESSAGE_OVERHEAD_TOKENS + media * MEDIA_TOKENS


def _tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)
