"""The `Backend` protocol: what the agent loop needs from any model, local or hosted.

A backend turns a `ModelRequest` (conversation + tools + tool choice + output schema + reasoning
+ cache policy + tenant + sampling) into assistant messages and a normalised `Usage`, either at
once (`generate`) or as a stream of `parley.protocol` events (`stream`), whose last events are
one `MessageEnd` per produced message followed by one `UsageEvent`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from parley.caching import CachePolicy
from parley.protocol import Conversation, Event, Message, ToolSpec, Usage
from parley.reasoning import Reasoning


@dataclass(frozen=True, slots=True)
class NamedToolChoice:
    """Force a call to this tool."""

    name: str


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingSettings:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    """Local engine (and vLLM/SGLang servers); hosted APIs that lack it ignore it."""
    seed: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    """OpenAI's penalties on tokens already in the output, in [-2, 2] (every chat backend but Anthropic's)."""
    repetition_penalty: float | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    """vLLM's extensions (the local engine and vLLM/SGLang servers); hosted APIs that lack them ignore them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NativeCompaction:
    """Ask the provider to compact server-side once the request's input passes `trigger_tokens`
    (Anthropic: the ``compact_20260112`` context-management edit; OpenAI Responses:
    ``context_management`` with ``compact_threshold``). Set by `parley.compaction` when the backend
    has ``capabilities.native_compaction``; a backend without it ignores the field."""

    trigger_tokens: int
    instructions: str | None = None
    """Summarisation instructions, where the provider takes them (Anthropic); None: the provider's own."""


@dataclass(kw_only=True)
class ModelRequest:
    conversation: Conversation
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool | None = None
    """May one turn hold several calls? None: the backend's default (the local engine: one call per turn)."""
    output_schema: dict[str, Any] | None = None
    """JSON Schema the final answer must match (constrained locally, native mode when hosted)."""
    reasoning: Reasoning | None = None
    cache: CachePolicy | None = None
    tenant: str | None = None
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    native_compaction: NativeCompaction | None = None
    """Server-side compaction for this request (see `NativeCompaction`)."""


@dataclass(kw_only=True)
class ModelResponse:
    messages: list[Message]
    """Assistant messages produced by this turn (reasoning, text and tool calls)."""
    usage: Usage
    finish_reason: str = "stop"
    model: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendCapabilities:
    tools: bool = True
    structured_output: bool = True
    reasoning: bool = False
    streaming: bool = True
    prompt_cache: bool = False
    native_compaction: bool = False
    """The provider compacts server-side when asked (`NativeCompaction`), returning an opaque
    compaction part that later requests carry back."""


@runtime_checkable
class Backend(Protocol):
    """Anything the `Agent` can run on."""

    @property
    def name(self) -> str:
        """Identity recorded in a RunState (e.g. ``local:smollm2-135m``, ``anthropic:claude-...``)."""
        ...

    @property
    def capabilities(self) -> BackendCapabilities: ...

    async def generate(self, request: ModelRequest) -> ModelResponse: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[Event]: ...
