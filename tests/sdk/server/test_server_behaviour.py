"""The server's behaviour over a fast fake engine, through the official clients and raw HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from parley.local_engine.errors import AdmissionError, DeadlineUnreachableError, QueueFullError
from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer
from parley.server.metrics import parse_exposition
from tests.sdk.server.conftest import serve

USER = [{"role": "user", "content": "hi"}]
TOOL_REPLY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def oa_client(server: BackgroundServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0, timeout=20)


def an_client(server: BackgroundServer, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0, timeout=20)


def sse_lines(response: httpx.Response) -> list[str]:
    return [line for line in response.text.split("\n") if line.startswith("data: ")]


# -- OpenAI ----------------------------------------------------------------------------------------
def test_openai_chat_returns_the_reply_and_usage(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    reply = oa_client(fake_server).chat.completions.create(model="test-model", messages=USER, max_tokens=64)
    assert reply.choices[0].message.content == fake_engine.replies
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(fake_engine.last.prompt_ids)
    assert reply.usage.completion_tokens == len(fake_engine.replies)  # the fake reports no end token
    assert reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_openai_max_tokens_gives_finish_reason_length(fake_server: BackgroundServer) -> None:
    reply = oa_client(fake_server).chat.completions.create(model="test-model", messages=USER, max_tokens=3)
    assert reply.choices[0].message.content == "Hel"
    assert reply.choices[0].finish_reason == "length"


def test_openai_stream_ends_with_usage_chunk_then_done(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    body = {"model": "test-model", "messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    response = httpx.post(fake_server.base_url + "/v1/chat/completions", json=body, timeout=20)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    lines = sse_lines(response)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == fake_engine.replies
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])


def test_openai_stream_through_the_client(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    stream = oa_client(fake_server).chat.completions.create(
        model="test-model", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == fake_engine.replies
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0


def test_openai_tool_call_is_parsed_and_streams_by_index() -> None:
    engine = FakeEngine(TOOL_REPLY)
    with serve(engine) as server:
        client = oa_client(server)
        reply = client.chat.completions.create(model="test-model", messages=USER, tools=[WEATHER])  # type: ignore[list-item]
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls"
        assert message.tool_calls is not None and len(message.tool_calls) == 1
        call = message.tool_calls[0]
        assert call.function.name == "get_weather"  # type: ignore[union-attr]
        assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
        # round trip: the call and its result go back in
        follow = client.chat.completions.create(
            model="test-model",
            tools=[WEATHER],  # type: ignore[list-item]
            messages=[
                *USER,
                message.model_dump(exclude_none=True),  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'},
            ],
        )
        assert follow.choices[0].finish_reason == "tool_calls"
        assert follow.choices[0].message.tool_calls[0].id != call.id  # type: ignore[index]  # ids never repeat
        stream = client.chat.completions.create(model="test-model", messages=USER, tools=[WEATHER], stream=True)  # type: ignore[list-item]
        parts: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in stream:
            for delta in chunk.choices[0].delta.tool_calls or []:
                entry = parts.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += delta.id or ""
                entry["name"] += (delta.function.name or "") if delta.function else ""
                entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls"
        assert parts[0]["name"] == "get_weather" and json.loads(parts[0]["arguments"]) == {"city": "Paris"}


def test_openai_tool_choice_none_keeps_the_call_as_text() -> None:
    with serve(FakeEngine(TOOL_REPLY)) as server:
        reply = oa_client(server).chat.completions.create(
            model="test-model",
            messages=USER,
            tools=[WEATHER],
            tool_choice="none",  # type: ignore[list-item]
        )
        assert reply.choices[0].message.tool_calls is None
        assert "get_weather" in (reply.choices[0].message.content or "")


def test_stop_strings_cut_the_output_in_both_dialects() -> None:
    with serve(FakeEngine("one two STOP three")) as server:
        reply = oa_client(server).chat.completions.create(model="test-model", messages=USER, stop=["STOP"])
        assert reply.choices[0].message.content == "one two "
        assert reply.choices[0].finish_reason == "stop"
        message = an_client(server).messages.create(
            model="test-model",
            max_tokens=64,
            messages=USER,
            stop_sequences=["STOP"],  # type: ignore[list-item]
        )
        assert message.stop_reason == "stop_sequence" and message.stop_sequence == "STOP"
        assert message.content[0].text == "one two "  # type: ignore[union-attr]


# -- Anthropic -------------------------------------------------------------------------------------
ANTHROPIC_ORDER = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
]


def test_anthropic_message_and_usage(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    message = an_client(fake_server).messages.create(
        model="test-model",
        max_tokens=64,
        system="Be brief.",
        messages=USER,  # type: ignore[list-item]
    )
    assert message.content[0].type == "text" and message.content[0].text == fake_engine.replies
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == len(fake_engine.last.prompt_ids)
    assert message.usage.cache_read_input_tokens == 0
    assert message.usage.cache_creation_input_tokens == 0


def test_anthropic_stream_events_come_in_order(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    with an_client(fake_server).messages.stream(model="test-model", max_tokens=64, messages=USER) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    # the SDK adds its own synthetic `text` events; the wire order is what matters
    wire = [k for k in kinds if k in ANTHROPIC_ORDER]
    assert wire[0] == "message_start" and wire[-2:] == ["message_delta", "message_stop"]
    assert wire.index("content_block_start") < wire.index("content_block_delta") < wire.index("content_block_stop")
    assert final.content[0].text == fake_engine.replies  # type: ignore[union-attr]
    assert final.usage.output_tokens > 0


def test_anthropic_raw_stream_has_named_events(fake_server: BackgroundServer) -> None:
    body = {"model": "test-model", "max_tokens": 8, "messages": USER, "stream": True}
    response = httpx.post(fake_server.base_url + "/v1/messages", json=body, timeout=20)
    names = [line[7:] for line in response.text.split("\n") if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    deltas = [json.loads(line[6:]) for line in sse_lines(response)]
    message_delta = next(d for d in deltas if d["type"] == "message_delta")
    assert message_delta["delta"]["stop_reason"] == "max_tokens"
    assert set(message_delta["usage"]) >= {"input_tokens", "output_tokens", "cache_read_input_tokens"}


def test_anthropic_tool_use_round_trip() -> None:
    with serve(FakeEngine(TOOL_REPLY)) as server:
        client = an_client(server)
        tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER["function"]["parameters"]}]
        message = client.messages.create(model="test-model", max_tokens=128, messages=USER, tools=tools)  # type: ignore[arg-type]
        assert message.stop_reason == "tool_use"
        use = next(b for b in message.content if b.type == "tool_use")
        assert use.name == "get_weather" and use.input == {"city": "Paris"}  # type: ignore[union-attr]
        follow = client.messages.create(
            model="test-model",
            max_tokens=128,
            tools=tools,  # type: ignore[arg-type]
            messages=[
                *USER,  # type: ignore[list-item]
                {"role": "assistant", "content": message.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}]},  # type: ignore[union-attr]
            ],
        )
        assert follow.stop_reason == "tool_use"
        with client.messages.stream(model="test-model", max_tokens=128, messages=USER, tools=tools) as stream:  # type: ignore[arg-type]
            final = stream.get_final_message()
        assert final.content[-1].type == "tool_use" and final.content[-1].input == {"city": "Paris"}  # type: ignore[union-attr]


def test_anthropic_thinking_budget_is_enforced_by_the_hook() -> None:
    engine = FakeEngine("a" * 1500 + "Answer.")
    with serve(engine) as server:
        message = an_client(server).messages.create(
            model="test-model",
            max_tokens=1900,
            messages=USER,  # type: ignore[list-item]
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    thinking = next(b for b in message.content if b.type == "thinking")
    text = next(b for b in message.content if b.type == "text")
    assert thinking.thinking.strip() == "a" * 1024  # type: ignore[union-attr]  # exactly the budget, then forced end
    assert text.text.endswith("Answer.")  # type: ignore[union-attr]


# -- cancellation, admission, deadlines --------------------------------------------------------------
def test_client_disconnect_mid_stream_aborts_and_frees_blocks() -> None:
    engine = FakeEngine("x" * 2000, step_s=0.005)
    with serve(engine) as server:
        body = {"model": "test-model", "messages": USER, "stream": True, "max_tokens": 2000}
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=20) as response:
            seen = 0
            for line in response.iter_lines():
                seen += line.startswith("data: ")
                if seen >= 5:
                    assert engine.blocks_used > 0  # still streaming: the request holds its blocks
                    break
        deadline = time.monotonic() + 5
        while (engine.blocks_used or not engine.aborted) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.aborted, "the engine request was not aborted"
        assert engine.blocks_used == 0
        assert engine.stats()["num_running"] == 0


@pytest.mark.parametrize(
    ("refusal", "status", "anthropic_type"),
    [(QueueFullError, 429, "rate_limit_error"), (DeadlineUnreachableError, 503, "overloaded_error")],
)
def test_admission_refusal_is_immediate_with_retry_after(
    refusal: type[AdmissionError], status: int, anthropic_type: str
) -> None:
    engine = FakeEngine()
    engine.refuse = refusal("refused", retry_after_s=2.5)
    with serve(engine) as server:
        response = httpx.post(
            server.base_url + "/v1/chat/completions",
            json={"model": "test-model", "messages": USER, "stream": True},
            headers={"x-parley-deadline-s": "2"},
        )
        assert response.status_code == status
        assert response.headers["retry-after"] == "3"
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        response = httpx.post(
            server.base_url + "/v1/messages", json={"model": "test-model", "max_tokens": 4, "messages": USER}
        )
        assert response.status_code == status and response.json()["error"]["type"] == anthropic_type
        assert response.headers["retry-after"] == "3"
        metrics = parse_exposition(httpx.get(server.base_url + "/metrics").text)
        assert sum(v for k, v in metrics.items() if k.startswith("parley_requests_refused_total")) == 2


def test_deadline_reaches_the_engine_from_header_or_field(
    fake_server: BackgroundServer, fake_engine: FakeEngine
) -> None:
    url = fake_server.base_url + "/v1/chat/completions"
    httpx.post(url, json={"model": "test-model", "messages": USER}, headers={"x-parley-deadline-s": "2"})
    assert fake_engine.last.deadline_s is not None and 0 < fake_engine.last.deadline_s <= 2
    httpx.post(url, json={"model": "test-model", "messages": USER, "deadline_s": 1.5})
    assert fake_engine.last.deadline_s is not None and 0 < fake_engine.last.deadline_s <= 1.5
    bad = httpx.post(url, json={"model": "test-model", "messages": USER}, headers={"x-parley-deadline-s": "soon"})
    assert bad.status_code == 400


def test_server_concurrency_bound_refuses_with_429() -> None:
    engine = FakeEngine("y" * 400, step_s=0.01)
    with serve(engine, max_concurrent=1) as server:
        body = {"model": "test-model", "messages": USER, "stream": True, "max_tokens": 400}
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=20) as first:
            lines = first.iter_lines()  # keep the iterator alive: closing it closes the stream
            next(lines)
            second = httpx.post(server.base_url + "/v1/chat/completions", json=body)
            assert second.status_code == 429 and "retry-after" in second.headers


# -- tenants, auth ---------------------------------------------------------------------------------
PREFIX = "You are the support assistant of a company that sells very long system prompts. " * 3


def _cached(server: BackgroundServer, key: str, salt: str | None = None) -> int:
    body: dict[str, Any] = {"model": "test-model", "messages": [{"role": "system", "content": PREFIX}, *USER]}
    if salt is not None:
        body["cache_salt"] = salt
    response = httpx.post(
        server.base_url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200, response.text
    cached: int = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached


def test_tenants_share_a_prefix_only_within_themselves(tenant_server: BackgroundServer) -> None:
    assert _cached(tenant_server, "key-a1") == 0  # cold
    assert _cached(tenant_server, "key-b") == 0  # another tenant: never a hit
    assert _cached(tenant_server, "key-a2") > 0  # same tenant, other key: hit
    assert _cached(tenant_server, "key-b") > 0  # globex now warm for itself


def test_client_cache_salt_narrows_but_never_crosses_tenants(tenant_server: BackgroundServer) -> None:
    assert _cached(tenant_server, "key-a1", salt="s1") == 0
    assert _cached(tenant_server, "key-a2", salt="s1") > 0  # same tenant, same salt
    assert _cached(tenant_server, "key-a1", salt="s2") == 0  # same tenant, other salt
    assert _cached(tenant_server, "key-b", salt="s1") == 0  # the salt does not reach acme's cache


def test_api_keys_are_required_when_configured(tenant_server: BackgroundServer) -> None:
    url = tenant_server.base_url
    response = httpx.post(url + "/v1/chat/completions", json={"model": "test-model", "messages": USER})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    response = httpx.post(
        url + "/v1/messages",
        json={"model": "test-model", "max_tokens": 4, "messages": USER},
        headers={"x-api-key": "wrong"},
    )
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    ok = an_client(tenant_server, key="key-b").messages.create(model="test-model", max_tokens=4, messages=USER)  # type: ignore[list-item]
    assert ok.usage.output_tokens == 4
    with pytest.raises(openai.AuthenticationError):
        oa_client(tenant_server, key="nope").models.list()


# -- observability -----------------------------------------------------------------------------------
def test_models_health_and_metrics(fake_server: BackgroundServer) -> None:
    client = oa_client(fake_server)
    assert [m.id for m in client.models.list()] == ["test-model"]
    assert [m.id for m in an_client(fake_server).models.list()] == ["test-model"]  # Anthropic's shape
    client.chat.completions.create(model="test-model", messages=USER)
    health = httpx.get(fake_server.base_url + "/health").json()
    assert health["status"] == "ok"
    text = httpx.get(fake_server.base_url + "/metrics").text
    values = parse_exposition(text)
    assert values['parley_requests_total{endpoint="chat_completions",status="200"}'] == 1
    assert values['parley_requests_total{endpoint="models",status="200"}'] == 2
    assert values["parley_prefix_cache_queries_total"] > 0
    assert "parley_prefix_cache_hits_total" in values
    assert values["parley_queue_depth"] == 0
    assert values["parley_time_to_first_token_seconds_count"] == 1
    assert values["parley_time_per_output_token_seconds_count"] == 1
    assert values["parley_generation_tokens_total"] > 0
    assert "# TYPE parley_prefix_cache_hits_total counter" in text


class _BrokenEngine(FakeEngine):
    async def stream(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise RuntimeError("the GPU caught fire")
        yield  # pragma: no cover


def test_internal_fault_is_500_in_the_documented_shape() -> None:
    with serve(_BrokenEngine()) as server:
        response = httpx.post(server.base_url + "/v1/chat/completions", json={"model": "test-model", "messages": USER})
        assert response.status_code == 500
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        assert "fire" not in response.text  # internals stay in the log
        response = httpx.post(
            server.base_url + "/v1/messages", json={"model": "test-model", "max_tokens": 4, "messages": USER}
        )
        assert response.status_code == 500 and response.json()["error"]["type"] == "api_error"


def test_anthropic_thinking_stream_has_thinking_then_signature_then_text() -> None:
    with serve(FakeEngine("b" * 1100 + "Done.")) as server:
        body = {
            "model": "test-model",
            "max_tokens": 1500,
            "messages": USER,
            "stream": True,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
        response = httpx.post(server.base_url + "/v1/messages", json=body, timeout=30)
    events = [json.loads(line[6:]) for line in sse_lines(response)]
    shape = []
    for event in events:
        label = event["type"]
        if label == "content_block_start":
            label += ":" + event["content_block"]["type"]
        if label == "content_block_delta":
            label += ":" + event["delta"]["type"]
        if not shape or shape[-1] != label:
            shape.append(label)
    assert shape == [
        "message_start",
        "ping",
        "content_block_start:thinking",
        "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta",
        "content_block_stop",
        "content_block_start:text",
        "content_block_delta:text_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_count_tokens_matches_the_rendered_prompt(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    client = an_client(fake_server)
    counted = client.messages.count_tokens(model="test-model", system="Be brief.", messages=USER)  # type: ignore[arg-type]
    message = client.messages.create(model="test-model", max_tokens=2, system="Be brief.", messages=USER)  # type: ignore[arg-type]
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_non_streaming_request_is_aborted_when_the_client_gives_up() -> None:
    engine = FakeEngine("z" * 1000, step_s=0.01)
    with serve(engine) as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                server.base_url + "/v1/chat/completions",
                json={"model": "test-model", "messages": USER, "max_tokens": 1000},
                timeout=0.5,
            )
        deadline = time.monotonic() + 5
        while (engine.blocks_used or not engine.aborted) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.aborted and engine.blocks_used == 0


def test_a_deadline_that_passed_before_submission_is_503(fake_server: BackgroundServer) -> None:
    response = httpx.post(
        fake_server.base_url + "/v1/chat/completions",
        json={"model": "test-model", "messages": USER},
        headers={"x-parley-deadline-s": "0.000001"},
    )
    assert response.status_code == 503 and "retry-after" in response.headers
    assert response.json()["error"]["code"] == "deadline_unreachable"


def test_a_request_dropped_past_its_deadline_ends_cleanly() -> None:
    engine = FakeEngine("w" * 100)
    engine.drop_after = 5
    with serve(engine) as server:
        body = {"model": "test-model", "messages": USER, "deadline_s": 30}
        response = httpx.post(server.base_url + "/v1/chat/completions", json=body)
        assert response.status_code == 503 and response.json()["error"]["type"] == "server_overloaded"
        response = httpx.post(server.base_url + "/v1/chat/completions", json={**body, "stream": True})
        lines = sse_lines(response)
        assert lines[-1] == "data: [DONE]"
        assert "error" in json.loads(lines[-2][6:])  # the stream says why it ended, in the OpenAI error shape
        response = httpx.post(
            server.base_url + "/v1/messages",
            json={"model": "test-model", "max_tokens": 50, "messages": USER, "stream": True},
        )
        names = [line[7:] for line in response.text.split("\n") if line.startswith("event: ")]
        assert names[-1] == "error" and "message_stop" not in names
        assert engine.blocks_used == 0


def test_metrics_show_the_decode_thread_count_chosen_per_batch_bucket() -> None:
    from parley.server.metrics import Metrics

    values = parse_exposition(Metrics(lambda: {"decode_threads": {1: 2, 4: 1}, "steps": 7}).render())
    assert values['parley_engine_decode_threads{batch_bucket="1"}'] == 2
    assert values['parley_engine_decode_threads{batch_bucket="4"}'] == 1
    assert values["parley_engine_steps"] == 7
