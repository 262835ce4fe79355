"""`POST /v1/responses` over a fast fake engine, through the official `openai` client and raw HTTP on 127.0.0.1:
plain and streamed answers (the documented event sequence), function calls and their outputs as items,
`store` / `previous_response_id` per tenant, and awkward requests answered 4xx naming the field, never 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer, TenantRegistry
from tests.sdk.server.conftest import serve

TOOL_REPLY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def client(server: BackgroundServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0, timeout=20)


def prompt_text(engine: FakeEngine) -> str:
    text: str = engine.tokenizer.decode(engine.last.prompt_ids)
    return text


@pytest.fixture
def stored_server(fake_engine: FakeEngine) -> Iterator[BackgroundServer]:
    keys = TenantRegistry({"key-a": "acme", "key-b": "globex"})
    with serve(fake_engine, tenants=keys, responses_store=":memory:") as server:
        yield server


# -- answers -----------------------------------------------------------------------------------------
def test_text_input_gets_a_response_object_with_usage(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    reply = client(fake_server).responses.create(model="test-model", input="hi", instructions="Be brief.")
    assert reply.output_text == fake_engine.replies and reply.status == "completed"
    assert reply.id.startswith("resp_") and reply.output[0].type == "message"
    assert reply.usage is not None and reply.usage.input_tokens == len(fake_engine.last.prompt_ids)
    assert reply.usage.output_tokens > 0 and reply.usage.input_tokens_details.cached_tokens == 0
    assert reply.store is False  # this server keeps nothing unless given a store
    assert prompt_text(fake_engine).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    again = client(fake_server).responses.create(model="test-model", input="hi", instructions="Be brief.")
    assert again.usage is not None and again.usage.input_tokens_details.cached_tokens > 0


def test_the_token_limit_gives_an_incomplete_response(fake_server: BackgroundServer) -> None:
    reply = client(fake_server).responses.create(model="test-model", input="hi", max_output_tokens=3)
    assert reply.status == "incomplete" and reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens" and reply.output_text == "Hel"


def test_streaming_follows_the_documented_event_sequence(fake_server: BackgroundServer) -> None:
    events = list(client(fake_server).responses.create(model="test-model", input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == deltas == "Hello from the fake engine."
    assert final.usage is not None and final.usage.total_tokens > 0


def test_a_function_call_comes_back_as_an_item_and_its_output_continues_the_turn(fake_engine: FakeEngine) -> None:
    fake_engine.replies = [TOOL_REPLY, "It is sunny."]
    with serve(fake_engine) as server:
        oa = client(server)
        first = oa.responses.create(model="test-model", input="Weather in Paris?", tools=[WEATHER])  # type: ignore[list-item]
        call = first.output[0]
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"}
        items: Any = [{"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True),
                 {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
        second = oa.responses.create(model="test-model", input=items, tools=[WEATHER])  # type: ignore[list-item]
    assert second.output_text == "It is sunny."
    assert "sunny, 21 C" in prompt_text(fake_engine) and "get_weather" in prompt_text(fake_engine)


def test_a_streamed_function_call_sends_argument_deltas(fake_engine: FakeEngine) -> None:
    fake_engine.replies = TOOL_REPLY
    with serve(fake_engine) as server:
        events = list(client(server).responses.create(model="test-model", input="Paris?", tools=[WEATHER],  # type: ignore[list-item]
                                                      stream=True))
    kinds = [e.type for e in events]
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.arguments == ""  # type: ignore[union-attr]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")  # type: ignore[union-attr]
    assert json.loads(done.arguments) == json.loads(streamed) == {"city": "Paris"}  # type: ignore[union-attr]
    assert kinds[-2:] == ["response.output_item.done", "response.completed"]
    assert events[-1].response.output[0].call_id == added.item.call_id  # type: ignore[union-attr]


# -- store and previous_response_id ----------------------------------------------------------------------
def test_previous_response_id_continues_a_stored_conversation_per_tenant(
    stored_server: BackgroundServer, fake_engine: FakeEngine
) -> None:
    acme = client(stored_server, "key-a")
    first = acme.responses.create(model="test-model", input="My name is Ann.", instructions="Be brief.")
    assert first.store is True
    second = acme.responses.create(model="test-model", input="What is my name?", previous_response_id=first.id)
    prompt = prompt_text(fake_engine)
    assert "My name is Ann." in prompt and "What is my name?" in prompt and fake_engine.replies in prompt
    assert "Be brief." not in prompt  # instructions are not carried over (OpenAI's rule)
    assert second.previous_response_id == first.id
    assert acme.responses.retrieve(first.id).output_text == first.output_text
    globex = client(stored_server, "key-b")
    with pytest.raises(openai.NotFoundError):
        globex.responses.retrieve(first.id)  # another tenant's response does not exist for it
    with pytest.raises(openai.BadRequestError) as info:
        globex.responses.create(model="test-model", input="x", previous_response_id=first.id)
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    acme.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        acme.responses.retrieve(first.id)


def test_store_false_keeps_nothing(stored_server: BackgroundServer) -> None:
    acme = client(stored_server, "key-a")
    reply = acme.responses.create(model="test-model", input="hi", store=False)
    assert reply.store is False
    with pytest.raises(openai.NotFoundError):
        acme.responses.retrieve(reply.id)


def test_the_documented_shape_validates_as_the_clients_own_type(fake_server: BackgroundServer) -> None:
    raw = httpx.post(fake_server.base_url + "/v1/responses", json={"model": "test-model", "input": "hi"}, timeout=20)
    body = raw.json()
    Response.model_validate(body)
    assert body["object"] == "response" and body["output"][0]["content"][0]["annotations"] == []
    assert body["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}


# -- awkward requests: 4xx naming the field, never 5xx ---------------------------------------------------
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
       "RU5ErkJggg==")
USER_ITEM = {"role": "user", "content": "hi"}

AWKWARD: list[tuple[str, dict[str, Any], int, str | None]] = [
    ("no input", {}, 400, "input"),
    ("empty input list", {"input": []}, 400, "input"),
    ("input a number", {"input": 5}, 400, "input"),
    ("unknown item type", {"input": [USER_ITEM, {"type": "computer_call_output", "call_id": "c"}]}, 400, "input[1]"),
    ("item not an object", {"input": ["hi"]}, 400, "input[0]"),
    ("function_call_output without call_id", {"input": [{"type": "function_call_output", "output": "x"}]}, 400,
     "input[0].call_id"),
    ("unknown content part", {"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, 400,
     "input[0].content[0]"),
    ("an image for a text-only model",
     {"input": [USER_ITEM, {"role": "user", "content": [{"type": "input_image", "image_url": PNG}]}]}, 400,
     "input[1].content[0]"),
    ("hosted tool", {"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ("tool_choice names a missing tool", {"input": "hi", "tools": [WEATHER],
                                          "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice"),
    ("forced call with a format", {"input": "hi", "tools": [WEATHER], "tool_choice": "required",
                                   "text": {"format": {"type": "json_object"}}}, 400, "text.format"),
    ("json_schema without schema", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400,
     "text.format.schema"),
    ("max_output_tokens zero", {"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ("max_output_tokens past the context", {"input": "hi", "max_output_tokens": 5000}, 400, "max_output_tokens"),
    ("oversized input", {"input": "x" * 3000}, 400, "input"),
    ("unknown reasoning effort", {"input": "hi", "reasoning": {"effort": "extreme"}}, 400, "reasoning.effort"),
    ("truncation auto", {"input": "hi", "truncation": "auto"}, 400, "truncation"),
    ("background", {"input": "hi", "background": True}, 400, "background"),
    ("unknown include", {"input": "hi", "include": ["file_search_call.results"]}, 400, "include[0]"),
    ("misspelt field", {"input": "hi", "max_tokens": 5}, 400, "max_tokens"),
    ("previous_response_id without a store", {"input": "hi", "previous_response_id": "resp_1"}, 400,
     "previous_response_id"),
    ("wrong model", {"input": "hi", "model": "gpt-9"}, 404, "model"),
]


@pytest.fixture(scope="module")
def battery() -> Iterator[tuple[BackgroundServer, FakeEngine]]:
    engine = FakeEngine()
    with serve(engine) as server:
        yield server, engine


@pytest.mark.parametrize(("case", "fields", "status", "param"), AWKWARD, ids=[c[0] for c in AWKWARD])
def test_awkward_requests_are_refused_naming_the_field(
    battery: tuple[BackgroundServer, FakeEngine], case: str, fields: dict[str, Any], status: int, param: str | None
) -> None:
    server, engine = battery
    body = {"model": "test-model", **fields}
    response = httpx.post(server.base_url + "/v1/responses", json=body, timeout=20)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    assert engine.submissions == []


def test_unknown_response_ids_are_404s(stored_server: BackgroundServer, fake_server: BackgroundServer) -> None:
    for server, key in ((stored_server, "key-a"), (fake_server, "unused")):
        for method in ("GET", "DELETE"):
            response = httpx.request(method, server.base_url + "/v1/responses/resp_nope",
                                     headers={"authorization": f"Bearer {key}"}, timeout=20)
            assert response.status_code == 404 and response.json()["error"]["param"] == "response_id"
    with pytest.raises(openai.BadRequestError) as info:
        client(stored_server, "key-a").responses.create(model="test-model", input="x", previous_response_id="resp_no")
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_reasoning_comes_back_as_a_reasoning_item_before_the_message(fake_engine: FakeEngine) -> None:
    fake_engine.replies = "Two and two.\n</think>\n\nFour."
    with serve(fake_engine) as server:
        oa = client(server)
        reply = oa.responses.create(model="test-model", input="2+2?", reasoning={"effort": "low"})
        events = list(oa.responses.create(model="test-model", input="2+2?", reasoning={"effort": "low"}, stream=True))
    kinds = [item.type for item in reply.output]
    assert kinds == ["reasoning", "message"] and reply.output_text == "Four."
    assert reply.output[0].content[0].text.strip() == "Two and two."  # type: ignore[union-attr,index]
    assert fake_engine.last.prompt_ids[-3:] == fake_engine.tokenizer.encode("<think>\n")[-3:]
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")  # type: ignore[union-attr]
    assert streamed.strip() == "Two and two."
    final = events[-1].response  # type: ignore[union-attr]
    assert [i.type for i in final.output] == kinds and final.output_text == "Four."


def test_a_turn_dropped_mid_stream_ends_with_error_and_response_failed(fake_engine: FakeEngine) -> None:
    fake_engine.drop_after = 3
    with serve(fake_engine) as server:
        events = list(client(server).responses.create(model="test-model", input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-2:] == ["error", "response.failed"]
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.status == "failed" and failed.error is not None and "dropped" in failed.error.message
    assert failed.error.code == "server_error"  # one of the codes the client's type documents
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_file_store_outlives_the_server(tmp_path: Any) -> None:
    path = str(tmp_path / "responses.db")
    with serve(FakeEngine("first"), responses_store=path) as server:
        first = client(server).responses.create(model="test-model", input="remember me")
    engine = FakeEngine("second")
    with serve(engine, responses_store=path) as server:
        again = client(server).responses.create(model="test-model", input="and now?", previous_response_id=first.id)
    assert again.output_text == "second" and "remember me" in prompt_text(engine) and "first" in prompt_text(engine)
