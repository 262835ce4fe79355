"""The Anthropic Messages request, as strict pydantic models.

Field facts from the anthropic-sdk types: `max_tokens` is required; content is a string or a list of
blocks discriminated by `type`; `tool_result` blocks answer the `tool_use` blocks of the assistant
message right before them; `thinking.budget_tokens` is at least 1024 and below `max_tokens`;
`cache_control` may sit on any block, tool and system part (accepted: our prefix cache is automatic).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parley.server.sampling_schema import VllmSampling
from parley.server.validation import FieldRule


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None


class ImageSource(_Strict):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(_Strict):
    """Accepted by the schema so the refusal can say why: the embedded model reads text only."""

    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControl | None = None


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, pattern=r"^[a-zA-Z0-9_-]+$")
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: dict[str, Any] | None = None
    toolset_name: str | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None
    toolset_name: str | None = None


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class MessageParam(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(_Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None


class ToolChoiceAuto(_Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Strict):
    type: Literal["tool"]
    name: str = Field(min_length=1)
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingDisabled, Field(discriminator="type")]


class JsonOutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class OutputConfig(_Strict):
    """`format` (json_schema) is enforced by the grammar; `effort` is accepted (the budget sets the length)."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class Metadata(_Strict):
    user_id: str | None = None


class MessagesRequest(_Strict, VllmSampling):
    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    metadata: Metadata | None = None
    cache_control: CacheControl | None = None
    """Top-level automatic caching; our prefix cache is always on, so it is accepted as a no-op."""
    service_tier: Literal["auto", "standard_only"] | None = None
    output_config: OutputConfig | None = None
    deadline_s: float | None = Field(default=None, gt=0.0, le=86400.0)
    """parley's extension: finish within this many seconds of arrival or be refused at once."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> MessagesRequest:
        if self.stop_sequences is not None and any(not s for s in self.stop_sequences):
            raise FieldRule("stop_sequences", "stop sequences must be non-empty strings")
        self.check_min_tokens(self.max_tokens, "max_tokens")
        if isinstance(self.thinking, ThinkingEnabled) and self.thinking.budget_tokens >= self.max_tokens:
            raise FieldRule("thinking.budget_tokens", "must be less than max_tokens")
        if isinstance(self.thinking, ThinkingEnabled) and isinstance(self.tool_choice, ToolChoiceAny | ToolChoiceTool):
            raise FieldRule("tool_choice", "Thinking may not be enabled when tool_choice forces tool use")
        names = [tool.name for tool in self.tools or []]
        if len(names) != len(set(names)):
            raise FieldRule("tools", "tool names must be unique")
        if isinstance(self.tool_choice, ToolChoiceTool) and self.tool_choice.name not in names:
            raise FieldRule("tool_choice.name", f"names the tool {self.tool_choice.name!r}, which is not in tools")
        forced = isinstance(self.tool_choice, ToolChoiceAny | ToolChoiceTool)
        if self.output_config is not None and self.output_config.format is not None and forced:
            raise FieldRule("output_config.format", "cannot be combined with a tool_choice that forces tool use")
        if isinstance(self.tool_choice, ToolChoiceAny) and not names:
            raise FieldRule("tool_choice", "'any' needs at least one tool in tools")
        return self


class CountTokensRequest(_Strict):
    """`POST /v1/messages/count_tokens`: the prompt-shaping fields of a Messages request."""

    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: CacheControl | None = None
