"""Speculative decoding (prompt-lookup drafts): same tokens as plain decoding, hooks see accepted tokens only,
the prefix cache and the KV pool stay consistent, and drafting pauses itself when drafts are rejected."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from parley.local_engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from parley.local_engine.errors import EngineConfigError  # noqa: E402
from parley.local_engine.sequence import Sequence  # noqa: E402
from parley.local_engine.speculative import NgramDrafter  # noqa: E402
from tests.local_engine.conftest import engine_from_hf  # noqa: E402

SPEC = EngineConfig(num_kv_blocks=256, block_size=4, max_num_batched_tokens=64, speculation="ngram",
                    speculative_tokens=4, speculative_max_batch=64)  # batches of 8 verify drafts too
PLAIN = EngineConfig(num_kv_blocks=256, block_size=4, max_num_batched_tokens=64)


def repetitive_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a phrase, so n-gram drafts exist from the first step."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        phrase = [rng.randrange(3, 320) for _ in range(3 + i % 4)]
        out.append([rng.randrange(3, 320) for _ in range(2 + i)] + phrase * (3 + i % 3))
    return out


@pytest.fixture(scope="module")
def engines(tiny_hf: Any) -> Any:
    spec, plain = engine_from_hf(tiny_hf, SPEC), engine_from_hf(tiny_hf, PLAIN)
    yield spec, plain
    spec.close()
    plain.close()


def test_drafter_proposes_what_followed_the_last_ngram() -> None:
    d = NgramDrafter(5, max_ngram=3, min_ngram=2)  # 5 x the starting acceptance 0.6: 3 tokens
    seq = Sequence("r", [5, 6, 7, 8, 9, 1, 5, 6], SamplingParams(max_tokens=10))
    assert d.propose(seq, 10) == [7, 8, 9]  # "5 6" occurred at 0..1
    assert d.propose(seq, 2) == [7, 8]  # room caps the draft
    seq.token_ids.append(4)  # "5 6 4" and "6 4" never occurred
    assert d.propose(seq, 10) == []
    seq.token_ids += [7, 8]  # "7 8": the latest earlier occurrence is at 2..3
    assert d.propose(seq, 10) == [9, 1, 5]


def test_drafting_pauses_when_drafts_are_rejected_and_comes_back() -> None:
    d = NgramDrafter(4, min_acceptance=0.3)
    seq = Sequence("r", [1, 2, 3, 1, 2], SamplingParams(max_tokens=99))
    assert len(d.propose(seq, 8)) == 2  # 4 tokens x the neutral starting acceptance 0.6, rounded
    for _ in range(2):
        d.record(seq, 2, 0)
    assert d.stats()["spec_pauses"] == 1
    paused = [d.propose(seq, 8) for _ in range(8)]
    assert paused == [[]] * 8  # the first pause lasts 8 steps
    assert d.propose(seq, 8)  # then drafting resumes


def test_config_validates_speculation_naming_the_field() -> None:
    with pytest.raises(EngineConfigError, match=r"EngineConfig\.speculation"):
        EngineConfig(speculation="eagle")
    with pytest.raises(EngineConfigError, match=r"EngineConfig\.speculative_tokens"):
        EngineConfig(speculation="ngram", speculative_tokens=0)


class Oracle:
    """A drafter that knows plain decoding's answer and gets every `wrong_every`-th draft's last token wrong: so
    most drafted tokens are accepted (their keys/values feed the next rows) and some are rejected."""

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]], wrong_every: int = 3) -> None:
        self.answers = {tuple(p): o for p, o in zip(prompts, outputs, strict=True)}
        self.wrong_every, self.calls = wrong_every, 0

    def __call__(self, seq: Sequence, room: int) -> list[int]:
        answer = self.answers[tuple(seq.token_ids[: seq.num_prompt_tokens])]
        done = seq.num_output_tokens
        draft = list(answer[done : done + min(4, room)])
        self.calls += 1
        if draft and self.calls % self.wrong_every == 0:
            draft[-1] = 3 + (draft[-1] + 1) % 300
        return draft


def with_drafter(engine: Engine, drafter: Any) -> Any:
    previous = engine.scheduler.drafter
    engine.scheduler.drafter = drafter
    return previous


def test_greedy_tokens_equal_plain_decoding_solo_and_batched(engines: Any) -> None:
    spec, plain = engines
    prompts = repetitive_prompts(8)
    p = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = [o.token_ids for o in plain.generate(prompts, p)]
    assert [o.token_ids for o in spec.generate(prompts, p)] == ref  # n-gram drafts (mostly rejected here)
    previous = with_drafter(spec, Oracle(prompts, ref))
    try:
        before = spec.stats()
        assert [o.token_ids for o in spec.generate(prompts, p)] == ref
        assert [spec.generate([q], p)[0].token_ids for q in prompts[:3]] == ref[:3]
        stats = spec.stats()
    finally:
        with_drafter(spec, previous)
    drafted = stats["spec_drafted_tokens"] - before["spec_drafted_tokens"]
    accepted = stats["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert 0.5 * drafted < accepted < drafted  # accepted drafts fed later rows; some were rejected
    assert stats["speculation"] == "ngram" and stats["blocks_used"] == 0  # every block returned


def test_seeded_sampling_draws_the_same_tokens_as_plain_sampling(engines: Any) -> None:
    """One random draw per emitted token, in order: speculation changes which forward computed a row, never
    which draw samples it; so the tokens, and with them the distribution, are plain sampling's."""
    spec, plain = engines
    prompts = repetitive_prompts(4, seed=3)
    for params in (SamplingParams(max_tokens=32, temperature=0.7, seed=11, ignore_eos=True),
                   SamplingParams(max_tokens=32, temperature=1.0, top_p=0.9, top_k=20, seed=12, ignore_eos=True),
                   SamplingParams(max_tokens=32, temperature=0.8, min_p=0.05, seed=13, ignore_eos=True,
                                  repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2)):
        ref = [o.token_ids for o in plain.generate(prompts, params)]
        assert [o.token_ids for o in spec.generate(prompts, params)] == ref
        previous = with_drafter(spec, Oracle(prompts, ref))
        try:
            before = spec.stats()["spec_accepted_tokens"]
            assert [o.token_ids for o in spec.generate(prompts, params)] == ref
            assert spec.stats()["spec_accepted_tokens"] - before > 40
        finally:
            with_drafter(spec, previous)


