"""History processors: what each request shows the model, never a call without its result.

The anchors' weak point (pydantic-ai #4728, #4827, #7878): a processor that keeps "the last N
messages" cuts a tool call from its result and the provider answers 400. Here every processor's
output is checked and normalised: the built-ins cut at turn boundaries, a user processor that
breaks a pair gets `HistoryProcessorError` naming it, before anything is sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from parley import Agent, Conversation, HistoryContext, RunContext, tool
from parley.backends.anthropic import AnthropicBackend
from parley.backends.base import ModelRequest
from parley.backends.local import LocalBackend
from parley.backends.scripted import FunctionBackend, ScriptedBackend, ScriptedTurn, call
from parley.context_window import estimate_tokens
from parley.errors import ConfigurationError, HistoryProcessorError
from parley.history import (
    DEFAULT_STUB,
    drop_old_tool_results,
    keep_last_messages,
    keep_last_turns,
    trim_to_budget,
)
from parley.local_engine.testing import FakeEngine
from parley.protocol import Message, Role, ToolCall, ToolResult
from tests.sdk.backends.fake_server import FakeServer, Reply

MODEL = "claude-sonnet-4-5-20250929"


@tool
def lookup(city: str) -> str:
    """Look up the weather of a city."""
    return f"{city}: 4 degrees"


def turn(n: int, *, calls: int = 3) -> list[Message]:
    """One old turn: a question, parallel calls, their results, an answer (6 messages with 3 calls)."""
    ids = [f"t{n}_c{k}" for k in range(calls)]
    out = [
        Message.user(f"question {n}"),
        Message.assistant(tool_calls=[ToolCall(id=i, name="lookup", arguments={"city": f"c{n}{i}"}) for i in ids]),
    ]
    out += [Message.tool(i, "lookup", f"result {n}/{k}: " + "x" * 40) for k, i in enumerate(ids)]
    out.append(Message.assistant(f"answer {n}"))
    return out


def history(turns: int = 60) -> list[Message]:
    messages: list[Message] = []
    for n in range(turns):
        messages += turn(n, calls=3 if n % 2 else 2)
    return messages


def strict_adjacency(body: dict[str, Any]) -> None:
    """Anthropic's rule, strictly: every tool_result answers a tool_use of the assistant message right
    before it, and every tool_use is answered in the very next message."""
    messages = body["messages"]
    assert messages and messages[0]["role"] == "user", "the conversation starts with a user message"
    for index, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        results = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        if results:
            assert message["role"] == "user" and index > 0
            before = messages[index - 1]
            assert before["role"] == "assistant", f"messages[{index}] answers calls but follows a {before['role']}"
            used = [b["id"] for b in before["content"] if b.get("type") == "tool_use"]
            assert set(results) <= set(used), f"messages[{index}]: results {results} for calls {used}"
            assert all(b.get("type") == "tool_result" for b in blocks[: len(results)]), "results lead the turn"
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if uses:
            assert index + 1 < len(messages), "an unanswered tool_use at the end"
            after = [b.get("tool_use_id") for b in messages[index + 1]["content"] if b.get("type") == "tool_result"]
            assert sorted(after) == sorted(uses), f"messages[{index}] calls {uses}, the next message answers {after}"


def _anthropic_message(content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
    usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    return {"id": "msg_01", "type": "message", "role": "assistant", "model": MODEL, "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": usage}


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    fake = await FakeServer().start()
    yield fake
    await fake.stop()


# -- the anchors' failure, on the wire ------------------------------------------------------------------
@pytest.mark.parametrize("processor", [keep_last_turns(5), keep_last_messages(5)], ids=repr)
async def test_sixty_turns_with_parallel_calls_keep_last_5_passes_a_strict_adjacency_check(
    server: FakeServer, processor: Any
) -> None:
    """A 60-turn history, parallel calls in every turn, and "keep the last 5" (where a plain slice would
    start with three results whose call was cut): every body sent to the Messages API keeps each
    tool_result right after its tool_use, including the current turn's parallel batch."""
    server.queue(
        Reply(body=_anthropic_message([
            {"type": "tool_use", "id": "toolu_A", "name": "lookup", "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "toolu_B", "name": "lookup", "input": {"city": "Rome"}},
        ], "tool_use")),
        Reply(body=_anthropic_message([{"type": "text", "text": "Oslo 4, Rome 4."}], "end_turn")),
    )
    old = history(60)
    naive = [*old, Message.user("and now Oslo and Rome?")][-5:]
    assert naive[0].role is Role.TOOL  # the plain slice would cut a call from its results
    backend = AnthropicBackend(MODEL, api_key="sk-test", base_url=server.url, retry_base_delay=0.0)
    agent = Agent(backend, instructions="Be brief.", tools=[lookup], history_processors=[processor])
    result = await agent.run([*old, Message.user("and now Oslo and Rome?")])

    assert result.output == "Oslo 4, Rome 4."
    bodies = [r.body for r in server.requests]
    assert len(bodies) == 2
    for body in bodies:
        strict_adjacency(body)
        assert body["system"][0]["text"] == "Be brief."
        assert len(body["messages"]) < 20  # trimmed: 60 turns are ~330 messages
    last = bodies[1]["messages"]
    assert [b["id"] for b in last[-2]["content"] if b["type"] == "tool_use"] == ["toolu_A", "toolu_B"]
    assert [b["tool_use_id"] for b in last[-1]["content"]] == ["toolu_A", "toolu_B"]  # the open batch, whole
    # the stored history is untouched: every old message is still there
    assert len(result.state.messages) == len(old) + 1 + 4
    assert result.state.messages[: len(old)] == old


def last_five(messages: list[Message]) -> list[Message]:
    return messages[-5:]


async def test_a_processor_that_orphans_results_raises_naming_it_and_sends_nothing(server: FakeServer) -> None:
    backend = AnthropicBackend(MODEL, api_key="sk-test", base_url=server.url, retry_base_delay=0.0)
    agent = Agent(backend, tools=[lookup], history_processors=[last_five])
    with pytest.raises(HistoryProcessorError) as caught:
        await agent.run([*history(60), Message.user("and now?")])
    assert caught.value.processor == "last_five"
    assert "last_five" in str(caught.value) and "without the call" in str(caught.value)
    assert caught.value.call_ids == ["t59_c0", "t59_c1", "t59_c2"]
    assert server.requests == []  # never a provider 400: nothing was sent


def drop_old_results_only(messages: list[Message]) -> list[Message]:
    """Keeps the calls of the first turn but drops their results."""
    return [m for i, m in enumerate(messages) if not (m.role is Role.TOOL and i < 5)]


async def test_a_processor_that_keeps_a_call_without_its_result_raises() -> None:
    backend = ScriptedBackend(["unused"])
    agent = Agent(backend, tools=[lookup], history_processors=[drop_old_results_only])
    with pytest.raises(HistoryProcessorError) as caught:
        await agent.run([*history(3), Message.user("and now?")])
    assert caught.value.processor == "drop_old_results_only"
    assert sorted(caught.value.call_ids) == ["t0_c0", "t0_c1"]
    assert "without their result" in str(caught.value)
    assert backend.requests == []


def forget_latest_round(messages: list[Message]) -> list[Message]:
    while messages and (messages[-1].role is Role.TOOL or messages[-1].tool_calls):
        messages = messages[:-1]
    return messages


async def test_cutting_the_open_batch_of_the_current_turn_raises() -> None:
    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="now_1"),
                                                        call("lookup", {"city": "Rome"}, id="now_2")]),
                               "unused"])
    agent = Agent(backend, tools=[lookup], history_processors=[forget_latest_round])
    with pytest.raises(HistoryProcessorError) as caught:
        await agent.run("Oslo and Rome?")
    assert caught.value.processor == "forget_latest_round"
    assert caught.value.call_ids == ["now_1", "now_2"]
    assert "open batch" in str(caught.value)
    assert len(backend.requests) == 1  # the first request went; the second never did


