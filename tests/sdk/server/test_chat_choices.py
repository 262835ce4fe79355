"""Chat completions with `n > 1`: `n` independent engine requests on one prompt (seed + i), answered as `n`
choices, plainly or as one interleaved stream, with the prompt counted once in `usage`."""

from __future__ import annotations

import openai

from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer

USER = [{"role": "user", "content": "hi"}]


def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=20)


def test_n_choices_are_independent_draws_of_one_prompt(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    reply = client(fake_server).chat.completions.create(model="test-model", messages=USER, n=3, seed=5,  # type: ignore[arg-type]
                                                        max_tokens=64)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content == fake_engine.replies and c.finish_reason == "stop" for c in reply.choices)
    submitted = fake_engine.submissions
    assert [s.params.seed for s in submitted] == [5, 6, 7] and len({s.request_id for s in submitted}) == 3
    assert all(s.prompt_ids == submitted[0].prompt_ids for s in submitted)
    assert reply.usage is not None and reply.usage.prompt_tokens == len(submitted[0].prompt_ids)
    assert reply.usage.completion_tokens == 3 * len(fake_engine.replies)


def test_without_a_seed_each_draw_gets_fresh_randomness(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    client(fake_server).chat.completions.create(model="test-model", messages=USER, n=2)  # type: ignore[arg-type]
    assert [s.params.seed for s in fake_engine.submissions] == [None, None]


def test_a_stream_of_n_choices_interleaves_them_and_ends_with_usage(
    fake_server: BackgroundServer, fake_engine: FakeEngine
) -> None:
    stream = client(fake_server).chat.completions.create(
        model="test-model", messages=USER, n=2, stream=True, stream_options={"include_usage": True}  # type: ignore[arg-type]
    )
    texts, finishes, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert texts == {0: fake_engine.replies, 1: fake_engine.replies} and finishes == {0: "stop", 1: "stop"}
    assert usage is not None and usage.completion_tokens == 2 * len(fake_engine.replies)
    assert fake_engine.blocks_used == 0  # every request's blocks came back
