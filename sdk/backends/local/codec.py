"""`PromptCodec`: how a local model family's prompts are written and its output read back.

A local turn needs more of a codec than rendering: the ids that end a turn, how its output is
parsed into events, how a call is spelt as plain text when tools are off, and the hooks that
constrain a turn (the grammar, from where it starts, the reasoning budget). Each rule has one home
here, per family, instead of one copy per caller. `codec_for(tokenizer)` picks the family:

* **Harmony** (gpt-oss: an `o200k_harmony` tokenizer, or ``model_type="gpt_oss"``):
  `parley.backends.local.harmony.HarmonyPrompts`;
* otherwise the tokenizer's chat template (`ChatTemplatePrompts`: the ChatML convention, or the
  model's own template when it renders tools, e.g. Qwen3's hermes ``<tool_call>``s, with its
  ``enable_thinking`` switch set from the request's reasoning), with the text-marker hook policy of
  `parley.backends.local.hooks.marker_hooks`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from parley.constrained.hook import THINK_END, TOOL_CALL_OPEN, Trigger
from parley.constrained.specs import ToolCallFormat
from parley.protocol import Conversation, Event, ToolCall, ToolSpec
from parley.protocol.chat_template import THINK_END as THINK_END_TEXT
from parley.protocol.chat_template import TOOL_CALL_CLOSE, ChatTemplateCodec
from parley.protocol.chat_template import TOOL_CALL_OPEN as TOOL_CALL_OPEN_TEXT
from parley.reasoning import Reasoning

if TYPE_CHECKING:
    from parley.backends.base import ModelRequest
    from parley.backends.local.engine_port import EnginePort
    from parley.backends.local.hooks import TurnHooks

ReasoningArg = Reasoning | bool | None
"""What `render` takes: the request's `Reasoning` (None: not asked for); a bool means `Reasoning()` / None."""


def as_reasoning(reasoning: ReasoningArg) -> Reasoning | None:
    if isinstance(reasoning, bool):
        return Reasoning() if reasoning else None
    return reasoning


class OutputParser(Protocol):
    """A fresh incremental parser per completion: token ids in, protocol events out (never raises)."""

    def feed_tokens(self, token_ids: Iterable[int]) -> list[Event]: ...

    def finish(self, finish_reason: str | None = "stop") -> list[Event]: ...


class PromptCodec(Protocol):
    """One model family's prompt format, as a local turn uses it."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn."""
        ...

    def render(self, conversation: Conversation, tools: Sequence[ToolSpec], *, reasoning: ReasoningArg) -> list[int]:
        """Prompt ids ending in an open assistant turn (for ChatML, inside an open reasoning block when reasoning)."""
        ...

    def parser(self, *, reasoning: bool, call_ids: Callable[[int], str]) -> OutputParser: ...

    def call_as_text(self, call: ToolCall) -> str:
        """A call the model wrote while tools were off, as the text it wrote."""
        ...

    def build_hooks(self, request: ModelRequest, engine: EnginePort, *, constrain_auto_tools: bool = True) -> TurnHooks:
        """The engine hooks of a turn: constraint, triggers, reasoning budget (`hooks` states the policy)."""
        ...


