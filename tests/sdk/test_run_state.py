"""RunState: versioned JSON, refusal of unknown versions, and the frozen fixture corpus replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley import Agent, RunState, ToolContext, tool
from parley.backends import ScriptedBackend
from parley.errors import RunStateError, RunStateVersionError
from parley.run_state import SCHEMA_VERSION, SCHEMA_VERSION_SUMMARIES, SUPPORTED_VERSIONS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "run_state"
ALL_FIXTURES = sorted(FIXTURES.glob("*/*.json"))


executed: list[str] = []


@tool
def lookup(ctx: ToolContext, city: str) -> str:
    executed.append(ctx.call_id)
    return f"4 C in {city}"


@tool(needs_approval=True)
def send_email(ctx: ToolContext, to: str, body: str) -> str:
    executed.append(ctx.call_id)
    return f"sent to {to}"


@tool(deferred=True)
def ask_manager(question: str) -> str:
    raise AssertionError("deferred")


def test_every_supported_version_has_fixtures_and_a_summary() -> None:
    assert SCHEMA_VERSION in SUPPORTED_VERSIONS
    for version in SUPPORTED_VERSIONS:
        assert SCHEMA_VERSION_SUMMARIES[version]
        assert list((FIXTURES / version).glob("*.json")), f"no frozen fixtures for schema_version {version}"
    assert {p.parent.name for p in ALL_FIXTURES} <= set(SUPPORTED_VERSIONS)


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fixture_loads_and_round_trips(path: Path) -> None:
    state = RunState.from_json(path.read_text())
    again = RunState.from_json(state.to_json())
    assert again == state
    assert state.trace_id.startswith("fixture-")


@pytest.mark.parametrize(
    "path", [p for p in ALL_FIXTURES if p.stem.startswith("resume_")], ids=lambda p: f"{p.parent.name}/{p.stem}"
)
async def test_fixture_resumes_to_completion(path: Path) -> None:
    executed.clear()
    state = RunState.from_json(path.read_text())
    recorded = set(state.records)
    batch = list(state.batch)
    decided_without_running = {i for i, d in state.decisions.items() if d.kind != "approved"}
    for item in list(state.pending):
        if item.kind == "approval":
            state.approve(item.call_id)
        else:
            state.provide_result(item.call_id, {"answer": "yes"})
            decided_without_running.add(item.call_id)
    backend = ScriptedBackend(["All done."])
    result = await Agent(backend, tools=[lookup, send_email, ask_manager]).run(state=state)
    assert result.output == "All done." and not result.paused
    answered = {r.call_id for m in result.messages for r in m.tool_results}
    assert answered >= {c.id for m in result.messages for c in m.tool_calls}
    assert not recorded & set(executed)  # nothing recorded ran again
    assert len(executed) == len(set(executed))  # nothing ran twice
    assert set(executed) | recorded | decided_without_running == {c.id for c in batch}
    assert result.usage.requests == state.usage.requests + 1  # usage continued from the state


def test_newer_version_is_refused_with_a_clear_error() -> None:
    data = json.loads(RunState(trace_id="t").to_json())
    data["schema_version"] = "1.99"
    with pytest.raises(RunStateVersionError, match="newer parley"):
        RunState.from_json(json.dumps(data))
    data["schema_version"] = "2.0"
    with pytest.raises(RunStateVersionError, match="upgrade parley"):
        RunState.from_json(json.dumps(data))


@pytest.mark.parametrize("version", ["0.9", "banana", None, 1])
def test_unknown_or_missing_versions_are_refused(version: object) -> None:
    data = json.loads(RunState(trace_id="t").to_json())
    if version is None:
        del data["schema_version"]
    else:
        data["schema_version"] = version
    with pytest.raises(RunStateVersionError):
        RunState.from_json(json.dumps(data))


@pytest.mark.parametrize(
    "text",
    ["", "{", "[]", '"x"', '{"schema_version": "1.0"}', '{"schema_version": "1.0", "trace_id": "t", "surprise": 1}'],
)
def test_malformed_states_are_a_typed_error(text: str) -> None:
    with pytest.raises(RunStateError):
        RunState.from_json(text)


def test_compatibility_policy_is_written_down() -> None:
    import parley.run_state as module

    doc = module.__doc__ or ""
    assert "Compatibility policy" in doc and "newer" in doc and "tests/fixtures/run_state" in doc


def test_1_0_states_load_as_the_current_version_with_an_empty_repeat_record() -> None:
    old = FIXTURES / "1.0" / "resume_pending_approval.json"
    assert json.loads(old.read_text())["schema_version"] == "1.0"
    state = RunState.from_json(old.read_text())
    assert state.schema_version == SCHEMA_VERSION == "1.2"
    assert state.call_log == {} and state.repeats == [] and state.tool_rounds == 0 and state.fingerprint is None
    assert json.loads(state.to_json())["schema_version"] == "1.2"


async def test_the_repeat_record_survives_the_fixture_and_answers_a_repeat() -> None:
    executed.clear()
    state = RunState.from_json((FIXTURES / "1.1" / "resume_pending_approval_after_a_repeat.json").read_text())
    assert [r.original_call_id for r in state.repeats] == ["call_lookup"] and len(state.call_log) == 1
    state.approve("call_email")
    from parley.backends import ScriptedTurn
    from parley.backends.scripted import call

    backend = ScriptedBackend([ScriptedTurn(tool_calls=[call("lookup", '{ "city": "Oslo" }', id="third")]), "Done."])
    result = await Agent(backend, tools=[lookup, send_email, ask_manager]).run(state=state)
    assert result.output == "Done." and executed == ["call_email"]  # lookup(Oslo) was not run a second time
    assert [r.call_id for r in result.repeats] == ["call_lookup_again", "third"]
