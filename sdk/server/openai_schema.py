"""The Chat Completions request, as strict pydantic models (OpenAI's documented fields, plus vLLM's).

Strict mode and `extra="forbid"` everywhere: `"5"`, `5.0` and `true` are not token limits, and
`max_token` is an unknown field, not a silent default. Cross-field rules that OpenAI documents
(`top_logprobs` needs `logprobs`, `stream_options` needs `stream`, a named tool choice names an
offered tool) are model validators, so they surface as 400s naming the field like any other.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parley.server.sampling_schema import VllmSampling
from parley.server.validation import FieldRule


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


# -- content parts ---------------------------------------------------------------------------------
class TextContent(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageContent(_Strict):
    """Accepted by the schema so the refusal can say why: the embedded model reads text only."""

    type: Literal["image_url"]
    image_url: ImageUrl


class RefusalContent(_Strict):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[TextContent | ImageContent, Field(discriminator="type")]
AssistantPart = Annotated[TextContent | RefusalContent, Field(discriminator="type")]


# -- messages ----------------------------------------------------------------------------------------
class SystemMessage(_Strict):
    role: Literal["system"]
    content: str | list[TextContent]
    name: str | None = None


class DeveloperMessage(_Strict):
    role: Literal["developer"]
    content: str | list[TextContent]
    name: str | None = None


class UserMessage(_Strict):
    role: Literal["user"]
    content: str | list[UserPart]
    name: str | None = None


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: str


class AssistantToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: str | list[AssistantPart] | None = None
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    """vLLM's field for the model's reasoning, sent back in multi-turn conversations."""
    reasoning: str | None = None

    @model_validator(mode="after")
    def _has_something(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls and self.refusal is None:
            raise ValueError("an assistant message needs content or tool_calls")
        return self


class ToolMessage(_Strict):
    role: Literal["tool"]
    content: str | list[TextContent]
    tool_call_id: str = Field(min_length=1)


ChatMessage = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role"),
]


# -- tools and formats -------------------------------------------------------------------------------
class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoiceParam(_Strict):
    type: Literal["function"]
    function: NamedFunction


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StructuredOutputs(_Strict):
    """vLLM's constraint parameters; exactly one is set. Unknown keys (``structural_tag``, the removed
    ``guided_*`` spellings at the top level) are refused by name rather than silently ignored."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, min_length=1)
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = Field(default=None, min_length=1)

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [name for name in ("json_", "regex", "choice", "grammar") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("set exactly one of json, regex, choice or grammar")
        if self.choice is not None and any(not option for option in self.choice):
            raise FieldRule("choice", "options must be non-empty strings")
        return self


class StreamOptions(_Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


# -- the request -------------------------------------------------------------------------------------
class ChatCompletionRequest(_Strict, VllmSampling):
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1, le=16)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoiceParam | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    user: str | None = None
    safety_identifier: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    """vLLM's per-request prefix-cache salt; combined with the server-side tenant, never replacing it."""
    prompt_cache_key: str | None = None
    """OpenAI's cache routing hint; a single engine has nothing to route, so it is accepted and unused."""
    metadata: dict[str, str] | None = None
    store: bool | None = None
    deadline_s: float | None = Field(default=None, gt=0.0, le=86400.0)
    """parley's extension: finish within this many seconds of arrival or be refused at once."""
    thinking_token_budget: int | None = Field(default=None, ge=0)
    """vLLM's reasoning budget: the model reasons first, and its reasoning ends after at most this many tokens."""
    structured_outputs: StructuredOutputs | None = None
    """vLLM's constraint on the answer: a JSON schema, a regex, one of some strings, or an EBNF grammar."""
    grammar: str | None = Field(default=None, min_length=1)
    """llama.cpp's GBNF grammar for the answer (compiled by xgrammar, whose EBNF dialect is GBNF's)."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ChatCompletionRequest:
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise FieldRule("stop", "at most 4 stop sequences")
        if isinstance(self.stop, list) and any(not s for s in self.stop) or self.stop == "":
            raise FieldRule("stop", "stop sequences must be non-empty strings")
        if self.top_logprobs is not None and self.top_logprobs > 0 and not self.logprobs:
            raise FieldRule("top_logprobs", "requires logprobs to be true")
        if self.stream_options is not None and not self.stream:
            raise FieldRule("stream_options", "only allowed when stream is true")
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise FieldRule("max_tokens", "conflicts with max_completion_tokens; send only max_completion_tokens")
        self.check_min_tokens(self.token_limit, "max_completion_tokens")
        constraints = [name for name in ("response_format", "structured_outputs", "grammar")
                       if getattr(self, name) is not None and not isinstance(getattr(self, name), TextFormat)]
        if len(constraints) > 1:
            raise FieldRule(constraints[1], f"conflicts with {constraints[0]}; send one constraint")
        if isinstance(self.tool_choice, NamedToolChoiceParam):
            offered = {tool.function.name for tool in self.tools or []}
            if self.tool_choice.function.name not in offered:
                raise FieldRule(
                    "tool_choice", f"names the function {self.tool_choice.function.name!r}, which is not in tools"
                )
        if self.tool_choice == "required" and not self.tools:
            raise FieldRule("tool_choice", "'required' needs at least one tool in tools")
        if self.tools is not None:
            names = [tool.function.name for tool in self.tools]
            if len(names) != len(set(names)):
                raise FieldRule("tools", "function names must be unique")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
