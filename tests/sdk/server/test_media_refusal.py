"""`parley serve` over a text-only model: an image (or PDF) in a request is a clear 400 naming the part, on
both endpoints, and the engine never sees the request. The decoders read images; the refusal comes
from the model's codec (`UnsupportedPartError`), so a model that can read them will get them."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(40)).decode()
TEXT_ONLY = "image input is not supported by this model (text only)"


def _post(server: BackgroundServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=30)


@pytest.mark.parametrize("image", [
    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
])
def test_chat_completions_answers_400_naming_the_image(
    fake_server: BackgroundServer, fake_engine: FakeEngine, image: dict[str, Any]
) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    response = _post(fake_server, "/v1/chat/completions", {"model": "test-model", "messages": messages})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages[1].content[1]" and error["type"] == "invalid_request_error"
    assert error["message"] == f"messages[1].content[1]: {TEXT_ONLY}"
    assert fake_engine.submissions == []


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("source", [
    {"type": "url", "url": "https://example.com/cat.png"},
    {"type": "base64", "media_type": "image/png", "data": PNG},
])
def test_messages_answers_400_naming_the_image(
    fake_server: BackgroundServer, fake_engine: FakeEngine, path: str, source: dict[str, Any]
) -> None:
    content = [{"type": "text", "text": "What is this?"}, {"type": "image", "source": source}]
    body: dict[str, Any] = {"model": "test-model", "messages": [{"role": "user", "content": content}]}
    if path == "/v1/messages":
        body["max_tokens"] = 16
    response = _post(fake_server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == f"messages[0].content[1]: {TEXT_ONLY}"
    assert fake_engine.submissions == []


def test_a_malformed_image_is_a_400_naming_its_field(fake_server: BackgroundServer) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%%"}}
    body = {"model": "test-model", "max_tokens": 16, "messages": [{"role": "user", "content": [image]}]}
    response = _post(fake_server, "/v1/messages", body)
    assert response.status_code == 400
    assert "messages[0].content[0].source.data" in response.json()["error"]["message"]


def test_the_400_names_the_clients_own_position_when_the_conversation_is_reshaped(
    fake_server: BackgroundServer, fake_engine: FakeEngine
) -> None:
    # The system prompt becomes a message of its own and tool results split a user message, yet the
    # refusal names the block where the client put it.
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                                             {"type": "text", "text": "and this?"}, image]}]
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    body = {"model": "test-model", "max_tokens": 16, "system": "Be brief.", "messages": messages, "tools": tools}
    response = _post(fake_server, "/v1/messages", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == f"messages[2].content[2]: {TEXT_ONLY}"
    assert fake_engine.submissions == []
