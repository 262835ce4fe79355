"""The execution ledger: copies of one saved state, resumed anywhere, run each side effect once.

Each test has its own default ledger file (``$PARLEY_LEDGER``, set by tests/conftest.py), which the
worker processes it starts inherit, as processes of one user share the default file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from parley import RunState, SQLiteSession, ToolResult
from parley.errors import CallInProgressError, ConfigurationError
from parley.ledger import HOST, LedgerEntry, MemoryLedger, default_path, resolve_ledger
from parley.ledger_stores import SQLiteLedger
from tests.conftest import REPO_ROOT
from tests.sdk.ledger_worker import mail_agent, sent


def paused_state(log: Path, **options: Any) -> RunState:
    result = mail_agent(log, **options).run_sync("Tell Ada the report is late")
    assert result.paused and [i.kind for i in result.interruptions] == ["approval"]
    return result.state


async def paused(log: Path, **options: Any) -> RunState:
    result = await mail_agent(log, **options).run("Tell Ada the report is late")
    assert result.paused
    return result.state


def worker(mode: str, state: Path, log: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.sdk.ledger_worker", mode, str(state), str(log), *extra],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    value: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return value


# -- the same state, twice ---------------------------------------------------------------------------


def test_the_same_json_resumed_in_two_processes_sends_once(tmp_path: Path) -> None:
    log, state_file = tmp_path / "sent.log", tmp_path / "state.json"
    state_file.write_text(paused_state(log).to_json())
    first = finished(worker("resume", state_file, log, "first"))
    second = finished(worker("resume", state_file, log, "second"))
    assert sent(log) == ["first mail_1"]  # the second process used the recorded result
    assert first == second == {"output": "Done: sent to ada@example.com", "paused": False}


async def test_an_approved_state_resumed_twice_sends_once_and_an_older_copy_needs_no_approval(tmp_path: Path) -> None:
    log = tmp_path / "sent.log"
    state = await paused(log)
    older = state.to_json()  # still waiting for the approval
    state.approve("mail_1")
    approved = state.to_json()
    agent = mail_agent(log)
    runs = [await agent.run(state=RunState.from_json(text)) for text in (approved, approved, older)]
    assert sent(log) == ["main mail_1"]
    assert [r.output for r in runs] == ["Done: sent to ada@example.com"] * 3 and not any(r.paused for r in runs)


def test_without_a_ledger_each_copy_runs_the_call(tmp_path: Path) -> None:
    log = tmp_path / "sent.log"
    state = paused_state(log)
    state.approve("mail_1")
    for _ in range(2):
        mail_agent(log).run_sync(state=RunState.from_json(state.to_json()), ledger=False)
    assert sent(log) == ["main mail_1", "main mail_1"]  # what ledger=False gives up


# -- concurrent resumes --------------------------------------------------------------------------------


def test_eight_processes_resuming_one_state_at_once_send_once(tmp_path: Path) -> None:
    log, state_file = tmp_path / "sent.log", tmp_path / "state.json"
    state_file.write_text(paused_state(log).to_json())
    start_at = f"{time.time() + 3:.3f}"  # all of them resume at this moment (imports done by then)
    workers = [worker("resume", state_file, log, f"w{n}", "--sleep", "0.3", "--start-at", start_at) for n in range(8)]
    outcomes = [finished(w) for w in workers]
    assert len(sent(log)) == 1
    assert all(o == {"output": "Done: sent to ada@example.com", "paused": False} for o in outcomes)


def test_threads_resuming_one_state_on_one_sqlite_file_send_once(tmp_path: Path) -> None:
    log, ledger = tmp_path / "sent.log", tmp_path / "ledger.sqlite3"
    state = paused_state(log)
    state.approve("mail_1")
    saved = state.to_json()
    outputs: list[Any] = []

    def resume() -> None:
        agent = mail_agent(log, sleep=0.3)
        try:
            outputs.append(agent.run_sync(state=RunState.from_json(saved), ledger=SQLiteLedger(ledger)).output)
        except Exception as exc:  # shown in the assertion below, not lost in a thread
            outputs.append(exc)

    threads = [threading.Thread(target=resume) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sent(log) == ["main mail_1"] and outputs == ["Done: sent to ada@example.com"] * 6


async def test_a_concurrent_resume_gets_call_in_progress_when_asked_not_to_wait(tmp_path: Path) -> None:
    log = tmp_path / "sent.log"
    state = await paused(log)
    state.approve("mail_1")
    saved = state.to_json()
    for ledger in (MemoryLedger(on_busy="error"), MemoryLedger(wait_s=0.2)):
        first = asyncio.ensure_future(mail_agent(log, sleep=1.0).run(state=RunState.from_json(saved), ledger=ledger))
        await asyncio.sleep(0.2)  # the first holds the claim now
        with pytest.raises(CallInProgressError, match="mail_1") as busy:
            await mail_agent(log).run(state=RunState.from_json(saved), ledger=ledger)
        assert busy.value.call_id == "mail_1" and busy.value.run_id == state.trace_id
        assert (await first).output == "Done: sent to ada@example.com"
        again = await mail_agent(log).run(state=RunState.from_json(saved), ledger=ledger)  # now recorded
        assert again.output == "Done: sent to ada@example.com"
    assert sent(log) == ["main mail_1", "main mail_1"]  # once per ledger


# -- a claim without a record ----------------------------------------------------------------------------


def _crashed_checkpoint(tmp_path: Path, log: Path, **options: Any) -> RunState:
    """Resume a paused state in a worker whose tool SIGKILLs the process after its effect."""
    state_file = tmp_path / "state.json"
    state_file.write_text(paused_state(log, **options).to_json())
    process = worker("crash", state_file, log)
    process.communicate(timeout=120)
    assert process.returncode == -9 and sent(log) == ["worker mail_1"]
    checkpoint = RunState.load(Path(str(state_file) + ".checkpoint"))
    assert checkpoint.started == ["mail_1"] and not checkpoint.records
    return checkpoint


def test_a_crash_between_claim_and_record_is_an_uncertain_call_for_a_person(tmp_path: Path) -> None:
    log = tmp_path / "sent.log"
    checkpoint = _crashed_checkpoint(tmp_path, log)
    result = mail_agent(log).run_sync(state=checkpoint)
    assert result.paused and sent(log) == ["worker mail_1"]  # never run again silently
    (item,) = result.interruptions
    assert item.kind == "uncertain" and item.call_id == "mail_1" and "may or may not have run" in (item.reason or "")

    retried = RunState.from_json(result.state.to_json())
    retried.approve("mail_1")  # a person chose to send it again
    done = mail_agent(log).run_sync(state=retried)
    assert done.output == "Done: sent to ada@example.com" and sent(log) == ["worker mail_1", "main mail_1"]
    again = mail_agent(log).run_sync(state=RunState.from_json(retried.to_json()))  # and once only
    assert again.output == done.output and len(sent(log)) == 2

    late = RunState.from_json(result.state.to_json())  # a copy where someone else chose to skip it
    late.reject("mail_1", message="It was sent before the crash; do not send again.")
    assert mail_agent(log).run_sync(state=late).output == done.output  # the first decision stands
    assert len(sent(log)) == 2


async def test_a_skipped_uncertain_call_is_skipped_for_every_copy(tmp_path: Path) -> None:
    log = tmp_path / "sent.log"
    state = await paused(log)
    state.approve("mail_1")
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    old = time.time() - 3600  # a claim whose holder stopped beating an hour ago: it died mid-call
    assert ledger._insert(LedgerEntry(state.trace_id, "mail_1", "dead", "other-host/boot", 1, old, old, "send_email"))
    uncertain = (await mail_agent(log).run(state=state, ledger=ledger)).state
    assert [i.kind for i in uncertain.pending] == ["uncertain"]
    skipped = RunState.from_json(uncertain.to_json())
    skipped.reject("mail_1", message="It was sent before the crash.")
    done = await mail_agent(log).run(state=skipped, ledger=ledger)
    assert done.output == "Done: It was sent before the crash."
    other = await mail_agent(log).run(state=RunState.from_json(uncertain.to_json()), ledger=ledger)  # undecided copy
    assert not other.paused and other.output == done.output and sent(log) == []


def test_a_crash_between_claim_and_record_is_retried_for_an_idempotent_tool(tmp_path: Path) -> None:
    log = tmp_path / "sent.log"
    checkpoint = _crashed_checkpoint(tmp_path, log)
    result = mail_agent(log, idempotent=True).run_sync(state=checkpoint)
    assert not result.paused and result.output == "Done: sent to ada@example.com"
    assert sent(log) == ["worker mail_1", "main mail_1"]  # retried with the same call id (its idempotency key)


async def test_a_claim_row_left_by_another_machine_counts_once_its_lease_is_over(tmp_path: Path) -> None:
    log = tmp_path / "sent.log"
    state = await paused(log)
    state.approve("mail_1")
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3", lease_s=60, wait_s=0.3)
    now = time.time()
    row = LedgerEntry(state.trace_id, "mail_1", "elsewhere", "other-host/boot", 1, now, now, "send_email")
    assert ledger._insert(row)
    with pytest.raises(CallInProgressError):  # its holder may be running it: wait, then give up
        await mail_agent(log).run(state=RunState.from_json(state.to_json()), ledger=ledger)
    ledger._touch(state.trace_id, "mail_1", "elsewhere", now - 3600)  # no heartbeat for an hour
    result = await mail_agent(log).run(state=RunState.from_json(state.to_json()), ledger=ledger)
    assert [i.kind for i in result.interruptions] == ["uncertain"] and sent(log) == []


# -- where the ledger lives --------------------------------------------------------------------------------


async def test_with_a_sqlite_session_the_ledger_is_in_the_session_database(tmp_path: Path) -> None:
    import sqlite3

    log, db = tmp_path / "sent.log", tmp_path / "chats.db"
    session = SQLiteSession("user-1", db)
    paused = await mail_agent(log).run("Tell Ada", session=session)
    paused.state.approve("mail_1")
    for _ in range(2):
        done = await mail_agent(log).run(state=RunState.from_json(paused.state.to_json()), session=session)
        assert done.output.startswith("Done: sent to ada@example.com")  # (the second also sees the first's turn)
    assert sent(log) == ["main mail_1"]
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT run_id, call_id, result_json IS NOT NULL FROM parley_ledger").fetchall()
    assert rows == [(paused.state.trace_id, "mail_1", 1)]
    assert not default_path().exists()  # the default file was not needed


def test_the_default_location_and_the_ledger_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARLEY_LEDGER")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_path() == tmp_path / "state" / "parley" / "ledger.sqlite3"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_path() == Path.home() / ".local" / "state" / "parley" / "ledger.sqlite3"
    monkeypatch.setenv("PARLEY_LEDGER", str(tmp_path / "mine.db"))
    assert default_path() == tmp_path / "mine.db"
    assert resolve_ledger(False) is None
    memory = MemoryLedger()
    assert resolve_ledger(memory) is memory
    named = resolve_ledger(tmp_path / "named.db")
    assert isinstance(named, SQLiteLedger) and named.path == tmp_path / "named.db"
    assert resolve_ledger(str(tmp_path / "named.db")) is named  # one connection per file per process
    with pytest.raises(ConfigurationError, match="ledger must be"):
        resolve_ledger(42)
    with pytest.raises(ConfigurationError, match="on_busy"):
        MemoryLedger(on_busy="later")  # type: ignore[arg-type]


async def test_an_unopenable_ledger_file_is_a_clear_error(tmp_path: Path) -> None:
    log = tmp_path / "sent.log"
    state = await paused(log)
    state.approve("mail_1")
    from parley.sessions.errors import SessionUnavailableError

    with pytest.raises(SessionUnavailableError, match="execution ledger .*no-such-folder.*ledger=PATH"):
        await mail_agent(log).run(state=state, ledger=tmp_path / "no-such-folder" / "ledger.db")
    assert sent(log) == []


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_sqlalchemy_ledger_claims_and_records_once(tmp_path: Path, database: str) -> None:
    pytest.importorskip("sqlalchemy", reason="needs the sql extra (SQLAlchemy)")
    import sqlalchemy as sa

    from parley.ledger_stores import SQLAlchemyLedger
    from tests.sdk.test_sessions import postgres_engine_or_skip

    if database == "postgresql":  # the server `make test` starts (scripts/postgres_for_tests.sh), else a skip
        engine = postgres_engine_or_skip()
    else:
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    ledger = SQLAlchemyLedger(engine)
    log = tmp_path / "sent.log"
    state = paused_state(log)
    state.approve("mail_1")
    for _ in range(2):
        done = mail_agent(log).run_sync(state=RunState.from_json(state.to_json()), ledger=ledger)
        assert done.output == "Done: sent to ada@example.com"
    assert sent(log) == ["main mail_1"]
    entry = ledger._get(state.trace_id, "mail_1")
    assert entry is not None and entry.result is not None and entry.host == HOST and entry.pid == os.getpid()
    assert asyncio.run(ledger.prune(older_than_s=3600)) == 0
    pruned = asyncio.run(ledger.prune(older_than_s=0))  # a shared server may hold other tests' rows too
    assert pruned == 1 if database == "sqlite" else pruned >= 1
    assert ledger._get(state.trace_id, "mail_1") is None


async def test_prune_forgets_old_results_and_keeps_claims_without_one(tmp_path: Path) -> None:
    for ledger in (MemoryLedger(), SQLiteLedger(tmp_path / "ledger.sqlite3")):
        done = await ledger.claim("run", "done", tool="t")
        await ledger.record(done, ToolResult(call_id="done", name="t", content="ok"))
        open_claim = await ledger.claim("run", "open", tool="t")
        ledger.abandon(open_claim)  # its outcome is unknown: never pruned
        assert await ledger.prune(older_than_s=60) == 0
        assert await ledger.prune(older_than_s=0) == 1
        assert await ledger.lookup("run", "done") is None and ledger._get("run", "open") is not None
        with pytest.raises(ConfigurationError):
            await ledger.prune(older_than_s=-1)


async def test_a_result_with_a_lone_surrogate_is_recorded_as_it_is(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    claim = await ledger.claim("run", "c1", tool="t")
    odd = ToolResult(call_id="c1", name="t", content="half a pair: \ud800")  # the tool ran: keep what it said
    assert await ledger.record(claim, odd) == odd
    assert await ledger.lookup("run", "c1") == odd


# -- beside tool calls: handoffs and guardrail verdicts ---------------------------------------------------


async def test_on_handoff_runs_once_whichever_copy_hands_off(tmp_path: Path) -> None:
    from parley import Agent, handoff
    from parley.backends import ScriptedBackend, ScriptedTurn
    from parley.backends.scripted import call

    log, handed = tmp_path / "sent.log", []

    def agents(*script: Any) -> Agent[str]:
        billing = Agent(ScriptedBackend(["Refunded."]), name="billing")
        mailer = mail_agent(log)
        return Agent(
            ScriptedBackend(list(script)),
            name="triage",
            tools=mailer.tools,
            handoffs=[handoff(billing, on_handoff=lambda ctx: handed.append(ctx.run_id))],
        )

    both = [call("send_email", {"to": "ada@example.com"}, id="mail_1"), call("transfer_to_billing", {}, id="t_1")]
    paused = await agents(ScriptedTurn(tool_calls=both)).run("Refund me, and tell Ada")
    assert paused.paused and paused.state.handoff_to == "billing"
    paused.state.approve("mail_1")
    saved = paused.state.to_json()
    for _ in range(2):
        done = await agents().run(state=RunState.from_json(saved))
        assert done.output == "Refunded."
    assert handed == [paused.state.trace_id] and sent(log) == ["main mail_1"]


async def test_a_calls_tool_guardrail_verdicts_are_judged_once_for_every_copy(tmp_path: Path) -> None:
    from parley import Agent, ToolDecision, tool_input_guardrail
    from parley.backends import ScriptedBackend, ScriptedTurn
    from parley.backends.scripted import call

    judged: list[str] = []

    @tool_input_guardrail
    def check_address(ctx: Any, pending: Any) -> ToolDecision:
        judged.append(pending.id)
        return ToolDecision.require_approval("an outside address: a person checks it")

    log = tmp_path / "sent.log"
    mailer = mail_agent(log)

    def agent(*script: Any) -> Agent[str]:
        return Agent(ScriptedBackend(list(script)), name="mailer", tools=mailer.tools, guardrails=[check_address])

    saved: list[str] = []  # the checkpoint taken before the batch was screened
    turn = ScriptedTurn(tool_calls=[call("send_email", {"to": "ada@example.com"}, id="mail_1")])
    first = await agent(turn).run("Tell Ada", checkpoint=lambda s: saved.append(s.to_json()) if s.batch else None)
    assert first.paused and judged == ["mail_1"]
    unscreened = RunState.from_json(saved[0])
    assert not unscreened.guardrails and not unscreened.pending
    again = await agent().run(state=unscreened)  # screened again? no: the recorded verdicts stand
    assert again.paused and again.interruptions[0].reason == "an outside address: a person checks it"
    assert judged == ["mail_1"] and [g.verdict for g in again.state.guardrails] == ["approval"]


def test_eight_threads_resuming_a_parent_whose_child_paused_send_once(tmp_path: Path) -> None:
    from tests.sdk.teamwork_agents import mail_agents

    counter = tmp_path / "sent.log"
    paused = mail_agents(counter)[0].run_sync("Tell Ada the report is late")
    (item,) = paused.interruptions
    assert item.path is not None and len(item.path) == 2  # waiting inside the mailer agent
    paused.state.approve(item.call_id)
    saved = paused.state.to_json()
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    together = threading.Barrier(8)
    outputs: list[Any] = []

    def resume() -> None:
        assistant = mail_agents(counter)[0]
        together.wait(timeout=60)
        outputs.append(assistant.run_sync(state=RunState.from_json(saved), ledger=ledger).output)

    threads = [threading.Thread(target=resume) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sent(counter) == ["main mail_1"]  # the child's send, once
    assert outputs == ["Done. Mailer: sent to ada@example.com"] * 8


def test_a_ledger_database_that_fails_raises_the_sessions_typed_errors(tmp_path: Path) -> None:
    import sqlite3

    from parley.sessions.errors import SessionBusyError, SessionCorruptError

    foreign = tmp_path / "foreign.sqlite3"
    foreign.write_bytes(b"this is not a database at all" * 200)
    ledger = SQLiteLedger(foreign)
    with pytest.raises(SessionCorruptError) as info:
        asyncio.run(ledger.prune(older_than_s=0))
    assert "foreign.sqlite3" in str(info.value)

    path = tmp_path / "ledger.sqlite3"
    busy = SQLiteLedger(path, busy_timeout_s=0.05)
    asyncio.run(busy.prune(older_than_s=0))  # creates the table
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(SessionBusyError, match="execution ledger"):
            asyncio.run(busy.prune(older_than_s=0))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        busy.close()
