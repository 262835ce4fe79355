"""`HarmonyPrompts`: the `PromptFamily` of gpt-oss (OpenAI's Harmony format) for the one local turn.

Rendering is `parley.protocol.harmony`'s, exactly: `render_conversation_for_completion` of the
request's conversation, its function tools in the developer message, envelope system/developer text
as the developer `# Instructions`, earlier calls as ``to=functions.x`` on ``commentary`` with
``<|constrain|>json``, results as ``functions.x`` tool messages, and analysis dropped by the
reference rules (kept while a turn is still in its tool loop). The system message carries the
reasoning effort: `Reasoning(effort=...)` as ``Reasoning: low|medium|high`` (``minimal`` is
``low``, Harmony's lowest); no effort, or no `Reasoning` at all, is Harmony's default ``medium``
(gpt-oss always reasons: a turn without `Reasoning` has no budget, not no analysis).

The ids are encoded by the engine's own tokenizer (a gpt-oss checkpoint's, or the locally built
`o200k_harmony_tokenizer()`), piece by piece as Harmony does, with every content piece's special
strings kept as plain text, so they equal `parley.protocol.harmony`'s rendering with the o200k
vocabulary. A turn ends at ``<|return|>`` (the final answer) or ``<|call|>`` (a tool call); its
output is read by `harmony.StreamParser`: analysis is reasoning, a ``functions.x`` recipient a tool
call, ``final`` the answer text (a ``commentary`` preamble is not part of the answer). The hooks
are `parley.backends.local.harmony_hooks`.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from parley.backends.local.family import OutputParser, ReasoningArg, TurnHooks, as_reasoning
from parley.backends.local.harmony_tokenizer import HarmonyTokenizer, is_harmony_tokenizer
from parley.constrained.hook import Trigger
from parley.local_engine.tokenizer import Tokenizer
from parley.protocol import Conversation, Event, ToolCall, ToolSpec, harmony
from parley.protocol.errors import CodecConfigError
from parley.protocol.harmony._envelope import recipient_for
from parley.reasoning import Reasoning

if TYPE_CHECKING:
    from parley.backends.base import ModelRequest
    from parley.backends.local.engine_port import EnginePort

__all__ = ["HarmonyPrompts", "harmony_effort", "ordinary_token_bytes"]

FIRST_SPECIAL_ID = harmony.SPECIAL_TOKENS["<|startoftext|>"]
RETURN_ID = harmony.SPECIAL_TOKENS["<|return|>"]
CALL_ID = harmony.SPECIAL_TOKENS["<|call|>"]

_EFFORT: dict[str, harmony.ReasoningEffort] = {"minimal": "low", "low": "low", "medium": "medium", "high": "high"}


def harmony_effort(reasoning: Reasoning | None) -> harmony.ReasoningEffort:
    """The system message's ``Reasoning:`` level for a request's `Reasoning` (see the module docstring)."""
    if reasoning is None or reasoning.effort is None:
        return "medium"
    return _EFFORT[reasoning.effort]


def _unicode_to_byte() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table: dict[int, str] = bytes_to_unicode()  # type: ignore[no-untyped-call]
    return {char: byte for byte, char in table.items()}


def ordinary_token_bytes(tokenizer: HarmonyTokenizer) -> dict[int, bytes]:
    """Each ordinary (non-Harmony-special) id's bytes, read from a byte-level BPE vocabulary."""
    table = _unicode_to_byte()
    out: dict[int, bytes] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id >= FIRST_SPECIAL_ID:  # every Harmony special (and nothing ordinary) lies above
            continue
        try:
            out[int(token_id)] = bytes(table[char] for char in token)
        except KeyError:  # an added token written as plain text
            out[int(token_id)] = token.encode("utf-8")
    return out


_TABLES: weakref.WeakKeyDictionary[HarmonyTokenizer, tuple[dict[int, bytes], dict[bytes, tuple[int, ...]]]]
_TABLES = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def _tables(tokenizer: HarmonyTokenizer) -> tuple[dict[int, bytes], dict[bytes, tuple[int, ...]]]:
    """A tokenizer's id -> bytes and bytes -> ids tables, built once per tokenizer object (~1 s for o200k)."""
    with _TABLES_LOCK:
        hit = _TABLES.get(tokenizer)
        if hit is None:
            token_bytes = ordinary_token_bytes(tokenizer)
            index: dict[bytes, list[int]] = {}
            for token_id, data in token_bytes.items():
                if data:
                    index.setdefault(data, []).append(token_id)
            hit = (token_bytes, {data: tuple(ids) for data, ids in index.items()})
            _TABLES[tokenizer] = hit
        return hit