class ChatTemplatePrompts:
    """`PromptCodec` over `ChatTemplateCodec` (ChatML convention, or the model's native template).

    Its hooks are the text-marker policy (`hooks.marker_hooks`): the answer grammar starts
    after ``</think>`` when the turn reasons, an `auto` call grammar at ``<tool_call>``.
    """

    tool_call_format: ToolCallFormat = "hermes"
    reasoning_close_text: str = THINK_END_TEXT

    def __init__(self, codec: ChatTemplateCodec) -> None:
        self.codec = codec
        self.tokenizer: Any = codec.tokenizer
        self.stop_token_ids = tuple(codec.stop_token_ids())
        # A spent budget forces "\n</think>" only: the layout after it is the model's, so an answer
        # grammar starting right after `</think>` is never fed whitespace it does not allow.
        self.reasoning_close_ids = tuple(self.tokenizer.encode("\n" + THINK_END_TEXT, add_special_tokens=False))
        template = getattr(self.tokenizer, "chat_template", None)
        self.thinking_switch = codec.style == "native" and isinstance(template, str) and "enable_thinking" in template
        """The model's own template takes `enable_thinking` (Qwen3): it is set from the request's reasoning."""
        self._switched: dict[bool, ChatTemplateCodec] = {}

    def answer_triggers(self, *, reasoning: bool) -> tuple[Trigger, ...]:
        """Where an answer or a forced call grammar starts: after ``</think>`` when reasoning, else at once."""
        return (THINK_END,) if reasoning else ()

    def tool_call_triggers(self) -> tuple[Trigger, ...]:
        """Tools on `auto`: the text that opens a call, from where the call grammar applies."""
        return (TOOL_CALL_OPEN,)

    def render(self, conversation: Conversation, tools: Sequence[ToolSpec], *, reasoning: ReasoningArg) -> list[int]:
        opened = as_reasoning(reasoning) is not None
        return list(self.codec_for(opened).render_ids(conversation, list(tools), open_reasoning=opened))

    def codec_for(self, reasoning: bool) -> ChatTemplateCodec:
        """The codec that renders a turn with (or without) reasoning.

        A template with an ``enable_thinking`` switch (Qwen3) renders with it set: off, the template
        writes its own empty ``<think>\n\n</think>\n\n`` block and the model answers at once; on,
        the prompt ends inside an open ``<think>`` block as for every family.
        """
        if not self.thinking_switch:
            return self.codec
        codec = self._switched.get(reasoning)
        if codec is None:
            view = _TemplateKwargs(self.tokenizer, enable_thinking=reasoning)
            codec = ChatTemplateCodec(
                view, style="native", default_system=self.codec.default_system,
                drop_past_reasoning=self.codec.drop_past_reasoning,
            )
            self._switched[reasoning] = codec
        return codec

    def parser(self, *, reasoning: bool, call_ids: Callable[[int], str]) -> OutputParser:
        return self.codec.stream_parser(start_in_reasoning=reasoning, call_ids=call_ids)

    def call_as_text(self, call: ToolCall) -> str:
        body = f'{{"name": {json.dumps(call.name)}, "arguments": {call.arguments}}}'
        return f"{TOOL_CALL_OPEN_TEXT}{body}{TOOL_CALL_CLOSE}"

    def build_hooks(self, request: ModelRequest, engine: EnginePort, *, constrain_auto_tools: bool = True) -> TurnHooks:
        from parley.backends.local.hooks import marker_hooks

        return marker_hooks(request, self, engine, constrain_auto_tools=constrain_auto_tools)


class _TemplateKwargs:
    """A tokenizer whose `apply_chat_template` always passes `kwargs` (a template switch such as `enable_thinking`)."""

    def __init__(self, tokenizer: Any, **kwargs: Any) -> None:
        self._tokenizer = tokenizer
        self._kwargs = kwargs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self._tokenizer.apply_chat_template(conversation, **{**self._kwargs, **kwargs})


HARMONY_MODEL_TYPES = frozenset({"gpt_oss"})


def codec_for(tokenizer: Any, *, model_type: str | None = None) -> PromptCodec:
    """The codec for the model family this tokenizer (and, when known, the model's `model_type`) belongs to."""
    from parley.backends.local.harmony_tokenizer import is_harmony_tokenizer

    if model_type in HARMONY_MODEL_TYPES or is_harmony_tokenizer(tokenizer):
        from parley.backends.local.harmony import HarmonyPrompts

        return HarmonyPrompts(tokenizer)
    return ChatTemplatePrompts(ChatTemplateCodec.for_tokenizer(tokenizer))
