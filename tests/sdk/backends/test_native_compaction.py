"""Provider-native compaction: ``Compaction(native=True)`` asks the provider to compact server-side.

Replayed shapes are the documented ones (platform.claude.com build-with-claude/compaction and the
``anthropic`` SDK's beta types: the ``compact_20260112`` edit, the ``compact-2026-01-12`` beta, the
``compaction`` content block and ``compaction_delta``, ``usage.iterations`` entries of type
``compaction``; developers.openai.com guides/compaction and the ``openai`` SDK's types:
``context_management: [{"type": "compaction", "compact_threshold": N}]`` and the ``compaction``
output item). The opaque block/item is kept in the envelope and sent back byte for byte; where
the backend cannot compact natively, parley's own summariser runs instead.
"""

from __future__ import annotations

from typing import Any

from parley import Agent, Compaction, RunResult
from parley.backends import FallbackBackend
from parley.backends.anthropic import AnthropicBackend
from parley.backends.openai import OpenAIBackend
from parley.compaction import DEFAULT_SUMMARY_PROMPT
from parley.protocol import CompactionPart, Message, Role
from tests.protocol.responses_shapes import message_item, response, stream_events, usage
from tests.sdk.backends.fake_server import FakeServer, Reply, sse_event

SONNET_46 = "claude-sonnet-4-6"  # compaction documented; 1M window (models.json)
SONNET_45 = "claude-sonnet-4-5-20250929"  # no compaction documented
COMPACTION_BLOCK = {"type": "compaction", "content": "Summary: the user plans a trip to Rome; hotels compared.",
                    "encrypted_content": "Eu8BCkYIBxgCKkD-opaque=="}
OPENAI_COMPACTION = {"id": "cmp_68af4", "type": "compaction", "encrypted_content": "gAAAAABo-opaque-summary=="}


def _message(content: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"id": "msg_01", "type": "message", "role": "assistant", "model": SONNET_46, "content": content,
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 1200, "output_tokens": 40, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0}}
    body.update(extra)
    return body


def _anthropic(server: FakeServer, model: str = SONNET_46, **kwargs: Any) -> AnthropicBackend:
    return AnthropicBackend(model, api_key="sk-test", base_url=server.url, retry_base_delay=0.0, **kwargs)


def _betas(headers: dict[str, str]) -> list[str]:
    return [b for b in headers.get("anthropic-beta", "").split(",") if b]


