"""`OpenAIBackend`: ``/v1/chat/completions`` over httpx, for OpenAI, vLLM, SGLang and llama.cpp servers.

One backend, four dialects (``flavor``; ``"auto"`` asks the server once: ``api.openai.com`` is
OpenAI, a ``/version`` answer is vLLM, a ``/get_server_info`` answer is SGLang, an OpenAPI title
naming llama.cpp (``llama-cpp-python``'s server) or a ``/props`` answer (llama.cpp's own
``llama-server``) is llama.cpp, anything else is treated as plain OpenAI-compatible):

================  =======================  ===========================  ===================  ======================
setting           openai                   vllm                         sglang               llamacpp
================  =======================  ===========================  ===================  ======================
length limit      max_completion_tokens    max_tokens                   max_tokens           max_tokens
output schema     response_format          structured_outputs.json      response_format      response_format
                  json_schema, strict      (never the removed guided_*) json_schema          json_object + schema
                  (schema made strict)
Reasoning.effort  reasoning_effort         reasoning_effort             reasoning_effort     rejected
Reasoning.budget  rejected (names it)      thinking_token_budget        rejected             rejected
reasoning text    —                        ``reasoning`` field          reasoning_content    reasoning_content
tenant            safety_identifier        cache_salt                   cache_salt           not sent (no field)
schema + tools    both sent                a structural tag (a call or  schema only with     schema only with
                                           the answer) with             tools off            tools off (its
                                           ``tool_call_parser=``; else                       server drops the
                                           schema only with tools off                        tools for the schema)
================  =======================  ===========================  ===================  ======================

llama.cpp, as found against ``llama-cpp-python[server]`` 0.3.36 (the ``llamacpp``-marked
``tests/sdk/backends/test_llamacpp_server.py``): it ignores ``max_completion_tokens`` (a turn ran on
to the context's end); it refuses a ``json_schema`` ``response_format`` (it takes ``{"type":
"json_object", "schema": ...}`` and compiles the schema to a grammar) and an assistant message whose
``content`` is null (a tool-call turn sent back: the llamacpp dialect sends ""); it reports
such request validation errors as HTTP 500, raised here as `BadRequestError` and not retried; it
ignores ``reasoning_effort``; and its streams carry no usage whatever ``stream_options`` says, so a
streamed llama.cpp turn reports zero tokens with ``Usage.raw == [{}]`` and no cost (`generate` has
the counts). Tool calls need a server chat format that has them (``--chat_format
chatml-function-calling``, or ``functionary`` with its own models); ``chatml-function-calling``
cannot stream a turn where the model chooses whether to call a tool (``tool_choice`` auto or
required: the stream closes empty), so `stream` asks for such a llama.cpp turn whole and replays it
as events (with its usage). That format's template HTML-escapes what it renders (``"`` in earlier
tool-call arguments and results reaches the model as ``&#34;``), which a small model may copy.

``CachePolicy.prompt_cache_key`` becomes ``prompt_cache_key``; streams ask for
``stream_options.include_usage`` so usage arrives in the last chunk. Tool-call deltas are assembled
by ``index``. Retries and typed errors as for `AnthropicBackend`. Cache reads are
``prompt_tokens_details.cached_tokens``; a server that sends no such figure (vLLM unless started with
``--enable-prompt-tokens-details``) gives ``Usage.cache_read_tokens=None`` and one logged warning per
backend naming the flag; vLLM's ``created_cache_tokens`` are counted as cache writes.

``api="responses"`` posts to ``/v1/responses`` instead (wire format: `parley.protocol.openai_responses`):
``max_output_tokens``, ``reasoning.effort`` (and ``reasoning.summary`` with ``reasoning_summary=``),
``text.format`` for an output schema. By default nothing is stored (``store=False``) and, for
reasoning models, ``include=["reasoning.encrypted_content"]`` asks for the encrypted reasoning,
which goes back unchanged in later requests (stateless tool loops). ``previous_response_id=True``
stores responses instead and sends only the items after the last response of the same
conversation (falling back to the whole conversation when the history was edited).
``SamplingSettings.stop`` is refused there (the API has no stop sequences); ``seed`` and
``top_k`` are not sent to OpenAI. Errors are mapped as for Chat Completions, including a
``response.failed`` / ``error`` event mid-stream. Server-side compaction (`NativeCompaction`, from
``Compaction()``, native by default; capability on for the Responses API against OpenAI) is
``context_management: [{"type": "compaction", "compact_threshold": N}]``; the ``compaction``
output item it yields is kept verbatim and sent back in later ``input``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from parley.backends.base import BackendCapabilities, ModelRequest, ModelResponse, NamedToolChoice
from parley.backends.errors import (
    APIConnectionError,
    BadRequestError,
    MalformedStreamError,
    ModelAPIError,
    ReasoningSettingError,
    StreamInterruptedError,
    error_from_status,
    retrying,
)
from parley.cache_planner import CacheLedger
from parley.errors import ConfigurationError
from parley.pricing import model_info
from parley.protocol import ErrorEvent, Event, Message, Usage, UsageEvent
from parley.protocol import openai as wire
from parley.protocol import openai_responses as responses_wire
from parley.protocol._wire_history import prepare_history
from parley.protocol.tool_markup import TOOL_CALL_PARSERS, call_or_answer_tag
from parley.usage import from_openai

Flavor = Literal["openai", "vllm", "sglang", "llamacpp", "auto"]
Dialect = Literal["openai", "vllm", "sglang", "llamacpp"]
FLAVORS = ("openai", "vllm", "sglang", "llamacpp", "auto")
Api = Literal["chat", "responses"]
DEFAULT_BASE_URL = "https://api.openai.com/v1"
logger = logging.getLogger(__name__)
CACHE_FIGURE_FLAGS: dict[str, str] = {
    "vllm": "start vLLM with --enable-prompt-tokens-details (and --enable-prefix-caching)",
    "sglang": "SGLang reports no cached-token figure in its usage",
    "llamacpp": "llama.cpp reports it with usage (not in every stream)",
    "openai": "the server's usage has no prompt_tokens_details.cached_tokens",
}
"""Per dialect, what to do when a server does not report its cache reads (named in the one-time warning)."""
_VALIDATION_ERROR = re.compile(r"^\d+ validation errors?\b")  # llama-cpp-python's request validation, as a 500


class OpenAIBackend:
    """A `Backend` over an OpenAI-compatible Chat Completions endpoint."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        flavor: Flavor = "openai",
        max_tokens: int | None = None,
        max_retries: int = 3,
        retry_base_delay: float = 0.5,
        max_retry_delay: float = 60.0,
        timeout: float = 600.0,
        extra_body: dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        http_client: httpx.AsyncClient | None = None,
        api: Api = "chat",
        store: bool | None = None,
        previous_response_id: bool = False,
        include: list[str] | None = None,
        reasoning_summary: Literal["auto", "concise", "detailed"] | None = None,
        native_compaction: bool | None = None,
        tool_call_parser: str | None = None,
    ) -> None:
        if flavor not in FLAVORS:
            raise ConfigurationError(
                f"OpenAIBackend flavor must be openai, vllm, sglang, llamacpp or auto, not {flavor!r}")
        if api not in ("chat", "responses"):
            raise ConfigurationError(f"OpenAIBackend api must be 'chat' or 'responses', not {api!r}")
        if tool_call_parser is not None and tool_call_parser not in TOOL_CALL_PARSERS:
            raise ConfigurationError(
                f"OpenAIBackend tool_call_parser={tool_call_parser!r} has no known call markup (known: "
                f"{', '.join(TOOL_CALL_PARSERS)}); leave it None and the schema goes only with tools off")
        self.tool_call_parser = tool_call_parser
        """vLLM's ``--tool-call-parser``, when its markup is known: lets a tools + typed-answer turn be one
        structural tag (a call or the answer) instead of the schema only on a turn with tools off."""
        if previous_response_id and store is False:
            raise ConfigurationError("OpenAIBackend previous_response_id=True needs stored responses (store=True)")
        self.api: Api = api
        self.store = previous_response_id if store is None else store
        """Responses API: let OpenAI store responses (default False, True with previous_response_id)."""
        self.previous_response_id = previous_response_id
        self.include = include
        """Responses API ``include``; None: encrypted reasoning for reasoning models when not stored."""
        self.reasoning_summary = reasoning_summary
        self._native_compaction = native_compaction
        self._chain = responses_wire.ResponseChain()
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.flavor: Flavor = flavor
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.max_retry_delay = max_retry_delay
        self.extra_body = dict(extra_body or {})
        self.parallel_tool_calls = parallel_tool_calls
        self.cache_ledger = CacheLedger()
        """Reported cache reads per request (OpenAI caches automatically: nothing to predict)."""
        self._warned_unreported_cache = False
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = http_client or httpx.AsyncClient(timeout=timeout)
        self.info = model_info("openai", model)

    @property
    def name(self) -> str:
        return f"{self.flavor}:{self.model}"

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(reasoning=bool(self.info.get("reasoning", True)), prompt_cache=True,
                                   native_compaction=self.native_compaction)

    @property
    def native_compaction(self) -> bool:
        """Server-side compaction (Responses API ``context_management``): on for ``api="responses"``
        against OpenAI unless ``native_compaction=False``; ``True`` forces it for another server."""
        if self._native_compaction is not None:
            return self._native_compaction and self.api == "responses"
        host = urlsplit(self.base_url).hostname
        openai = self.flavor == "openai" or (self.flavor == "auto" and host == "api.openai.com")
        return self.api == "responses" and openai

    # -- flavor -------------------------------------------------------------------------------
    async def resolve_flavor(self) -> Dialect:
        """The concrete dialect; ``auto`` probes the server once and remembers the answer."""
        if self.flavor != "auto":
            return self.flavor
        detected: Dialect = "openai"
        if urlsplit(self.base_url).hostname != "api.openai.com":
            root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
            if await self._probe(f"{root}/version", "version"):
                detected = "vllm"
            elif await self._probe(f"{root}/get_server_info", None):
                detected = "sglang"
            elif await self._probe(f"{root}/openapi.json", "info", title="llama.cpp") or \
                    await self._probe(f"{root}/props", "default_generation_settings"):
                detected = "llamacpp"
        self.flavor = detected
        return detected

    async def _probe(self, url: str, key: str | None, *, title: str | None = None) -> bool:
        """``url`` answers 200 (with ``key`` in its JSON object; ``title``: inside that key's ``title``)."""
        try:
            response = await self._client.get(url, headers=self._headers, timeout=5.0)
            if response.status_code != 200:
                return False
            if key is None:
                return True
            payload = response.json()
            if not isinstance(payload, dict) or key not in payload:
                return False
            section = payload[key]
            return title is None or (isinstance(section, dict) and title in str(section.get("title", "")))
        except (httpx.HTTPError, ValueError):
            return False

    # -- request building ---------------------------------------------------------------------
    def build_body(self, request: ModelRequest, flavor: Dialect, *,
                   stream: bool = False) -> dict[str, Any]:
        if self.api == "responses":
            return self._responses_body(request, flavor, stream=stream)
        sampling = request.sampling
        extra: dict[str, Any] = {}
        max_tokens = sampling.max_tokens or self.max_tokens
        if max_tokens is not None:
            extra["max_completion_tokens" if flavor == "openai" else "max_tokens"] = max_tokens
        extra.update(temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed)
        if sampling.top_k is not None and flavor != "openai":  # vLLM/SGLang/llama.cpp extension; not OpenAI
            extra["top_k"] = sampling.top_k
        if sampling.stop:
            extra["stop"] = list(sampling.stop)
        extra.update(frequency_penalty=sampling.frequency_penalty, presence_penalty=sampling.presence_penalty)
        if flavor in ("vllm", "sglang"):
            extra.update(repetition_penalty=sampling.repetition_penalty, min_p=sampling.min_p,
                         min_tokens=sampling.min_tokens, ignore_eos=sampling.ignore_eos)
        extra.update(self._reasoning(request, flavor))
        if request.output_schema is not None and self._writes_call_or_answer(request, flavor):
            tag = call_or_answer_tag(str(self.tool_call_parser), list(request.tools), dict(request.output_schema))
            extra["structured_outputs"] = {"structural_tag": json.dumps(tag, ensure_ascii=False)}
        elif request.output_schema is not None and not self._schema_fights_tools(request, flavor):
            if flavor == "vllm":
                extra["structured_outputs"] = {"json": request.output_schema}
            elif flavor == "llamacpp":  # json_schema is refused; json_object + schema becomes a grammar
                extra["response_format"] = {"type": "json_object", "schema": dict(request.output_schema)}
            else:
                extra["response_format"] = wire.response_format(request.output_schema, strict=flavor == "openai")
        if request.tenant is not None and flavor != "llamacpp":  # llama.cpp has no tenant / cache-salt field
            extra["safety_identifier" if flavor == "openai" else "cache_salt"] = request.tenant
        policy = request.cache
        if policy is not None and policy.enabled and policy.prompt_cache_key and flavor != "llamacpp":
            extra["prompt_cache_key"] = policy.prompt_cache_key
        choice = request.tool_choice
        history = prepare_history(request.conversation.messages, provider=flavor)
        body = wire.build_request(
            self.model,
            history,
            request.tools,
            tool_choice="auto" if isinstance(choice, NamedToolChoice) else choice,
            tool_name=choice.name if isinstance(choice, NamedToolChoice) else None,
            stream=stream,
            developer_role=flavor == "openai",
            parallel_tool_calls=self.parallel_tool_calls
            if request.parallel_tool_calls is None
            else request.parallel_tool_calls,
            **extra,
        )
        if flavor == "llamacpp":  # llama-cpp-python takes no null content (and its templates read content)
            for entry in body["messages"]:
                if entry.get("role") == "assistant" and entry.get("content") is None:
                    entry["content"] = ""
        body.update(self.extra_body)
        return body

    @staticmethod
    def _schema_fights_tools(request: ModelRequest, flavor: Dialect) -> bool:
        """True where the answer schema must not be sent: tools the model may call on a self-hosted server.

        vLLM, SGLang and llama.cpp apply an output schema to the whole generation, tool calls included, so
        with tools on ``auto`` or ``required`` the model could not call a tool (vLLM with ``required``
        returned calls whose arguments were not objects, round after round; PydanticAI issue 6552). OpenAI
        itself keeps the two apart. So on those servers the schema goes only with a turn whose tools are
        off; the agent validates the typed answer either way (and repairs it, `Agent.output_retries`), and
        after `max_tool_rounds` it asks for the answer with tools off, where the schema is enforced."""
        return flavor != "openai" and bool(request.tools) and request.tool_choice != "none"

    def _writes_call_or_answer(self, request: ModelRequest, flavor: Dialect) -> bool:
        """vLLM with a known tool parser and tools on ``auto``: one structural tag admits the typed
        answer or calls in the parser's markup (`parley.protocol.tool_markup`), so neither is lost."""
        return flavor == "vllm" and self.tool_call_parser is not None and bool(request.tools) and \
            request.tool_choice == "auto"

    def _replays_stream(self, request: ModelRequest, flavor: Dialect) -> bool:
        """llama.cpp's ``chatml-function-calling`` cannot stream a turn that may or must call a tool."""
        return flavor == "llamacpp" and self.api == "chat" and bool(request.tools) and \
            request.tool_choice in ("auto", "required")

    def _responses_body(self, request: ModelRequest, flavor: Dialect, *,
                        stream: bool) -> dict[str, Any]:
        sampling = request.sampling
        if sampling.stop:
            raise ConfigurationError("the Responses API has no stop sequences (SamplingSettings.stop); use api='chat'")
        extra: dict[str, Any] = {"max_output_tokens": sampling.max_tokens or self.max_tokens,
                                 "temperature": sampling.temperature, "top_p": sampling.top_p}
        if flavor != "openai":
            extra.update(top_k=sampling.top_k, seed=sampling.seed)
        chat_reasoning = self._reasoning(request, flavor)
        reasoning = {"effort": chat_reasoning.get("reasoning_effort"), "summary": self.reasoning_summary}
        if any(v is not None for v in reasoning.values()):
            extra["reasoning"] = {k: v for k, v in reasoning.items() if v is not None}
        extra["thinking_token_budget"] = chat_reasoning.get("thinking_token_budget")
        if request.output_schema is not None and not self._schema_fights_tools(request, flavor):
            extra["text"] = {"format": responses_wire.text_format(request.output_schema, strict=flavor == "openai")}
        if request.tenant is not None:
            extra["safety_identifier" if flavor == "openai" else "cache_salt"] = request.tenant
        policy = request.cache
        if policy is not None and policy.enabled and policy.prompt_cache_key:
            extra["prompt_cache_key"] = policy.prompt_cache_key
        include = self.include
        if include is None:
            include = [] if self.store or not self.info.get("reasoning", True) else [responses_wire.ENCRYPTED_REASONING]
        messages = request.conversation.messages
        history = prepare_history(messages, provider=flavor)
        previous, check = None, True
        if self.previous_response_id:
            found = self._chain.find(messages, scope=request.tenant or "")
            if found is not None and history == list(messages):  # nothing was rewritten: the prefix is what was sent
                previous, start = found
                history, check = history[start:], False
        choice = request.tool_choice
        body = responses_wire.build_request(
            self.model,
            history,
            request.tools,
            tool_choice="auto" if isinstance(choice, NamedToolChoice) else choice,
            tool_name=choice.name if isinstance(choice, NamedToolChoice) else None,
            parallel_tool_calls=self.parallel_tool_calls
            if request.parallel_tool_calls is None
            else request.parallel_tool_calls,
            stream=stream,
            provider=flavor,
            developer_role=flavor == "openai",
            store=self.store,
            include=include,
            previous_response_id=previous,
            check_pairing=check,
            **extra,
        )
        native = request.native_compaction
        if native is not None and self.native_compaction:  # documented: a list of entries, type "compaction"
            body["context_management"] = [{"type": "compaction", "compact_threshold": native.trigger_tokens}]
        body.update(self.extra_body)
        return body

    def _remember(self, request: ModelRequest, message: Message, response_id: str | None) -> None:
        if self.api == "responses" and self.previous_response_id and response_id:
            self._chain.remember([*request.conversation.messages, message], response_id, scope=request.tenant or "")

    def _reasoning(self, request: ModelRequest, flavor: str) -> dict[str, Any]:
        reasoning = request.reasoning
        out: dict[str, Any] = {"separate_reasoning": True} if flavor == "sglang" else {}
        if reasoning is None:
            return out
        where = f"{flavor} model {self.model!r}"
        if flavor == "llamacpp" and (reasoning.effort is not None or reasoning.budget_tokens):
            setting = "Reasoning.effort" if reasoning.effort is not None else "Reasoning.budget_tokens"
            raise ReasoningSettingError(f"{where} rejects {setting}: llama.cpp's server has no reasoning "
                                        "setting (it ignores reasoning_effort); leave Reasoning unset")
        if reasoning.effort is not None:
            if flavor == "openai" and self.info.get("known") and not self.info.get("reasoning"):
                raise ReasoningSettingError(f"{where} rejects Reasoning.effort: it is not a reasoning model")
            out["reasoning_effort"] = reasoning.effort
        if reasoning.budget_tokens is not None and (reasoning.budget_tokens > 0 or flavor == "vllm"):
            if flavor != "vllm":
                raise ReasoningSettingError(
                    f"{where} rejects Reasoning.budget_tokens: only vLLM has a reasoning budget "
                    "(thinking_token_budget); use Reasoning(effort=...)"
                )
            out["thinking_token_budget"] = reasoning.budget_tokens
        return out

    # -- transport ------------------------------------------------------------------------------
    async def _post(self, body: dict[str, Any]) -> httpx.Response:
        url = f"{self.base_url}/{'responses' if self.api == 'responses' else 'chat/completions'}"
        stream = bool(body.get("stream"))
        try:
            request = self._client.build_request("POST", url, json=body, headers=self._headers)
            response = await self._client.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise APIConnectionError(f"cannot reach {url}: {type(exc).__name__}: {exc}", provider=self.flavor) from exc
        if response.status_code >= 400:
            raw = await response.aread()
            await response.aclose()
            try:
                payload: Any = json.loads(raw)
            except ValueError:
                payload = raw.decode(errors="replace")
            error = error_from_status(response.status_code, payload, dict(response.headers), provider=self.flavor,
                                      request_id_header="x-request-id")
            if self.flavor == "llamacpp" and response.status_code == 500 and _is_validation_error(payload):
                error = BadRequestError(str(error), status_code=500, request_id=error.request_id,
                                        provider=self.flavor, body=payload, retryable=False)
            raise error
        return response

    async def _with_retries(self, body: dict[str, Any]) -> httpx.Response:
        return await retrying(lambda: self._post(body), max_retries=self.max_retries,
                              base_delay=self.retry_base_delay, max_delay=self.max_retry_delay)

    # -- Backend API ----------------------------------------------------------------------------
    async def generate(self, request: ModelRequest) -> ModelResponse:
        flavor = await self.resolve_flavor()
        body = self.build_body(request, flavor)
        response = await self._with_retries(body)
        try:
            payload = response.json()
            failed = responses_wire.error_of(payload) if self.api == "responses" else None
            if failed is None:
                decode = responses_wire.decode_response if self.api == "responses" else wire.decode_response
                decoded = decode(payload, provider=flavor)
        except Exception as exc:
            raise MalformedStreamError(f"unreadable {flavor} response: {exc}", provider=flavor,
                                       status_code=response.status_code) from exc
        if failed is not None:
            raise error_from_status(failed[0], failed[1], dict(response.headers), provider=flavor,
                                    request_id_header="x-request-id")
        usage = from_openai(decoded.usage, model=self.model if flavor == "openai" else None, provider=flavor)
        self._record_usage(usage, flavor)
        self._remember(request, decoded.message, decoded.id)
        return ModelResponse(messages=[decoded.message], usage=usage, finish_reason=decoded.finish_reason,
                             model=decoded.model or self.model)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Event]:
        flavor = await self.resolve_flavor()
        replay = self._replays_stream(request, flavor)
        body = self.build_body(request, flavor, stream=not replay)
        response = await self._with_retries(body)
        decoder: wire.StreamDecoder | responses_wire.StreamDecoder
        decoder = responses_wire.StreamDecoder(provider=flavor) if self.api == "responses" else \
            wire.StreamDecoder(provider=flavor)
        failure: ModelAPIError | None = None
        finished = False
        try:
            async for data in (_replayed(response) if replay else _sse_data(response)):
                if data == "[DONE]":
                    finished = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError as exc:
                    failure = MalformedStreamError(f"malformed {flavor} stream chunk {data[:80]!r}: {exc}",
                                                   provider=flavor)
                    break
                for event in decoder.feed(chunk):
                    if isinstance(decoder, responses_wire.StreamDecoder):
                        if decoder.error is not None and failure is None:
                            failure = error_from_status(*decoder.error, {}, provider=flavor)
                    elif isinstance(event, ErrorEvent) and event.code != "malformed_chunk":
                        failure = error_from_status(500, chunk, {}, provider=flavor)
                    yield event
                if failure is not None:
                    break
        except httpx.HTTPError as exc:
            failure = StreamInterruptedError(f"{flavor} stream interrupted: {type(exc).__name__}: {exc}",
                                             provider=flavor)
        finally:
            await response.aclose()
        if failure is None and not finished and decoder.finish_reason is None:
            failure = StreamInterruptedError(f"the {flavor} stream ended without finishing", provider=flavor)
        if failure is not None:
            yield ErrorEvent(code="stream_interrupted" if isinstance(failure, StreamInterruptedError)
                             else "malformed_stream" if isinstance(failure, MalformedStreamError) else "api_error",
                             message=str(failure))
            raise failure
        for event in decoder.finish():
            yield event
        usage = from_openai(decoder.usage, model=self.model if flavor == "openai" else None, provider=flavor)
        if not decoder.usage:
            usage = usage.model_copy(update={"cost": None})
        self._record_usage(usage, flavor)
        if decoder.messages:
            self._remember(request, decoder.messages[-1], decoder.id)
        yield UsageEvent(usage=usage)

    def _record_usage(self, usage: Usage, flavor: Dialect) -> None:
        """Into the cache ledger; the first request whose server says nothing of its cache warns, once."""
        self.cache_ledger.record(None, usage)
        if usage.cache_read_tokens is None and not self._warned_unreported_cache:
            self._warned_unreported_cache = True
            logger.warning("%s at %s did not report cached prompt tokens: Usage.cache_read_tokens is None "
                           "(unknown, not 0); %s", flavor, self.base_url, CACHE_FIGURE_FLAGS[flavor])

    async def aclose(self) -> None:
        await self._client.aclose()


