"""Images through the hosted backends, against the local fake server: a tool that returns an image has
its result sent to Anthropic as an image block inside the ``tool_result``, and to OpenAI as a user
message after the tool messages; user images go out as ``image``/``image_url`` parts."""

from __future__ import annotations

import base64
from typing import Any

from parley import Agent, tool
from parley.backends.anthropic import AnthropicBackend
from parley.backends.openai import OpenAIBackend
from parley.protocol import ImagePart, Message
from tests.sdk.backends.fake_server import FakeServer, Reply

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(120))
B64 = base64.b64encode(PNG).decode()
MODEL = "claude-sonnet-4-5-20250929"


@tool
def screenshot() -> list[object]:
    """Take a screenshot of the screen."""
    return ["the screen:", ImagePart(data=PNG)]


def _anthropic(content: list[dict[str, Any]], stop: str = "end_turn") -> dict[str, Any]:
    usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    return {"id": "msg_01", "type": "message", "role": "assistant", "model": MODEL, "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": usage}


def _openai(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}


async def test_a_tools_image_goes_to_anthropic_inside_its_tool_result(server: FakeServer) -> None:
    use = {"type": "tool_use", "id": "toolu_01", "name": "screenshot", "input": {}}
    server.queue(Reply(body=_anthropic([use], stop="tool_use")),
                 Reply(body=_anthropic([{"type": "text", "text": "A cat on a sofa."}])))
    backend = AnthropicBackend(MODEL, api_key="sk-test", base_url=server.url, retry_base_delay=0.0)
    result = await Agent(backend, tools=[screenshot]).run("What is on my screen?")
    assert result.output == "A cat on a sofa."
    sent = server.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    [block] = sent[2]["content"]
    assert block == {"type": "tool_result", "tool_use_id": "toolu_01", "content": [
        {"type": "text", "text": "the screen:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}},
    ]}


async def test_a_user_image_goes_to_anthropic_as_an_image_block(server: FakeServer) -> None:
    server.queue(Reply(body=_anthropic([{"type": "text", "text": "A cat."}])))
    backend = AnthropicBackend(MODEL, api_key="sk-test", base_url=server.url, retry_base_delay=0.0)
    await Agent(backend).run([Message.user("What is this?", ImagePart(url="https://example.com/cat.png"))])
    [user] = server.requests[0].body["messages"]
    assert user["content"][1] == {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}


async def test_a_tools_image_goes_to_openai_after_the_tool_messages(server: FakeServer) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
    server.queue(Reply(body=_openai({"content": None, "tool_calls": [call]}, finish="tool_calls")),
                 Reply(body=_openai({"content": "A cat."})))
    backend = OpenAIBackend("gpt-4o", api_key="sk-test", base_url=f"{server.url}/v1", retry_base_delay=0.0)
    result = await Agent(backend, tools=[screenshot]).run("What is on my screen?")
    assert result.output == "A cat."
    sent = server.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
    assert sent[2] == {"role": "tool", "tool_call_id": "call_1", "content": "the screen:"}
    assert sent[3]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64," + B64}}