@pytest.mark.parametrize("bad", [lambda m: None, lambda m: [*m, "text"], lambda m: [Message.system("only")]])
async def test_a_processor_returning_nothing_sendable_raises(bad: Any) -> None:
    agent = Agent(ScriptedBackend(["unused"]), history_processors=[bad])
    with pytest.raises(HistoryProcessorError):
        await agent.run("hi")


def test_processors_are_checked_when_the_agent_is_made() -> None:
    with pytest.raises(ConfigurationError, match="not callable"):
        Agent(ScriptedBackend([]), history_processors=["keep"])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match=r"\(messages\) or \(ctx, messages\)"):
        Agent(ScriptedBackend([]), history_processors=[lambda a, b, c: a])
    with pytest.raises(ConfigurationError):
        keep_last_turns(0)
    with pytest.raises(ConfigurationError):
        trim_to_budget(1.5)


def test_a_processor_that_moves_a_result_away_from_its_call_is_repaired() -> None:
    """Reordering is repaired by the normaliser (results back next to their calls), not an error."""
    def shuffle(messages: list[Message]) -> list[Message]:
        tools = [m for m in messages if m.role is Role.TOOL]
        return [m for m in messages if m.role is not Role.TOOL] + tools[::-1]

    seen: list[ModelRequest] = []

    def reply(request: ModelRequest) -> str:
        seen.append(request)
        return "done"

    agent = Agent(FunctionBackend(reply), history_processors=[shuffle])
    agent.run_sync([*history(2), Message.user("and now?")])
    sent = seen[0].conversation.messages
    for index, message in enumerate(sent):
        if message.tool_calls:
            answers = [r.call_id for m in sent[index + 1 : index + 1 + len(message.tool_calls)] for r in m.tool_results]
            assert answers == [c.id for c in message.tool_calls]


