"""The envelope: one message type for every backend.

A `Message` is Harmony-shaped (role, channel, recipient, content type) and carries a list of
*parts* discriminated by `kind`: text, reasoning (with a provider signature or a redacted payload),
tool calls and tool results. Codecs (Harmony, chat templates, Anthropic and OpenAI wire JSON) only
translate envelopes; nothing else in parley depends on a provider's shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from parley.protocol.errors import InvalidArgumentsError, OrphanToolResultError


class Role(str, Enum):
    """Author roles, in Harmony's order of instruction priority."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Channel(str, Enum):
    """Harmony's well-known channels; any other string is allowed too."""

    ANALYSIS = "analysis"
    COMMENTARY = "commentary"
    FINAL = "final"


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Part):
    """Plain text content."""

    kind: Literal["text"] = "text"
    text: str


class ReasoningPart(_Part):
    """Chain of thought; `signature`/`redacted` are opaque provider payloads sent back unchanged."""

    kind: Literal["reasoning"] = "reasoning"
    text: str = ""
    signature: str | None = None
    """Anthropic's thinking signature (or another provider's integrity token)."""
    redacted: str | None = None
    """An encrypted/redacted reasoning payload; `text` is empty when this is set."""
    provider: str | None = None
    """Which provider produced the signature or payload; other providers drop them."""


class ToolCall(_Part):
    """A model's request to run a tool. `arguments` is the JSON text exactly as produced."""

    kind: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_as_json_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return value

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a JSON object, or `InvalidArgumentsError`."""
        try:
            value = json.loads(self.arguments)
        except (ValueError, RecursionError) as exc:
            raise InvalidArgumentsError(f"arguments of tool call {self.id!r} are not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise InvalidArgumentsError(f"arguments of tool call {self.id!r} must be a JSON object")
        return value


class ToolResult(_Part):
    """The outcome of a tool call, addressed by `call_id`."""

    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str
    is_error: bool = False


Part = Annotated[TextPart | ReasoningPart | ToolCall | ToolResult, Field(discriminator="kind")]


class CacheMark(BaseModel):
    """A prompt-cache breakpoint placed after a message (Anthropic `cache_control`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl: Literal["5m", "1h"] = "5m"


class Message(BaseModel):
    """One message of a conversation."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["message"] = "message"
    role: Role
    parts: list[Part] = Field(default_factory=list)
    channel: str | None = None
    recipient: str | None = None
    """Harmony `to=`: e.g. `functions.get_weather` on an assistant call, or the tool on a result."""
    name: str | None = None
    """Author name (Harmony `role:name`, OpenAI `name`)."""
    content_type: str | None = None
    """E.g. `json` for `<|constrain|>json`."""
    cache: CacheMark | None = None

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def system(cls, text: str) -> Message:
        return cls(role=Role.SYSTEM, parts=[TextPart(text=text)])

    @classmethod
    def developer(cls, text: str) -> Message:
        return cls(role=Role.DEVELOPER, parts=[TextPart(text=text)])

    @classmethod
    def user(cls, text: str) -> Message:
        return cls(role=Role.USER, parts=[TextPart(text=text)])

    @classmethod
    def assistant(
        cls,
        text: str | None = None,
        *,
        channel: str | None = None,
        reasoning: str | None = None,
        tool_calls: Iterable[ToolCall] = (),
    ) -> Message:
        parts: list[Part] = []
        if reasoning is not None:
            parts.append(ReasoningPart(text=reasoning))
        if text is not None:
            parts.append(TextPart(text=text))
        parts.extend(tool_calls)
        return cls(role=Role.ASSISTANT, parts=parts, channel=channel)

    @classmethod
    def tool(cls, call_id: str, name: str, content: str, *, is_error: bool = False) -> Message:
        result = ToolResult(call_id=call_id, name=name, content=content, is_error=is_error)
        return cls(role=Role.TOOL, parts=[result], name=name)

    # -- views ----------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """The concatenated text parts (reasoning excluded)."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def reasoning(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, ReasoningPart))

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [p for p in self.parts if isinstance(p, ToolResult)]


class Conversation(BaseModel):
    """An ordered list of messages with a JSON round trip."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["conversation"] = "conversation"
    messages: list[Message] = Field(default_factory=list)

    def __iter__(self) -> Iterator[Message]:  # type: ignore[override]
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def append(self, message: Message) -> None:
        self.messages.append(message)

    def to_json(self) -> str:
        return self.model_dump_json(exclude_defaults=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> Conversation:
        return cls.model_validate_json(text)

    def check_tool_pairing(self) -> None:
        """Raise `OrphanToolResultError` if a tool result answers no earlier call."""
        called: set[str] = set()
        for message in self.messages:
            called.update(call.id for call in message.tool_calls)
            for result in message.tool_results:
                if result.call_id not in called:
                    raise OrphanToolResultError(
                        f"tool result for call id {result.call_id!r} ({result.name}) has no matching tool call"
                    )
