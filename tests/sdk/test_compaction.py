"""Compaction: the oldest turns become a summary, the cached prefix stays byte-identical.

The anchors' weak points: thresholds in absolute tokens (here: a fraction of the model's window)
and compaction that rewrites the prompt's beginning, so the provider's and the local engine's
prefix caches miss on the next request. Here the instructions, the leading system/developer
messages and everything up to the last cache breakpoint are sent unchanged; the summary follows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parley import Agent, CachePolicy, Compaction, RunHooks, RunState, tool
from parley.backends.anthropic import AnthropicBackend
from parley.backends.base import ModelRequest
from parley.backends.local import LocalBackend
from parley.backends.scripted import FunctionBackend, ScriptedBackend, ScriptedTurn
from parley.compaction import DEFAULT_SUMMARY_PROMPT, SUMMARY_HEADER
from parley.context_window import estimate_tokens
from parley.errors import CompactionError, ConfigurationError
from parley.local_engine.testing import FakeEngine
from parley.protocol import CacheMark, Message, Role, SummaryPart, TextPart, Usage
from tests.sdk.test_history_processors import history, lookup, strict_adjacency, turn

MODEL = "claude-sonnet-4-5-20250929"
SYSTEM = "You are a careful travel agent. Check every fact with the lookup tool before you answer. " * 60
HANDBOOK = Message(role=Role.USER, parts=[TextPart(text="The travel handbook: " + "rule. " * 300)],
                   cache=CacheMark())


def prefix() -> list[Message]:
    """A developer message, a cached handbook and its acknowledgement: the pinned prefix."""
    return [Message.developer("House rules: be polite."), HANDBOOK, Message.assistant("I have read the handbook.")]


def is_summary_request(request: ModelRequest) -> bool:
    last = request.conversation.messages[-1]
    return last.role is Role.USER and last.text == DEFAULT_SUMMARY_PROMPT


class Model:
    """A FunctionBackend's brain: answers, and numbered summaries when asked to summarise."""

    def __init__(self, *, fail_after_summary: bool = False, empty: bool = False) -> None:
        self.summaries = 0
        self.fail_after_summary = fail_after_summary
        self.empty = empty

    def __call__(self, request: ModelRequest) -> Any:
        if is_summary_request(request):
            self.summaries += 1
            return ScriptedTurn(text="" if self.empty else f"SUMMARY-{self.summaries}",
                                usage=Usage(input_tokens=100, output_tokens=7, requests=1))
        if self.fail_after_summary and self.summaries:
            self.fail_after_summary = False
            raise RuntimeError("the process dies here")
        return ScriptedTurn(text="Done.", usage=Usage(input_tokens=10, output_tokens=2, requests=1))


def _json(messages: list[Message]) -> list[str]:
    return [m.model_dump_json() for m in messages]


async def _two_runs(compaction: Compaction, model: Model | None = None) -> tuple[FunctionBackend, Any, Any, Agent[str]]:
    """Run 1 with a large window (nothing compacted), run 2 with a small one (compacted)."""
    backend = FunctionBackend(model or Model())
    backend.context_window = 10**6  # type: ignore[attr-defined]
    agent = Agent(backend, instructions=SYSTEM, tools=[lookup], compaction=compaction, cache=CachePolicy())
    first = await agent.run([*prefix(), *history(12), Message.user("now?")])
    size = estimate_tokens(backend.requests[0].conversation.messages, backend.requests[0].tools)
    backend.context_window = int(size * 1.2)  # type: ignore[attr-defined]  # 0.5 of it: well over the line
    second = await agent.run("and Rome?", state=first.state)
    return backend, first, second, agent