async def test_anthropic_compacts_server_side_and_the_block_goes_back_verbatim(server: FakeServer) -> None:
    iterations = [{"type": "compaction", "input_tokens": 180000, "output_tokens": 3500,
                   "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
                  {"type": "message", "input_tokens": 1200, "output_tokens": 40,
                   "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}]
    first = _message([COMPACTION_BLOCK, {"type": "text", "text": "Book the second hotel."}])
    first["usage"]["iterations"] = iterations
    server.queue(Reply(body=first), Reply(body=_message([{"type": "text", "text": "Done."}])))
    backend = _anthropic(server)
    assert backend.capabilities.native_compaction
    agent = Agent(backend, instructions="Plan trips.", compaction=Compaction(at=0.5, native=True))

    result = await agent.run("Which hotel?")
    assert len(server.requests) == 1  # no summary request of ours
    sent = server.requests[0]
    assert sent.body["context_management"] == {
        "edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 500_000}}]}
    assert "compact-2026-01-12" in _betas(sent.headers)
    [assistant] = [m for m in result.messages if m.role is Role.ASSISTANT]
    part = assistant.parts[0]
    assert isinstance(part, CompactionPart) and part.provider == "anthropic"
    assert part.payload == COMPACTION_BLOCK and part.text == COMPACTION_BLOCK["content"]
    assert result.output == "Book the second hotel."
    # the compaction's own sampling is billed and counted (the top-level usage leaves it out)
    assert result.usage.input_tokens == 1200 + 180000 and result.usage.output_tokens == 40 + 3500
    assert result.state.compaction is None  # the record is the part itself, in the messages

    await agent.run("And the flight?", state=result.state)
    again = server.requests[1].body
    assert again["messages"][1] == {"role": "assistant", "content": [
        COMPACTION_BLOCK, {"type": "text", "text": "Book the second hotel."}]}
    assert again["context_management"] == sent.body["context_management"]


async def test_custom_summary_instructions_go_as_the_edits_instructions(server: FakeServer) -> None:
    server.queue(Reply(body=_message([{"type": "text", "text": "ok"}])))
    agent = Agent(_anthropic(server), compaction=Compaction(at=0.8, native=True, prompt="Keep every booking id."))
    await agent.run("hi")
    [edit] = server.requests[0].body["context_management"]["edits"]
    assert edit == {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 800_000},
                    "instructions": "Keep every booking id."}


async def test_a_streamed_compaction_block_is_assembled_from_its_deltas(server: FakeServer) -> None:
    events = [
        {"type": "message_start", "message": {**_message([]), "stop_reason": None}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "compaction", "content": None}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "compaction_delta", "content": "Summary: the "}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "compaction_delta", "content": "user plans a trip to Rome; hotels compared.",
                   "encrypted_content": COMPACTION_BLOCK["encrypted_content"]}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Book it."}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 12}},
        {"type": "message_stop"},
    ]
    server.queue(Reply(sse=[sse_event(e["type"], e) for e in events]))
    agent = Agent(_anthropic(server), compaction=Compaction(native=True))
    result = [item async for item in agent.run_stream("Which hotel?")][-1]
    assert isinstance(result, RunResult)
    [assistant] = [m for m in result.messages if m.role is Role.ASSISTANT]
    part = assistant.parts[0]
    assert isinstance(part, CompactionPart) and part.payload == COMPACTION_BLOCK
    assert server.requests[0].body["stream"] is True and "context_management" in server.requests[0].body


async def test_without_the_capability_our_summariser_runs_and_nothing_native_is_sent(server: FakeServer) -> None:
    server.queue(Reply(body=_message([{"type": "text", "text": "SUMMARY: Rome trip."}])),
                 Reply(body=_message([{"type": "text", "text": "Done."}])))
    backend = _anthropic(server, SONNET_45)
    assert not backend.capabilities.native_compaction
    agent = Agent(backend, compaction=Compaction(at=0.5, keep_last_turns=1, native=True, window=60))
    history = [Message.user("first question " * 20), Message.assistant("first answer " * 20)]
    result = await agent.run([*history, Message.user("Which hotel?")])
    summary, answer = server.requests
    assert summary.body["messages"][-1]["content"] in (DEFAULT_SUMMARY_PROMPT,
                                                       [{"type": "text", "text": DEFAULT_SUMMARY_PROMPT}])
    assert "context_management" not in summary.body and "context_management" not in answer.body
    assert "compact-2026-01-12" not in _betas(answer.headers)
    assert result.state.compaction is not None and result.state.compaction.summary == "SUMMARY: Rome trip."


async def test_capability_follows_models_json_and_can_be_set(server: FakeServer) -> None:
    assert _anthropic(server, "claude-opus-4-6").capabilities.native_compaction
    assert not _anthropic(server, "claude-haiku-4-5").capabilities.native_compaction
    assert _anthropic(server, "claude-haiku-4-5", native_compaction=True).capabilities.native_compaction
    assert not _anthropic(server, SONNET_46, native_compaction=False).capabilities.native_compaction
    mixed = FallbackBackend([_anthropic(server), _anthropic(server, SONNET_45)])
    assert not mixed.capabilities.native_compaction  # any backend may serve: all must compact
    assert FallbackBackend([_anthropic(server), _anthropic(server, "claude-opus-4-6")]).capabilities.native_compaction


def _openai(server: FakeServer, **kwargs: Any) -> OpenAIBackend:
    kwargs.setdefault("api", "responses")
    return OpenAIBackend("gpt-5", base_url=f"{server.url}/v1", api_key="sk-test", retry_base_delay=0.0, **kwargs)


async def test_openai_responses_compacts_server_side_and_the_item_goes_back_verbatim(server: FakeServer) -> None:
    server.queue(Reply(body=response([OPENAI_COMPACTION, message_item("Book the second hotel.")], model="gpt-5")),
                 Reply(body=response([message_item("Done.")], model="gpt-5")))
    backend = _openai(server)
    assert backend.capabilities.native_compaction
    agent = Agent(backend, instructions="Plan trips.", compaction=Compaction(at=0.5, native=True))
    result = await agent.run("Which hotel?")
    sent = server.requests[0]
    assert sent.path == "/v1/responses"
    assert sent.body["context_management"] == [{"type": "compaction", "compact_threshold": 200_000}]
    [assistant] = [m for m in result.messages if m.role is Role.ASSISTANT]
    part = assistant.parts[0]
    assert isinstance(part, CompactionPart) and part.provider == "openai" and part.payload == OPENAI_COMPACTION

    await agent.run("And the flight?", state=result.state)
    items = server.requests[1].body["input"]
    assert OPENAI_COMPACTION in items
    assert items.index(OPENAI_COMPACTION) == [i.get("content") for i in items].index("Which hotel?") + 1


async def test_a_streamed_openai_compaction_item_lands_in_the_message(server: FakeServer) -> None:
    final = response([OPENAI_COMPACTION, message_item("Book it.")], model="gpt-5", counts=usage())
    server.queue(Reply(sse=[sse_event(e["type"], e) for e in stream_events(final)]))
    agent = Agent(_openai(server), compaction=Compaction(native=True))
    result = [item async for item in agent.run_stream("Which hotel?")][-1]
    assert isinstance(result, RunResult)
    [assistant] = [m for m in result.messages if m.role is Role.ASSISTANT]
    assert [p.kind for p in assistant.parts] == ["compaction", "text"]


async def test_chat_completions_and_other_servers_have_no_native_compaction(server: FakeServer) -> None:
    assert not _openai(server, api="chat").capabilities.native_compaction
    assert not _openai(server, flavor="vllm").capabilities.native_compaction
    assert not _openai(server, native_compaction=False).capabilities.native_compaction
    assert _openai(server, flavor="vllm", native_compaction=True).capabilities.native_compaction


async def test_a_compaction_part_never_reaches_another_provider(server: FakeServer) -> None:
    anthropic_part = CompactionPart(provider="anthropic", payload=COMPACTION_BLOCK, text=COMPACTION_BLOCK["content"])
    openai_part = CompactionPart(provider="openai", payload=OPENAI_COMPACTION)
    history = [Message.user("Which hotel?"),
               Message(role=Role.ASSISTANT, parts=[anthropic_part, openai_part]), Message.user("And now?")]
    from parley.backends.base import ModelRequest
    from parley.protocol import Conversation

    request = ModelRequest(conversation=Conversation(messages=history))
    anthropic_body, _, _ = _anthropic(server).build_body(request)
    assert anthropic_body["messages"][1]["content"] == [COMPACTION_BLOCK]
    openai_body = _openai(server).build_body(request, "openai")
    assert [i for i in openai_body["input"] if i.get("type") == "compaction"] == [OPENAI_COMPACTION]
    assert "context_management" not in anthropic_body and "context_management" not in openai_body  # not asked


async def test_a_session_keeps_the_providers_compaction_for_the_next_run(server: FakeServer, tmp_path: Any) -> None:
    from parley import SQLiteSession

    server.queue(Reply(body=_message([COMPACTION_BLOCK, {"type": "text", "text": "Book the second hotel."}])),
                 Reply(body=_message([{"type": "text", "text": "Done."}])))
    agent = Agent(_anthropic(server), compaction=Compaction(native=True))
    with SQLiteSession("trip", tmp_path / "s.db") as session:
        await agent.run("Which hotel?", session=session)
    with SQLiteSession("trip", tmp_path / "s.db") as session:  # another process, later
        stored = session.get_items_sync()
        assert isinstance(stored[1].parts[0], CompactionPart) and stored[1].parts[0].payload == COMPACTION_BLOCK
        await agent.run("And the flight?", session=session)
    assert server.requests[1].body["messages"][1]["content"][0] == COMPACTION_BLOCK


async def test_native_is_the_default_and_native_false_keeps_our_summariser(server: FakeServer) -> None:
    assert Compaction().native is True  # "used when available"
    server.queue(Reply(body=_message([{"type": "text", "text": "SUMMARY: Rome trip."}])),
                 Reply(body=_message([{"type": "text", "text": "Done."}])))
    backend = _anthropic(server)
    assert backend.capabilities.native_compaction
    agent = Agent(backend, compaction=Compaction(at=0.5, keep_last_turns=1, native=False, window=60))
    history = [Message.user("first question " * 20), Message.assistant("first answer " * 20)]
    await agent.run([*history, Message.user("Which hotel?")])
    summary, answer = server.requests
    assert "context_management" not in summary.body and "context_management" not in answer.body
    assert "compact-2026-01-12" not in _betas(answer.headers)
