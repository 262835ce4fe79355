"""The repeat rule: an identical call (tool + canonical arguments) is not run, or asked about, twice.

All on scripted models: a small local model that repeats `send_report(...)` turn after turn is the
case this guards (issue 16), played here by a script that does exactly that.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from parley import Agent, RepeatedCall, RunResult, RunState, ToolContext, tool
from parley.backends import FunctionBackend, ModelRequest, ScriptedBackend, ScriptedTurn
from parley.backends.scripted import call
from parley.protocol import MessageEnd, Role, ToolCall
from parley.protocol.events import ToolCallRepeated
from parley.tools import call_key

executed: list[tuple[str, str]] = []


@tool(needs_approval=True)
def send_report(ctx: ToolContext, to: str, text: str) -> str:
    """Email a report (side effect)."""
    executed.append(("send_report", ctx.call_id))
    return f"sent to {to}"


@tool
def lookup(ctx: ToolContext, city: str) -> str:
    executed.append(("lookup", ctx.call_id))
    return f"4 C in {city}"


@tool(idempotent=True)
def job_status(ctx: ToolContext, job: str) -> str:
    executed.append(("job_status", ctx.call_id))
    return f"job {job}: {len(executed)}"


@tool(on_repeat="error")
def charge(ctx: ToolContext, amount: int) -> str:
    executed.append(("charge", ctx.call_id))
    return f"charged {amount}"


@tool
def flaky(ctx: ToolContext, n: int) -> str:
    executed.append(("flaky", ctx.call_id))
    if len([e for e in executed if e[0] == "flaky"]) == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


TOOLS = [send_report, lookup, job_status, charge, flaky]
REPORT = {"to": "ada@example.com", "text": "4 C"}


@pytest.fixture(autouse=True)
def _clear() -> None:
    executed.clear()


def runs_of(name: str) -> int:
    return sum(1 for tool_name, _ in executed if tool_name == name)


def results(result: RunResult[Any]) -> dict[str, tuple[str, bool]]:
    return {r.call_id: (r.content, r.is_error) for m in result.messages for r in m.tool_results}


def approve_all(agent: Agent[Any], result: RunResult[Any]) -> tuple[RunResult[Any], int]:
    """The README's loop, counting how many times a person was asked."""
    asked = 0
    while result.paused:
        state = result.state
        for item in result.interruptions:
            asked += 1
            state.approve(item.call_id)
        result = agent.run_sync(state=RunState.from_json(state.to_json()))
    return result, asked


def test_canonical_arguments_ignore_key_order_and_spacing() -> None:
    assert call_key("t", '{"b": 2, "a": {"y": 1, "x": [1, 2]}}') == call_key("t", '{"a":{"x":[1,2],"y":1},"b":2}')
    assert call_key("t", '{"a": 1}') != call_key("t", '{"a": 2}')
    assert call_key("t", '{"a": 1}') != call_key("u", '{"a": 1}')
    assert call_key("t", "not json") == "t\nnot json"


def test_the_issue_16_loop_sends_once_asks_once_and_ends_with_an_answer() -> None:
    """The same approved call, 20 times in a row: one execution, one approval, then an answer."""

    def model(request: ModelRequest) -> ScriptedTurn | str:
        if request.tool_choice == "none":
            return "Reported."
        # the arguments as a sloppy model writes them: keys reordered, spaces, every turn the same call
        return ScriptedTurn(tool_calls=[call("send_report", '{ "text": "4 C", "to": "ada@example.com" }')])

    agent = Agent(FunctionBackend(model), tools=TOOLS)
    result, asked = approve_all(agent, agent.run_sync("Report the weather to Ada"))
    assert result.output == "Reported."
    assert runs_of("send_report") == 1 and asked == 1
    assert [r.action for r in result.repeats] == ["reused"]
    # the second round only repeated the first: the model is going round in circles, so tools go off
    assert result.turns == 3 and result.state.tool_rounds == 2 and result.state.stalled
    assert [r.tool_choice for r in agent.backend.requests] == ["auto", "auto", "none"]  # type: ignore[attr-defined]
    content, is_error = results(result)[result.repeats[0].call_id]
    assert content == "[already done: an identical call ran earlier; not run again] sent to ada@example.com"
    assert not is_error
    assert (
        result.state.call_log[call_key("send_report", json.dumps(REPORT))].call_id == result.repeats[0].original_call_id
    )


def test_changed_arguments_run_and_ask_again() -> None:
    other = {"to": "bob@example.com", "text": "4 C"}
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("send_report", REPORT, id="a")]),
            ScriptedTurn(tool_calls=[call("send_report", other, id="b")]),
            "done",
        ]
    )
    agent = Agent(backend, tools=TOOLS)
    result, asked = approve_all(agent, agent.run_sync("go"))
    assert result.output == "done" and asked == 2 and runs_of("send_report") == 2 and not result.repeats


