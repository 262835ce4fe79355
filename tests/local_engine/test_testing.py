"""The shipped fake engine keeps the engine's contract: what callers' tests rely on it for."""

from __future__ import annotations

import pytest

from parley.local_engine import AdmissionError, EngineError, QueueFullError, RequestAborted, SamplingParams, StreamDelta
from parley.local_engine.testing import ByteTokenizer, FakeEngine

END = ByteTokenizer.eos_token_id


async def _run(engine: FakeEngine, prompt: list[int], **params: object) -> list[StreamDelta]:
    sampling = SamplingParams(stop_token_ids=(END,), **params)  # type: ignore[arg-type]
    return [delta async for delta in engine.stream(prompt, sampling, tenant="t")]


async def test_a_reply_streams_token_by_token_and_the_stop_id_ends_it_unseen() -> None:
    engine = FakeEngine("hi!")
    deltas = await _run(engine, [1, 2, 3], max_tokens=16)
    assert b"".join(bytes(d.token_ids) for d in deltas) == b"hi!"
    assert deltas[-1].finished and deltas[-1].finish_reason == "stop" and END not in deltas[-1].token_ids
    assert engine.last.prompt_ids == [1, 2, 3] and engine.last.tenant == "t"


async def test_max_tokens_ends_with_length() -> None:
    deltas = await _run(FakeEngine("a long reply"), [1], max_tokens=3)
    assert sum(len(d.token_ids) for d in deltas) == 3 and deltas[-1].finish_reason == "length"


async def test_replies_are_taken_in_order_and_running_out_is_an_engine_error() -> None:
    engine = FakeEngine(["one", "two"])
    first = await _run(engine, [1], max_tokens=8)
    second = await _run(engine, [1], max_tokens=8)
    assert [bytes(sum((d.token_ids for d in run), ())) for run in (first, second)] == [b"one", b"two"]
    with pytest.raises(EngineError, match="no scripted reply"):
        await _run(engine, [1], max_tokens=8)


async def test_full_prompt_blocks_are_cached_per_tenant() -> None:
    engine = FakeEngine("x")
    prompt = list(range(40))  # two full 16-token blocks, the rest computed
    assert (await _run(engine, prompt, max_tokens=2))[0].cached_tokens == 0
    assert (await _run(engine, prompt, max_tokens=2))[0].cached_tokens == 32
    other = [d async for d in engine.stream(prompt, SamplingParams(max_tokens=2), tenant="other")]
    assert other[0].cached_tokens == 0  # never across tenants


async def test_forced_tokens_replace_the_script_and_forbidden_ones_are_recorded() -> None:
    class ForceThenForbid:
        def __init__(self) -> None:
            self.seen: list[int] = []

        def forced_token(self) -> int | None:
            return ord("Z") if not self.seen else None

        def fill_bitmask(self, row: object) -> bool:
            row[ord("b") // 32] = 0  # type: ignore[index]  # forbids every token in b's word
            return True

        def accept_token(self, token_id: int) -> None:
            self.seen.append(token_id)

        def is_terminated(self) -> bool:
            return len(self.seen) >= 2

    engine = FakeEngine("ab")
    hook = ForceThenForbid()
    deltas = [d async for d in engine.stream([1], SamplingParams(max_tokens=8), hooks=hook)]
    assert hook.seen == [ord("Z"), ord("b")] and engine.rejected == [ord("b")]
    assert deltas[-1].finish_reason == "stop"  # the hook said it was done


async def test_refusal_drops_and_aborts_behave_like_the_engine() -> None:
    engine = FakeEngine("x" * 50)
    engine.refuse = QueueFullError("the waiting queue is full", retry_after_s=1.0)
    with pytest.raises(AdmissionError):
        await _run(engine, [1], max_tokens=4)
    engine.refuse, engine.drop_after = None, 3
    with pytest.raises(RequestAborted):
        await _run(engine, [1], max_tokens=40)
    assert engine.stats()["blocks_used"] == 0
    engine.drop_after = None
    stream = engine.stream(list(range(20)), SamplingParams(max_tokens=40), request_id="r1")
    await stream.__anext__()
    assert engine.stats()["blocks_used"] == 2
    engine.abort("r1")
    assert engine.stats()["blocks_used"] == 0 and engine.aborted == ["r1"]
    assert [d async for d in stream] == []  # an aborted request ends
