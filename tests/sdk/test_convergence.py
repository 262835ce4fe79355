"""Convergence: after `max_tool_rounds` rounds of tool calls the model is asked with tools off, so a
run ends with an answer or a typed error naming the cause — never by quietly using up `max_turns`."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from parley import Agent, RunState, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.errors import ConfigurationError, MaxTurnsExceeded, OutputValidationError

ran: list[int] = []


@tool
def step(n: int) -> str:
    ran.append(n)
    return f"step {n} done"


class Answer(BaseModel):
    city: str
    temp_c: int


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def eager(answer: str = '{"city": "Oslo", "temp_c": 4}') -> FunctionBackend:
    """A model that calls a new tool every turn it may, and answers only when tools are off."""

    def model(request: ModelRequest) -> ScriptedTurn | str:
        if request.tool_choice == "none":
            return answer
        return ScriptedTurn(tool_calls=[call("step", {"n": len(request.conversation.messages)})])

    return FunctionBackend(model)


def test_after_the_default_three_rounds_the_typed_answer_is_asked_for() -> None:
    backend = eager()
    result = Agent(backend, tools=[step], output_type=Answer).run_sync("go")
    assert result.output == Answer(city="Oslo", temp_c=4)
    assert [r.tool_choice for r in backend.requests] == ["auto", "auto", "auto", "none"]
    assert len(ran) == 3 and result.turns == 4
    # the request still offers the tools (stable prompt prefix) and the output schema
    assert backend.requests[-1].tools and backend.requests[-1].output_schema == Answer.model_json_schema()


def test_max_tool_rounds_is_configurable_and_none_lifts_it() -> None:
    backend = eager()
    Agent(backend, tools=[step], output_type=Answer, max_tool_rounds=1).run_sync("go")
    assert [r.tool_choice for r in backend.requests] == ["auto", "none"]
    ran.clear()
    backend = eager()
    result = Agent(backend, tools=[step], output_type=Answer, max_tool_rounds=None, max_turns=6).run_sync("go")
    # no round limit: tools stay on until the last turn max_turns allows, which asks for the answer
    assert [r.tool_choice for r in backend.requests] == ["auto"] * 5 + ["none"]
    assert isinstance(result.output, Answer) and len(ran) == 5


def test_without_an_output_type_the_text_after_the_rounds_is_the_answer() -> None:
    backend = eager(answer="All steps done.")
    result = Agent(backend, tools=[step], max_tool_rounds=2).run_sync("go")
    assert result.output == "All steps done." and len(ran) == 2


def test_a_backend_that_ignores_tools_off_ends_with_a_typed_error_naming_the_cause() -> None:
    stubborn = FunctionBackend(
        lambda request: ScriptedTurn(tool_calls=[call("step", {"n": len(request.conversation.messages)})])
    )
    agent = Agent(stubborn, tools=[step], output_type=Answer, output_retries=1)
    with pytest.raises(OutputValidationError, match="kept calling tools") as caught:
        agent.run_sync("go")
    assert "max_tool_rounds=3" in str(caught.value) and caught.value.attempts == 2
    assert len(ran) == 3  # the calls made while tools were off never ran
    assert stubborn.calls == 5  # 3 rounds, then 2 answer attempts (output_retries=1): far below max_turns=20


def test_calls_made_with_tools_off_get_error_results_and_the_model_can_still_answer() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("step", {"n": 1}, id="a")]),
            ScriptedTurn(tool_calls=[call("step", {"n": 2}, id="b")]),  # tools were off: not run
            '{"city": "Oslo", "temp_c": 4}',
        ]
    )
    result = Agent(backend, tools=[step], output_type=Answer, max_tool_rounds=1).run_sync("go")
    assert isinstance(result.output, Answer) and ran == [1]
    refused = [r for m in result.messages for r in m.tool_results if r.call_id == "b"][0]
    assert refused.is_error and refused.content.startswith("Not run: tools are off now (max_tool_rounds=1")


def test_the_last_turn_max_turns_allows_has_tools_off() -> None:
    backend = eager()
    result = Agent(backend, tools=[step], output_type=Answer, max_turns=2).run_sync("go")
    assert [r.tool_choice for r in backend.requests] == ["auto", "none"] and isinstance(result.output, Answer)


def test_max_turns_names_what_went_wrong_on_the_last_turn() -> None:
    looping = FunctionBackend(lambda req: ScriptedTurn(tool_calls=[call("step", {"n": 1})]))
    with pytest.raises(MaxTurnsExceeded, match="last of max_turns=2") as caught:
        Agent(looping, tools=[step], max_turns=2).run_sync("go")
    assert caught.value.state.turn == 2


def test_rounds_restart_with_a_new_user_message() -> None:
    backend = eager(answer="done")
    agent = Agent(backend, tools=[step], max_tool_rounds=2)
    first = agent.run_sync("go")
    assert first.state.tool_rounds == 2
    backend.requests.clear()
    again = agent.run_sync("once more", state=RunState.from_json(first.state.to_json()))
    assert [r.tool_choice for r in backend.requests] == ["auto", "auto", "none"] and again.output == "done"


def test_a_tool_choice_policy_is_still_capped() -> None:
    backend = eager()
    Agent(backend, tools=[step], output_type=Answer, tool_choice=lambda messages: "required").run_sync("go")
    assert [r.tool_choice for r in backend.requests] == ["required"] * 3 + ["none"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_bad_max_tool_rounds_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="max_tool_rounds"):
        Agent(ScriptedBackend([]), tools=[step], max_tool_rounds=bad)  # type: ignore[arg-type]


def test_an_answer_cut_off_at_the_token_limit_says_so() -> None:
    cut = ScriptedTurn(text='{"city": "Os', finish_reason="length")
    with pytest.raises(OutputValidationError, match="cut off at the token limit"):
        Agent(ScriptedBackend([cut, cut]), output_type=Answer, output_retries=1).run_sync("go")


def test_after_an_answer_that_fails_the_output_type_the_repair_goes_with_tools_off() -> None:
    # A self-hosted server (vLLM without a known tool parser, llama.cpp) enforces the answer schema only on
    # a turn with tools off: a model that answered in prose beside tools gets its repair turn there.
    def model(request: ModelRequest) -> ScriptedTurn | str:
        return '{"city": "Oslo", "temp_c": 4}' if request.tool_choice == "none" else "It is cold in Oslo."

    backend = FunctionBackend(model)
    result = Agent(backend, tools=[step], output_type=Answer).run_sync("go")
    assert result.output == Answer(city="Oslo", temp_c=4) and not ran
    assert [r.tool_choice for r in backend.requests] == ["auto", "none"]
    follow_up = Agent(backend, tools=[step], output_type=Answer).run_sync("again", state=result.state)
    assert follow_up.output == Answer(city="Oslo", temp_c=4)
    assert [r.tool_choice for r in backend.requests][2:] == ["auto", "none"]  # tools are back for a new message
