"""Malformed requests: each gets its documented status and error shape, naming the field — never a 200 or a 500.

The seed document's draft server answered 200 to `"5"`, `5.0` and `true` as `max_tokens` and gave a
misspelt `max_token` the default; those traps lead the table.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer
from tests.sdk.server.conftest import serve

USER = [{"role": "user", "content": "hi"}]
OA = {"model": "test-model", "messages": USER}
AN = {"model": "test-model", "max_tokens": 16, "messages": USER}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def oa(**fields: Any) -> dict[str, Any]:
    return {**OA, **fields}


def an(**fields: Any) -> dict[str, Any]:
    return {**AN, **fields}


def without(base: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in base.items() if k != key}


# (case id, path, body: dict or raw bytes, expected status, field the error must name (or None))
OPENAI_CASES: list[tuple[str, dict[str, Any] | bytes, int, str | None]] = [
    ("max_tokens as string '5'", oa(max_tokens="5"), 400, "max_tokens"),
    ("max_tokens as float 5.0", oa(max_tokens=5.0), 400, "max_tokens"),
    ("max_tokens as bool true", oa(max_tokens=True), 400, "max_tokens"),
    ("misspelt max_token", oa(max_token=2), 400, "max_token"),
    ("max_tokens zero", oa(max_tokens=0), 400, "max_tokens"),
    ("max_tokens negative", oa(max_tokens=-1), 400, "max_tokens"),
    ("max_completion_tokens as float", oa(max_completion_tokens=3.5), 400, "max_completion_tokens"),
    ("temperature as string", oa(temperature="0.5"), 400, "temperature"),
    ("temperature out of range", oa(temperature=2.5), 400, "temperature"),
    ("top_p zero", oa(top_p=0), 400, "top_p"),
    ("top_p as bool", oa(top_p=True), 400, "top_p"),
    ("top_k negative", oa(top_k=-1), 400, "top_k"),
    ("seed as float", oa(seed=1.5), 400, "seed"),
    (
        "NaN literal",
        b'{"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        400,
        None,
    ),
    (
        "Infinity literal",
        b'{"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": Infinity}',
        400,
        None,
    ),
    (
        "overflowing number literal (1e999 is not a finite number)",
        b'{"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
        400,
        None,
    ),
    ("duplicate key", b'{"model": "test-model", "model": "x", "messages": []}', 400, None),
    ("not JSON", b'{"model": ', 400, None),
    ("JSON array body", b"[1, 2]", 400, None),
    ("empty body", b"", 400, None),
    ("invalid UTF-8", b'{"model": "\xff"}', 400, None),
    ("empty messages", oa(messages=[]), 400, "messages"),
    ("missing messages", without(OA, "messages"), 400, "messages"),
    ("messages not a list", oa(messages="hi"), 400, "messages"),
    ("unknown role", oa(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    ("content is a number", oa(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (
        "unknown field in a message",
        oa(messages=[{"role": "user", "content": "x", "mood": "y"}]),
        400,
        "messages[0].mood",
    ),
    (
        "image input",
        oa(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages[0].content[0]",
    ),
    (
        "tool result without its call",
        oa(messages=[*USER, {"role": "tool", "tool_call_id": "nope", "content": "1"}]),
        400,
        "messages[1].tool_call_id",
    ),
    (
        "tool call arguments not JSON",
        oa(
            messages=[
                *USER,
                {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "1"},
            ]
        ),
        400,
        "messages[1].tool_calls[0].function.arguments",
    ),
    ("assistant message with nothing", oa(messages=[*USER, {"role": "assistant"}]), 400, "messages[1]"),
    ("stream as string", oa(stream="yes"), 400, "stream"),
    ("stream_options without stream", oa(stream_options={"include_usage": True}), 400, "stream_options"),
    ("five stop sequences", oa(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("n above 16", oa(n=17), 400, "n"),
    ("logprobs as string", oa(logprobs="true"), 400, "logprobs"),
    ("top_logprobs without logprobs", oa(top_logprobs=3), 400, "top_logprobs"),
    (
        "schema that does not compile",
        oa(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
        400,
        "response_format.json_schema.schema",
    ),
    ("unknown response_format type", oa(response_format={"type": "xml"}), 400, "response_format.type"),
    (
        "tool_choice names a missing tool",
        oa(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
        400,
        "tool_choice",
    ),
    (
        "tool name with a space",
        oa(tools=[{"type": "function", "function": {"name": "a b"}}]),
        400,
        "tools[0].function.name",
    ),
    (
        "tool parameters not a schema",
        oa(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}], tool_choice="required"),
        400,
        "tools[0].parameters",
    ),
    ("frequency_penalty above 2", oa(frequency_penalty=2.5), 400, "frequency_penalty"),
    ("min_tokens past max_tokens", oa(max_tokens=4, min_tokens=8), 400, "min_tokens"),
    ("ignore_eos as a string", oa(ignore_eos="yes"), 400, "ignore_eos"),
    ("repetition_penalty zero", oa(repetition_penalty=0), 400, "repetition_penalty"),
    ("min_p above 1", oa(min_p=1.5), 400, "min_p"),
    ("unknown constraint field", oa(structured_outputs={"structural_tag": {}}), 400,
     "structured_outputs.structural_tag"),
    ("two constraints at once", oa(structured_outputs={"regex": "a+", "choice": ["a"]}), 400, "structured_outputs"),
    ("vLLM's removed guided_json", oa(guided_json={"type": "object"}), 400, "guided_json"),
    ("grammar with response_format", oa(grammar='root ::= "a"', response_format={"type": "json_object"}), 400,
     "grammar"),
    ("structured_outputs.json not JSON", oa(structured_outputs={"json": "{"}), 400, "structured_outputs.json"),
    ("metadata value not a string", oa(metadata={"k": 1}), 400, "metadata.k"),
    ("prompt past the context length", oa(messages=[{"role": "user", "content": "x" * 3000}]), 400, "messages"),
    ("max_tokens past the context", oa(max_tokens=5000), 400, "max_tokens"),
    ("deadline not positive", oa(deadline_s=0), 400, "deadline_s"),
]

ANTHROPIC_CASES: list[tuple[str, dict[str, Any] | bytes, int, str | None]] = [
    ("missing max_tokens", without(AN, "max_tokens"), 400, "max_tokens"),
    ("max_tokens as string '5'", an(max_tokens="5"), 400, "max_tokens"),
    ("max_tokens as float 5.0", an(max_tokens=5.0), 400, "max_tokens"),
    ("max_tokens as bool true", an(max_tokens=True), 400, "max_tokens"),
    ("misspelt max_token", {**without(AN, "max_tokens"), "max_token": 2}, 400, "max_token"),
    ("empty messages", an(messages=[]), 400, "messages"),
    ("system role inside messages", an(messages=[{"role": "system", "content": "x"}]), 400, "messages[0].role"),
    (
        "unknown block type",
        an(messages=[{"role": "user", "content": [{"type": "video"}]}]),
        400,
        "messages[0].content[0].type",
    ),
    (
        "tool_result without its tool_use",
        an(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]}]),
        400,
        "messages[0].content[0].tool_use_id",
    ),
    (
        "tool_use without a tool_result",
        an(
            messages=[
                *USER,
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": "and?"},
            ]
        ),
        400,
        "messages[1]",
    ),
    (
        "thinking budget below 1024",
        an(max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 500}),
        400,
        "thinking.budget_tokens",
    ),
    (
        "thinking budget not below max_tokens",
        an(max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 1024}),
        400,
        "thinking.budget_tokens",
    ),
    ("temperature above 1", an(temperature=1.5), 400, "temperature"),
    ("top_k as float", an(top_k=3.0), 400, "top_k"),
    ("stop_sequences as a string", an(stop_sequences="END"), 400, "stop_sequences"),
    (
        "tool_choice names a missing tool",
        an(tools=[{"name": "f", "input_schema": {"type": "object"}}], tool_choice={"type": "tool", "name": "g"}),
        400,
        "tool_choice.name",
    ),
    ("NaN literal", b'{"model": "test-model", "max_tokens": NaN, "messages": []}', 400, None),
    (
        "cache_control with a bad ttl",
        an(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}],
                }
            ]
        ),
        400,
        "messages[0].content[0].cache_control.ttl",
    ),
]


@pytest.fixture(scope="module")
def fake_server() -> Any:
    """One server for the whole table (no request here changes server state that another depends on)."""
    with serve(FakeEngine(), max_body_bytes=64 * 1024) as server:
        yield server


_CLIENTS: dict[str, httpx.Client] = {}


def _post(server: BackgroundServer, path: str, body: dict[str, Any] | bytes) -> httpx.Response:
    """POST through one pooled client per server (a fresh client per request costs an SSL context)."""
    client = _CLIENTS.setdefault(server.base_url, httpx.Client(base_url=server.base_url, timeout=10))
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content, headers={"content-type": "application/json"})


def _assert_openai_shape(response: httpx.Response, status: int, field: str | None) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    if field is not None:
        assert error["param"] == field, error
        assert field in error["message"], error


def _assert_anthropic_shape(response: httpx.Response, status: int, field: str | None, kind: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind
    if field is not None:
        assert field in body["error"]["message"], body


def test_the_table_is_large_enough() -> None:
    assert len(OPENAI_CASES) + len(ANTHROPIC_CASES) >= 30


@pytest.mark.parametrize(("case", "body", "status", "field"), OPENAI_CASES, ids=[c[0] for c in OPENAI_CASES])
def test_openai_malformed(fake_server: BackgroundServer, case: str, body: Any, status: int, field: str | None) -> None:
    _assert_openai_shape(_post(fake_server, "/v1/chat/completions", body), status, field)


@pytest.mark.parametrize(("case", "body", "status", "field"), ANTHROPIC_CASES, ids=[c[0] for c in ANTHROPIC_CASES])
def test_anthropic_malformed(
    fake_server: BackgroundServer, case: str, body: Any, status: int, field: str | None
) -> None:
    _assert_anthropic_shape(_post(fake_server, "/v1/messages", body), status, field, "invalid_request_error")


def test_unknown_model_is_404_in_each_shape(fake_server: BackgroundServer) -> None:
    _assert_openai_shape(_post(fake_server, "/v1/chat/completions", oa(model="gpt-9")), 404, "model")
    _assert_anthropic_shape(_post(fake_server, "/v1/messages", an(model="claude-9")), 404, None, "not_found_error")


def test_body_over_the_limit_is_413_in_each_shape(fake_server: BackgroundServer) -> None:
    big = oa(messages=[{"role": "user", "content": "x" * 70_000}])
    _assert_openai_shape(_post(fake_server, "/v1/chat/completions", big), 413, None)
    big_an = an(messages=[{"role": "user", "content": "x" * 70_000}])
    _assert_anthropic_shape(_post(fake_server, "/v1/messages", big_an), 413, None, "request_too_large")


def test_chunked_body_over_the_limit_is_413(fake_server: BackgroundServer) -> None:
    def chunks() -> Any:
        for _ in range(100):
            yield b"x" * 1024

    response = httpx.post(fake_server.base_url + "/v1/chat/completions", content=chunks(), timeout=10)
    _assert_openai_shape(response, 413, None)


def test_wrong_method_and_unknown_path_answer_in_shape(fake_server: BackgroundServer) -> None:
    _assert_openai_shape(httpx.get(fake_server.base_url + "/v1/chat/completions"), 405, None)
    _assert_openai_shape(httpx.get(fake_server.base_url + "/v1/nothing"), 404, None)


def test_the_seed_traps_never_get_200(fake_server: BackgroundServer) -> None:
    """A valid request gets 200, and each trap differs from it by one field only."""
    ok = _post(fake_server, "/v1/chat/completions", oa(max_tokens=5))
    assert ok.status_code == 200, ok.text
    for trap in ("5", 5.0, True):
        assert _post(fake_server, "/v1/chat/completions", oa(max_tokens=trap)).status_code == 400