async def test_the_system_prefix_and_breakpoints_are_byte_identical_after_compaction() -> None:
    backend, first, second, _ = await _two_runs(Compaction(at=0.5, keep_last_turns=2))
    before, summary, after = backend.requests  # run 1; run 2's summary request, then its request
    assert not is_summary_request(before) and is_summary_request(summary) and not is_summary_request(after)
    old, new = before.conversation.messages, after.conversation.messages

    # instructions + developer message + cached handbook + its acknowledgement: the same bytes
    assert _json(new[:4]) == _json(old[:4])
    assert new[0].text == SYSTEM and new[2].cache == CacheMark()
    # then the summary, a typed part, then the last two turns verbatim
    assert isinstance(new[4].parts[0], SummaryPart) and new[4].role is Role.USER
    assert new[4].text == f"{SUMMARY_HEADER}\n\nSUMMARY-1"
    assert [m.text for m in new[5:] if m.role is Role.USER] == ["now?", "and Rome?"]
    assert _json(new[5:]) == _json([*first.state.messages[-2:], Message.user("and Rome?")])

    # on the wire: tools, system (with its breakpoints) and the cached handbook block are unchanged
    anthropic = AnthropicBackend(MODEL, api_key="sk-test")
    body_old, _, _ = anthropic.build_body(before)
    body_new, plan, _ = anthropic.build_body(after)
    assert body_new["tools"] == body_old["tools"] and body_new["system"] == body_old["system"]
    assert any("cache_control" in block for block in body_new["system"])  # the planner's system breakpoint
    assert body_new["messages"][0] == body_old["messages"][0]  # the handbook, its cache_control included
    assert body_new["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    strict_adjacency(body_new)
    assert plan is not None

    # the summariser got the same prefix and tools (so its request reads the cache), tools off
    assert _json(summary.conversation.messages[:4]) == _json(old[:4])
    assert summary.tools == before.tools and summary.tool_choice == "none"
    assert "question 0" in str(summary.conversation.messages) and "now?" not in str(summary.conversation.messages)

    record = second.state.compaction
    assert record is not None and record.summary == "SUMMARY-1" and record.count == 1
    assert (record.start, record.backend) == (3, "function")
    assert record.tokens_after < record.tokens_before
    # the stored history is whole; the summariser's usage is the run's
    assert len(second.messages) == len(first.messages) + 2
    assert second.state.usage.requests == first.state.usage.requests + 2
    assert RunState.from_json(second.state.to_json()).compaction == record


async def test_a_resume_uses_the_recorded_summary_instead_of_asking_again() -> None:
    """The state is checkpointed right after compaction: a crash before the next answer, a resume in
    another process (from JSON), and the same summary is sent without a second summary request."""
    model = Model(fail_after_summary=True)
    backend = FunctionBackend(model)
    backend.context_window = 10**6  # type: ignore[attr-defined]
    agent = Agent(backend, instructions=SYSTEM, tools=[lookup], compaction=Compaction(at=0.5, keep_last_turns=2))
    first = await agent.run([*prefix(), *history(12), Message.user("now?")])
    size = estimate_tokens(backend.requests[0].conversation.messages, backend.requests[0].tools)
    backend.context_window = int(size * 1.2)  # type: ignore[attr-defined]
    saved: list[str] = []
    with pytest.raises(RuntimeError, match="dies"):
        await agent.run("and Rome?", state=first.state, checkpoint=lambda s: saved.append(s.to_json()))
    assert model.summaries == 1 and saved
    state = RunState.from_json(saved[-1])
    assert state.compaction is not None and state.compaction.summary == "SUMMARY-1"

    resumed = await agent.run(state=state)
    assert resumed.output == "Done." and model.summaries == 1  # not asked again
    sent = backend.requests[-1].conversation.messages
    assert sent[4].text.endswith("SUMMARY-1") and sent[-1].text == "and Rome?"


async def test_another_backend_may_summarise() -> None:
    summariser = ScriptedBackend(["SUMMARY-BY-ANOTHER"], name="cheap")
    backend, _, second, _ = await _two_runs(Compaction(at=0.5, keep_last_turns=2, backend=summariser))
    assert not any(is_summary_request(r) for r in backend.requests)
    assert is_summary_request(summariser.requests[0])
    assert second.state.compaction is not None and second.state.compaction.backend == "cheap"
    assert backend.requests[-1].conversation.messages[4].text.endswith("SUMMARY-BY-ANOTHER")


async def test_a_second_compaction_summarises_the_first_summary_with_the_next_turns() -> None:
    backend, _, second, agent = await _two_runs(Compaction(at=0.5, keep_last_turns=2))
    first_record = second.state.compaction
    assert first_record is not None
    more = [m for n in range(12, 24) for m in turn(n)]
    third = await agent.run([*more, Message.user("and Paris?")], state=second.state)
    record = third.state.compaction
    assert record is not None and record.count == 2 and record.summary == "SUMMARY-2"
    assert record.start == first_record.start and record.through > first_record.through
    summary_request = [r for r in backend.requests if is_summary_request(r)][-1]
    texts = [m.text for m in summary_request.conversation.messages]
    assert f"{SUMMARY_HEADER}\n\nSUMMARY-1" in texts and "question 0" not in texts[:6]
    sent = backend.requests[-1].conversation.messages
    assert _json(sent[:4]) == _json(backend.requests[0].conversation.messages[:4])
    assert sent[4].text.endswith("SUMMARY-2") and sent[-1].text == "and Paris?"
    strict_adjacency(AnthropicBackend(MODEL, api_key="sk-test").build_body(backend.requests[-1])[0])


async def test_an_empty_summary_is_a_typed_error() -> None:
    with pytest.raises(CompactionError, match="no text"):
        await _two_runs(Compaction(at=0.5), Model(empty=True))


async def test_nothing_is_summarised_when_only_the_current_turn_is_left() -> None:
    backend = FunctionBackend(Model())
    backend.context_window = 50  # type: ignore[attr-defined]
    agent = Agent(backend, compaction=Compaction(at=0.5, keep_last_turns=1))
    result = await agent.run("a long question " * 40)
    assert result.output == "Done." and result.state.compaction is None
    assert len(backend.requests) == 1


async def test_the_window_must_be_known() -> None:
    agent = Agent(ScriptedBackend(["ok"]), compaction=Compaction())
    with pytest.raises(ConfigurationError, match=r"Compaction\(window=\.\.\.\)"):
        await agent.run("hi")
    ok = Agent(ScriptedBackend(["ok"]), compaction=Compaction(window=10_000))
    assert (await ok.run("hi")).output == "ok"


def test_settings_are_checked() -> None:
    for bad in ({"at": 0}, {"at": 1.5}, {"keep_last_turns": 0}, {"window": -1}, {"backend": object()},
                {"prompt": " "}):
        with pytest.raises(ConfigurationError):
            Compaction(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Compaction"):
        Agent(ScriptedBackend([]), compaction={"at": 0.8})  # type: ignore[arg-type]


# -- the local engine's prefix cache -------------------------------------------------------------------
class Usages(RunHooks):
    def __init__(self) -> None:
        self.seen: list[Usage] = []

    def after_model_request(self, ctx: Any, request: ModelRequest, response: Any) -> None:
        self.seen.append(response.usage)


@pytest.mark.model
async def test_the_local_engine_still_reads_the_preserved_prefix_from_its_cache_after_compaction() -> None:
    """SmolLM2's real tokenizer on the fake engine (full 16-token blocks cached per tenant): the request
    after compaction reports cached prompt tokens >= the preserved prefix (instructions, developer
    message, cached handbook and its acknowledgement, padded to a whole number of blocks so "only
    full blocks are cached" cannot hide a miss)."""
    from parley.local_engine import loader
    from parley.local_engine.testing import BLOCK

    tokenizer = loader.load_tokenizer(loader.resolve(None).folder)

    def reply(prompt: list[int]) -> str:
        text = tokenizer.decode(prompt)
        return "The user asked about the weather in many cities." if DEFAULT_SUMMARY_PROMPT in text else "Done."

    engine = FakeEngine(reply, tokenizer=tokenizer, max_model_len=8192)
    backend = LocalBackend(engine=engine)
    chat = backend.codec.codec  # type: ignore[attr-defined]  # the ChatTemplateCodec under the local codec
    instructions = "You are a careful travel agent."
    kept = prefix()

    def prefix_len(text: str) -> int:
        return len(chat.render_ids([Message.system(text), *kept], add_generation_prompt=False))

    while prefix_len(instructions) % BLOCK:
        instructions += " Be kind."
    preserved = prefix_len(instructions)

    plain = Agent(backend, instructions=instructions)
    first = await plain.run([*kept, *history(12), Message.user("now?")])
    size = len(engine.submissions[0].prompt_ids)
    usages = Usages()
    compacting = Agent(backend, instructions=instructions, hooks=usages,
                       compaction=Compaction(at=0.5, keep_last_turns=1, window=size))
    second = await compacting.run("and Rome?", state=first.state)

    assert second.output == "Done." and second.state.compaction is not None
    summary_prompt, after = engine.submissions[1].prompt_ids, engine.submissions[2].prompt_ids
    assert DEFAULT_SUMMARY_PROMPT in tokenizer.decode(summary_prompt)
    assert len(after) < size / 2  # compacted
    assert after[:preserved] == engine.submissions[0].prompt_ids[:preserved]  # the prefix, token for token
    assert usages.seen[-1].cache_read_tokens >= preserved > 0
    # the summary request itself shared the old conversation's prefix: it read far more than the prefix
    total = second.state.usage.cache_read_tokens - first.state.usage.cache_read_tokens
    assert total - usages.seen[-1].cache_read_tokens > preserved


# -- the frozen fixture ----------------------------------------------------------------------------------
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_state" / "1.1" / "compaction_paused_for_approval.json"


@tool(needs_approval=True)
def send_email(to: str, body: str) -> str:
    return f"sent to {to}"


async def test_a_frozen_compacted_state_resumes_with_its_summary_and_no_new_summary_request() -> None:
    state = RunState.from_json(FIXTURE.read_text())
    assert state.compaction is not None and state.status == "paused"
    state.approve("call_email")

    def reply(request: ModelRequest) -> str:
        assert not is_summary_request(request), "the recorded summary must be reused"
        return "Sent."

    backend = FunctionBackend(reply, name="scripted")
    agent = Agent(backend, name="mailer", instructions="You are a weather assistant.", tools=[send_email],
                  compaction=Compaction(at=0.5, keep_last_turns=1, window=120))
    result = await agent.run(state=state)
    assert result.output == "Sent."
    sent = backend.requests[0].conversation.messages
    assert [m.role for m in sent[:3]] == [Role.SYSTEM, Role.DEVELOPER, Role.USER]
    assert sent[2].text.endswith(state.compaction.summary) and isinstance(sent[2].parts[0], SummaryPart)
    assert sent[3].text == "Email Ada the last forecast"
    assert sent[-1].tool_results[0].content == "sent to ada@example.com"
    assert result.state.compaction == state.compaction
