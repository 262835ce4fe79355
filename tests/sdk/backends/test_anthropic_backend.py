"""`AnthropicBackend` against a local server replaying documented Messages API responses."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from parley.backends.anthropic import AnthropicBackend
from parley.backends.base import ModelRequest, NamedToolChoice, SamplingSettings
from parley.backends.errors import (
    BadRequestError,
    MalformedStreamError,
    ModelAPIError,
    OverloadedError,
    RateLimitError,
    ReasoningSettingError,
    StreamInterruptedError,
)
from parley.caching import CachePolicy
from parley.errors import ConfigurationError
from parley.protocol import (
    Conversation,
    ErrorEvent,
    Message,
    MessageEnd,
    ReasoningDelta,
    TextDelta,
    ToolCallEnd,
    ToolSpec,
    UsageEvent,
)
from parley.reasoning import Reasoning
from tests.sdk.backends.fake_server import FakeServer, Reply, sse_event

MODEL = "claude-sonnet-4-5-20250929"
WEATHER = ToolSpec(name="get_weather", description="Get the weather",
                   parameters={"type": "object", "properties": {"location": {"type": "string"}}})


def _backend(server: FakeServer, model: str = MODEL, **kwargs: Any) -> AnthropicBackend:
    kwargs.setdefault("retry_base_delay", 0.0)
    return AnthropicBackend(model, api_key="sk-test", base_url=server.url, **kwargs)


def _message(content: list[dict[str, Any]], stop: str = "end_turn", **usage: int) -> dict[str, Any]:
    counts = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    counts.update(usage)
    return {"id": "msg_01", "type": "message", "role": "assistant", "model": MODEL, "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": counts}


def _request(*messages: Message, **kwargs: Any) -> ModelRequest:
    return ModelRequest(conversation=Conversation(messages=list(messages)), **kwargs)


THINKING = {"type": "thinking", "thinking": "Need the weather tool.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}
TOOL_USE = {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather",
            "input": {"location": "Paris"}}


async def test_tool_loop_with_thinking_sends_signed_blocks_back_unchanged(server: FakeServer) -> None:
    server.queue(Reply(body=_message([THINKING, TOOL_USE], stop="tool_use")),
                 Reply(body=_message([{"type": "text", "text": "Sunny in Paris."}])))
    backend = _backend(server)
    request = _request(Message.system("Be brief."), Message.user("Weather in Paris?"), tools=[WEATHER],
                       reasoning=Reasoning(budget_tokens=2048))
    first = await backend.generate(request)
    assert first.finish_reason == "tool_calls"
    [assistant] = first.messages
    assert assistant.parts[0].signature == THINKING["signature"]
    call = assistant.tool_calls[0]
    request.conversation.append(assistant)
    request.conversation.append(Message.tool(call.id, call.name, "18°C, sunny"))
    second = await backend.generate(request)
    assert second.messages[0].text == "Sunny in Paris."
    sent = server.requests[1]
    assert sent.path == "/v1/messages"
    assert "sk-test" in (sent.headers.get("x-api-key", "") + sent.headers.get("authorization", ""))
    assert sent.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent.body["max_tokens"] == 2048 + 4096
    assert sent.body["system"] == [{"type": "text", "text": "Be brief."}]
    assert sent.body["messages"][1] == {"role": "assistant", "content": [THINKING, TOOL_USE]}
    assert sent.body["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": TOOL_USE["id"], "content": "18°C, sunny"}]}
    assert second.usage.requests == 1 and second.usage.cost == Decimal("0.000105")  # 10 in @3 + 5 out @15 per MTok


STREAM = [
    sse_event("message_start", {"type": "message_start", "message": {
        "id": "msg_02", "type": "message", "role": "assistant", "content": [], "model": MODEL, "stop_reason": None,
        "usage": {"input_tokens": 50, "output_tokens": 1, "cache_read_input_tokens": 0,
                  "cache_creation_input_tokens": 0}}}),
    sse_event("content_block_start", {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
    sse_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": {"type": "thinking_delta", "thinking": "Let me see."}}),
    sse_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": {"type": "signature_delta", "signature": "EqQBsig=="}}),
    sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
    sse_event("ping", {"type": "ping"}),
    sse_event("content_block_start", {"type": "content_block_start", "index": 1,
                                      "content_block": {"type": "text", "text": ""}}),
    sse_event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                      "delta": {"type": "text_delta", "text": "Hello"}}),
    sse_event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                      "delta": {"type": "text_delta", "text": " there"}}),
    sse_event("content_block_stop", {"type": "content_block_stop", "index": 1}),
    sse_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                "usage": {"output_tokens": 30}}),
    sse_event("message_stop", {"type": "message_stop"}),
]


async def _collect(backend: AnthropicBackend, request: ModelRequest) -> list[Any]:
    return [event async for event in backend.stream(request)]


async def test_stream_with_thinking_signature_ends_with_message_then_usage(server: FakeServer) -> None:
    server.queue(Reply(sse=STREAM))
    events = await _collect(_backend(server), _request(Message.user("hi"), reasoning=Reasoning(effort="low")))
    assert server.requests[0].body["stream"] is True
    assert server.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello there"
    assert [e.signature for e in events if isinstance(e, ReasoningDelta) and e.signature] == ["EqQBsig=="]
    assert isinstance(events[-2], MessageEnd) and isinstance(events[-1], UsageEvent)
    message = events[-2].message
    assert message.parts[0].signature == "EqQBsig==" and message.text == "Hello there"
    usage = events[-1].usage
    assert (usage.input_tokens, usage.output_tokens, usage.requests) == (50, 30, 1)


async def test_streamed_tool_use_arguments(server: FakeServer) -> None:
    records = [STREAM[0],
               sse_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                 "content_block": {**TOOL_USE, "input": {}}}),
               sse_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                 "delta": {"type": "input_json_delta", "partial_json": '{"locat'}}),
               sse_event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
                   "type": "input_json_delta", "partial_json": 'ion": "Rome"}'}}),
               sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
               sse_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                                           "usage": {"output_tokens": 12}}),
               sse_event("message_stop", {"type": "message_stop"})]
    server.queue(Reply(sse=records))
    events = await _collect(_backend(server), _request(Message.user("Rome?"), tools=[WEATHER]))
    [end] = [e for e in events if isinstance(e, ToolCallEnd)]
    assert end.call.parsed_arguments() == {"location": "Rome"}
    assert events[-2].finish_reason == "tool_calls"


def _usage_reply(**usage: Any) -> Reply:
    return Reply(body=_message([{"type": "text", "text": "ok"}], **usage))


async def test_cache_creation_then_read_with_5m_and_1h_breakpoints(server: FakeServer) -> None:
    long_system = "You are a meticulous assistant. " * 400  # ~3,200 tokens by the planner's estimate
    backend = _backend(server, cache=CachePolicy(long_ttl_for_tools_and_system=True))
    server.queue(
        _usage_reply(input_tokens=20, cache_creation_input_tokens=3300, cache_read_input_tokens=0,
                     cache_creation={"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 3200}),
        _usage_reply(input_tokens=25, cache_creation_input_tokens=60, cache_read_input_tokens=3300,
                     cache_creation={"ephemeral_5m_input_tokens": 60, "ephemeral_1h_input_tokens": 0}),
    )
    conversation = [Message.system(long_system), Message.user("first question")]
    first = await backend.generate(_request(*conversation, tools=[WEATHER]))
    body = server.requests[0].body
    assert "cache_control" not in body["tools"][-1]  # tools alone are below the 1024-token minimum
    assert any(w.startswith("tools prefix") for w in backend.cache_ledger.warnings)
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "extended-cache-ttl-2025-04-11" in server.requests[0].headers["anthropic-beta"]
    assert (first.usage.cache_write_tokens, first.usage.cache_write_1h_tokens, first.usage.cache_write_5m_tokens) == (
        3300, 3200, 100)
    # Sonnet 4.5: $3 input -> 1h write $6, 5m write $3.75, output $15 per MTok.
    assert first.usage.cost == (20 * Decimal(3) + 3200 * Decimal(6) + 100 * Decimal("3.75") + 5 * Decimal(15)) / 10**6

    conversation += [first.messages[0], Message.user("second question")]
    second = await backend.generate(_request(*conversation, tools=[WEATHER]))
    assert second.usage.cache_read_tokens == 3300 and second.usage.input_tokens == 25
    assert second.usage.prompt_tokens == 25 + 3300 + 60  # input excludes cache reads: nothing counted twice
    ledger = backend.cache_ledger
    assert ledger.requests == 2 and ledger.cache_read_tokens == 3300
    assert 0.45 < ledger.hit_rate < 0.5  # 3300 of 6705 prompt tokens over both requests
    assert ledger.predicted_read_tokens > 3000  # the planner expected the second request to hit


async def test_prompt_below_the_minimum_is_not_marked_and_warns(server: FakeServer) -> None:
    server.queue(_usage_reply())
    backend = _backend(server, model="claude-opus-4-6", cache=CachePolicy())
    await backend.generate(_request(Message.system("short"), Message.user("hi")))
    assert "cache_control" not in str(server.requests[0].body)
    assert any("below the model's minimum cacheable length (4096)" in w for w in backend.cache_ledger.warnings)


async def test_429_with_retry_after_is_retried(server: FakeServer) -> None:
    error = {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens exceeded"}}
    server.queue(Reply(429, error, headers={"retry-after": "0", "request-id": "req_011"}), _usage_reply())
    response = await _backend(server).generate(_request(Message.user("hi")))
    assert response.messages[0].text == "ok" and len(server.requests) == 2

    server.queue(*[Reply(429, error, headers={"retry-after": "0", "request-id": "req_012"})] * 2)
    with pytest.raises(RateLimitError) as info:
        await _backend(server, max_retries=1).generate(_request(Message.user("hi")))
    assert info.value.status_code == 429 and info.value.retryable and info.value.request_id == "req_012"
    assert info.value.retry_after == 0.0 and "rate_limit_error" in str(info.value)


async def test_529_overloaded(server: FakeServer) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.queue(Reply(529, overloaded), _usage_reply())
    assert (await _backend(server).generate(_request(Message.user("x")))).messages[0].text == "ok"
    server.queue(Reply(529, overloaded))
    with pytest.raises(OverloadedError) as info:
        await _backend(server, max_retries=0).generate(_request(Message.user("x")))
    assert info.value.status_code == 529 and info.value.retryable


async def test_400_is_not_retried_and_keeps_the_error_body(server: FakeServer) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error",
                                       "message": "messages.1: `tool_use` ids were found without `tool_result`"}}
    server.queue(Reply(400, body, headers={"request-id": "req_400"}))
    with pytest.raises(BadRequestError) as info:
        await _backend(server).generate(_request(Message.user("x")))
    assert len(server.requests) == 1 and not info.value.retryable
    assert info.value.request_id == "req_400" and "tool_result" in str(info.value) and info.value.body == body


async def test_stream_cut_midway_raises_after_an_error_event(server: FakeServer) -> None:
    server.queue(Reply(sse=STREAM, cut_after=8))
    seen: list[Any] = []
    with pytest.raises(StreamInterruptedError) as info:
        async for event in _backend(server).stream(_request(Message.user("x"))):
            seen.append(event)
    assert "Hello" in "".join(e.text for e in seen if isinstance(e, TextDelta))
    assert isinstance(seen[-1], ErrorEvent) and seen[-1].code == "stream_interrupted"
    assert info.value.retryable and not any(isinstance(e, UsageEvent) for e in seen)


async def test_malformed_json_in_a_stream_event(server: FakeServer) -> None:
    server.queue(Reply(sse=[*STREAM[:3], 'event: content_block_delta\ndata: {"type": "content_block_delta", "ind']))
    with pytest.raises(MalformedStreamError):
        await _collect(_backend(server), _request(Message.user("x")))


async def test_error_event_inside_the_stream(server: FakeServer) -> None:
    error = sse_event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    server.queue(Reply(sse=[STREAM[0], error]))
    with pytest.raises(OverloadedError):
        await _collect(_backend(server), _request(Message.user("x")))


async def test_count_tokens(server: FakeServer) -> None:
    server.routes["/v1/messages/count_tokens"] = Reply(body={"input_tokens": 2095})
    assert await _backend(server).count_tokens(_request(Message.user("x"), tools=[WEATHER])) == 2095
    sent = server.requests[0].body
    assert "max_tokens" not in sent and sent["tools"][0]["name"] == "get_weather"


# -- reasoning mapping and validation (no request is sent) ----------------------------------------
def _body(model: str, **kwargs: Any) -> dict[str, Any]:
    backend = AnthropicBackend(model, api_key="k", max_tokens=1000)
    body, _, _ = backend.build_body(_request(Message.user("x"), **kwargs))
    return body


def test_adaptive_models_get_effort_and_reject_budgets() -> None:
    body = _body("claude-opus-4-8", reasoning=Reasoning(effort="medium"))
    assert body["thinking"] == {"type": "adaptive"} and body["output_config"] == {"effort": "medium"}
    with pytest.raises(ReasoningSettingError, match="rejects Reasoning.budget_tokens"):
        _body("claude-opus-4-8", reasoning=Reasoning(budget_tokens=4000))
    assert _body("claude-sonnet-4-6", reasoning=Reasoning(budget_tokens=2000))["thinking"]["type"] == "enabled"


@pytest.mark.parametrize(
    ("model", "kwargs", "match"),
    [
        (MODEL, {"reasoning": Reasoning(budget_tokens=512)}, "below the minimum 1024"),
        (MODEL, {"reasoning": Reasoning(budget_tokens=4000), "sampling": SamplingSettings(max_tokens=3000)},
         "must be below max_tokens=3000"),
        (MODEL, {"reasoning": Reasoning(effort="low"), "tool_choice": "required", "tools": [WEATHER]},
         "forces tool use"),
        (MODEL, {"reasoning": Reasoning(effort="low"), "tool_choice": NamedToolChoice("get_weather"),
                 "tools": [WEATHER]}, "forces tool use"),
        (MODEL, {"reasoning": Reasoning(effort="low"), "sampling": SamplingSettings(temperature=0.2)},
         "temperature=0.2"),
        ("claude-3-haiku-20240307", {"reasoning": Reasoning(effort="low")}, "no extended thinking"),
    ],
)
def test_rejected_reasoning_settings_name_the_setting(model: str, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ReasoningSettingError, match=match):
        _body(model, **kwargs)
    assert issubclass(ReasoningSettingError, ConfigurationError)


def test_tool_choice_output_schema_and_sampling() -> None:
    body = _body(MODEL, tools=[WEATHER], tool_choice=NamedToolChoice("get_weather"),
                 output_schema={"type": "object"}, sampling=SamplingSettings(temperature=0.3, stop=("END",)))
    assert body["tool_choice"] == {"type": "tool", "name": "get_weather"}
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    assert body["temperature"] == 0.3 and body["stop_sequences"] == ["END"]


def test_missing_api_key_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        AnthropicBackend(MODEL)._get_client()
    assert issubclass(StreamInterruptedError, ModelAPIError)


def test_parallel_tool_use_can_be_disabled() -> None:
    backend = AnthropicBackend(MODEL, api_key="k", parallel_tool_calls=False)
    body, _, _ = backend.build_body(_request(Message.user("x"), tools=[WEATHER]))
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


def test_a_zero_budget_means_no_thinking() -> None:
    assert "thinking" not in _body(MODEL, reasoning=Reasoning(budget_tokens=0))


def test_a_request_can_turn_parallel_tool_use_off_and_send_top_k() -> None:
    backend = AnthropicBackend(MODEL, api_key="k")  # parallel on by default
    request = _request(Message.user("x"), tools=[WEATHER], parallel_tool_calls=False,
                       sampling=SamplingSettings(top_k=5))
    body, _, _ = backend.build_body(request)
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True} and body["top_k"] == 5