def test_identical_calls_in_one_batch_run_once_and_pause_once() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(
                tool_calls=[
                    call("send_report", REPORT, id="a"),
                    call("lookup", {"city": "Oslo"}, id="l1"),
                    call("send_report", {"text": "4 C", "to": "ada@example.com"}, id="b"),
                    call("lookup", {"city": "Oslo"}, id="l2"),
                ]
            ),
            "done",
        ]
    )
    agent = Agent(backend, tools=TOOLS)
    first = agent.run_sync("go")
    assert first.paused and [i.call_id for i in first.interruptions] == ["a"]
    result, asked = approve_all(agent, first)
    assert result.output == "done" and asked == 1
    assert runs_of("send_report") == 1 and runs_of("lookup") == 1
    assert {(r.call_id, r.original_call_id) for r in result.repeats} == {("b", "a"), ("l2", "l1")}
    found = results(result)
    assert found["b"][0].endswith("sent to ada@example.com") and found["l2"][0].endswith("4 C in Oslo")
    # adjacency: every call answered right after its assistant message, in call order
    tool_ids = [m.tool_results[0].call_id for m in result.messages if m.role is Role.TOOL]
    assert tool_ids == ["a", "l1", "b", "l2"]


def test_on_repeat_error_reaches_the_model_as_an_error_result() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("charge", {"amount": 5}, id="c1")]),
            ScriptedTurn(tool_calls=[call("charge", {"amount": 5}, id="c2")]),
            "done",
        ]
    )
    result = Agent(backend, tools=TOOLS).run_sync("go")
    assert backend.requests[-1].tool_choice == "none"  # a round of nothing but repeats: tools off
    assert runs_of("charge") == 1
    content, is_error = results(result)["c2"]
    assert is_error and "already called with exactly these arguments" in content
    assert result.repeats == [
        RepeatedCall(
            call_id="c2", tool_name="charge", arguments='{"amount":5}', original_call_id="c1", action="error", turn=2
        )
    ]


def test_idempotent_tools_default_to_allow_and_run_again() -> None:
    assert job_status.on_repeat == "allow" and lookup.on_repeat == "reuse" and charge.on_repeat == "error"
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("job_status", {"job": "j"}, id="s1")]),
            ScriptedTurn(tool_calls=[call("job_status", {"job": "j"}, id="s2")]),
            "done",
        ]
    )
    result = Agent(backend, tools=TOOLS).run_sync("poll")
    assert runs_of("job_status") == 2 and not result.repeats
    assert results(result)["s1"][0] != results(result)["s2"][0]  # polling sees the fresh value


def test_a_rejected_call_repeated_is_not_asked_about_again() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("send_report", REPORT, id="a")]),
            ScriptedTurn(tool_calls=[call("send_report", REPORT, id="b")]),
            "ok, not sent",
        ]
    )
    agent = Agent(backend, tools=TOOLS)
    first = agent.run_sync("go")
    state = first.state
    state.reject("a", message="no reports today")
    result = agent.run_sync(state=RunState.from_json(state.to_json()))
    assert not result.paused and result.output == "ok, not sent" and runs_of("send_report") == 0
    content, is_error = results(result)["b"]
    assert (
        is_error
        and content == "[already rejected: an identical call was rejected earlier; not run again] no reports today"
    )


def test_failed_calls_are_not_recorded_so_the_model_may_retry() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("flaky", {"n": 1}, id="f1")]),
            ScriptedTurn(tool_calls=[call("flaky", {"n": 1}, id="f2")]),
            "done",
        ]
    )
    result = Agent(backend, tools=TOOLS).run_sync("go")
    assert runs_of("flaky") == 2 and not result.repeats
    assert results(result)["f1"][1] and results(result)["f2"] == ("ok", False)


def test_edited_arguments_count_as_what_ran() -> None:
    fixed = {"to": "ada@example.com", "text": "4 C"}
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("send_report", {"to": "example.com", "text": "4 C"}, id="a")]),
            ScriptedTurn(
                tool_calls=[
                    call("send_report", {"to": "example.com", "text": "4 C"}, id="b"),
                    call("send_report", fixed, id="c"),
                ]
            ),
            "done",
        ]
    )
    agent = Agent(backend, tools=TOOLS)
    first = agent.run_sync("go")
    state = first.state
    state.approve("a", arguments=fixed)
    result = agent.run_sync(state=RunState.from_json(state.to_json()))
    assert not result.paused and runs_of("send_report") == 1
    assert [(r.call_id, r.original_call_id) for r in result.repeats] == [("b", "a"), ("c", "a")]