def _is_validation_error(payload: Any) -> bool:
    """llama-cpp-python's answer to a request its pydantic model refuses (sent as HTTP 500)."""
    error = payload.get("error") if isinstance(payload, dict) else payload
    message = error.get("message") if isinstance(error, dict) else error
    return isinstance(message, str) and _VALIDATION_ERROR.match(message) is not None


async def _replayed(response: httpx.Response) -> AsyncIterator[str]:
    """A whole Chat Completions answer as the data of one stream chunk (the deltas are the message), then
    ``[DONE]``; a body that is neither an answer nor an error object becomes data that is not JSON, so
    the stream reports it as malformed."""
    raw = await response.aread()
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or not isinstance(payload.get("choices", payload.get("error")), (list, dict)):
        yield f"(not a Chat Completions answer) {raw.decode(errors='replace')}"  # never parses: malformed
        return
    if isinstance(payload.get("choices"), list):
        choices = []
        for choice in payload["choices"]:
            if not isinstance(choice, dict):
                choices.append(choice)
                continue
            delta = dict(choice.get("message") or {})
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                delta["tool_calls"] = [_indexed_call(call, i) for i, call in enumerate(calls)]
            choices.append({"index": choice.get("index", 0), "delta": delta,
                            "finish_reason": choice.get("finish_reason")})
        payload = {**payload, "object": "chat.completion.chunk", "choices": choices}
    yield json.dumps(payload)
    yield "[DONE]"


def _indexed_call(call: Any, index: int) -> Any:
    if not isinstance(call, dict):
        return call
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), (dict, list)):
        function["arguments"] = json.dumps(function["arguments"], ensure_ascii=False)
    return {**call, "index": index, "function": function}


async def _sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The ``data:`` payloads of a server-sent-event stream (multi-line data joined by newlines)."""
    lines: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            lines.append(value[1:] if value.startswith(" ") else value)
    if lines:
        yield "\n".join(lines)
