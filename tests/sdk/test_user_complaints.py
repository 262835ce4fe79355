"""The recurring user complaints of the reference list (protocol-and-providers.md §6), one test each
where the agent runtime is the place to fix them (the others live with the codecs and adapters)."""

from __future__ import annotations

import json
from typing import Any

from parley import Agent, RunState, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.protocol import Message, ReasoningPart, Role


@tool(needs_approval=True)
def deploy(service: str) -> str:
    return f"deployed {service}"


@tool
def lookup(key: str) -> str:
    return f"value of {key}"


async def test_1_and_3_approval_survives_a_reload_as_plain_json() -> None:
    """#1 pause/persist/resume, #3 approval state lost across UI reloads."""
    agent = Agent(
        ScriptedBackend([ScriptedTurn(tool_calls=[call("deploy", {"service": "api"}, id="d")]), "ok"]), tools=[deploy]
    )
    paused = await agent.run("deploy api")
    stored = json.dumps({"ui": "reloaded", "state": json.loads(paused.state.to_json())})  # e.g. a browser store
    state = RunState.from_json(json.dumps(json.loads(stored)["state"]))
    state.approve("d")
    assert (await agent.run(state=state)).output == "ok"


async def test_2_every_call_is_paired_with_exactly_one_result_after_a_deferred_resume() -> None:
    """#2 deferred-resume edge cases: calls and results must pair, in order, adjacent."""
    calls = [call("deploy", {"service": s}, id=s) for s in ("a", "b", "c")]
    backend = ScriptedBackend([ScriptedTurn(tool_calls=calls), "done"])
    agent = Agent(backend, tools=[deploy])
    state = (await agent.run("go")).state
    state.reject("b", message="no")
    state = RunState.from_json(state.to_json())
    state = (await agent.run(state=state)).state  # still paused on a and c
    state.approve("c")
    state.approve("a")
    result = await agent.run(state=RunState.from_json(state.to_json()))
    sent = backend.requests[-1].conversation.messages
    caller = next(i for i, m in enumerate(sent) if m.tool_calls)
    assert [m.tool_results[0].call_id for m in sent[caller + 1 : caller + 4]] == ["a", "b", "c"]
    assert result.output == "done"


async def test_11_reasoning_and_its_signature_go_back_unchanged_in_a_tool_loop() -> None:
    """#11 thinking + tools round trip: the signed reasoning block precedes the call when sent back."""
    signed = ReasoningPart(text="need the key", signature="sig-123", provider="anthropic")

    def model(request: ModelRequest) -> Any:
        if not any(m.tool_results for m in request.conversation):
            message = Message(role=Role.ASSISTANT, parts=[signed, call("lookup", {"key": "k"}, id="l")])
            from parley.backends import ModelResponse
            from parley.protocol import Usage

            return ModelResponse(messages=[message], usage=Usage(requests=1))
        assistant = next(m for m in request.conversation if m.role is Role.ASSISTANT)
        assert assistant.parts[0] == signed and assistant.tool_calls[0].id == "l"
        return "value found"

    assert (await Agent(FunctionBackend(model), tools=[lookup]).run("?")).output == "value found"


async def test_12_a_paused_run_may_resume_on_another_backend() -> None:
    """#12 switching provider mid-conversation: the state records who ran each part."""
    first = ScriptedBackend([ScriptedTurn(tool_calls=[call("deploy", {"service": "x"}, id="d")])], name="provider-a")
    state = (await Agent(first, tools=[deploy]).run("go")).state
    assert state.backend == "provider-a"
    state.approve("d")
    second = ScriptedBackend(["finished elsewhere"], name="provider-b")
    result = await Agent(second, tools=[deploy]).run(state=RunState.from_json(state.to_json()))
    assert result.output == "finished elsewhere" and result.state.backend == "provider-b"
    assert second.requests[0].conversation.messages[-1].tool_results[0].content == "deployed x"


async def test_durable_results_are_checkpointed_before_the_next_model_call() -> None:
    """Durability: when the model is asked again, the saved state already holds the last results."""
    saved: list[str] = []

    def model(request: ModelRequest) -> Any:
        results = [r for m in request.conversation for r in m.tool_results]
        if results:
            last = RunState.from_json(saved[-1])
            recorded = {r.call_id for m in last.messages for r in m.tool_results}
            assert {r.call_id for r in results} <= recorded
            return "done"
        return ScriptedTurn(tool_calls=[call("lookup", {"key": "a"}, id="a"), call("lookup", {"key": "b"}, id="b")])

    result = await Agent(FunctionBackend(model), tools=[lookup]).run(
        "go", checkpoint=lambda state: saved.append(state.to_json())
    )
    assert result.output == "done" and len(saved) >= 3
    assert RunState.from_json(saved[-1]).status == "complete"
