"""The prompt codec the server uses: render a `Conversation` to token ids, parse output back to events.

A thin adapter over `parley.protocol.chat_template.ChatTemplateCodec`, so that both endpoints share
one rendering (and one trust boundary: client text can never become a special token). Protocol
errors in a conversation (a tool result without its call, an unknown role) are the client's fault
and become 400s here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from parley.protocol import Conversation, ProtocolError, ToolSpec
from parley.server.errors import invalid

THINK_END = "\n</think>\n\n"


class OutputParser(Protocol):
    def feed_tokens(self, token_ids: Sequence[int]) -> list[Any]: ...

    def finish(self, finish_reason: str | None = "stop") -> list[Any]: ...


class PromptCodec(Protocol):
    """What `Turn` needs: render, a fresh parser per request, stop ids and the reasoning terminator."""

    @property
    def stop_token_ids(self) -> Sequence[int]: ...

    @property
    def think_end_ids(self) -> Sequence[int]: ...

    def render(self, conversation: Conversation, tools: Sequence[ToolSpec], *, thinking: bool) -> list[int]: ...

    def parser(self, *, thinking: bool, request_id: str) -> OutputParser: ...


class ChatTemplatePrompts:
    """`PromptCodec` over the chat-template codec (ChatML convention for SmolLM2, native templates otherwise)."""

    def __init__(self, tokenizer: Any) -> None:
        from parley.protocol.chat_template import ChatTemplateCodec

        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, str) and "SmolLM" in template:
            self.codec = ChatTemplateCodec.for_smollm2(tokenizer)
        else:
            self.codec = ChatTemplateCodec(tokenizer)
        self.tokenizer = tokenizer
        self._stop_ids = list(self.codec.stop_token_ids())
        self._think_end_ids = list(tokenizer.encode(THINK_END, add_special_tokens=False))

    @property
    def stop_token_ids(self) -> Sequence[int]:
        """Ids that end an assistant turn (`<|im_end|>`, EOS)."""
        return self._stop_ids

    @property
    def think_end_ids(self) -> Sequence[int]:
        """The tokens the reasoning budget forces to close `<think>`."""
        return self._think_end_ids

    def render(self, conversation: Conversation, tools: Sequence[ToolSpec], *, thinking: bool) -> list[int]:
        try:
            return list(self.codec.render_ids(conversation, list(tools), open_reasoning=thinking))
        except ProtocolError as exc:
            raise invalid(str(exc), param="messages") from None
        except ValueError as exc:  # e.g. a native template refusing a message layout
            raise invalid(f"the conversation cannot be rendered for this model: {exc}", param="messages") from None

    def parser(self, *, thinking: bool, request_id: str) -> OutputParser:
        parser: OutputParser = self.codec.stream_parser(start_in_reasoning=thinking)
        return parser
