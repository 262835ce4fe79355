"""`OpenAIBackend` against a local server replaying Chat Completions responses (OpenAI, vLLM, SGLang)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from parley.backends.base import ModelRequest, NamedToolChoice, SamplingSettings
from parley.backends.errors import (
    APIConnectionError,
    BadRequestError,
    MalformedStreamError,
    RateLimitError,
    ReasoningSettingError,
    ServerError,
    StreamInterruptedError,
)
from parley.backends.openai import OpenAIBackend
from parley.caching import CachePolicy
from parley.errors import ConfigurationError
from parley.protocol import (
    Conversation,
    ErrorEvent,
    Message,
    MessageEnd,
    ReasoningDelta,
    Role,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolSpec,
    UsageEvent,
)
from parley.reasoning import Reasoning
from tests.sdk.backends.fake_server import FakeServer, Reply, sse_event

WEATHER = ToolSpec(name="get_weather", description="Get the weather",
                   parameters={"type": "object", "properties": {"location": {"type": "string"}}})


def _backend(server: FakeServer, model: str = "gpt-4o-mini", **kwargs: Any) -> OpenAIBackend:
    kwargs.setdefault("retry_base_delay", 0.0)
    kwargs.setdefault("api_key", "sk-test")
    return OpenAIBackend(model, base_url=f"{server.url}/v1", **kwargs)


def _request(*messages: Message, **kwargs: Any) -> ModelRequest:
    return ModelRequest(conversation=Conversation(messages=list(messages)), **kwargs)


def _completion(message: dict[str, Any], finish: str = "stop", **usage: Any) -> dict[str, Any]:
    counts: dict[str, Any] = {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29}
    counts.update(usage)
    return {"id": "chatcmpl-123", "object": "chat.completion", "created": 1677652288, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": counts}


TOOL_CALL = {"id": "call_abc123", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"location\": \"Boston, MA\"}"}}


async def test_tool_loop(server: FakeServer) -> None:
    server.queue(Reply(body=_completion({"content": None, "tool_calls": [TOOL_CALL]}, "tool_calls")),
                 Reply(body=_completion({"content": "It is 22°C in Boston."},
                                        prompt_tokens_details={"cached_tokens": 0})))
    backend = _backend(server)
    request = _request(Message.system("Be brief."), Message.user("Boston?"), tools=[WEATHER],
                       tool_choice=NamedToolChoice("get_weather"), tenant="user-42",
                       sampling=SamplingSettings(max_tokens=200, temperature=0.0, seed=7))
    first = await backend.generate(request)
    [assistant] = first.messages
    assert first.finish_reason == "tool_calls" and assistant.tool_calls[0].id == "call_abc123"
    request.conversation.append(assistant)
    request.conversation.append(Message.tool("call_abc123", "get_weather", "22°C"))
    request.tool_choice = "auto"
    second = await backend.generate(request)
    assert second.messages[0].text == "It is 22°C in Boston."
    one, two = (r.body for r in server.requests)
    assert server.requests[0].path == "/v1/chat/completions"
    assert server.requests[0].headers["authorization"] == "Bearer sk-test"
    assert one["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert one["max_completion_tokens"] == 200 and one["temperature"] == 0.0 and one["seed"] == 7
    assert one["safety_identifier"] == "user-42" and "cache_salt" not in one
    assert two["messages"][2]["tool_calls"][0]["function"]["arguments"] == TOOL_CALL["function"]["arguments"]
    assert two["messages"][3] == {"role": "tool", "tool_call_id": "call_abc123", "content": "22°C"}
    # gpt-4o-mini: $0.15 input, $0.60 output per MTok.
    assert second.usage.cost == (19 * Decimal("0.15") + 10 * Decimal("0.60")) / 10**6


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return sse_event(None, {"id": "chatcmpl-9", "object": "chat.completion.chunk", "model": "gpt-4o-mini",
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "Let me check"}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"location\":"}}]}),
    _chunk({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\"}"}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": " \"Lima\"}"}}]}),
    _chunk({}, "tool_calls"),
    sse_event(None, {"id": "chatcmpl-9", "object": "chat.completion.chunk", "choices": [],
                     "usage": {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
                               "prompt_tokens_details": {"cached_tokens": 1920},
                               "completion_tokens_details": {"reasoning_tokens": 0}}}),
    "data: [DONE]",
]


async def _collect(backend: OpenAIBackend, request: ModelRequest) -> list[Any]:
    return [event async for event in backend.stream(request)]


async def test_stream_assembles_tool_calls_by_index_and_reports_cached_usage(server: FakeServer) -> None:
    server.queue(Reply(sse=STREAM))
    events = await _collect(_backend(server), _request(Message.user("Lima and Oslo?"), tools=[WEATHER]))
    sent = server.requests[0].body
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Let me check"]
    assert [(e.index, e.id) for e in events if isinstance(e, ToolCallStart)] == [(0, "call_1"), (1, "call_2")]
    assert [e.call.parsed_arguments() for e in events if isinstance(e, ToolCallEnd)] == [
        {"location": "Lima"}, {"location": "Oslo"}]
    assert isinstance(events[-2], MessageEnd) and isinstance(events[-1], UsageEvent)
    usage = events[-1].usage
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens) == (86, 1920, 300)
    assert usage.prompt_tokens == 2006  # the cached 1920 are inside prompt_tokens: not counted twice
    assert usage.cost == (86 * Decimal("0.15") + 1920 * Decimal("0.075") + 300 * Decimal("0.60")) / 10**6


async def test_parallel_tool_calls_flag_and_cache_ledger(server: FakeServer) -> None:
    server.queue(Reply(sse=STREAM))
    backend = _backend(server, parallel_tool_calls=False)
    await _collect(backend, _request(Message.user("x"), tools=[WEATHER]))
    assert server.requests[0].body["parallel_tool_calls"] is False
    assert backend.cache_ledger.requests == 1 and abs(backend.cache_ledger.hit_rate - 1920 / 2006) < 1e-9


async def test_vllm_flavor_fields(server: FakeServer) -> None:
    body = _completion({"content": "{\"a\": 1}", "reasoning": "think first"},
                       prompt_tokens_details={"cached_tokens": 16})
    server.queue(Reply(body=body))
    backend = _backend(server, model="Qwen/Qwen3-8B", flavor="vllm")
    response = await backend.generate(_request(
        Message.user("x"), output_schema={"type": "object"}, tenant="acme",
        reasoning=Reasoning(budget_tokens=256, effort="low"), cache=CachePolicy(prompt_cache_key="k1"),
        sampling=SamplingSettings(max_tokens=64)))
    sent = server.requests[0].body
    assert sent["structured_outputs"] == {"json": {"type": "object"}}
    assert not any(key.startswith("guided_") for key in sent) and "response_format" not in sent
    assert sent["thinking_token_budget"] == 256 and sent["reasoning_effort"] == "low"
    assert sent["cache_salt"] == "acme" and sent["prompt_cache_key"] == "k1" and sent["max_tokens"] == 64
    message = response.messages[0]
    assert message.reasoning == "think first" and message.parts[0].provider == "vllm"
    assert response.usage.cache_read_tokens == 16 and response.usage.input_tokens == 3
    assert response.usage.cost is None  # self-hosted: no price, no guess
    assert backend.name == "vllm:Qwen/Qwen3-8B"


async def test_sglang_stream_reasoning_content_and_rejected_budget(server: FakeServer) -> None:
    records = [_chunk({"reasoning_content": "hmm"}), _chunk({"content": "4"}), _chunk({}, "stop"), "data: [DONE]"]
    server.queue(Reply(sse=records))
    backend = _backend(server, model="qwen3", flavor="sglang")
    events = await _collect(backend, _request(Message.user("2+2"), output_schema={"type": "object"}))
    assert [e.text for e in events if isinstance(e, ReasoningDelta)] == ["hmm"]
    assert server.requests[0].body["response_format"]["json_schema"]["strict"] is False
    assert server.requests[0].body["separate_reasoning"] is True
    assert events[-1].usage.requests == 1 and events[-1].usage.cost is None  # no usage chunk was sent
    with pytest.raises(ReasoningSettingError, match="rejects Reasoning.budget_tokens"):
        backend.build_body(_request(Message.user("x"), reasoning=Reasoning(budget_tokens=100)), "sglang")


async def test_auto_flavor_detects_vllm(server: FakeServer) -> None:
    server.routes["/version"] = Reply(body={"version": "0.12.0"})
    server.queue(Reply(body=_completion({"content": "hi"})))
    backend = _backend(server, model="m", flavor="auto")
    await backend.generate(_request(Message.user("x"), tenant="t"))
    assert backend.flavor == "vllm" and server.requests[-1].body["cache_salt"] == "t"


async def test_auto_flavor_falls_back_to_openai(server: FakeServer) -> None:
    server.routes["/version"] = Reply(404, {"detail": "Not Found"})
    server.routes["/get_server_info"] = Reply(404, {"detail": "Not Found"})
    backend = _backend(server, model="m", flavor="auto")
    assert await backend.resolve_flavor() == "openai"


def test_openai_reasoning_mapping() -> None:
    backend = OpenAIBackend("o4-mini", api_key="k")
    body = backend.build_body(_request(Message.user("x"), reasoning=Reasoning(effort="high"),
                                       output_schema={"type": "object", "properties": {"a": {"type": "string"}}}),
                              "openai")
    assert body["reasoning_effort"] == "high"
    schema = body["response_format"]["json_schema"]
    assert schema["strict"] is True and schema["schema"]["additionalProperties"] is False
    assert schema["schema"]["properties"]["a"]["type"] == ["string", "null"]
    with pytest.raises(ReasoningSettingError, match="Reasoning.budget_tokens"):
        backend.build_body(_request(Message.user("x"), reasoning=Reasoning(budget_tokens=100)), "openai")
    with pytest.raises(ReasoningSettingError, match="gpt-4o.* rejects Reasoning.effort"):
        OpenAIBackend("gpt-4o", api_key="k").build_body(
            _request(Message.user("x"), reasoning=Reasoning(effort="low")), "openai")
    with pytest.raises(ConfigurationError, match="flavor"):
        OpenAIBackend("m", flavor="tgi")  # type: ignore[arg-type]


async def test_429_with_retry_after_then_success(server: FakeServer) -> None:
    error = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
    server.queue(Reply(429, error, headers={"retry-after": "0", "x-request-id": "req_1"}),
                 Reply(body=_completion({"content": "ok"})))
    assert (await _backend(server).generate(_request(Message.user("x")))).messages[0].text == "ok"
    assert len(server.requests) == 2
    server.queue(Reply(429, error, headers={"retry-after-ms": "5", "x-request-id": "req_2"}))
    with pytest.raises(RateLimitError) as info:
        await _backend(server, max_retries=0).generate(_request(Message.user("x")))
    assert info.value.request_id == "req_2" and info.value.retry_after == 0.005


async def test_400_and_500(server: FakeServer) -> None:
    error = {"error": {"message": "Invalid 'messages[1].tool_call_id'", "type": "invalid_request_error",
                       "param": "messages", "code": None}}
    server.queue(Reply(400, error))
    with pytest.raises(BadRequestError, match="tool_call_id") as info:
        await _backend(server).generate(_request(Message.user("x")))
    assert info.value.status_code == 400 and not info.value.retryable and len(server.requests) == 1
    server.queue(Reply(500, {"error": {"message": "boom", "type": "server_error"}}))
    with pytest.raises(ServerError):
        await _backend(server, max_retries=0).generate(_request(Message.user("x")))


async def test_stream_cut_midway(server: FakeServer) -> None:
    server.queue(Reply(sse=STREAM, cut_after=4))
    seen: list[Any] = []
    with pytest.raises(StreamInterruptedError):
        async for event in _backend(server).stream(_request(Message.user("x"))):
            seen.append(event)
    assert isinstance(seen[-1], ErrorEvent) and seen[-1].code == "stream_interrupted"
    assert not any(isinstance(e, (MessageEnd, UsageEvent)) for e in seen)


async def test_malformed_json_chunk(server: FakeServer) -> None:
    server.queue(Reply(sse=[STREAM[0], "data: {\"choices\": [{\"delta\": {\"content\": \"x\"", "data: [DONE]"]))
    with pytest.raises(MalformedStreamError):
        await _collect(_backend(server), _request(Message.user("x")))


async def test_connection_refused_is_typed() -> None:
    backend = OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
    with pytest.raises(APIConnectionError) as info:
        await backend.generate(_request(Message.user("x")))
    assert info.value.retryable and info.value.status_code is None


def test_request_settings_reach_the_body_where_the_flavor_has_them() -> None:
    backend = OpenAIBackend("m", api_key="k")
    tool = ToolSpec(name="f", description="", parameters={"type": "object", "properties": {}})
    request = _request(Message.user("x"), tools=[tool], parallel_tool_calls=False, sampling=SamplingSettings(top_k=7))
    vllm = backend.build_body(request, "vllm")
    assert vllm["parallel_tool_calls"] is False and vllm["top_k"] == 7
    assert "top_k" not in backend.build_body(request, "openai")  # OpenAI's API has no top_k


def test_penalties_reach_every_chat_flavor_and_vllm_extensions_only_vllm_and_sglang() -> None:
    backend = OpenAIBackend("m", api_key="k")
    sampling = SamplingSettings(frequency_penalty=0.5, presence_penalty=0.1, repetition_penalty=1.2, min_p=0.05,
                                min_tokens=3, ignore_eos=True)
    request = _request(Message.user("x"), sampling=sampling)
    extensions = {"repetition_penalty": 1.2, "min_p": 0.05, "min_tokens": 3, "ignore_eos": True}
    for flavor in ("vllm", "sglang"):
        body = backend.build_body(request, flavor)
        assert body["frequency_penalty"] == 0.5 and body["presence_penalty"] == 0.1
        assert {k: body[k] for k in extensions} == extensions
    for flavor in ("openai", "llamacpp"):
        body = backend.build_body(request, flavor)
        assert body["frequency_penalty"] == 0.5 and not extensions.keys() & body.keys()


# -- the llamacpp dialect: what llama-cpp-python's server (tests/sdk/backends/test_llamacpp_server.py) showed --
def _llamacpp(server: FakeServer, **kwargs: Any) -> OpenAIBackend:
    return _backend(server, model="smollm2", flavor="llamacpp", **kwargs)


async def test_llamacpp_flavor_fields(server: FakeServer) -> None:
    server.queue(Reply(body=_completion({"content": "{\"a\": \"x\"}"})))
    backend = _llamacpp(server)
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    call = Message(role=Role.ASSISTANT, parts=[ToolCall(id="call_1", name="get_weather", arguments="{}")])
    await backend.generate(_request(
        Message.user("x"), call, Message.tool("call_1", "get_weather", "22°C"), tools=[WEATHER],
        tool_choice="none", output_schema=schema, tenant="acme", cache=CachePolicy(prompt_cache_key="k1"),
        sampling=SamplingSettings(max_tokens=16, top_k=5)))
    sent = server.requests[0].body
    # max_completion_tokens is ignored by llama.cpp (it generated to the end of the context).
    assert sent["max_tokens"] == 16 and "max_completion_tokens" not in sent and sent["top_k"] == 5
    # json_schema is refused; json_object with a schema is compiled to a grammar (the schema as given; sent on
    # this answer turn because its tools are off).
    assert sent["response_format"] == {"type": "json_object", "schema": schema}
    # No tenant or cache-key fields: the server has none.
    assert not {"safety_identifier", "cache_salt", "prompt_cache_key"} & set(sent)
    # A tool-call turn goes back with "" content: null is refused, and its templates read the key.
    assert sent["messages"][1]["content"] == "" and sent["messages"][1]["tool_calls"][0]["id"] == "call_1"
    assert OpenAIBackend("m", api_key="k").build_body(_request(Message.user("x"), call,
                                                                Message.tool("call_1", "get_weather", "ok")),
                                                       "openai")["messages"][1]["content"] is None


def test_llamacpp_rejects_reasoning_settings_by_name() -> None:
    backend = OpenAIBackend("smollm2", api_key="k", flavor="llamacpp")
    for reasoning, setting in ((Reasoning(effort="low"), "Reasoning.effort"),
                               (Reasoning(budget_tokens=64), "Reasoning.budget_tokens")):
        with pytest.raises(ReasoningSettingError, match=f"rejects {setting}: llama.cpp's server has no reasoning"):
            backend.build_body(_request(Message.user("x"), reasoning=reasoning), "llamacpp")
    assert "reasoning_effort" not in backend.build_body(_request(Message.user("x"), reasoning=Reasoning()),
                                                        "llamacpp")


@pytest.mark.parametrize("route, reply", [
    ("/openapi.json", {"openapi": "3.1.0", "info": {"title": "🦙 llama.cpp Python API", "version": "0.3.36"}}),
    ("/props", {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}),  # llama.cpp's llama-server
])
async def test_auto_flavor_detects_llamacpp(server: FakeServer, route: str, reply: dict[str, Any]) -> None:
    for path in ("/version", "/get_server_info", "/openapi.json", "/props"):
        server.routes[path] = Reply(404, {"detail": "Not Found"})
    server.routes[route] = Reply(body=reply)
    backend = _backend(server, model="m", flavor="auto")
    assert await backend.resolve_flavor() == "llamacpp"


async def test_auto_flavor_ignores_another_servers_openapi_document(server: FakeServer) -> None:
    for path in ("/version", "/get_server_info", "/props"):
        server.routes[path] = Reply(404, {"detail": "Not Found"})
    server.routes["/openapi.json"] = Reply(body={"openapi": "3.1.0", "info": {"title": "Some Proxy"}})
    assert await _backend(server, model="m", flavor="auto").resolve_flavor() == "openai"


async def test_llamacpp_stream_that_may_call_a_tool_replays_the_whole_answer(server: FakeServer) -> None:
    # chatml-function-calling cannot stream tool_choice auto/required: the stream closes empty.
    server.queue(Reply(body=_completion({"content": None, "tool_calls": [TOOL_CALL]}, "tool_calls",
                                        prompt_tokens=211, completion_tokens=6)))
    events = await _collect(_llamacpp(server), _request(Message.user("Boston?"), tools=[WEATHER]))
    sent = server.requests[0].body
    assert "stream" not in sent and "stream_options" not in sent
    assert [type(e) for e in events] == [ToolCallStart, ToolCallDelta, ToolCallEnd, MessageEnd, UsageEvent]
    assert (events[0].id, events[0].name) == ("call_abc123", "get_weather")
    assert events[2].call.parsed_arguments() == {"location": "Boston, MA"}
    assert events[3].finish_reason == "tool_calls"
    assert (events[4].usage.input_tokens, events[4].usage.output_tokens) == (211, 6)  # a replay has real usage


async def test_llamacpp_stream_replays_text_and_streams_named_tool_calls(server: FakeServer) -> None:
    server.queue(Reply(body=_completion({"content": "It is sunny."})), Reply(sse=STREAM))
    backend = _llamacpp(server)
    events = await _collect(backend, _request(Message.user("x"), tools=[WEATHER], tool_choice="required"))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["It is sunny."]
    events = await _collect(backend, _request(Message.user("x"), tools=[WEATHER],
                                              tool_choice=NamedToolChoice("get_weather")))
    assert server.requests[1].body["stream"] is True  # a named call streams on llama.cpp
    assert len([e for e in events if isinstance(e, ToolCallEnd)]) == 2


async def test_llamacpp_replayed_stream_that_is_not_json_is_malformed(server: FakeServer) -> None:
    server.queue(Reply(body="not json", headers={"content-type": "text/plain"}))
    with pytest.raises(MalformedStreamError):
        await _collect(_llamacpp(server), _request(Message.user("x"), tools=[WEATHER]))


async def test_llamacpp_validation_error_500_is_a_bad_request_and_not_retried(server: FakeServer) -> None:
    error = {"error": {"message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
                                  "'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\"}",
                       "type": "internal_server_error", "param": None, "code": None}}
    server.queue(Reply(500, error))
    with pytest.raises(BadRequestError, match="validation error") as info:
        await _llamacpp(server).generate(_request(Message.user("x")))
    assert len(server.requests) == 1 and not info.value.retryable and info.value.status_code == 500
    server.queue(Reply(500, {"error": {"message": "CUDA out of memory", "type": "internal_server_error"}}),
                 Reply(body=_completion({"content": "ok"})))
    assert (await _llamacpp(server).generate(_request(Message.user("x")))).messages[0].text == "ok"  # retried


# -- tools and a typed answer never fight (self-hosted servers constrain the whole generation to a schema) ------
SCHEMA_KEYS = ("structured_outputs", "response_format", "text")


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "llamacpp"])
@pytest.mark.parametrize("choice", ["auto", "required", NamedToolChoice("get_weather")])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_self_hosted_server_gets_no_answer_schema_while_tools_may_be_called(flavor: str, choice: Any,
                                                                            api: str) -> None:
    backend = OpenAIBackend("m", api_key="k", api=api)
    request = _request(Message.user("x"), tools=[WEATHER], tool_choice=choice, output_schema={"type": "object"})
    body = backend.build_body(request, flavor)  # type: ignore[arg-type]
    assert not set(SCHEMA_KEYS) & body.keys()
    assert body["tools"] and body.get("tool_choice") is not None


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "llamacpp"])
def test_with_tools_off_the_schema_is_enforced_by_the_server(flavor: str) -> None:
    backend = OpenAIBackend("m", api_key="k")
    schema = {"type": "object"}
    tools_off = _request(Message.user("x"), tools=[WEATHER], tool_choice="none", output_schema=schema)
    no_tools = _request(Message.user("x"), output_schema=schema)
    for request in (tools_off, no_tools):
        body = backend.build_body(request, flavor)  # type: ignore[arg-type]
        assert set(SCHEMA_KEYS) & body.keys(), flavor


def test_openai_itself_keeps_tools_and_the_answer_schema_together() -> None:
    body = OpenAIBackend("m", api_key="k").build_body(
        _request(Message.user("x"), tools=[WEATHER], tool_choice="auto", output_schema={"type": "object"}), "openai")
    assert body["response_format"]["type"] == "json_schema" and body["tools"]


@pytest.mark.parametrize("api", ["chat"])
def test_vllm_with_a_known_tool_parser_gets_one_structural_tag_a_call_or_the_answer(api: str) -> None:
    backend = OpenAIBackend("m", api_key="k", api=api, tool_call_parser="hermes")
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    body = backend.build_body(_request(Message.user("x"), tools=[WEATHER], tool_choice="auto",
                                       output_schema=schema), "vllm")
    assert set(body) & set(SCHEMA_KEYS) == {"structured_outputs"} and body["tools"] and body["tool_choice"] == "auto"
    tag = json.loads(body["structured_outputs"]["structural_tag"])  # vLLM takes the tag as a JSON string
    answer, calls = tag["format"]["elements"]
    assert answer == {"type": "json_schema", "json_schema": schema}
    assert {t["begin"] for t in calls["tags"]} == {'<tool_call>\n{"name": "get_weather", "arguments": ',
                                                   '<tool_call>{"name": "get_weather", "arguments": '}
    assert all(t["content"]["json_schema"] == WEATHER.parameters for t in calls["tags"])


@pytest.mark.parametrize("choice", ["required", NamedToolChoice("get_weather")])
def test_a_turn_that_must_call_a_tool_gets_no_answer_schema_even_with_a_known_parser(choice: Any) -> None:
    backend = OpenAIBackend("m", api_key="k", tool_call_parser="hermes")
    body = backend.build_body(_request(Message.user("x"), tools=[WEATHER], tool_choice=choice,
                                       output_schema={"type": "object"}), "vllm")
    assert not set(SCHEMA_KEYS) & body.keys()


@pytest.mark.parametrize("flavor", ["sglang", "llamacpp"])
def test_the_tool_parser_setting_changes_nothing_where_the_server_has_no_structural_tag(flavor: str) -> None:
    backend = OpenAIBackend("m", api_key="k", tool_call_parser="hermes")
    body = backend.build_body(_request(Message.user("x"), tools=[WEATHER], tool_choice="auto",
                                       output_schema={"type": "object"}), flavor)  # type: ignore[arg-type]
    assert not set(SCHEMA_KEYS) & body.keys()


def test_an_unknown_tool_parser_is_refused_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="llama3_json.*hermes"):
        OpenAIBackend("m", api_key="k", tool_call_parser="llama3_json")


# -- cache figures: unknown is not 0 --------------------------------------------------------------------------
async def test_a_server_that_reports_no_cache_figure_gives_unknown_reads_and_warns_once(
        server: FakeServer, caplog: pytest.LogCaptureFixture) -> None:
    server.queue(Reply(body=_completion({"content": "a"})), Reply(body=_completion({"content": "b"})))
    backend = _backend(server, model="smollm2", flavor="vllm")
    with caplog.at_level("WARNING", logger="parley.backends.openai"):
        first = await backend.generate(_request(Message.user("x")))
        second = await backend.generate(_request(Message.user("y")))
    assert first.usage.cache_read_tokens is None and first.usage.input_tokens == 19 == first.usage.prompt_tokens
    assert (first.usage + second.usage).cache_read_tokens is None  # a sum with an unknown part is unknown
    [warning] = [r for r in caplog.records if "cached prompt tokens" in r.getMessage()]
    assert "--enable-prompt-tokens-details" in warning.getMessage()
    ledger = backend.cache_ledger
    assert (ledger.requests, ledger.unreported_requests, ledger.cache_read_tokens, ledger.hit_rate) == (2, 2, 0, 0.0)


async def test_vllm_created_cache_tokens_are_cache_writes(server: FakeServer) -> None:
    server.queue(Reply(body=_completion({"content": "a"}, prompt_tokens=700,
                                        prompt_tokens_details={"cached_tokens": 512, "created_cache_tokens": 176})))
    backend = _backend(server, model="smollm2", flavor="vllm")
    usage = (await backend.generate(_request(Message.user("x")))).usage
    assert (usage.cache_read_tokens, usage.cache_write_tokens, usage.input_tokens) == (512, 176, 12)
    assert usage.prompt_tokens == 700


def test_a_reported_zero_is_zero_reads_and_a_known_price_needs_a_known_figure() -> None:
    from parley.usage import from_openai

    zero = from_openai({"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}},
                       model="gpt-4o-mini")
    assert zero.cache_read_tokens == 0 and zero.cost is not None
    silent = from_openai({"prompt_tokens": 10, "completion_tokens": 2}, model="gpt-4o-mini")
    assert silent.cache_read_tokens is None and silent.cost is None  # reads unknown: the price is not guessed
