"""Every family parley serves, as a tiny random-weight model, against HF transformers on the same weights:
prefill logits at every position (one pass, and chunked + decode through the paged cache), 32 greedy tokens
equal to HF `generate()` with paged KV and chunked prefill, prefix-cache hits, and batch invariance (solo vs
batched vs staggered arrivals). Fast: seconds per family, no files."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.local_engine.families import (
    FAMILIES,
    engine_of,
    greedy,
    hf_greedy,
    hf_logits,
    hf_model,
    logits_every_position,
    our_model,
    parity,
    prompts_of,
)

torch = pytest.importorskip("torch")

from parley.local_engine import Engine  # noqa: E402

NAMES = sorted(FAMILIES)
GEN = 32


@pytest.fixture(scope="module", params=NAMES)
def family(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, Engine]]:
    hf = hf_model(request.param)
    engine = engine_of(our_model(hf))
    yield request.param, hf, engine
    engine.close()


def test_prefill_logits_match_hf_at_every_position(family: tuple[str, Any, Engine]) -> None:
    name, hf, engine = family
    prompt = prompts_of([37], seed=1)[0]
    ref = hf_logits(hf, prompt)
    one_pass = logits_every_position(engine.model, prompt, [37])  # type: ignore[arg-type]
    chunked = logits_every_position(engine.model, prompt, [13, 19, 1, 1, 1, 1, 1])  # type: ignore[arg-type]
    for how, ours in (("one pass", one_pass), ("chunked + decode", chunked)):
        abs_diff, rel_diff = parity(ours, ref)
        print(f"{name} {how}: max |logit - HF| {abs_diff:.2e} (relative {rel_diff:.2e}) over 37 positions")
        assert rel_diff <= 1e-4, (name, how, abs_diff, rel_diff)


def test_32_greedy_tokens_equal_hf_generate(family: tuple[str, Any, Engine]) -> None:
    name, hf, engine = family
    prompts = prompts_of([3, 11, 29, 45], seed=2)  # 29 and 45 exceed the 16-token step budget: chunked
    outs = engine.generate(prompts, greedy(GEN))
    same = sum(o.token_ids == hf_greedy(hf, p, GEN) for p, o in zip(prompts, outs, strict=True))
    print(f"{name}: {same}/{len(prompts)} prompts give HF's {GEN} greedy tokens")
    assert same == len(prompts)


def test_prefix_cache_hits_give_the_same_tokens(family: tuple[str, Any, Engine]) -> None:
    name, hf, engine = family
    shared = prompts_of([24], seed=3)[0]
    a, b = shared + prompts_of([5], seed=4)[0], shared + prompts_of([7], seed=5)[0]
    engine.generate([a], greedy(4), tenant=name)
    hits_before = engine.stats()["prefix_cache_hits"]
    out = engine.generate([b], greedy(GEN), tenant=name)[0]
    assert out.cached_tokens == 24 and engine.stats()["prefix_cache_hits"] - hits_before == 24
    assert out.token_ids == hf_greedy(hf, b, GEN)


def test_batched_and_staggered_runs_equal_solo_runs(family: tuple[str, Any, Engine]) -> None:
    _, _, engine = family
    prompts = prompts_of([2 + 5 * i for i in range(8)], seed=6)
    solo = [engine.generate([p], greedy(12), tenant=f"solo{i}")[0].token_ids for i, p in enumerate(prompts)]
    batched = [o.token_ids for o in engine.generate(prompts, greedy(12), tenant="batch")]

    async def staggered() -> list[list[int]]:
        async def one(i: int, prompt: list[int]) -> list[int]:
            await asyncio.sleep(0.004 * i)
            tokens: list[int] = []
            async for delta in engine.stream(prompt, greedy(12), tenant="staggered"):
                tokens.extend(delta.token_ids)
            return tokens

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    assert batched == solo
    assert asyncio.run(staggered()) == solo
