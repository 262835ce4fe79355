"""The hosted backends against `parley serve` on 127.0.0.1 (over the server tests' fake engine).

parley's own server speaks both wire formats, so a conversation with a tool loop must go through
`OpenAIBackend` (as OpenAI, as vLLM, and auto-detected) and `AnthropicBackend` alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from parley.backends import AnthropicBackend, OpenAIBackend
from parley.backends.base import ModelRequest, SamplingSettings
from parley.local_engine.testing import FakeEngine
from parley.protocol import Conversation, Message, MessageEnd, ToolCallEnd, ToolSpec, UsageEvent
from tests.sdk.server.conftest import serve

TOOL = ToolSpec(name="lookup", parameters={"type": "object", "properties": {"x": {"type": "integer"}}})
REPLY = 'Sure.\n<tool_call>\n{"name": "lookup", "arguments": {"x": 1}}\n</tool_call>'


@pytest.fixture(scope="module")
def parley_server() -> Iterator[Any]:
    with serve(FakeEngine(REPLY)) as server:
        yield server


def _request() -> ModelRequest:
    conversation = Conversation(messages=[Message.system("Use tools."), Message.user("Look up 1.")])
    return ModelRequest(conversation=conversation, tools=[TOOL], tenant="acme",
                        sampling=SamplingSettings(max_tokens=300))


def _backends(url: str) -> list[Any]:
    return [OpenAIBackend("test-model", base_url=f"{url}/v1", api_key="k", flavor=flavor, max_retries=0)
            for flavor in ("openai", "vllm", "auto")] + [
        AnthropicBackend("test-model", api_key="k", base_url=url, max_retries=0)]


async def test_tool_call_round_trip_through_every_hosted_backend(parley_server: Any) -> None:
    for backend in _backends(parley_server.base_url):
        response = await backend.generate(_request())
        [message] = response.messages
        assert message.text == "Sure.", backend.name
        [call] = message.tool_calls
        assert call.name == "lookup" and call.parsed_arguments() == {"x": 1}
        assert response.finish_reason == "tool_calls" and response.usage.requests == 1
        assert response.usage.prompt_tokens > 0 and response.usage.cost is None

        events = [event async for event in backend.stream(_request())]
        assert isinstance(events[-2], MessageEnd) and isinstance(events[-1], UsageEvent), backend.name
        [end] = [e for e in events if isinstance(e, ToolCallEnd)]
        assert end.call.parsed_arguments() == {"x": 1}
        # The tenant's prefix was computed once: later requests read it from the cache.
        assert events[-1].usage.cache_read_tokens > 0

        follow_up = _request()
        follow_up.conversation.append(message)
        follow_up.conversation.append(Message.tool(call.id, call.name, "42"))
        assert (await backend.generate(follow_up)).messages[0].tool_calls  # the fake replies the same way
