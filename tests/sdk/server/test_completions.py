"""`POST /v1/completions`, `/tokenize` and `/detokenize` over the fake engine, through the official client and
raw HTTP: raw prompts (text or ids, no chat template), `echo`, `stop`, `n` independent draws, streaming, and
awkward requests answered 4xx naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer
from tests.sdk.server.conftest import serve


def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=20)


def test_a_text_prompt_goes_to_the_engine_raw(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    reply = client(fake_server).completions.create(model="test-model", prompt="Once upon a time", max_tokens=64)
    assert reply.object == "text_completion" and reply.choices[0].text == fake_engine.replies
    assert reply.choices[0].finish_reason == "stop"
    assert fake_engine.last.prompt_ids == fake_engine.tokenizer.encode("Once upon a time", add_special_tokens=True)
    assert fake_engine.last.params.temperature == 1.0 and fake_engine.last.params.stop_token_ids == ()
    assert reply.usage is not None and reply.usage.prompt_tokens == len(fake_engine.last.prompt_ids)
    assert reply.usage.completion_tokens == len(fake_engine.replies)


def test_max_tokens_defaults_to_16_and_echo_puts_the_prompt_first(
    fake_server: BackgroundServer, fake_engine: FakeEngine
) -> None:
    ids = fake_engine.tokenizer.encode("Hi! ")
    reply = client(fake_server).completions.create(model="test-model", prompt=ids, echo=True)
    assert fake_engine.last.prompt_ids == ids and fake_engine.last.params.max_tokens == 16
    assert reply.choices[0].text == "Hi! " + fake_engine.replies[:16] and reply.choices[0].finish_reason == "length"


def test_stop_strings_cut_the_text(fake_server: BackgroundServer) -> None:
    reply = client(fake_server).completions.create(model="test-model", prompt="x", stop=["fake"], max_tokens=64)
    assert reply.choices[0].text == "Hello from the " and reply.choices[0].finish_reason == "stop"


def test_n_draws_are_independent_requests_numbered_prompt_by_prompt(
    fake_server: BackgroundServer, fake_engine: FakeEngine
) -> None:
    reply = client(fake_server).completions.create(model="test-model", prompt=["a", "b"], n=3, seed=7,
                                                   max_tokens=5, extra_body={"ignore_eos": True})
    assert [c.index for c in reply.choices] == list(range(6))
    submitted = fake_engine.submissions
    assert [s.params.seed for s in submitted] == [7, 8, 9, 7, 8, 9]  # each draw its own stream
    assert len({s.request_id for s in submitted}) == 6 and all(s.params.ignore_eos for s in submitted)
    assert [s.prompt_ids for s in submitted[:3]] == [fake_engine.tokenizer.encode("a", add_special_tokens=True)] * 3
    assert reply.usage is not None and reply.usage.prompt_tokens == 2 * len(submitted[0].prompt_ids)
    assert reply.usage.completion_tokens == 6 * 5


def test_a_stream_interleaves_the_choices_and_ends_with_usage_and_done(fake_server: BackgroundServer) -> None:
    body = {"model": "test-model", "prompt": "x", "n": 2, "max_tokens": 64, "stream": True,
            "stream_options": {"include_usage": True}}
    response = httpx.post(fake_server.base_url + "/v1/completions", json=body, timeout=20)
    lines = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    texts = {0: "", 1: ""}
    finishes = {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert texts == {0: "Hello from the fake engine.", 1: "Hello from the fake engine."}
    assert finishes == {0: "stop", 1: "stop"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2 * len(texts[0])


def test_tokenize_and_detokenize_round_trip(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    url = fake_server.base_url
    tokens = httpx.post(url + "/tokenize", json={"prompt": "héllo"}, timeout=20).json()
    assert tokens["tokens"] == fake_engine.tokenizer.encode("héllo", add_special_tokens=True)
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == fake_engine.max_model_len
    back = httpx.post(url + "/detokenize", json={"tokens": tokens["tokens"]}, timeout=20).json()
    assert back == {"prompt": "héllo"}
    chat = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=20).json()
    client(fake_server).chat.completions.create(model="test-model", messages=[{"role": "user", "content": "hi"}])
    assert chat["tokens"] == fake_engine.last.prompt_ids  # what a chat request with these messages sends


@pytest.fixture(scope="module")
def battery() -> Iterator[tuple[BackgroundServer, FakeEngine]]:
    engine = FakeEngine()
    with serve(engine) as server:
        yield server, engine


AWKWARD: list[tuple[str, str, dict[str, Any], str]] = [
    ("empty prompt", "/v1/completions", {"prompt": ""}, "prompt"),
    ("empty prompt in a batch", "/v1/completions", {"prompt": ["a", ""]}, "prompt[1]"),
    ("token id out of range", "/v1/completions", {"prompt": [1, 2, 99999]}, "prompt[2]"),
    ("token id negative in a batch", "/v1/completions", {"prompt": [[1], [2, -1]]}, "prompt[1][1]"),
    ("bools are not token ids", "/v1/completions", {"prompt": [True]}, "prompt[0]"),
    ("prompt past the context", "/v1/completions", {"prompt": "x" * 3000}, "prompt"),
    ("max_tokens past the context", "/v1/completions", {"prompt": "x", "max_tokens": 5000}, "max_tokens"),
    ("n zero", "/v1/completions", {"prompt": "x", "n": 0}, "n"),
    ("n too large", "/v1/completions", {"prompt": "x", "n": 17}, "n"),
    ("echo with logprobs", "/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
    ("suffix", "/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix"),
    ("best_of above n", "/v1/completions", {"prompt": "x", "best_of": 2}, "best_of"),
    ("logit_bias", "/v1/completions", {"prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
    ("min_tokens past max_tokens", "/v1/completions", {"prompt": "x", "min_tokens": 20}, "min_tokens"),
    ("misspelt field", "/v1/completions", {"prompt": "x", "max_token": 3}, "max_token"),
    ("grammar with structured_outputs", "/v1/completions",
     {"prompt": "x", "grammar": 'root ::= "a"', "structured_outputs": {"regex": "a"}}, "grammar"),
    ("unknown constraint key", "/v1/completions", {"prompt": "x", "structured_outputs": {"xml": "a"}},
     "structured_outputs.xml"),
    ("tokenize with neither", "/tokenize", {}, "prompt"),
    ("tokenize with both", "/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, "prompt"),
    ("detokenize out of range", "/detokenize", {"tokens": [1, 99999]}, "tokens[1]"),
]


@pytest.mark.parametrize(("case", "path", "fields", "param"), AWKWARD, ids=[c[0] for c in AWKWARD])
def test_awkward_requests_are_refused_naming_the_field(
    battery: tuple[BackgroundServer, FakeEngine], case: str, path: str, fields: dict[str, Any], param: str
) -> None:
    server, engine = battery
    body = {"model": "test-model", **fields} if path == "/v1/completions" else fields
    response = httpx.post(server.base_url + path, json=body, timeout=20)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert engine.submissions == []
