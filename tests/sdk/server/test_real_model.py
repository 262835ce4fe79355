"""End to end with the embedded SmolLM2 on the real engine, through the official OpenAI and Anthropic clients.

One engine is shared by every test here (loading costs seconds); outputs are kept short.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from parley.server import BackgroundServer, ServerConfig, TenantRegistry, create_app

pytestmark = pytest.mark.model

SYSTEM = "You are a helpful assistant. Answer briefly."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from parley.local_engine import Engine

    engine = Engine.from_pretrained()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(engine, config=ServerConfig(model_name="smollm2"))) as server:
        yield server


@pytest.fixture(scope="module")
def oa(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="local", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def an(server: BackgroundServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="local", max_retries=0, timeout=120)


def _wait_for_free_blocks(engine: Any, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    stats: dict[str, Any] = engine.stats()
    while (stats["blocks_used"] or stats["num_running"]) and time.monotonic() < deadline:
        time.sleep(0.02)
        stats = engine.stats()
    return stats


def test_chat_and_streaming_agree_greedily(oa: openai.OpenAI) -> None:
    messages: Any = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    reply = oa.chat.completions.create(model="smollm2", messages=messages, max_tokens=12, temperature=0)
    text = reply.choices[0].message.content or ""
    assert "Paris" in text
    assert reply.usage is not None and reply.usage.completion_tokens <= 12
    stream = oa.chat.completions.create(
        model="smollm2",
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.prompt_tokens == reply.usage.prompt_tokens
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens > 0  # same prefix


def test_logprobs(oa: openai.OpenAI) -> None:
    reply = oa.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Say yes."}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content) <= 3
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in content)
    assert content[0].token == content[0].top_logprobs[0].token  # greedy picks the most likely


def test_tool_call_round_trip(oa: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = oa.chat.completions.create(
        model="smollm2",
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",  # type: ignore[list-item]
        parallel_tool_calls=False,
        max_tokens=40,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    call: Any = calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])  # type: ignore[index]
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18, "sky": "sunny"}'},
    ]
    answer = oa.chat.completions.create(
        model="smollm2",
        messages=messages,
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=16,
        temperature=0,  # type: ignore[list-item]
    )
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].message.content


def test_json_schema_output_validates(oa: openai.OpenAI) -> None:
    reply = oa.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Invent a person with a name and an age."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        max_tokens=40,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), PERSON)


def test_anthropic_stream_events_and_cache_usage(an: anthropic.Anthropic) -> None:
    system = "You are a meticulous assistant for a bakery. Keep every answer under ten words. " * 2
    kwargs: Any = {
        "model": "smollm2",
        "max_tokens": 8,
        "system": system,
        "messages": [{"role": "user", "content": "Hello!"}],
    }
    cold = an.messages.create(**kwargs)
    with an.messages.stream(**kwargs) as stream:
        wire = [
            e.type
            for e in stream
            if e.type
            in (
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            )
        ]
        warm = stream.get_final_message()
    assert wire[0] == "message_start" and wire[1] == "content_block_start"
    assert wire[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(wire[2:-3]) == {"content_block_delta"}
    assert warm.stop_reason in ("end_turn", "max_tokens")
    total = cold.usage.input_tokens + (cold.usage.cache_read_input_tokens or 0)
    assert warm.usage.input_tokens + (warm.usage.cache_read_input_tokens or 0) == total
    assert (warm.usage.cache_read_input_tokens or 0) > (cold.usage.cache_read_input_tokens or 0)
    assert warm.usage.input_tokens < cold.usage.input_tokens  # input_tokens excludes what the cache served
    assert warm.usage.cache_creation_input_tokens == 0


def test_disconnect_mid_stream_frees_blocks(server: BackgroundServer, engine: Any) -> None:
    body = {
        "model": "smollm2",
        "max_tokens": 400,
        "temperature": 0.8,
        "seed": 1,
        "stream": True,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
    }
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        received = 0
        for line in lines:
            received += line.startswith("data: ")
            if received >= 4:
                assert engine.stats()["blocks_used"] > 0
                break
    stats = _wait_for_free_blocks(engine)
    assert stats["blocks_used"] == 0 and stats["num_running"] == 0


def test_tenants_share_a_prefix_only_within_themselves(engine: Any) -> None:
    keys = TenantRegistry({"alice-1": "alice", "alice-2": "alice", "bob-1": "bob"})
    app = create_app(engine, config=ServerConfig(model_name="smollm2", tenants=keys))
    prefix = "Shared policy: refunds within 30 days, exchanges within 60 days, no questions asked. " * 4

    def cached(client: httpx.Client, key: str, question: str) -> int:
        body = {
            "model": "smollm2",
            "max_tokens": 1,
            "messages": [{"role": "system", "content": prefix}, {"role": "user", "content": question}],
        }
        response = client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text
        value: int = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        return value

    with BackgroundServer(app) as server, httpx.Client(base_url=server.base_url, timeout=60) as client:
        assert cached(client, "alice-1", "Can I return shoes?") == 0
        assert cached(client, "bob-1", "Can I return a hat?") == 0  # another tenant never hits alice's blocks
        assert cached(client, "alice-2", "Can I return a coat?") > 0  # same tenant, other key


# -- the Responses API, through the official client and the OpenAI Agents SDK -------------------------
RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}
PERSON_FORMAT = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}


def test_responses_structured_output_validates(oa: openai.OpenAI) -> None:
    reply = oa.responses.create(model="smollm2", input="Invent a person with a name and an age.",
                                text=PERSON_FORMAT, max_output_tokens=40, temperature=0)  # type: ignore[arg-type]
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), PERSON)


def test_responses_tools_on_auto_with_a_format_answer_with_a_call_or_the_typed_answer(oa: openai.OpenAI) -> None:
    """One grammar for both: whichever the model picks, it is well formed."""
    for question in ("What is the weather in Paris?", "Invent a person with a name and an age."):
        reply = oa.responses.create(model="smollm2", input=question, tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
                                    parallel_tool_calls=False, text=PERSON_FORMAT,  # type: ignore[arg-type]
                                    max_output_tokens=40, temperature=0)
        first = reply.output[0]
        if first.type == "function_call":
            assert first.name == "get_weather" and len(reply.output) == 1
            jsonschema.validate(json.loads(first.arguments), WEATHER["function"]["parameters"])  # type: ignore[index]
        else:
            jsonschema.validate(json.loads(reply.output_text), PERSON)


def test_responses_stream_agrees_with_the_plain_answer_and_counts_cached_tokens(oa: openai.OpenAI) -> None:
    kwargs: Any = {"model": "smollm2", "input": "Say hello.", "instructions": SYSTEM, "max_output_tokens": 12,
                   "temperature": 0}
    plain = oa.responses.create(**kwargs)
    events = list(oa.responses.create(**kwargs, stream=True))
    final = events[-1].response  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert final.output_text == plain.output_text == deltas and deltas
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens > 0


def test_agents_sdk_typed_output_through_responses(server: BackgroundServer) -> None:
    agents = pytest.importorskip("agents", reason="the openai-agents package (dev extra) is not installed")
    import asyncio

    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="local", max_retries=0, timeout=120)
    agent = agents.Agent(
        name="inventor", instructions="Invent a person.", output_type=Person,
        model=agents.OpenAIResponsesModel(model="smollm2", openai_client=client),
        model_settings=agents.ModelSettings(max_tokens=40, temperature=0),
    )
    result = asyncio.run(agents.Runner.run(agent, "A person, please."))
    assert isinstance(result.final_output, Person) and result.final_output.name


def test_completions_with_logprobs_on_a_raw_prompt(oa: openai.OpenAI) -> None:
    reply = oa.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0,
                                  logprobs=2, n=2)
    first, second = reply.choices
    assert first.text and first.text == second.text  # greedy: both draws agree
    logprobs = first.logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
    assert "".join(logprobs.tokens) == first.text and len(logprobs.token_logprobs) == 6
    assert all(len(top) == 2 and max(top.values()) >= lp - 1e-4
               for top, lp in zip(logprobs.top_logprobs or [], logprobs.token_logprobs, strict=True))


@pytest.mark.parametrize(("constraint", "check"), [
    ({"structured_outputs": {"regex": r"[0-9]{3}-[0-9]{4}"}}, lambda text: re.fullmatch(r"[0-9]{3}-[0-9]{4}", text)),
    ({"structured_outputs": {"choice": ["red", "green", "blue"]}}, lambda text: text in ("red", "green", "blue")),
    ({"grammar": 'root ::= "yes" | "no"'}, lambda text: text in ("yes", "no")),
    # the word is bounded: under `[a-z]+` greedy SmolLM2 may spell one word until max_tokens (it did in q4 mode
    # once the norms ran in C++: "theresanjayamaya..."), which says nothing about the constraint
    ({"structured_outputs": {"grammar": 'root ::= [a-z] [a-z]? [a-z]? [a-z]? [a-z]? [a-z]? " " [0-9]'}},
     lambda text: re.fullmatch(r"[a-z]{1,6} [0-9]", text)),
    ({"structured_outputs": {"json": PERSON}}, lambda text: jsonschema.validate(json.loads(text), PERSON) is None),
], ids=["regex", "choice", "gbnf", "ebnf", "json"])
def test_constraint_parameters_shape_the_answer(oa: openai.OpenAI, constraint: dict[str, Any], check: Any) -> None:
    reply = oa.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Answer."}],
                                       max_tokens=30, temperature=0, extra_body=constraint)
    text = reply.choices[0].message.content or ""
    assert check(text), text
    assert reply.choices[0].finish_reason == "stop"


def test_completions_constrain_every_draw(oa: openai.OpenAI) -> None:
    reply = oa.completions.create(model="smollm2", prompt="My favourite colour is", max_tokens=10, n=2,
                                  temperature=1.0, seed=3,
                                  extra_body={"structured_outputs": {"choice": [" red", " green", " blue"]}})
    assert [c.text in (" red", " green", " blue") for c in reply.choices] == [True, True]
    gbnf = oa.completions.create(model="smollm2", prompt="Count:", max_tokens=12, temperature=0,
                                 extra_body={"grammar": 'root ::= " " [0-9] ("," [0-9])*'})
    assert re.fullmatch(r" [0-9](,[0-9])*", gbnf.choices[0].text), gbnf.choices[0].text