# -- async processors, processors taking the context ---------------------------------------------------
@dataclass
class Deps:
    secret: str


async def redact(ctx: RunContext[Deps], messages: list[Message]) -> list[Message]:
    assert isinstance(ctx, HistoryContext)
    for message in messages:  # in place: the processor works on its own copy
        for part in message.parts:
            if isinstance(part, ToolResult):
                part.content = part.content.replace(ctx.deps.secret, "[redacted]")
    return messages


async def test_async_processors_taking_the_context_run_in_order_on_a_copy() -> None:
    calls: list[str] = []

    async def first(messages: list[Message]) -> list[Message]:
        calls.append(f"first:{len(messages)}")
        return messages

    def second(ctx: HistoryContext[Deps], messages: list[Message]) -> list[Message]:
        calls.append(f"second:turn={ctx.turn}:window={ctx.window}")
        assert ctx.instructions and ctx.instructions[0].text == "Be brief."
        assert ctx.count_tokens(messages) > 0 and not ctx.exact_count
        return messages

    @tool
    def vault(name: str) -> str:
        """Read a value."""
        return f"{name} is hunter2"

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("vault", {"name": "pw"})]), "ok"])
    agent = Agent(backend, instructions="Be brief.", tools=[vault], deps_type=Deps,
                  history_processors=[first, redact, second])
    result = await agent.run("what is pw?", deps=Deps(secret="hunter2"))

    assert calls == ["first:1", "second:turn=0:window=None", "first:3", "second:turn=1:window=None"]
    sent = backend.requests[1].conversation.messages
    assert sent[-1].tool_results[0].content == "pw is [redacted]"
    stored = [r for m in result.state.messages for r in m.tool_results]
    assert stored[0].content == "pw is hunter2"  # what the run keeps is never changed


# -- built-ins -------------------------------------------------------------------------------------------
def test_keep_last_turns_keeps_the_pinned_prefix_and_whole_turns() -> None:
    messages = [Message.developer("rules"), *history(10), Message.user("now?")]
    kept = keep_last_turns(3)(list(messages))
    assert kept[0].text == "rules"
    assert kept[1].text == "question 8" and kept[-1].text == "now?"
    assert kept[1:] == messages[-len(kept) + 1 :]
    assert keep_last_turns(50)(list(messages)) == messages