class _TokenizerBase:
    """The engine tokenizer's ordinary tokens as `harmony.HarmonyEncoding` reads a base vocabulary."""

    name = "tokenizer"

    def __init__(self, tokenizer: Tokenizer, token_bytes: dict[int, bytes]) -> None:
        self._tokenizer = tokenizer
        self._bytes = token_bytes

    def encode_ordinary(self, text: str) -> list[int]:
        # split_special_tokens: a `<|start|>` in the text is characters, never the special token.
        return list(self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def token_bytes(self, token_id: int) -> bytes | None:
        return self._bytes.get(token_id)


class HarmonyOutputParser:
    """`harmony.StreamParser` as a local turn's `OutputParser`; call ids from the turn's factory."""

    def __init__(self, encoding: harmony.HarmonyEncoding, call_ids: Callable[[int], str]) -> None:
        counter = itertools.count()
        self._parser = harmony.StreamParser(
            "assistant", encoding=encoding, call_id_factory=lambda: call_ids(next(counter))
        )

    def feed_tokens(self, token_ids: Iterable[int]) -> list[Event]:
        events: list[Event] = []
        for token_id in token_ids:
            events += self._parser.feed_token(int(token_id))
        return events

    def finish(self, finish_reason: str | None = "stop") -> list[Event]:
        return self._parser.finish()  # the engine does not emit the stop id: the end of input ends the message


class HarmonyPrompts:
    """`PromptFamily` for gpt-oss over `parley.protocol.harmony` (see the module docstring)."""

    stop_token_ids: tuple[int, ...] = (RETURN_ID, CALL_ID)

    def __init__(self, tokenizer: Tokenizer, *, system: harmony.SystemContent | None = None) -> None:
        if not is_harmony_tokenizer(tokenizer):
            raise CodecConfigError(
                "Harmony prompts need an o200k_harmony tokenizer (<|channel|>, <|start|>, <|message|> at their "
                "Harmony ids): the checkpoint's own, or "
                "parley.backends.local.harmony_tokenizer.o200k_harmony_tokenizer()"
            )
        self.tokenizer: HarmonyTokenizer = tokenizer
        self.system = system if system is not None else harmony.SystemContent()
        """The system message's defaults (identity, knowledge cutoff, date); the effort comes per request."""

    @property
    def token_bytes(self) -> dict[int, bytes]:
        """Ordinary id -> bytes (read once per tokenizer; the hooks and the parser share it)."""
        return _tables(self.tokenizer)[0]

    @property
    def ids_by_bytes(self) -> dict[bytes, tuple[int, ...]]:
        """Bytes -> the ordinary ids spelling them (the header masks look prefixes up here)."""
        return _tables(self.tokenizer)[1]

    @cached_property
    def encoding(self) -> harmony.HarmonyEncoding:
        """Harmony's encoding over the engine's tokenizer (ids equal to the o200k vocabulary's)."""
        return harmony.HarmonyEncoding(_TokenizerBase(self.tokenizer, self.token_bytes))

    def system_content(self, reasoning: Reasoning | None) -> harmony.SystemContent:
        from dataclasses import replace

        return replace(self.system, reasoning_effort=harmony_effort(reasoning))

    def rendered(
        self, conversation: Conversation, tools: Sequence[ToolSpec], *, reasoning: ReasoningArg
    ) -> harmony.RenderedPrompt:
        """The prompt as Harmony pieces (what `render` encodes)."""
        system = self.system_content(as_reasoning(reasoning))
        return harmony.render_conversation_for_completion(conversation, system=system, tools=list(tools))

    def render(self, conversation: Conversation, tools: Sequence[ToolSpec], *, reasoning: ReasoningArg) -> list[int]:
        return self.rendered(conversation, tools, reasoning=reasoning).token_ids(self.encoding)

    def parser(self, *, reasoning: bool, call_ids: Callable[[int], str]) -> OutputParser:
        return HarmonyOutputParser(self.encoding, call_ids)

    def call_as_text(self, call: ToolCall) -> str:
        recipient = recipient_for(call.name)
        channel = "commentary" if recipient.startswith("functions.") else "analysis"
        return f"<|channel|>{channel} to={recipient} <|constrain|>json<|message|>{call.arguments}<|call|>"

    def build_hooks(self, request: ModelRequest, engine: EnginePort, *, constrain_auto_tools: bool = True) -> TurnHooks:
        from parley.backends.local.harmony_hooks import harmony_hooks

        return harmony_hooks(request, self, engine, constrain_auto_tools=constrain_auto_tools)

    def answer_triggers(self, *, reasoning: bool) -> tuple[Trigger, ...] | None:
        """None: the answer sits inside channel headers a text grammar cannot see."""
        return None
