"""`AnthropicBackend`: the Messages API through the official ``anthropic`` async client.

The conversation goes through the switching rules (`prepare_history`: other providers'
signatures dropped, ids unique, call/result pairs adjacent), then `parley.protocol.anthropic`
builds the body; the cache planner places ``cache_control`` breakpoints; reasoning maps to
``thinking`` per model (data: ``models.json``):

* ``budget`` models: ``{"type": "enabled", "budget_tokens": b}`` with 1024 <= b < max_tokens
  (unless interleaved thinking); `Reasoning.effort` alone maps to a budget
  (minimal 1024, low 2048, medium 8192, high 16384);
* ``adaptive`` models (Claude 4.7+): ``{"type": "adaptive"}`` + ``output_config.effort``;
  `Reasoning.budget_tokens` is rejected with `ReasoningSettingError`; ``both`` (4.6) prefers
  adaptive for effort and still accepts a budget;
* thinking with a forced tool choice, or with a changed temperature / top_p, is refused before any
  request is sent (the API would answer 400).

Server-side compaction (`NativeCompaction` on the request, set by ``Compaction()``, native by default)
becomes ``context_management: {"edits": [{"type": "compact_20260112", "trigger": {"type":
"input_tokens", "value": N}}]}`` (plus ``instructions`` when given) with the ``compact-2026-01-12``
beta header, on models whose ``models.json`` entry has ``compaction`` (or with
``native_compaction=True``); the response's ``compaction`` block is kept verbatim
(`parley.protocol.anthropic`) and sent back, and the compaction's own usage (``usage.iterations``
entries of type ``compaction``, which the top-level counts leave out) is added to `Usage`.
``pause_after_compaction`` is never set, so a compacting response is a whole turn.

The client's own retries are off: parley retries 429 / 5xx / 529 with backoff, honouring
``retry-after``, and maps every failure to `parley.backends.errors.ModelAPIError`.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator
from typing import Any

from parley.backends.base import BackendCapabilities, ModelRequest, ModelResponse, NamedToolChoice
from parley.backends.errors import (
    APIConnectionError,
    MalformedStreamError,
    ModelAPIError,
    ReasoningSettingError,
    StreamInterruptedError,
    error_from_status,
    retrying,
)
from parley.cache_planner import CachePlan, CachePlanner
from parley.caching import CachePolicy
from parley.errors import ConfigurationError
from parley.pricing import model_info
from parley.protocol import ErrorEvent, Event, UsageEvent
from parley.protocol import anthropic as wire
from parley.protocol._wire_history import prepare_history
from parley.usage import from_anthropic

DEFAULT_MAX_TOKENS = 4096
MIN_BUDGET = 1024
EFFORT_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
ADAPTIVE_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high"}
BETA_INTERLEAVED = "interleaved-thinking-2025-05-14"
BETA_1H_CACHE = "extended-cache-ttl-2025-04-11"
BETA_COMPACTION = "compact-2026-01-12"
COMPACTION_EDIT = "compact_20260112"


class AnthropicBackend:
    """A `Backend` over Anthropic's Messages API (or anything speaking it, via `base_url`)."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        cache: CachePolicy | None = None,
        interleaved_thinking: bool = False,
        parallel_tool_calls: bool = True,
        max_retries: int = 3,
        retry_base_delay: float = 0.5,
        max_retry_delay: float = 60.0,
        timeout: float = 600.0,
        default_headers: dict[str, str] | None = None,
        native_compaction: bool | None = None,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.cache = cache
        self.interleaved_thinking = interleaved_thinking
        self.parallel_tool_calls = parallel_tool_calls
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.max_retry_delay = max_retry_delay
        self._api_key = api_key
        self._base_url = base_url
        self._timeout = timeout
        self._default_headers = default_headers
        self._client: Any = None
        self.info = model_info("anthropic", model)
        self.planner = CachePlanner(min_tokens=int(self.info.get("min_cache_tokens", 1024)))
        self.native_compaction = bool(self.info.get("compaction")) if native_compaction is None else native_compaction
        """Server-side compaction for this model (None at construction: from ``models.json``)."""

    @property
    def name(self) -> str:
        return f"anthropic:{self.model}"

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(reasoning=self.info.get("thinking") != "none", prompt_cache=True,
                                   native_compaction=self.native_compaction)

    @property
    def cache_ledger(self) -> Any:
        return self.planner.ledger

    # -- request building ---------------------------------------------------------------------
    def build_body(self, request: ModelRequest, *, stream: bool = False) -> tuple[dict[str, Any], CachePlan | None,
                                                                                  dict[str, str]]:
        """The request body, the cache plan (None when caching is off) and extra headers."""
        sampling = request.sampling
        max_tokens = sampling.max_tokens
        extra: dict[str, Any] = {}
        thinking, output_config, max_tokens = self._reasoning(request, max_tokens)
        if thinking:
            extra["thinking"] = thinking
        if request.output_schema is not None:
            output_config["format"] = {"type": "json_schema", "schema": request.output_schema}
        if output_config:
            extra["output_config"] = output_config
        if sampling.temperature is not None:
            extra["temperature"] = sampling.temperature
        if sampling.top_p is not None:
            extra["top_p"] = sampling.top_p
        if sampling.top_k is not None:
            extra["top_k"] = sampling.top_k
        if sampling.stop:
            extra["stop_sequences"] = list(sampling.stop)
        native = request.native_compaction if self.native_compaction else None
        if native is not None:
            edit: dict[str, Any] = {"type": COMPACTION_EDIT,
                                    "trigger": {"type": "input_tokens", "value": native.trigger_tokens}}
            if native.instructions is not None:
                edit["instructions"] = native.instructions
            extra["context_management"] = {"edits": [edit]}
        choice = request.tool_choice
        history = prepare_history(request.conversation.messages, provider=wire.PROVIDER)
        body = wire.build_request(
            self.model,
            history,
            request.tools,
            max_tokens=max_tokens,
            tool_choice="auto" if isinstance(choice, NamedToolChoice) else choice,
            tool_name=choice.name if isinstance(choice, NamedToolChoice) else None,
            parallel_tool_calls=self.parallel_tool_calls
            if request.parallel_tool_calls is None
            else request.parallel_tool_calls,
            stream=stream,
            **extra,
        )
        policy = request.cache if request.cache is not None else self.cache
        plan = self.planner.plan(body, policy) if policy is not None and policy.enabled else None
        if plan is None and any("cache_control" in str(m) for m in body["messages"]):
            plan = self.planner.plan(body, None)  # caller marks only: still validated and predicted
        betas = []
        if self.interleaved_thinking and thinking:
            betas.append(BETA_INTERLEAVED)
        if plan is not None and any(bp.ttl == "1h" for bp in plan.breakpoints):
            betas.append(BETA_1H_CACHE)
        if native is not None:
            betas.append(BETA_COMPACTION)
        headers = {"anthropic-beta": ",".join(betas)} if betas else {}
        return body, plan, headers

    def _reasoning(
        self, request: ModelRequest, max_tokens: int | None
    ) -> tuple[dict[str, Any] | None, dict[str, Any], int]:
        reasoning = request.reasoning
        mode = self.info.get("thinking", "budget")
        if reasoning is None or (reasoning.effort is None and not reasoning.budget_tokens):
            return None, {}, max_tokens or self.max_tokens  # budget 0 means no thinking
        where = f"Anthropic model {self.model!r}"
        if mode == "none":
            raise ReasoningSettingError(f"{where} has no extended thinking: drop Reasoning(...) for this model")
        forced = request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice)
        if forced:
            raise ReasoningSettingError(
                f"{where}: thinking may not be enabled when tool_choice forces tool use "
                f"(tool_choice={request.tool_choice!r}); use tool_choice='auto' or no Reasoning"
            )
        temperature = request.sampling.temperature
        if temperature is not None and temperature != 1:
            raise ReasoningSettingError(f"{where}: temperature={temperature} is not allowed with thinking (must be 1)")
        top_p = request.sampling.top_p
        if top_p is not None and not 0.95 <= top_p <= 1:
            raise ReasoningSettingError(f"{where}: top_p={top_p} is not allowed with thinking (0.95..1 only)")
        budget = reasoning.budget_tokens
        if mode == "adaptive" or (mode == "both" and budget is None):
            if budget is not None:
                raise ReasoningSettingError(
                    f"{where} rejects Reasoning.budget_tokens (extended thinking budgets are a legacy feature "
                    "there): use Reasoning(effort=...)"
                )
            effort = ADAPTIVE_EFFORT[reasoning.effort or "high"]
            return {"type": "adaptive"}, {"effort": effort}, max_tokens or self.max_tokens
        if budget is None:
            budget = EFFORT_BUDGETS[reasoning.effort or "medium"]
        if budget < MIN_BUDGET:
            raise ReasoningSettingError(f"{where}: Reasoning.budget_tokens={budget} is below the minimum {MIN_BUDGET}")
        if max_tokens is None:
            max_tokens = budget + self.max_tokens
        if budget >= max_tokens and not self.interleaved_thinking:
            raise ReasoningSettingError(
                f"{where}: Reasoning.budget_tokens={budget} must be below max_tokens={max_tokens} "
                "(or enable interleaved_thinking)"
            )
        return {"type": "enabled", "budget_tokens": budget}, {}, max_tokens

    # -- transport ------------------------------------------------------------------------------
    def _get_client(self) -> Any:
        if self._client is None:
            import anthropic

            key = self._api_key or os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise ConfigurationError("AnthropicBackend needs an API key: pass api_key=... or set ANTHROPIC_API_KEY")
            self._client = anthropic.AsyncAnthropic(
                api_key=key, base_url=self._base_url, max_retries=0, timeout=self._timeout,
                default_headers=self._default_headers,
            )
            self._known = set(inspect.signature(self._client.messages.create).parameters)
        return self._client

    def _split(self, body: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for the client: parameters it knows, the rest in ``extra_body``."""
        known = {k: v for k, v in body.items() if k in self._known}
        unknown = {k: v for k, v in body.items() if k not in self._known}
        if unknown:
            known["extra_body"] = unknown
        return known

    async def _call(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        client = self._get_client()
        try:
            return await client.messages.create(**self._split(body), extra_headers=headers or None)
        except Exception as exc:
            raise _map_error(exc) from exc

    async def _with_retries(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        return await retrying(lambda: self._call(body, headers), max_retries=self.max_retries,
                              base_delay=self.retry_base_delay, max_delay=self.max_retry_delay)

    # -- Backend API ----------------------------------------------------------------------------
    async def generate(self, request: ModelRequest) -> ModelResponse:
        body, plan, headers = self.build_body(request)
        response = await self._with_retries(body, headers)
        try:
            decoded = wire.decode_response(_as_dict(response))
        except Exception as exc:
            raise MalformedStreamError(f"unreadable Anthropic response: {exc}", provider="anthropic") from exc
        usage = from_anthropic(decoded.usage, model=self.model)
        self.planner.record(plan, usage)
        return ModelResponse(messages=[decoded.message], usage=usage, finish_reason=decoded.finish_reason,
                             model=decoded.model or self.model)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Event]:
        body, plan, headers = self.build_body(request, stream=True)
        events = await self._with_retries(body, headers)
        decoder = wire.StreamDecoder()
        failure: ModelAPIError | None = None
        try:
            async for event in events:
                for out in decoder.feed(_as_dict(event)):
                    yield out
        except Exception as exc:
            failure = _map_error(exc, streaming=True)
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                await close()  # also when the consumer stops early: return the connection
        if failure is None and not decoder.done:
            failure = StreamInterruptedError("the Anthropic stream ended before message_stop", provider="anthropic")
        if failure is not None:
            yield ErrorEvent(code=_code(failure), message=str(failure))
            raise failure
        usage = from_anthropic(decoder.usage, model=self.model)
        self.planner.record(plan, usage)
        yield UsageEvent(usage=usage)

    async def count_tokens(self, request: ModelRequest) -> int:
        """``/v1/messages/count_tokens`` for this request (messages, system, tools, thinking)."""
        body, _, headers = self.build_body(request)
        client = self._get_client()
        allowed = set(inspect.signature(client.messages.count_tokens).parameters)
        kwargs = {k: v for k, v in body.items() if k in allowed}
        rest = {k: v for k, v in body.items() if k not in allowed and k not in ("max_tokens", "stream")}
        try:
            result = await client.messages.count_tokens(**kwargs, extra_body=rest or None,
                                                        extra_headers=headers or None)
        except Exception as exc:
            raise _map_error(exc) from exc
        return int(_as_dict(result)["input_tokens"])

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


def _as_dict(obj: Any) -> dict[str, Any]:
    """The client's object as the JSON the API sent. Blocks the (non-beta) client types do not know,
    such as ``compaction``, are parsed into the nearest type with their fields kept as extras:
    dumping them warns about the mismatch, which is silenced here (the fields are all there)."""
    if isinstance(obj, dict):
        return obj
    for method in ("to_dict", "model_dump"):
        if hasattr(obj, method):
            try:
                value = getattr(obj, method)(warnings=False)
            except TypeError:
                value = getattr(obj, method)()
            if isinstance(value, dict):
                return value
    raise TypeError(f"cannot read {type(obj).__name__} as JSON")


def _code(error: ModelAPIError) -> str:
    if isinstance(error, StreamInterruptedError):
        return "stream_interrupted"
    return "malformed_stream" if isinstance(error, MalformedStreamError) else "api_error"


_STREAM_ERROR_STATUS = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500,
                        "invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                        "not_found_error": 404, "request_too_large": 413}


def _map_error(exc: BaseException, *, streaming: bool = False) -> ModelAPIError:
    """The typed parley error for anything the client raised."""
    import anthropic

    if isinstance(exc, ModelAPIError):
        return exc
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        body = exc.body
        if status < 400 and isinstance(body, dict):  # an `error` event inside a 200 stream
            kind = str((body.get("error") or {}).get("type", "api_error"))
            status = _STREAM_ERROR_STATUS.get(kind, 500)
        return error_from_status(status, body, dict(exc.response.headers), provider="anthropic")
    if isinstance(exc, anthropic.APIConnectionError):
        if streaming:
            return StreamInterruptedError(f"Anthropic stream interrupted: {exc}", provider="anthropic")
        return APIConnectionError(f"cannot reach the Anthropic API: {exc}", provider="anthropic")
    if isinstance(exc, ValueError):  # json.JSONDecodeError and pydantic validation errors
        return MalformedStreamError(f"malformed Anthropic stream event: {exc}", provider="anthropic")
    if streaming:
        return StreamInterruptedError(f"Anthropic stream interrupted: {type(exc).__name__}: {exc}",
                                      provider="anthropic")
    return APIConnectionError(f"Anthropic request failed: {type(exc).__name__}: {exc}", provider="anthropic")
