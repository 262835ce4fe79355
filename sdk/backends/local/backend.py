"""`LocalBackend`: the agent loop over parley's own engine, with constrained tools and answers.

Each request is one `LocalTurn` (`parley.backends.local.turn`, the code `parley serve` runs too):
the model's prompt family (`parley.backends.local.family`) renders the conversation (content can
never produce special tokens), the family's hook policy constrains tool calls and typed answers and
enforces the reasoning budget, the engine streams, and the family's parser turns tokens back into
events. The tenant becomes the engine's cache salt (prefix-cache blocks are never shared across
tenants); `Usage.cache_read_tokens` is the engine's cached prompt tokens, `input_tokens` the rest.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from parley.backends.base import BackendCapabilities, ModelRequest, ModelResponse
from parley.backends.local.codec import codec_for
from parley.backends.local.engine_port import EnginePort
from parley.backends.local.family import PromptFamily
from parley.backends.local.turn import LocalTurn, LogprobChunk, TurnEnd, TurnOptions
from parley.errors import ConfigurationError
from parley.protocol import Event, Message, MessageEnd, Usage, UsageEvent
from parley.reasoning import ReasoningBudgetHook

if TYPE_CHECKING:
    from parley.local_engine import Engine, EngineConfig

DEFAULT_MAX_TOKENS = 512
_ENGINES: dict[tuple[object, ...], Engine] = {}
_ENGINES_LOCK = threading.Lock()


def shared_engine(
    model: str | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    quantization: str | None = "auto",
    engine_config: EngineConfig | None = None,
) -> Engine:
    """One engine per (model, device, dtype, quantization, config) per process: loading weights is the slow part.

    `quantization="auto"` (the default, as in `Engine.from_pretrained`) runs what was measured fastest within
    1 % of the model's quality (`parley.local_engine.auto_mode`); None runs the dtype unquantised."""
    key = (model, device, dtype, quantization, engine_config)
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            from parley.local_engine import Engine

            engine = Engine.from_pretrained(model, device=device, dtype=dtype, config=engine_config,
                                            quantization="none" if quantization is None else quantization)
            _ENGINES[key] = engine
        return engine


class LocalBackend:
    """A `Backend` over `parley.local_engine` (default: the embedded SmolLM2-135M-Instruct).

    `engine` may be any `EnginePort` (e.g. `parley.local_engine.testing.FakeEngine` in tests);
    `codec` defaults to the one the model's family needs (`parley.backends.local.codec.codec_for`).
    `quantization` ("auto", the default; None for the dtype unquantised; "q4", "q8", "int8") and
    `engine_config` (an `EngineConfig`: threads, speculation, compile, KV pool...) shape the engine this
    backend loads; engines are shared per process by those settings (`shared_engine`).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        engine: EnginePort | None = None,
        device: str | None = None,
        dtype: str | None = None,
        codec: PromptFamily | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        quantization: str | None = "auto",
        engine_config: EngineConfig | None = None,
    ) -> None:
        if engine is not None and (model is not None or engine_config is not None or quantization != "auto"):
            raise ConfigurationError(
                "pass either engine or the settings LocalBackend loads one with (model, quantization, "
                "engine_config), not both"
            )
        self._model = model
        self._device = device
        self._dtype = dtype
        self._quantization = quantization
        self._engine_config = engine_config
        self._engine = engine
        self._codec = codec
        self.max_tokens = max_tokens
        self.last_reasoning_hook: ReasoningBudgetHook | None = None
        """The reasoning hook of the latest request (tests and diagnostics read its counters)."""

    # -- identity -------------------------------------------------------------------------------
    @property
    def engine(self) -> EnginePort:
        if self._engine is None:
            self._engine = shared_engine(self._model, device=self._device, dtype=self._dtype,
                                         quantization=self._quantization, engine_config=self._engine_config)
        return self._engine

    @property
    def codec(self) -> PromptFamily:
        if self._codec is None:
            self._codec = codec_for(self.engine.tokenizer)
        return self._codec

    @property
    def name(self) -> str:
        return f"local:{self.engine.model_id}"

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            tools=True, structured_output=True, reasoning=True, streaming=True, prompt_cache=True
        )

    # -- generation ------------------------------------------------------------------------------
    async def generate(self, request: ModelRequest) -> ModelResponse:
        messages: list[Message] = []
        usage = Usage()
        finish = "stop"
        async for event in self.stream(request):
            if isinstance(event, MessageEnd):
                messages.append(event.message)
                finish = event.finish_reason or finish
            elif isinstance(event, UsageEvent):
                usage = usage + event.usage
        return ModelResponse(messages=messages, usage=usage, finish_reason=finish, model=self.name)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Event]:
        turn = LocalTurn(self.engine, self.codec, request, TurnOptions(default_max_tokens=self.max_tokens))
        self.last_reasoning_hook = turn.hooks.reasoning
        try:
            async for item in turn.events():
                if isinstance(item, TurnEnd):
                    yield MessageEnd(message=item.message, finish_reason=item.finish_reason)
                    yield UsageEvent(usage=item.usage())
                elif not isinstance(item, LogprobChunk):
                    yield item
        finally:
            await turn.close()
