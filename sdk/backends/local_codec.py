"""`PromptCodec`: how a local model family's prompts are written and its output read back.

A local turn needs more of a codec than rendering: the ids that end a turn, the tokens a reasoning
budget forces to close the reasoning block, the text after which an answer grammar starts, the
text that opens a tool call (where an `auto` tool grammar starts), and how a call is spelt as
plain text when tools are off. Each rule has one home here, per family, instead of one copy per
caller. `codec_for(tokenizer)` picks the family from the tokenizer's chat template.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from parley.constrained.hook import THINK_END, TOOL_CALL_OPEN, Trigger
from parley.constrained.specs import ToolCallFormat
from parley.protocol import Conversation, Event, ToolCall, ToolSpec
from parley.protocol.chat_template import THINK_END as THINK_END_TEXT
from parley.protocol.chat_template import TOOL_CALL_CLOSE, ChatTemplateCodec
from parley.protocol.chat_template import TOOL_CALL_OPEN as TOOL_CALL_OPEN_TEXT


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

    @property
    def reasoning_close_ids(self) -> tuple[int, ...]:
        """The tokens a spent reasoning budget forces (they close the reasoning block)."""
        ...

    @property
    def reasoning_close_text(self) -> str:
        """Text whose appearance means the model closed its reasoning itself."""
        ...

    @property
    def answer_trigger(self) -> Trigger:
        """After reasoning: where an answer or tool-call grammar starts."""
        ...

    @property
    def tool_call_trigger(self) -> Trigger:
        """Tools on `auto`: the text that opens a call, from where the call grammar applies."""
        ...

    @property
    def tool_call_format(self) -> ToolCallFormat: ...

    def render(self, conversation: Conversation, tools: Sequence[ToolSpec], *, reasoning: bool) -> list[int]:
        """Prompt ids ending in an open assistant turn (inside an open reasoning block when `reasoning`)."""
        ...

    def parser(self, *, reasoning: bool, call_ids: Callable[[int], str]) -> OutputParser: ...

    def call_as_text(self, call: ToolCall) -> str:
        """A call the model wrote while tools were off, as the text it wrote."""
        ...


class ChatTemplatePrompts:
    """`PromptCodec` over `ChatTemplateCodec` (ChatML convention, or the model's native template)."""

    tool_call_format: ToolCallFormat = "hermes"
    answer_trigger: Trigger = THINK_END
    tool_call_trigger: Trigger = TOOL_CALL_OPEN
    reasoning_close_text: str = THINK_END_TEXT

    def __init__(self, codec: ChatTemplateCodec) -> None:
        self.codec = codec
        self.tokenizer: Any = codec.tokenizer
        self.stop_token_ids = tuple(codec.stop_token_ids())
        # A spent budget forces "\n</think>" only: the layout after it is the model's, so an answer
        # grammar starting right after `</think>` is never fed whitespace it does not allow.
        self.reasoning_close_ids = tuple(self.tokenizer.encode("\n" + THINK_END_TEXT, add_special_tokens=False))

    def render(self, conversation: Conversation, tools: Sequence[ToolSpec], *, reasoning: bool) -> list[int]:
        return list(self.codec.render_ids(conversation, list(tools), open_reasoning=reasoning))

    def parser(self, *, reasoning: bool, call_ids: Callable[[int], str]) -> OutputParser:
        return self.codec.stream_parser(start_in_reasoning=reasoning, call_ids=call_ids)

    def call_as_text(self, call: ToolCall) -> str:
        body = f'{{"name": {json.dumps(call.name)}, "arguments": {call.arguments}}}'
        return f"{TOOL_CALL_OPEN_TEXT}{body}{TOOL_CALL_CLOSE}"


def codec_for(tokenizer: Any) -> PromptCodec:
    """The codec for the model family this tokenizer belongs to."""
    return ChatTemplatePrompts(ChatTemplateCodec.for_tokenizer(tokenizer))