def test_a_new_user_message_starts_a_fresh_record() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="l1")]),
            "4 C",
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="l2")]),
            "still 4 C",
        ]
    )
    agent = Agent(backend, tools=TOOLS)
    first = agent.run_sync("weather?")
    again = agent.run_sync("and now? look again", state=first.state)
    assert again.output == "still 4 C" and runs_of("lookup") == 2 and not again.repeats


async def test_repeats_are_streamed_as_events() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="l1")]),
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="l2")]),
            "4 C",
        ]
    )
    items = [item async for item in Agent(backend, tools=TOOLS).run_stream("go")]
    repeated = [e for e in items if isinstance(e, ToolCallRepeated)]
    assert [(e.call_id, e.original_call_id, e.action, e.tool_name) for e in repeated] == [
        ("l2", "l1", "reused", "lookup")
    ]
    index = items.index(repeated[0])
    following = items[index + 1]
    assert isinstance(following, MessageEnd) and following.message.tool_results[0].call_id == "l2"
    assert ToolCallRepeated.model_validate_json(repeated[0].model_dump_json()) == repeated[0]


RESUME_SCRIPT = """
import json, sys
from parley import Agent, RunState, ToolContext, tool
from parley.backends import FunctionBackend, ScriptedTurn
from parley.backends.scripted import call

log = open(sys.argv[3], "a")

@tool
def lookup(ctx: ToolContext, city: str) -> str:
    log.write(f"lookup {ctx.call_id}\\n"); log.flush()
    return f"4 C in {city}"

@tool(needs_approval=True)
def send_report(ctx: ToolContext, to: str, text: str) -> str:
    log.write(f"send_report {ctx.call_id}\\n"); log.flush()
    return "sent"

def model(request):
    done = [r.name for m in request.conversation for r in m.tool_results]
    if len(done) == 0:
        return ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"})])
    if len(done) == 1:
        return ScriptedTurn(tool_calls=[call("send_report", {"to": "ada@example.com", "text": "4 C"})])
    if len(done) == 2:  # after the resume: the same two calls again, reordered keys
        return ScriptedTurn(tool_calls=[call("lookup", '{"city": "Oslo"}'),
                                        call("send_report", '{"text": "4 C", "to": "ada@example.com"}')])
    return "Reported."

agent = Agent(FunctionBackend(model), tools=[lookup, send_report], max_tool_rounds=5)
if sys.argv[1] == "start":
    result = agent.run_sync("Report the Oslo weather to Ada")
    result.state.save(sys.argv[2])
    print("paused:", [i.tool_name for i in result.interruptions])
else:
    state = RunState.load(sys.argv[2])
    for item in state.pending:
        state.approve(item.call_id)
    result = agent.run_sync(state=state)
    print("paused:", result.paused, "output:", result.output)
    print("repeats:", json.dumps([r.tool_name for r in result.repeats]))
"""


def test_the_record_holds_across_processes(tmp_path: Path) -> None:
    script, state, log = tmp_path / "agent.py", tmp_path / "state.json", tmp_path / "executions.log"
    script.write_text(textwrap.dedent(RESUME_SCRIPT))

    def run(step: str) -> str:
        done = subprocess.run(
            [sys.executable, str(script), step, str(state), str(log)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "paused: ['send_report']" in run("start")
    saved = json.loads(state.read_text())
    assert saved["schema_version"] == "1.2" and len(saved["call_log"]) == 1  # lookup ran; the report waits
    out = run("resume")
    assert "paused: False output: Reported." in out and 'repeats: ["lookup", "send_report"]' in out
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["lookup", "send_report"]


def test_tools_without_the_option_are_guarded_and_unknown_tools_are_not() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("nope", {}, id="n1")]),
            ScriptedTurn(tool_calls=[call("nope", {}, id="n2")]),
            "done",
        ]
    )
    result = Agent(backend, tools=TOOLS).run_sync("go")
    assert not result.repeats and all("Unknown tool" in content for content, _ in results(result).values())


def test_call_ids_in_repeats_match_the_conversation() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="x")]),
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="x")]),  # a reused id, made unique
            "done",
        ]
    )
    result = Agent(backend, tools=TOOLS).run_sync("go")
    calls: list[ToolCall] = [c for m in result.messages for c in m.tool_calls]
    assert result.repeats[0].call_id == calls[1].id != "x" and result.repeats[0].original_call_id == "x"


def test_a_round_with_something_new_keeps_tools_on() -> None:
    backend = ScriptedBackend(
        [
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="l1")]),
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="l2"), call("lookup", {"city": "Rome"})]),
            ScriptedTurn(tool_calls=[call("lookup", {"city": "Paris"})]),
            "done",
        ]
    )
    result = Agent(backend, tools=TOOLS).run_sync("go")
    assert [r.tool_choice for r in backend.requests] == ["auto", "auto", "auto", "none"]  # the third: max rounds
    assert runs_of("lookup") == 3 and not result.state.stalled
