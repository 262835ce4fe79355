"""The agent loop over a scripted model: tools, errors back to the model, parallelism, limits, streaming."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal

import pytest

from parley import Agent, Message, RunResult, UsageLimits, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import ConfigurationError, MaxTurnsExceeded, OrphanToolResultError, UsageLimitExceeded
from parley.protocol import MessageEnd, Role, TextDelta, ToolCallEnd, Usage


@tool
def lookup(city: str) -> str:
    """Weather for a city.

    Args:
        city: The city name.
    """
    return f"4 C in {city}"


@tool
def explode(reason: str) -> str:
    raise RuntimeError(f"boom: {reason}")


def results_of(result: RunResult[object]) -> dict[str, tuple[str, bool]]:
    return {r.call_id: (r.content, r.is_error) for m in result.messages for r in m.tool_results}


async def test_a_plain_answer_with_instructions_first() -> None:
    backend = ScriptedBackend(["Hello!"])
    result = await Agent(backend, instructions="Be brief.").run("hi")
    assert result.output == "Hello!" and not result.paused
    sent = backend.requests[0].conversation.messages
    assert [m.role for m in sent] == [Role.SYSTEM, Role.USER] and sent[0].text == "Be brief."
    assert result.usage.requests == 1 and result.turns == 1


async def test_tool_call_then_answer_offers_tool_specs() -> None:
    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="c1")]), "It is 4 C."])
    result = await Agent(backend, tools=[lookup]).run("weather?")
    assert result.output == "It is 4 C."
    assert results_of(result) == {"c1": ("4 C in Oslo", False)}
    spec = backend.requests[0].tools[0]
    assert spec.name == "lookup" and spec.parameters["properties"]["city"]["type"] == "string"
    # the second request shows the model its call and the result right after it
    second = backend.requests[1].conversation.messages
    assert second[-2].tool_calls[0].id == "c1" and second[-1].tool_results[0].call_id == "c1"


async def test_plain_functions_are_accepted_as_tools() -> None:
    def double(x: int) -> int:
        return 2 * x

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("double", {"x": 21}, id="d")]), "42"])
    result = await Agent(backend, tools=[double]).run("?")
    assert results_of(result)["d"] == ("42", False)


async def test_tool_errors_invalid_arguments_and_unknown_tools_go_back_to_the_model() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(
                tool_calls=[
                    call("explode", {"reason": "x"}, id="e"),
                    call("lookup", {"city": 5}, id="bad"),
                    call("nope", {}, id="u"),
                ]
            ),
            "sorry",
        ]
    )
    result = await Agent(backend, tools=[lookup, explode]).run("go")
    found = results_of(result)
    assert all(is_error for _, is_error in found.values())
    assert "boom" in found["e"][0] or "RuntimeError" in found["e"][0]
    assert "city" in found["bad"][0]
    assert "Unknown tool 'nope'" in found["u"][0] and "lookup" in found["u"][0]
    assert result.output == "sorry"


async def test_independent_calls_run_in_parallel() -> None:
    @tool
    async def slow(n: int) -> int:
        await asyncio.sleep(0.2)
        return n

    calls = [call("slow", {"n": i}, id=f"s{i}") for i in range(4)]
    backend = ScriptedBackend([ScriptedTurn(tool_calls=calls), "done"])
    started = time.perf_counter()
    result = await Agent(backend, tools=[slow]).run("go")
    assert time.perf_counter() - started < 0.6
    assert [r.call_id for m in result.messages for r in m.tool_results] == ["s0", "s1", "s2", "s3"]


async def test_duplicate_call_ids_from_the_model_are_made_unique() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("lookup", {"city": "A"}, id="x"), call("lookup", {"city": "B"}, id="x")]),
            ScriptedTurn(tool_calls=[call("lookup", {"city": "C"}, id="x"), call("lookup", {"city": "D"}, id="")]),
            "ok",
        ]
    )
    result = await Agent(backend, tools=[lookup]).run("go")
    calls = [c for m in result.messages for c in m.tool_calls]
    ids = [c.id for c in calls]
    assert len(set(ids)) == 4 and ids[0] == "x"
    by_id = {r.call_id: r.content for m in result.messages for r in m.tool_results}
    assert [by_id[c.id] for c in calls] == ["4 C in A", "4 C in B", "4 C in C", "4 C in D"]


async def test_max_turns_raises_with_a_resumable_state() -> None:
    looping = FunctionBackend(lambda req: ScriptedTurn(tool_calls=[call("lookup", {"city": "X"})]))
    with pytest.raises(MaxTurnsExceeded) as caught:
        await Agent(looping, tools=[lookup], max_turns=3).run("go")
    assert caught.value.state.turn == 3 and looping.calls == 3


async def test_request_limit_is_checked_before_the_request() -> None:
    looping = FunctionBackend(lambda req: ScriptedTurn(tool_calls=[call("lookup", {"city": "X"})]))
    agent = Agent(looping, tools=[lookup], usage_limits=UsageLimits(request_limit=2))
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("go")
    assert caught.value.limit == "request_limit" and looping.calls == 2


@pytest.mark.parametrize(
    ("limits", "name"),
    [
        (UsageLimits(total_tokens_limit=150), "total_tokens_limit"),
        (UsageLimits(input_tokens_limit=100), "input_tokens_limit"),
        (UsageLimits(output_tokens_limit=50), "output_tokens_limit"),
        (UsageLimits(tool_calls_limit=2), "tool_calls_limit"),
        (UsageLimits(cost_limit=Decimal("0.05")), "cost_limit"),
    ],
)
async def test_token_tool_call_and_cost_limits(limits: UsageLimits, name: str) -> None:
    usage = Usage(input_tokens=60, output_tokens=30, requests=1, cost=Decimal("0.02"))
    looping = FunctionBackend(lambda req: ScriptedTurn(tool_calls=[call("lookup", {"city": "X"})], usage=usage))
    with pytest.raises(UsageLimitExceeded) as caught:
        await Agent(looping, tools=[lookup], usage_limits=limits).run("go")
    assert caught.value.limit == name
    assert looping.calls <= 3


def test_usage_limits_reject_nonsense() -> None:
    with pytest.raises(ConfigurationError):
        UsageLimits(request_limit=-1)
    with pytest.raises(ConfigurationError):
        UsageLimits(cost_limit=0.5)  # type: ignore[arg-type]


async def test_run_stream_yields_events_then_the_result() -> None:
    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="c")]), "Sunny."])
    items = [item async for item in Agent(backend, tools=[lookup]).run_stream("go")]
    final = items[-1]
    assert isinstance(final, RunResult) and final.output == "Sunny."
    events = items[:-1]
    assert any(isinstance(e, ToolCallEnd) for e in events)
    tool_ends = [e for e in events if isinstance(e, MessageEnd) and e.message.role is Role.TOOL]
    assert tool_ends[0].message.tool_results[0].content == "4 C in Oslo"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Sunny."


def test_run_sync() -> None:
    assert Agent(ScriptedBackend(["hi"])).run_sync("x").output == "hi"


def test_bad_configuration_is_a_typed_error() -> None:
    with pytest.raises(ConfigurationError):
        Agent(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        Agent(ScriptedBackend([]), max_turns=0)
    with pytest.raises(ConfigurationError, match="share the name"):
        Agent(ScriptedBackend([]), tools=[lookup, lookup])
    with pytest.raises(ConfigurationError, match="input or a state"):
        Agent(ScriptedBackend([])).run_sync()


# -- histories that would break tool_use / tool_result adjacency ----------------------------------


async def test_history_results_are_moved_next_to_their_calls_in_call_order() -> None:
    history = [
        Message.user("weather in A and B?"),
        Message.assistant(tool_calls=[call("lookup", {"city": "A"}, id="a"), call("lookup", {"city": "B"}, id="b")]),
        Message.user("also, hurry"),
        Message.tool("b", "lookup", "B: rain"),
        Message.tool("a", "lookup", "A: sun"),
    ]
    backend = ScriptedBackend(["A sun, B rain"])
    await Agent(backend, tools=[lookup]).run(history)
    sent = backend.requests[0].conversation.messages
    roles = [m.role for m in sent]
    assert roles == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.USER]
    assert [sent[2].tool_results[0].call_id, sent[3].tool_results[0].call_id] == ["a", "b"]


async def test_an_unanswered_call_mid_history_gets_an_error_result() -> None:
    history = [
        Message.user("q"),
        Message.assistant(tool_calls=[call("lookup", {"city": "A"}, id="lost")]),
        Message.user("never mind, say hi"),
    ]
    backend = ScriptedBackend(["hi"])
    await Agent(backend, tools=[lookup]).run(history)
    sent = backend.requests[0].conversation.messages
    assert sent[2].role is Role.TOOL and sent[2].tool_results[0].is_error
    assert sent[3].text == "never mind, say hi"


async def test_unanswered_calls_at_the_end_of_a_history_are_executed() -> None:
    history = [
        Message.user("q"),
        Message.assistant(tool_calls=[call("lookup", {"city": "A"}, id="a"), call("lookup", {"city": "B"}, id="b")]),
        Message.tool("a", "lookup", "kept as given"),
    ]
    backend = ScriptedBackend(["done"])
    result = await Agent(backend, tools=[lookup]).run(history)
    assert results_of(result) == {"a": ("kept as given", False), "b": ("4 C in B", False)}


async def test_an_orphan_result_in_a_history_is_refused() -> None:
    with pytest.raises(OrphanToolResultError):
        await Agent(ScriptedBackend(["x"])).run([Message.user("q"), Message.tool("ghost", "lookup", "?")])


async def test_a_previous_results_messages_continue_the_conversation() -> None:
    backend = ScriptedBackend(["first", "second"])
    agent = Agent(backend, instructions="sys")
    first = await agent.run("one")
    await agent.run([*first.messages, Message.user("two")])
    sent = backend.requests[1].conversation.messages
    assert [m.role for m in sent] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.USER]


async def test_backend_sees_tool_choice_none_without_tools() -> None:
    def check(req: ModelRequest) -> bool:
        return req.tool_choice == "none" and req.tools == []

    await Agent(ScriptedBackend([ScriptedTurn(text="x", expect=check)])).run("q")


async def test_tool_choice_may_be_decided_per_turn() -> None:
    from parley.backends import NamedToolChoice

    def plan(messages: list[Message]) -> NamedToolChoice | str:
        return NamedToolChoice("lookup") if not any(m.tool_results for m in messages) else "none"

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "A"})]), "done"])
    await Agent(backend, tools=[lookup], tool_choice=plan).run("go")
    assert [r.tool_choice for r in backend.requests] == [NamedToolChoice("lookup"), "none"]


async def test_run_stream_raises_what_the_run_raises() -> None:
    from parley.errors import ScriptExhaustedError

    stream = Agent(
        ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", {"city": "A"})])]), tools=[lookup]
    ).run_stream("go")
    with pytest.raises(ScriptExhaustedError):
        async for _ in stream:
            pass
