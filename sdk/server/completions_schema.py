"""Legacy completions (`POST /v1/completions`) and vLLM's `/tokenize` / `/detokenize`, as strict models.

The prompt is raw text or token ids, sent to the engine as it is (no chat template): what benchmark
and evaluation tools send. `max_tokens` defaults to 16, as OpenAI's completions API does. Fields
that need what the engine does not compute are refused by name: `echo` with `logprobs` (prompt
logprobs), `suffix` (fill-in-the-middle), `best_of` above `n`, `logit_bias`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parley.server.openai_schema import StructuredOutputs
from parley.server.sampling_schema import VllmSampling
from parley.server.validation import FieldRule

__all__ = ["CompletionRequest", "DetokenizeRequest", "StreamOptions", "TokenizeRequest"]

MAX_PROMPTS = 64
"""Prompts one batched request may carry (each becomes `n` engine requests)."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_Strict, VllmSampling):
    model: str = Field(min_length=1)
    prompt: Prompt
    max_tokens: int | None = Field(default=16, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16)
    best_of: int | None = Field(default=None, ge=1, le=16)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = None
    suffix: str | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Any] | None = None
    user: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    deadline_s: float | None = Field(default=None, gt=0.0, le=86400.0)
    structured_outputs: StructuredOutputs | None = None
    """vLLM's constraint on each completion (as on chat completions), applied from the first token."""
    grammar: str | None = Field(default=None, min_length=1)
    """llama.cpp's GBNF grammar for each completion."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> CompletionRequest:
        if self.structured_outputs is not None and self.grammar is not None:
            raise FieldRule("grammar", "conflicts with structured_outputs; send one constraint")
        if self.prompt in ("", []):
            raise FieldRule("prompt", "must not be empty")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str | list):
            if len(self.prompt) > MAX_PROMPTS:
                raise FieldRule("prompt", f"at most {MAX_PROMPTS} prompts in one request, got {len(self.prompt)}")
            for i, one in enumerate(self.prompt):
                if one in ("", []):
                    raise FieldRule(f"prompt[{i}]", "must not be empty")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise FieldRule("stop", "at most 4 stop sequences")
        if self.stop == "" or isinstance(self.stop, list) and any(not s for s in self.stop):
            raise FieldRule("stop", "stop sequences must be non-empty strings")
        if self.stream_options is not None and not self.stream:
            raise FieldRule("stream_options", "only allowed when stream is true")
        if self.echo and self.logprobs is not None:
            raise FieldRule("echo", "echo with logprobs needs prompt logprobs, which this engine does not compute")
        if self.suffix:
            raise FieldRule("suffix", "fill-in-the-middle is not supported by this server")
        if self.best_of is not None and self.best_of != self.n:
            raise FieldRule("best_of", "must equal n: every sampled completion is returned")
        if self.logit_bias:
            raise FieldRule("logit_bias", "is not supported by the local engine")
        self.check_min_tokens(self.max_tokens, "max_tokens")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per entry of a batched `prompt` (a single one otherwise)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and isinstance(prompt[0], int):
            return [[int(t) for t in prompt]]
        return list(prompt)  # type: ignore[arg-type]

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None

    @model_validator(mode="after")
    def _one_of(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise FieldRule("prompt", "send exactly one of prompt (text) or messages (a chat)")
        return self


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)
