"""ScriptedBackend and FunctionBackend: the model doubles every agent test stands on."""

from __future__ import annotations

import pytest

from parley.backends import FunctionBackend, ModelRequest, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import ScriptExhaustedError, ScriptMismatchError
from parley.protocol import Conversation, Message, MessageEnd, ReasoningDelta, TextDelta, ToolCallEnd, Usage, UsageEvent


def request(text: str = "hi") -> ModelRequest:
    return ModelRequest(conversation=Conversation(messages=[Message.user(text)]))


async def test_turns_play_in_order_and_requests_are_recorded() -> None:
    backend = ScriptedBackend(["one", ScriptedTurn(text="two", reasoning="think")])
    first = await backend.generate(request("a"))
    second = await backend.generate(request("b"))
    assert first.messages[0].text == "one"
    assert second.messages[0].text == "two" and second.messages[0].reasoning == "think"
    assert [r.conversation.messages[0].text for r in backend.requests] == ["a", "b"]
    assert backend.remaining == 0


async def test_running_out_of_script_is_a_typed_error() -> None:
    backend = ScriptedBackend(["only"])
    await backend.generate(request())
    with pytest.raises(ScriptExhaustedError, match="turn 2 but the script holds 1"):
        await backend.generate(request())


async def test_an_expectation_that_fails_is_a_mismatch() -> None:
    def wants_tools(req: ModelRequest) -> bool:
        return bool(req.tools)

    backend = ScriptedBackend([ScriptedTurn(text="x", expect=wants_tools)])
    with pytest.raises(ScriptMismatchError, match="scripted turn 1"):
        await backend.generate(request())


async def test_an_expectation_may_assert() -> None:
    def check(req: ModelRequest) -> None:
        assert req.conversation.messages[-1].text == "expected", "wrong prompt"

    backend = ScriptedBackend([ScriptedTurn(text="x", expect=check)])
    with pytest.raises(ScriptMismatchError, match="wrong prompt"):
        await backend.generate(request("other"))


async def test_usage_is_scripted_or_estimated_deterministically() -> None:
    scripted = Usage(input_tokens=7, output_tokens=3, requests=1)
    backend = ScriptedBackend([ScriptedTurn(text="a b c", usage=scripted), "four words right here"])
    assert (await backend.generate(request())).usage == scripted
    estimated = (await backend.generate(request("one two"))).usage
    assert (estimated.input_tokens, estimated.output_tokens, estimated.requests) == (2, 4, 1)


async def test_stream_ends_with_message_end_then_usage() -> None:
    backend = ScriptedBackend([ScriptedTurn(reasoning="hmm", text="ok", tool_calls=[call("f", {"x": 1}, id="c1")])])
    events = [e async for e in backend.stream(request())]
    kinds = [type(e) for e in events]
    assert kinds[0] is ReasoningDelta and TextDelta in kinds
    assert isinstance(events[-2], MessageEnd) and isinstance(events[-1], UsageEvent)
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert ends[0].call.id == "c1" and ends[0].call.parsed_arguments() == {"x": 1}


async def test_function_backend_decides_from_the_request() -> None:
    async def reply(req: ModelRequest) -> str:
        return req.conversation.messages[-1].text.upper()

    backend = FunctionBackend(reply)
    assert (await backend.generate(request("shout"))).messages[0].text == "SHOUT"
    assert backend.calls == 1


async def test_function_backend_rejects_a_bad_turn_type() -> None:
    backend = FunctionBackend(lambda req: 42)  # type: ignore[arg-type,return-value]
    with pytest.raises(ScriptMismatchError, match="int"):
        await backend.generate(request())


def test_a_user_image_does_not_break_a_script() -> None:
    from parley import Agent
    from parley.protocol import ImagePart

    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
    agent = Agent(ScriptedBackend(["A cat."]))
    result = agent.run_sync(Message.user("what is this?", ImagePart.from_bytes(png, media_type="image/png")))
    assert result.output == "A cat."
