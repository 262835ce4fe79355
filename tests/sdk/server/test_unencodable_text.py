"""A lone surrogate (``"\\ud800"``, valid as a JSON escape) in a request: a 400 in the endpoint's error shape
naming the field, on both endpoints, never a 500 (the tokenizer's `TypeError` used to escape)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer
from tests.sdk.server.conftest import serve

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather \ud800", "parameters": {"type": "object"}},
}


def _post(server: BackgroundServer, path: str, body: dict[str, Any]) -> httpx.Response:
    # json.dumps writes a lone surrogate as the escape "\ud800", which strict JSON parsers accept.
    data = json.dumps(body).encode("ascii")
    return httpx.post(server.base_url + path, content=data, headers={"content-type": "application/json"}, timeout=30)


def _openai(**fields: Any) -> dict[str, Any]:
    return {"model": "test-model", "max_tokens": 4, **fields}


def _anthropic(**fields: Any) -> dict[str, Any]:
    return {"model": "test-model", "max_tokens": 4, **fields}


CASES = [
    ("openai", "/v1/chat/completions", _openai(messages=[{"role": "user", "content": "bad \ud800 text"}]),
     r"messages\[0\]\.content"),
    ("openai", "/v1/chat/completions",
     _openai(messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": [
         {"type": "text", "text": "x\udfff"}]}]), r"messages\[1\]\.content"),
    ("openai", "/v1/chat/completions", _openai(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER]),
     r"tools\[0\]\.description"),
    ("openai", "/v1/chat/completions",
     _openai(messages=[{"role": "user", "content": "bad \ud800"}], stream=True), r"messages\[0\]\.content"),
    ("anthropic", "/v1/messages", _anthropic(messages=[{"role": "user", "content": "bad \ud800 text"}]),
     r"messages\[\d\]\.content"),
    ("anthropic", "/v1/messages", _anthropic(system="be \ud800 brief", messages=[{"role": "user", "content": "hi"}]),
     r"messages\[0\]\.content"),
    ("anthropic", "/v1/messages", _anthropic(messages=[{"role": "user", "content": [
        {"type": "text", "text": "bad \ud800"}]}], stream=True), r"messages\[\d\]\.content"),
    ("anthropic", "/v1/messages/count_tokens",
     {"model": "test-model", "messages": [{"role": "user", "content": "bad \ud800"}]}, r"messages\[\d\]\.content"),
]


def _check(response: httpx.Response, dialect: str, where: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    if dialect == "openai":
        error = body["error"]
        assert error["type"] == "invalid_request_error"
        assert isinstance(error["param"], str) and error["param"]  # "messages" (or the field's own path)
    else:
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        error = body["error"]
    assert re.search(where, error["message"]), error["message"]
    assert "lone surrogate U+D" in error["message"]


@pytest.fixture(scope="module")
def byte_server() -> Iterator[BackgroundServer]:
    """The fake engine's byte tokenizer: it refuses surrogates with a `UnicodeEncodeError`."""
    with serve(FakeEngine()) as server:
        yield server


@pytest.mark.parametrize(("dialect", "path", "body", "where"), CASES)
def test_a_lone_surrogate_is_a_400_naming_the_field(
    byte_server: BackgroundServer, dialect: str, path: str, body: dict[str, Any], where: str
) -> None:
    _check(_post(byte_server, path, body), dialect, where)


@pytest.mark.model
@pytest.mark.parametrize(("dialect", "path", "body", "where"), CASES)
def test_a_lone_surrogate_is_a_400_with_the_real_tokenizer(
    real_tokenizer_server: BackgroundServer, dialect: str, path: str, body: dict[str, Any], where: str
) -> None:
    _check(_post(real_tokenizer_server, path, body), dialect, where)


@pytest.fixture(scope="module")
def real_tokenizer_server() -> Iterator[BackgroundServer]:
    """The embedded SmolLM2 tokenizer (its fast tokenizer raises `TypeError` on a surrogate); no weights."""
    from parley.local_engine import loader

    tokenizer = loader.load_tokenizer(loader.resolve(None).folder)
    with serve(FakeEngine(tokenizer=tokenizer), constrain_auto_tool_calls=False) as server:
        yield server


def test_valid_text_after_a_refused_request_is_served(byte_server: BackgroundServer) -> None:
    _post(byte_server, "/v1/chat/completions", _openai(messages=[{"role": "user", "content": "\ud800"}]))
    fine = _openai(messages=[{"role": "user", "content": "h\u00e9 \U0001f600"}])
    ok = _post(byte_server, "/v1/chat/completions", fine)
    assert ok.status_code == 200, ok.text