class Forcing:
    """Forces a repeating pattern (so drafts from it are accepted) and records what it was told."""

    def __init__(self, pattern: list[int]) -> None:
        self.pattern, self.told = pattern, []

    def forced_token(self) -> int | None:
        return self.pattern[len(self.told) % len(self.pattern)]

    def fill_bitmask(self, row: Any) -> bool:
        return False

    def accept_token(self, token_id: int) -> None:
        self.told.append(token_id)

    def is_terminated(self) -> bool:
        return False


class Banning:
    """A grammar-like mask that forbids a set of tokens at every step."""

    def __init__(self, banned: set[int]) -> None:
        self.banned, self.told = banned, []

    def forced_token(self) -> int | None:
        return None

    def fill_bitmask(self, row: Any) -> bool:
        for t in self.banned:
            row[t // 32] &= ~(1 << (t % 32)) if t % 32 != 31 else 0x7FFFFFFF
        return True

    def accept_token(self, token_id: int) -> None:
        self.told.append(token_id)

    def is_terminated(self) -> bool:
        return False


def test_hooks_are_told_accepted_tokens_only_and_forced_tokens_feed_drafts(engines: Any) -> None:
    spec, _ = engines
    pattern = [10, 11, 12, 13, 14]
    prompt = [3, 4] + pattern * 3
    hook = Forcing(pattern)
    before = spec.stats()
    out = spec.generate([prompt], SamplingParams(max_tokens=30, ignore_eos=True), hooks=[hook])[0]
    assert out.token_ids == (pattern * 6)[:30] and hook.told == out.token_ids
    after = spec.stats()
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert accepted / (after["spec_drafted_tokens"] - before["spec_drafted_tokens"]) > 0.9


def test_a_masked_draft_token_ends_the_draft(engines: Any) -> None:
    spec, plain = engines
    prompts = repetitive_prompts(4, seed=5)
    p = SamplingParams(max_tokens=30, ignore_eos=True)
    free = [o.token_ids for o in plain.generate(prompts, p)]
    banned = {t for toks in free for t in toks[::3]}  # tokens greedy decoding (and so the drafts) would use
    hooks_plain = [Banning(banned) for _ in prompts]
    hooks_spec = [Banning(banned) for _ in prompts]
    ref = [o.token_ids for o in plain.generate(prompts, p, hooks=hooks_plain)]
    got = [o.token_ids for o in spec.generate(prompts, p, hooks=hooks_spec)]
    assert got == ref
    for toks, hook in zip(got, hooks_spec, strict=True):
        assert hook.told == toks and not banned & set(toks)


def test_cached_blocks_written_under_speculation_serve_later_requests(tiny_hf: Any) -> None:
    """Blocks committed after verification hold exactly the accepted tokens' keys/values: a later prompt that
    extends prompt + output reads them from the cache and continues as a fresh engine would."""
    spec = engine_from_hf(tiny_hf, SPEC)
    fresh = engine_from_hf(tiny_hf, PLAIN)
    try:
        pattern = [20, 21, 22, 23, 24, 25, 26]
        prompt = [5, 6] + pattern * 2
        p = SamplingParams(max_tokens=40, ignore_eos=True)
        first = spec.generate([prompt], p, tenant="t", hooks=[Forcing(pattern)])[0]  # drafts accepted
        stats = spec.stats()
        assert stats["spec_accepted_tokens"] > 0.8 * stats["spec_drafted_tokens"] > 20
        longer = prompt + first.token_ids
        again = spec.generate([longer], SamplingParams(max_tokens=12, ignore_eos=True), tenant="t")[0]
        assert again.cached_tokens >= len(longer) - 4
        assert again.token_ids == fresh.generate([longer], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    finally:
        spec.close()
        fresh.close()


def test_max_tokens_stop_ids_and_a_tight_pool_are_respected(tiny_hf: Any) -> None:
    tight = EngineConfig(num_kv_blocks=24, block_size=4, max_num_batched_tokens=32, speculation="ngram",
                         speculative_tokens=6)
    spec, plain = engine_from_hf(tiny_hf, tight), engine_from_hf(tiny_hf, PLAIN)
    try:
        prompts = repetitive_prompts(5, seed=2)
        for n in (1, 2, 7, 23):
            p = SamplingParams(max_tokens=n, ignore_eos=True)
            outs = spec.generate(prompts, p)
            assert [len(o.token_ids) for o in outs] == [n] * len(prompts)
            assert [o.token_ids for o in outs] == [o.token_ids for o in plain.generate(prompts, p)]
        ref = plain.generate(prompts[:1], SamplingParams(max_tokens=30, ignore_eos=True))[0].token_ids
        stop = ref[12]
        out = spec.generate(prompts[:1], SamplingParams(max_tokens=30, stop_token_ids=[stop]))[0]
        assert out.token_ids == ref[: ref.index(stop) + 1] and out.finish_reason == "stop"
        assert spec.stats()["blocks_used"] == 0
    finally:
        spec.close()
        plain.close()


@pytest.mark.model
def test_smollm2_speculation_keeps_greedy_tokens_on_structured_text(smol_engine: Engine) -> None:
    """The real model echoing JSON from its prompt: drafts are accepted and the tokens are plain greedy's."""
    import json

    doc = {"name": "Ada Lovelace", "born": "1815-12-10", "city": "London", "fields": ["mathematics", "computing"]}
    text = f"Here is a record: {json.dumps(doc)}\nRepeat the record exactly as JSON."
    tok = smol_engine.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    p = SamplingParams(max_tokens=48, min_tokens=48)
    ref = smol_engine.generate([ids], p)[0].token_ids
    spec = Engine.from_pretrained(None, device="cpu", dtype="float32",
                                  config=EngineConfig(speculation="ngram", quantization=None))
    try:
        got = spec.generate([ids], p)[0].token_ids
        stats = spec.stats()
        assert got == ref
        assert stats["spec_accepted_tokens"] >= 0.5 * stats["spec_drafted_tokens"] > 0
    finally:
        spec.close()
