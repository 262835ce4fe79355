"""`LocalBackend`: the agent loop over parley's own engine, with constrained tools and answers.

One request goes: conversation + tools -> chat-template codec -> token ids (content can never
produce special tokens) -> engine stream with per-request hooks -> codec stream parser -> events.

Hooks, composed:

* **reasoning budget** (when the request asks for reasoning): the prompt opens ``<think>`` and
  `ReasoningBudgetHook` forces ``</think>`` after exactly N reasoning tokens;
* **constraint** (`parley.constrained`):
  - tools offered with ``tool_choice="required"`` or a named tool: a hermes tool-call grammar
    (``<tool_call>{"name": ..., "arguments": <schema-valid>}</tool_call>``) from the first answer
    token (after reasoning, when there is any);
  - ``tool_choice="auto"``: decoding is free until the model writes ``<tool_call>``; from there
    the call is grammar-constrained, so a call the model starts is always well-formed and its
    arguments schema-valid (a small model is not forced to call anything);
  - ``auto`` tools *and* an output schema: each turn is either a tool call or the final answer,
    one grammar for both (`ToolCalls(..., answer_schema=...)`), from the first answer token;
  - no tools (or ``"none"``) and an output schema: the answer is constrained to the schema.

The tenant becomes the engine's cache salt (prefix-cache blocks are never shared across tenants);
`Usage.cache_read_tokens` is the engine's cached prompt tokens, `input_tokens` the rest.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

from parley.backends.base import BackendCapabilities, ModelRequest, ModelResponse, NamedToolChoice
from parley.errors import ConfigurationError
from parley.protocol import Event, Message, MessageEnd, Role, ToolSpec, Usage, UsageEvent
from parley.reasoning import ReasoningBudgetHook, local_budget

DEFAULT_MAX_TOKENS = 512
_ENGINES: dict[tuple[str | None, str | None, str | None], Any] = {}
_ENGINES_LOCK = threading.Lock()


def shared_engine(model: str | None = None, *, device: str | None = None, dtype: str | None = None) -> Any:
    """One engine per (model, device, dtype) per process: loading weights is the slow part."""
    key = (model, device, dtype)
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            from parley.local_engine import Engine

            engine = Engine.from_pretrained(model, device=device, dtype=dtype)
            _ENGINES[key] = engine
        return engine


class LocalBackend:
    """A `Backend` over `parley.local_engine` (default: the embedded SmolLM2-135M-Instruct)."""

    def __init__(
        self,
        model: str | None = None,
        *,
        engine: Any = None,
        device: str | None = None,
        dtype: str | None = None,
        codec: Any = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        if engine is not None and model is not None:
            raise ConfigurationError("pass either model or engine to LocalBackend, not both")
        self._model = model
        self._device = device
        self._dtype = dtype
        self._engine = engine
        self._codec = codec
        self.max_tokens = max_tokens
        self.last_reasoning_hook: ReasoningBudgetHook | None = None
        """The reasoning hook of the latest request (tests and diagnostics read its counters)."""

    # -- identity -------------------------------------------------------------------------------
    @property
    def engine(self) -> Any:
        if self._engine is None:
            self._engine = shared_engine(self._model, device=self._device, dtype=self._dtype)
        return self._engine

    @property
    def codec(self) -> Any:
        if self._codec is None:
            from parley.protocol.chat_template import ChatTemplateCodec

            tokenizer = self.engine.tokenizer
            if self._model is None:
                self._codec = ChatTemplateCodec.for_smollm2(tokenizer)
            else:
                self._codec = ChatTemplateCodec(tokenizer)
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
        from parley.local_engine import ComposedHook, SamplingParams
        from parley.protocol.chat_template import StreamParser

        engine, codec = self.engine, self.codec
        tokenizer = engine.tokenizer
        tools = self._offered_tools(request)
        reasoning = request.reasoning is not None and local_budget(request.reasoning) >= 0
        prompt_ids = codec.render_ids(request.conversation, tools, open_reasoning=reasoning)
        stop_ids = codec.stop_token_ids()

        hooks: list[Any] = []
        reasoning_hook: ReasoningBudgetHook | None = None
        if reasoning and request.reasoning is not None:
            reasoning_hook = ReasoningBudgetHook(
                local_budget(request.reasoning),
                list(tokenizer.encode("\n</think>", add_special_tokens=False)),
                stop_token_ids=stop_ids,
                decode=tokenizer.decode,
            )
            hooks.append(reasoning_hook)
        self.last_reasoning_hook = reasoning_hook
        constraint = self._constraint(request, tools, reasoning, stop_ids)
        if constraint is not None:
            hooks.append(constraint)

        sampling = request.sampling
        params = SamplingParams(
            max_tokens=sampling.max_tokens or self.max_tokens,
            temperature=sampling.temperature if sampling.temperature is not None else 0.0,
            top_p=sampling.top_p if sampling.top_p is not None else 1.0,
            seed=sampling.seed,
            stop_token_ids=tuple(stop_ids),
            stop=sampling.stop,
        )
        prefix = uuid.uuid4().hex[:8]
        parser = StreamParser(tokenizer, start_in_reasoning=reasoning, call_ids=lambda i: f"call_{prefix}_{i}")
        hook: Any = None if not hooks else hooks[0] if len(hooks) == 1 else ComposedHook(hooks)

        produced: list[Message] = []
        output_tokens = 0
        prompt_tokens = len(prompt_ids)
        cached = 0
        finish = "stop"
        async for delta in engine.stream(prompt_ids, params, hooks=hook, tenant=request.tenant):
            output_tokens += len(delta.token_ids)
            for event in parser.feed_tokens(delta.token_ids):
                if _keep(event, produced):
                    yield event
            if delta.finished:
                prompt_tokens, cached = delta.prompt_tokens, delta.cached_tokens
                finish = delta.finish_reason or "stop"
        for event in parser.finish("length" if finish == "length" else "stop"):
            if _keep(event, produced):
                yield event
        if not produced:
            yield MessageEnd(message=Message(role=Role.ASSISTANT, parts=[]), finish_reason=finish)
        reasoning_tokens = reasoning_hook.reasoning_tokens if reasoning_hook is not None else 0
        yield UsageEvent(
            usage=Usage(
                input_tokens=prompt_tokens - cached,
                cache_read_tokens=cached,
                output_tokens=output_tokens,
                reasoning_tokens=reasoning_tokens,
                requests=1,
                cost=Decimal(0),  # local compute has no per-token price; a known zero keeps run totals known
                raw=[
                    {
                        "backend": "local",
                        "prompt_tokens": prompt_tokens,
                        "cached_tokens": cached,
                        "output_tokens": output_tokens,
                        "reasoning_tokens": reasoning_tokens,
                        "finish_reason": finish,
                    }
                ],
            )
        )

    # -- helpers ------------------------------------------------------------------------------------
    @staticmethod
    def _offered_tools(request: ModelRequest) -> list[ToolSpec]:
        """Tools to render: all of them whatever the choice, so the prompt prefix (and its cache) stays stable."""
        if isinstance(request.tool_choice, NamedToolChoice):
            if not any(t.name == request.tool_choice.name for t in request.tools):
                raise ConfigurationError(f"tool_choice names {request.tool_choice.name!r}, which is not offered")
        return list(request.tools)

    def _constraint(self, request: ModelRequest, tools: list[ToolSpec], reasoning: bool, stop_ids: list[int]) -> Any:
        from parley.constrained.compiler import compile
        from parley.constrained.hook import THINK_END, TOOL_CALL_OPEN, ConstraintHook
        from parley.constrained.specs import JsonSchema, ToolCalls

        engine = self.engine
        vocab = getattr(engine, "vocab_size", None)
        choice = request.tool_choice
        triggers: list[Any] = [THINK_END] if reasoning else []
        if tools and choice != "none":
            callable_tools = tools
            if isinstance(choice, NamedToolChoice):
                callable_tools = [t for t in tools if t.name == choice.name]
            answer = request.output_schema if choice == "auto" else None
            spec: Any = ToolCalls(callable_tools, format="hermes", answer_schema=answer)
            if choice == "auto" and answer is None:
                triggers = [TOOL_CALL_OPEN]
        elif request.output_schema is not None:
            spec = JsonSchema(request.output_schema)
        else:
            return None
        matcher = compile(spec, engine.tokenizer, vocab_size=vocab, stop_token_ids=stop_ids)
        return ConstraintHook(matcher, triggers=triggers)


def _keep(event: Event, produced: list[Message]) -> bool:
    """Drop empty non-assistant frames the parser may report; remember produced messages."""
    if isinstance(event, MessageEnd):
        message = event.message
        if message.role is not Role.ASSISTANT or not message.parts:
            return False
        produced.append(message)
    return True
