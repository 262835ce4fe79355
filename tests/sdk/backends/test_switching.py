"""Switching backends in one conversation: local (scripted) -> Anthropic -> OpenAI -> local -> Anthropic.

What each provider is sent must be valid for it: no other provider's signatures or encrypted
reasoning, every call followed by its result, ids unique and in the provider's pattern.
"""

from __future__ import annotations

import json
import re
from typing import Any

from parley.backends.anthropic import AnthropicBackend
from parley.backends.base import ModelRequest
from parley.backends.openai import OpenAIBackend
from parley.backends.scripted import ScriptedBackend, ScriptedTurn, call
from parley.protocol import Conversation, Message, ReasoningPart, Role, TextPart, ToolCall, ToolSpec
from parley.protocol._wire_history import MISSING_RESULT, prepare_history
from parley.protocol.chat_template import ChatTemplateCodec
from tests.sdk.backends.fake_server import FakeServer, Reply

WEATHER = ToolSpec(name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})
ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def _anthropic_reply(content: list[dict[str, Any]], stop: str) -> Reply:
    return Reply(body={"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                       "content": content, "stop_reason": stop, "usage": {"input_tokens": 5, "output_tokens": 5}})


def _check_anthropic(body: dict[str, Any]) -> None:
    messages = body["messages"]
    for index, message in enumerate(messages):
        uses = [b["id"] for b in message["content"] if b["type"] == "tool_use"]
        for block in message["content"]:
            if block["type"] in ("tool_use",):
                assert ANTHROPIC_ID.match(block["id"])
            if block["type"] == "thinking":
                assert block["signature"].startswith("anthropic-sig")
        if uses:
            following = messages[index + 1]
            assert following["role"] == "user"
            results = [b["tool_use_id"] for b in following["content"] if b["type"] == "tool_result"]
            assert results == uses  # adjacent and complete, in call order
    all_ids = [b["id"] for m in messages for b in m["content"] if b["type"] == "tool_use"]
    assert len(all_ids) == len(set(all_ids))


def _check_openai(body: dict[str, Any]) -> None:
    text = json.dumps(body)
    assert "signature" not in text and "anthropic-sig" not in text and "encrypted" not in text
    messages = body["messages"]
    for index, message in enumerate(messages):
        calls = [c["id"] for c in message.get("tool_calls") or []]
        if calls:
            answered = [m["tool_call_id"] for m in messages[index + 1 : index + 1 + len(calls)]]
            assert answered == calls and all(len(c) <= 40 for c in calls)


async def test_local_anthropic_openai_local_anthropic(server: FakeServer) -> None:
    local = ScriptedBackend([
        ScriptedTurn(reasoning="local thinking", tool_calls=[call("get_weather", {"city": "Oslo"}, id="call_0")]),
        ScriptedTurn(tool_calls=[call("get_weather", {"city": "Lima"}, id="call_0")]),  # local ids repeat per turn
    ])
    anthropic = AnthropicBackend("claude-sonnet-4-5", api_key="k", base_url=server.url, retry_base_delay=0)
    openai = OpenAIBackend("gpt-4o-mini", base_url=f"{server.url}/v1", api_key="k", retry_base_delay=0)
    conversation = Conversation(messages=[Message.system("Weather bot."), Message.user("Oslo?")])

    async def turn(backend: Any, result: str | None = None) -> Message:
        response = await backend.generate(ModelRequest(conversation=conversation, tools=[WEATHER]))
        [message] = response.messages
        conversation.append(message)
        for tool_call in message.tool_calls:
            conversation.append(Message.tool(tool_call.id, tool_call.name, result or f"weather for {tool_call.id}"))
        return message

    await turn(local)
    server.queue(_anthropic_reply([
        {"type": "thinking", "thinking": "Also Paris.", "signature": "anthropic-sig-1"},
        {"type": "redacted_thinking", "data": "anthropic-sig-redacted"},
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}], "tool_use"))
    await turn(anthropic)
    sent = server.requests[-1].body
    _check_anthropic(sent)
    assert "local thinking" not in json.dumps(sent)  # unsigned reasoning cannot go to Anthropic

    conversation.append(Message.user("And Rome?"))
    server.queue(Reply(body={"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "call_Ab1.2", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": "{\"city\": \"Rome\"}"}}]}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5}}))
    await turn(openai)
    _check_openai(server.requests[-1].body)

    await turn(local)
    server.queue(_anthropic_reply([{"type": "text", "text": "Oslo 4°C, Paris 12°C, Rome 18°C, Lima 20°C."}],
                                  "end_turn"))
    final = await turn(anthropic)
    assert final.text.startswith("Oslo")
    sent = server.requests[-1].body
    _check_anthropic(sent)
    blocks = [b for m in sent["messages"] for b in m["content"]]
    assert {"type": "thinking", "thinking": "Also Paris.", "signature": "anthropic-sig-1"} in blocks
    assert {"type": "redacted_thinking", "data": "anthropic-sig-redacted"} in blocks
    use_ids = [b["id"] for b in blocks if b["type"] == "tool_use"]
    assert use_ids[0] == "call_0" and use_ids[-1].startswith("call_0_") and "call_Ab1.2" not in use_ids

    # And back to a local model: the chat-template codec renders the whole mixed history.
    history = prepare_history(conversation.messages, provider=None)
    text = ChatTemplateCodec().render(history, [WEATHER])
    assert text.count("<tool_call>") == 4 + 2  # four calls plus two mentions in the tools system prompt
    assert "anthropic-sig" not in text


def test_prepare_history_repairs_pairs_and_strips_foreign_payloads() -> None:
    foreign = Message(role=Role.ASSISTANT, parts=[
        ReasoningPart(text="their thoughts", signature="sig", provider="openai"),
        ReasoningPart(redacted="enc", provider="openai"),
        ToolCall(id="a", name="f"), ToolCall(id="b", name="f")])
    messages = [Message.user("go"), foreign, Message.user("hurry"), Message.tool("b", "f", "B"),
                Message.assistant("done")]
    repaired = prepare_history(messages, provider="anthropic")
    assert [m.role for m in repaired] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.USER,
                                         Role.ASSISTANT]
    assert repaired[1].parts[0] == ReasoningPart(text="their thoughts") and len(repaired[1].parts) == 3
    assert [r.tool_results[0].call_id for r in repaired[2:4]] == ["a", "b"]
    assert repaired[2].tool_results[0].is_error and repaired[2].tool_results[0].content == MISSING_RESULT
    assert messages[1].parts[0].signature == "sig"  # the input is untouched
    # The last turn's calls may still be running: no synthetic result for them.
    pending = prepare_history([Message.user("go"), Message.assistant(tool_calls=[ToolCall(id="x", name="f")])],
                              provider=None)
    assert len(pending) == 2
    mixed_user = Message(role=Role.USER, parts=[*Message.tool("x", "f", "X").parts, TextPart(text="thanks")])
    out = prepare_history([Message.user("go"), Message.assistant(tool_calls=[ToolCall(id="x", name="f")]),
                           mixed_user], provider=None)
    assert [m.role for m in out] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER]
