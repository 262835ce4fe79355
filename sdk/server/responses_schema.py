"""The Responses API request (`POST /v1/responses`), as strict pydantic models.

The envelope is checked here (types, ranges, known fields, cross-field rules); `input` items are
left as JSON for the one Responses decoder (`parley.protocol.openai_responses.decode_input`), which
names a bad item by its index. Fields OpenAI documents but a single local engine cannot honour
(hosted tools, `background`, `conversation`, stored prompts, `truncation: "auto"`) are refused by
name rather than accepted and ignored: a client relying on them would silently get something else.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parley.server.sampling_schema import VllmSampling
from parley.server.validation import FieldRule

__all__ = [
    "FunctionTool",
    "JsonSchemaFormat",
    "NamedFunctionChoice",
    "ReasoningParam",
    "ResponsesRequest",
    "TextParam",
]

MAX_INPUT_ITEMS = 4096
"""More items than any context holds; a longer list is refused before it is decoded."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1)


class TextFormatText(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[TextFormatText | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class TextParam(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    """Accepted for clients that always send it; a local model has no verbosity control."""


class ReasoningParam(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    """Accepted; the reasoning comes back whole as `reasoning_text`, never summarised."""
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None
    """OpenAI pads deltas against side channels; on 127.0.0.1-style deployments there is none to pad."""


class ResponsesRequest(_Strict, VllmSampling):
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=128)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextParam | None = None
    reasoning: ReasoningParam | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    store: bool | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    """OpenAI's cache routing hint; one engine has nothing to route, so it is accepted and unused."""
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    truncation: Literal["disabled"] | None = None
    """Only "disabled": the server never drops input items to make a conversation fit."""
    background: Literal[False] | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)
    thinking_token_budget: int | None = Field(default=None, ge=0)
    """vLLM's reasoning budget (tokens), as on chat completions."""
    deadline_s: float | None = Field(default=None, gt=0.0, le=86400.0)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ResponsesRequest:
        if self.input is None and self.previous_response_id is None:
            raise FieldRule("input", "is required (text or a list of items) unless previous_response_id is given")
        if isinstance(self.input, list) and len(self.input) > MAX_INPUT_ITEMS:
            raise FieldRule("input", f"at most {MAX_INPUT_ITEMS} items, got {len(self.input)}")
        if self.input == "" or (self.input == [] and self.previous_response_id is None):
            raise FieldRule("input", "must not be empty")
        if self.stream_options is not None and not self.stream:
            raise FieldRule("stream_options", "only allowed when stream is true")
        names = [tool.name for tool in self.tools or []]
        if len(names) != len(set(names)):
            raise FieldRule("tools", "function names must be unique")
        if isinstance(self.tool_choice, NamedFunctionChoice) and self.tool_choice.name not in names:
            raise FieldRule("tool_choice", f"names the function {self.tool_choice.name!r}, which is not in tools")
        if self.tool_choice == "required" and not names:
            raise FieldRule("tool_choice", "'required' needs at least one tool in tools")
        forced = self.tool_choice == "required" or isinstance(self.tool_choice, NamedFunctionChoice)
        if forced and self.output_format is not None:
            raise FieldRule("text.format", "cannot be combined with a tool_choice that forces a call")
        for i, entry in enumerate(self.include or []):
            if entry not in _INCLUDABLE:
                raise FieldRule(f"include[{i}]", f"{entry!r} is not available from this server")
        self.check_min_tokens(self.max_output_tokens, "max_output_tokens")
        return self

    @property
    def output_format(self) -> JsonSchemaFormat | JsonObjectFormat | None:
        fmt = self.text.format if self.text is not None else None
        return fmt if isinstance(fmt, JsonSchemaFormat | JsonObjectFormat) else None


_INCLUDABLE = frozenset({"reasoning.encrypted_content", "message.output_text.logprobs"})
"""What `include` may name: encrypted reasoning is not produced (the reasoning is in the clear), and
logprobs are not returned on this route; asking for either is harmless, anything else is refused."""
