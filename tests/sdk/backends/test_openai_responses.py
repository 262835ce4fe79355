"""`OpenAIBackend(api="responses")` against a local server replaying documented Responses API shapes."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from parley import Agent, tool
from parley.backends import FallbackBackend
from parley.backends.base import ModelRequest, NamedToolChoice, SamplingSettings
from parley.backends.errors import (
    BadRequestError,
    MalformedStreamError,
    RateLimitError,
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
    TextDelta,
    ToolCallEnd,
    ToolSpec,
    UsageEvent,
)
from parley.reasoning import Reasoning
from tests.protocol.responses_shapes import (
    CALL_ITEM,
    ENCRYPTED,
    REASONING_ITEM,
    STREAMED_FINAL,
    STREAMED_REASONING,
    message_item,
    response,
    stream_events,
    usage,
)
from tests.sdk.backends.fake_server import FakeServer, Reply, sse_event

WEATHER = ToolSpec(name="get_weather", description="Get the weather",
                   parameters={"type": "object", "properties": {"location": {"type": "string"}}})


def _backend(server: FakeServer, model: str = "o4-mini", **kwargs: Any) -> OpenAIBackend:
    kwargs.setdefault("retry_base_delay", 0.0)
    kwargs.setdefault("api_key", "sk-test")
    return OpenAIBackend(model, base_url=f"{server.url}/v1", api="responses", **kwargs)


def _request(*messages: Message, **kwargs: Any) -> ModelRequest:
    return ModelRequest(conversation=Conversation(messages=list(messages)), **kwargs)


def _sse(events: list[dict[str, Any]]) -> list[str]:
    return [sse_event(event["type"], event) for event in events]


@tool
def get_weather(location: str) -> str:
    """The weather in a city."""
    return f"18 C and sunny in {location}"


async def test_agent_tool_loop_sends_the_encrypted_reasoning_back_unchanged(server: FakeServer) -> None:
    server.queue(Reply(body=response([REASONING_ITEM, CALL_ITEM])),
                 Reply(body=response([message_item("It is 18 C and sunny in Paris.")], response_id="resp_2",
                                     counts=usage(input_tokens=2100, cached=2048, output=20, reasoning=0))))
    agent = Agent(_backend(server), instructions="Be brief.", tools=[get_weather], reasoning=Reasoning(effort="low"))
    result = await agent.run("Weather in Paris?")
    assert result.output == "It is 18 C and sunny in Paris."

    first, second = (r.body for r in server.requests)
    assert [r.path for r in server.requests] == ["/v1/responses", "/v1/responses"]
    assert server.requests[0].headers["authorization"] == "Bearer sk-test"
    assert first["store"] is False and first["include"] == ["reasoning.encrypted_content"]
    assert first["reasoning"] == {"effort": "low"} and first["model"] == "o4-mini"
    assert first["tools"][0] == {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                                 "parameters": first["tools"][0]["parameters"], "strict": False}
    assert first["input"][0] == {"type": "message", "role": "system", "content": "Be brief."}
    assert first["input"][1] == {"type": "message", "role": "user", "content": "Weather in Paris?"}
    # the second request replays the first response's items: reasoning (unchanged), call, then its output
    reasoning, call, output = second["input"][2:]
    assert reasoning == REASONING_ITEM
    assert call == {"type": "function_call", "call_id": CALL_ITEM["call_id"], "name": "get_weather",
                    "arguments": CALL_ITEM["arguments"]}
    assert output == {"type": "function_call_output", "call_id": CALL_ITEM["call_id"],
                      "output": "18 C and sunny in Paris, France"}
    assert "previous_response_id" not in second

    # usage: input_tokens include the cached ones; normalised without double counting
    total = result.usage
    assert total.requests == 2
    assert total.cache_read_tokens == 1920 + 2048
    assert total.input_tokens == (2006 - 1920) + (2100 - 2048)
    assert total.prompt_tokens == 2006 + 2100
    assert total.output_tokens == 320 and total.reasoning_tokens == 256
    per_mtok = (Decimal("1.10") * total.input_tokens + Decimal("0.275") * total.cache_read_tokens
                + Decimal("4.40") * total.output_tokens)
    assert total.cost == per_mtok / 10**6
    assert result.state.usage.raw[0]["input_tokens_details"] == {"cached_tokens": 1920}


async def test_stream_deltas_usage_and_reasoning_round_trip(server: FakeServer) -> None:
    server.queue(Reply(sse=_sse(stream_events(STREAMED_FINAL))))
    backend = _backend(server)
    request = _request(Message.user("Weather in Paris?"), tools=[WEATHER])
    events = [e async for e in backend.stream(request)]
    assert server.requests[0].body["stream"] is True
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Need the weather.\n\nCall it."
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Let me check."
    [end] = [e for e in events if isinstance(e, ToolCallEnd)]
    assert end.call.id == CALL_ITEM["call_id"] and end.call.parsed_arguments() == {"location": "Paris, France"}
    [done] = [e for e in events if isinstance(e, MessageEnd)]
    assert done.finish_reason == "tool_calls"
    assert isinstance(events[-1], UsageEvent)
    streamed_usage = events[-1].usage
    assert streamed_usage.input_tokens == 86 and streamed_usage.cache_read_tokens == 1920
    assert streamed_usage.output_tokens == 300 and streamed_usage.reasoning_tokens == 256
    assert backend.cache_ledger.cache_read_tokens == 1920 and backend.cache_ledger.prompt_tokens == 2006

    server.queue(Reply(body=response([message_item("Sunny.")])))
    request.conversation.append(done.message)
    request.conversation.append(Message.tool(end.call.id, "get_weather", "18 C"))
    await backend.generate(request)
    sent = server.requests[1].body["input"]
    # id and encrypted content unchanged; a multi-part summary goes back as one part with the same text
    assert {k: sent[1][k] for k in ("type", "id", "encrypted_content")} == \
        {k: STREAMED_REASONING[k] for k in ("type", "id", "encrypted_content")}
    assert sent[1]["summary"] == [{"type": "summary_text", "text": "Need the weather.\n\nCall it."}]
    assert [i["type"] for i in sent] == ["message", "reasoning", "message", "function_call", "function_call_output"]


async def test_request_settings(server: FakeServer) -> None:
    server.queue(Reply(body=response([message_item("{\"city\": \"Paris\"}")])))
    backend = _backend(server, reasoning_summary="auto", parallel_tool_calls=False)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    request = _request(Message.developer("JSON only."), Message.user("x"), tools=[WEATHER],
                       tool_choice=NamedToolChoice("get_weather"), output_schema=schema, tenant="user-42",
                       cache=CachePolicy(prompt_cache_key="conv-7"), reasoning=Reasoning(effort="high"),
                       sampling=SamplingSettings(max_tokens=300, temperature=0.2, seed=7, top_k=5))
    await backend.generate(request)
    body = server.requests[0].body
    assert body["input"][0]["role"] == "developer"
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"} and body["parallel_tool_calls"] is False
    assert body["text"]["format"]["type"] == "json_schema" and body["text"]["format"]["strict"] is True
    assert body["text"]["format"]["schema"]["additionalProperties"] is False
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert body["max_output_tokens"] == 300 and body["temperature"] == 0.2
    assert "seed" not in body and "top_k" not in body and "max_completion_tokens" not in body
    assert body["safety_identifier"] == "user-42" and body["prompt_cache_key"] == "conv-7"
    with pytest.raises(ConfigurationError, match="stop"):
        await backend.generate(_request(Message.user("x"), sampling=SamplingSettings(stop=("END",))))


async def test_non_reasoning_models_do_not_ask_for_encrypted_reasoning(server: FakeServer) -> None:
    server.queue(Reply(body=response([message_item("Hi.")], model="gpt-4.1-2025-04-14")))
    result = await _backend(server, "gpt-4.1").generate(_request(Message.user("hi")))
    assert result.messages[0].text == "Hi." and result.model == "gpt-4.1-2025-04-14"
    assert "include" not in server.requests[0].body and "reasoning" not in server.requests[0].body


async def test_previous_response_id_sends_only_the_new_items(server: FakeServer) -> None:
    server.queue(Reply(body=response([REASONING_ITEM, CALL_ITEM], response_id="resp_1")),
                 Reply(body=response([message_item("Sunny.")], response_id="resp_2")),
                 Reply(body=response([message_item("Still sunny.")], response_id="resp_3")))
    backend = _backend(server, previous_response_id=True)
    agent = Agent(backend, tools=[get_weather])
    result = await agent.run("Weather in Paris?")
    first, second = (r.body for r in server.requests)
    assert first["store"] is True and "include" not in first and "previous_response_id" not in first
    assert second["previous_response_id"] == "resp_1"
    assert second["input"] == [{"type": "function_call_output", "call_id": CALL_ITEM["call_id"],
                                "output": "18 C and sunny in Paris, France"}]
    # a new user turn on the same history chains onto the last response
    await agent.run("And tomorrow?", state=result.state)
    third = server.requests[2].body
    assert third["previous_response_id"] == "resp_2"
    assert third["input"] == [{"type": "message", "role": "user", "content": "And tomorrow?"}]
    with pytest.raises(ConfigurationError, match="store"):
        OpenAIBackend("o4-mini", api="responses", previous_response_id=True, store=False)
    with pytest.raises(ConfigurationError, match="api"):
        OpenAIBackend("o4-mini", api="assistants")  # type: ignore[arg-type]


async def test_an_edited_history_is_sent_whole(server: FakeServer) -> None:
    server.queue(Reply(body=response([message_item("A.")], response_id="resp_1")),
                 Reply(body=response([message_item("B.")], response_id="resp_2")))
    backend = _backend(server, previous_response_id=True)
    one = _request(Message.user("first"))
    answer = (await backend.generate(one)).messages[0]
    edited = _request(Message.user("first, edited"), answer, Message.user("second"))
    await backend.generate(edited)
    body = server.requests[1].body
    assert "previous_response_id" not in body and len(body["input"]) == 3


ERROR_400 = {"error": {"message": "Invalid 'input[2].call_id': no function call found.",
                       "type": "invalid_request_error", "param": "input", "code": None}}
ERROR_429 = {"error": {"message": "Rate limit reached for o4-mini", "type": "requests",
                       "param": None, "code": "rate_limit_exceeded"}}
ERROR_500 = {"error": {"message": "The server had an error processing your request.", "type": "server_error",
                       "param": None, "code": None}}


async def test_http_errors_are_mapped_like_chat_completions(server: FakeServer) -> None:
    server.queue(Reply(400, ERROR_400, headers={"x-request-id": "req_400"}))
    with pytest.raises(BadRequestError, match="call_id") as bad:
        await _backend(server).generate(_request(Message.user("x")))
    assert bad.value.status_code == 400 and not bad.value.retryable and bad.value.request_id == "req_400"
    assert len(server.requests) == 1  # never retried

    server.queue(Reply(429, ERROR_429, headers={"retry-after": "0"}), Reply(body=response([message_item("ok")])))
    assert (await _backend(server).generate(_request(Message.user("x")))).messages[0].text == "ok"
    server.queue(Reply(429, ERROR_429, headers={"retry-after-ms": "5"}))
    with pytest.raises(RateLimitError) as limited:
        await _backend(server, max_retries=0).generate(_request(Message.user("x")))
    assert limited.value.retry_after == 0.005 and limited.value.retryable

    server.queue(Reply(500, ERROR_500), Reply(body=response([message_item("recovered")])))
    assert (await _backend(server, max_retries=1).generate(_request(Message.user("x")))).messages[0].text == \
        "recovered"
    server.queue(Reply(500, ERROR_500))
    with pytest.raises(ServerError):
        await _backend(server, max_retries=0).generate(_request(Message.user("x")))
    assert all(r.path == "/v1/responses" for r in server.requests)


async def test_a_failed_response_in_a_200_answer_is_a_typed_error(server: FakeServer) -> None:
    failed = {**response([]), "status": "failed", "error": {"code": "server_error", "message": "model crashed"}}
    server.queue(Reply(body=failed))
    with pytest.raises(ServerError, match="model crashed"):
        await _backend(server).generate(_request(Message.user("x")))


async def test_stream_errors(server: FakeServer) -> None:
    created = stream_events(STREAMED_FINAL)[:2]
    failed = {"type": "response.failed", "sequence_number": 2,
              "response": {**response([]), "status": "failed",
                           "error": {"code": "rate_limit_exceeded", "message": "Rate limit reached"}}}
    server.queue(Reply(sse=_sse([*created, failed])))
    seen: list[Any] = []
    with pytest.raises(RateLimitError):
        async for event in _backend(server).stream(_request(Message.user("x"))):
            seen.append(event)
    assert isinstance(seen[-1], ErrorEvent) and seen[-1].code == "api_error"

    server.queue(Reply(sse=_sse([*created, {"type": "error", "code": "context_length_exceeded", "param": "input",
                                           "message": "Your input exceeds the context window of this model."}])))
    with pytest.raises(BadRequestError, match="context window"):
        [e async for e in _backend(server).stream(_request(Message.user("x")))]

    server.queue(Reply(sse=_sse(stream_events(STREAMED_FINAL)), cut_after=6))
    seen = []
    with pytest.raises(StreamInterruptedError):
        async for event in _backend(server).stream(_request(Message.user("x"))):
            seen.append(event)
    assert not any(isinstance(e, (MessageEnd, UsageEvent)) for e in seen)

    server.queue(Reply(sse=[*_sse(created), "event: response.output_text.delta\ndata: {\"type\": \"resp"]))
    with pytest.raises(MalformedStreamError):
        [e async for e in _backend(server).stream(_request(Message.user("x")))]


async def test_context_length_stream_error_falls_back_to_another_backend(server: FakeServer) -> None:
    error = {"type": "error", "code": "context_length_exceeded", "param": "input",
             "message": "Your input exceeds the context window of this model."}
    server.queue(Reply(sse=_sse([*stream_events(STREAMED_FINAL)[:2], error])),
                 Reply(sse=_sse(stream_events(STREAMED_FINAL))))
    small, large = _backend(server, "o4-mini"), _backend(server, "gpt-5")
    backend = FallbackBackend([small, large])
    events = [e async for e in backend.stream(_request(Message.user("x")))]
    assert [r.body["model"] for r in server.requests] == ["o4-mini", "gpt-5"]
    assert not any(isinstance(e, ErrorEvent) for e in events)
    usage_event = events[-1]
    assert isinstance(usage_event, UsageEvent) and usage_event.usage.raw[0]["served_by"] == "openai:gpt-5"
    assert json.dumps(server.requests[1].body["input"]) == json.dumps(server.requests[0].body["input"])
    assert ENCRYPTED not in json.dumps(server.requests[0].body)