def test_keep_last_messages_moves_the_cut_back_to_the_turn_start() -> None:
    messages = [*history(4), Message.user("now?")]
    kept = keep_last_messages(5)(list(messages))
    assert kept[0].role is Role.USER and kept[0].text == "question 3"
    assert len(kept) >= 5 and kept == messages[-len(kept) :]


def test_drop_old_tool_results_stubs_all_but_the_newest_and_the_open_batch() -> None:
    messages = [*history(3), Message.user("now?"),
                Message.assistant(tool_calls=[ToolCall(id="open_1", name="lookup", arguments={"city": "Oslo"})]),
                Message.tool("open_1", "lookup", "fresh result")]
    out = drop_old_tool_results(keep=2)(list(messages))
    results = [r for m in out for r in m.tool_results]
    kept = [r for r in results if r.content != DEFAULT_STUB]
    assert [r.call_id for r in kept] == ["t2_c1", "open_1"]  # the newest two (the open batch counts)
    assert all(r.content == DEFAULT_STUB for r in results if r.call_id not in {"t2_c1", "open_1"})
    assert [c.id for m in out for c in m.tool_calls] == [c.id for m in messages for c in m.tool_calls]
    custom = drop_old_tool_results(keep=0, stub=lambda r: f"[{r.name} result dropped]")(list(messages))
    assert [r.content for m in custom for r in m.tool_results][0] == "[lookup result dropped]"
    assert [r.content for m in custom for r in m.tool_results][-1] == "fresh result"  # the open batch stays


async def test_trim_to_budget_counts_the_local_prompt_exactly_and_fits_the_fraction() -> None:
    """With a local backend the count is the engine's prompt length: the prompt sent is at most the
    fraction of max_model_len, cut at a turn boundary, instructions kept."""
    engine = FakeEngine("Done.", max_model_len=4096)
    backend = LocalBackend(engine=engine)
    agent = Agent(backend, instructions="Be brief.", history_processors=[trim_to_budget(0.25)])
    messages = [*history(30), Message.user("now?")]
    result = await agent.run(messages)
    assert result.output == "Done."
    sent = engine.last.prompt_ids
    assert len(sent) <= 0.25 * 4096
    text = engine.tokenizer.decode(sent)
    assert text.count("question") >= 2 and "question 0" not in text and "Be brief." in text
    full = backend.codec.render(  # the untrimmed prompt would not have fit
        Conversation(messages=[Message.system("Be brief."), *messages]), [], reasoning=None
    )
    assert len(full) > 4096 * 0.25


async def test_trim_to_budget_uses_a_windows_fraction_with_estimates() -> None:
    seen: list[ModelRequest] = []

    def reply(request: ModelRequest) -> str:
        seen.append(request)
        return "ok"

    backend = FunctionBackend(reply)
    backend.context_window = 2000  # type: ignore[attr-defined]
    agent = Agent(backend, history_processors=[trim_to_budget(0.5)])
    messages = [*history(30), Message.user("now?")]
    await agent.run(messages)
    sent = seen[0].conversation.messages
    assert estimate_tokens(messages) > 2000  # ~4 characters per token
    assert 0.4 * 2000 < estimate_tokens(sent) <= 0.5 * 2000  # the earliest cut that fits
    assert sent[0].role is Role.USER and sent[-1].text == "now?" and sent == messages[-len(sent) :]

    unknown = Agent(ScriptedBackend(["ok"]), history_processors=[trim_to_budget(0.5)])
    with pytest.raises(ConfigurationError, match="window"):
        await unknown.run("hi")
    explicit = Agent(ScriptedBackend(["ok"]), history_processors=[trim_to_budget(0.5, window=100)])
    assert (await explicit.run([*history(5), Message.user("now?")])).output == "ok"
