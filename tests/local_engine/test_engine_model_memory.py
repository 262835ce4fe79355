"""The embedded SmolLM2 under a deliberately tiny KV pool: evicting cached prefix blocks and preempting running
requests (recompute) must never change a greedy output. References are cold solo runs on the roomy session
engine, each under its own tenant so nothing is served from its prefix cache."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")

from parley.local_engine import Engine, EngineConfig, SamplingParams  # noqa: E402

pytestmark = pytest.mark.model

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)
_cold_tenants = itertools.count()


def small_pool_engine(smol_engine: Engine, num_kv_blocks: int) -> Engine:
    """A second engine over the session engine's weights (no reload) with a pool of `num_kv_blocks` x 16 tokens."""
    return Engine.from_model(
        smol_engine.model,  # type: ignore[arg-type]
        smol_engine.tokenizer,
        model_id=smol_engine.model_id,
        eos_token_ids=smol_engine.eos_token_ids,
        config=EngineConfig(num_kv_blocks=num_kv_blocks, block_size=16),
    )


def cold_solo(smol_engine: Engine, prompt: list[int], params: SamplingParams) -> list[int]:
    out = smol_engine.generate([prompt], params, tenant=f"cold-{next(_cold_tenants)}")[0]
    assert out.cached_tokens == 0
    return out.token_ids


def text_ids(engine: Engine, text: str, n: int) -> list[int]:
    """The first `n` tokens of `text`, repeated as needed."""
    ids = [int(t) for t in engine.tokenizer.encode((text + " ") * 4)]
    assert len(ids) >= n, (len(ids), n)
    return ids[:n]


@pytest.fixture
def tight(smol_engine: Engine) -> Iterator[Engine]:
    engine = small_pool_engine(smol_engine, num_kv_blocks=8)  # 128 tokens: two requests of <= 64 tokens
    yield engine
    engine.close()


def test_evicting_cached_prefix_blocks_keeps_outputs_equal_to_cold_runs(smol_engine: Engine, tight: Engine) -> None:
    shared = text_ids(smol_engine, "You are a careful assistant for a bakery. Answer in one short sentence, "
                      "politely, and never invent prices or opening hours that you were not given.", 48)
    questions = ["When do you open on Sunday?", "Do you sell rye bread?", "Can I order a cake for Friday?"]
    with_prefix = [shared + text_ids(smol_engine, " Customer: " + q, 9) for q in questions]
    others = [
        text_ids(smol_engine, f"Story {i}: once upon a time a fox named {name} walked through the wet forest at "
                 "night, looking for berries, mushrooms and a warm place to sleep until the morning came.", 60)
        for i, name in enumerate(["Ada", "Bo", "Cy"])
    ]
    # Interleaved so the shared prefix is cached, reused, then pushed out of the 8-block pool by other prompts
    # (leaf blocks go first, so a later request may find only part of the prefix), then recomputed.
    order = [with_prefix[0], others[0], with_prefix[1], others[1], others[2], with_prefix[2], with_prefix[0]]
    got = [tight.generate([p], PARAMS, tenant="bakery")[0] for p in order]
    together = tight.generate(with_prefix + others[:1], PARAMS, tenant="bakery")  # concurrent, under pressure too
    stats = tight.stats()
    assert stats["evictions"] > 0, stats
    cached = [o.cached_tokens for o in got]
    assert cached[2] == 48, cached  # the prefix was served from cache...
    assert min(cached[5:]) < 48, cached  # ...then evicted, so part or all of it was recomputed
    expected = {tuple(p): cold_solo(smol_engine, p, PARAMS) for p in with_prefix + others}
    assert [o.token_ids for o in got] == [expected[tuple(p)] for p in order]
    assert [o.token_ids for o in together] == [expected[tuple(p)] for p in with_prefix + others[:1]]
    assert stats["blocks_used"] == 0


def test_preempted_requests_under_a_small_pool_equal_their_solo_runs(smol_engine: Engine) -> None:
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    prompts = [
        text_ids(smol_engine, f"Question {i}: describe, step by step and in plain words, how a {thing} works, "
                 "what it is made of, and why people have used it for such a long time.", n)
        for i, (thing, n) in enumerate([("bicycle", 30), ("windmill", 35), ("clock", 40), ("compass", 27)])
    ]
    # 8 blocks = 128 tokens: three prompts are admitted at once, then their decodes outgrow the pool.
    engine = small_pool_engine(smol_engine, num_kv_blocks=8)
    try:
        got = engine.generate(prompts, params)
        stats = engine.stats()
    finally:
        engine.close()
    print(f"preemptions: {stats['preemptions']}")
    assert stats["preemptions"] > 0, stats
    assert stats["blocks_used"] == 0, stats
    assert [o.finish_reason for o in got] == ["length"] * 4
    assert [o.token_ids for o in got] == [cold_solo(smol_engine, p, params) for p in prompts]
