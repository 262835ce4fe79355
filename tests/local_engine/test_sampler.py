"""Sampler: greedy, seeded per-request streams, top-k / top-p, hook masks and forced tokens, logprobs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from parley.local_engine.config import SamplingParams  # noqa: E402
from parley.local_engine.sampler import (  # noqa: E402
    Sampler,
    bitmask_penalties,
    derive_seed,
    rows_allowing_nothing,
    unpack_bitmask,
)
from parley.local_engine.sequence import Sequence  # noqa: E402

V = 100


def seq(params: SamplingParams, hook: object = None, rid: str = "r") -> Sequence:
    return Sequence(rid, [1, 2, 3], params, hook=hook)


def flat_logits(n: int = 1) -> torch.Tensor:
    return torch.zeros(n, V)


def draw(s: Sequence, steps: int, logits: torch.Tensor | None = None) -> list[int]:
    sampler = Sampler(V, torch.device("cpu"))
    base = flat_logits() if logits is None else logits
    return [sampler(base.clone(), [s])[0][0] for _ in range(steps)]


def test_greedy_takes_the_argmax() -> None:
    logits = torch.randn(3, V)
    tokens, _ = Sampler(V, torch.device("cpu"))(logits.clone(), [seq(SamplingParams()) for _ in range(3)])
    assert tokens == logits.argmax(-1).tolist()


def test_same_seed_reproduces_and_different_seeds_are_not_shifted_copies() -> None:
    p1, p2 = SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=1.0, seed=2)
    a = draw(seq(p1), 40)
    assert a == draw(seq(p1), 40)
    b = draw(seq(p2), 40)
    assert a != b
    # the seed+step bug: request 2's step k equals request 1's step k+1
    assert a[1:] != b[:-1] and b[1:] != a[:-1]
    assert derive_seed(1) != derive_seed(2)


def test_a_requests_stream_does_not_depend_on_its_batch_neighbours() -> None:
    sampler = Sampler(V, torch.device("cpu"))
    p = SamplingParams(temperature=1.0, seed=7)
    alone = seq(p)
    solo = [sampler(flat_logits(), [alone])[0][0] for _ in range(20)]
    batched_seq = seq(p, rid="b")
    others = [seq(SamplingParams(temperature=1.0, seed=s), rid=f"o{s}") for s in range(3)]
    batched = [sampler(flat_logits(4), [others[0], batched_seq, others[1], others[2]])[0][1] for _ in range(20)]
    assert solo == batched


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.arange(V, dtype=torch.float32).unsqueeze(0) / 10
    top_k = draw(seq(SamplingParams(temperature=1.0, top_k=3, seed=0)), 60, logits)
    assert set(top_k) <= {97, 98, 99}
    # with probabilities 0.9 / 0.09 / ..., top_p=0.5 keeps only the first token
    peaked = torch.full((1, V), -10.0)
    peaked[0, 5], peaked[0, 6] = 5.0, 2.7
    assert set(draw(seq(SamplingParams(temperature=1.0, top_p=0.5, seed=0)), 30, peaked)) == {5}


def test_unpack_bitmask_layout_matches_xgrammar() -> None:
    mask = torch.zeros(1, 4, dtype=torch.int32)
    mask[0, 0] = 1 << 3
    mask[0, 2] = -(1 << 31)  # token 95: the sign bit of word 2
    allowed = unpack_bitmask(mask, V)
    assert allowed[0].nonzero().flatten().tolist() == [3, 95]


@pytest.mark.parametrize("vocab", [32, 95, 1000, 49152])
def test_bitmask_penalties_block_exactly_the_masked_out_tokens(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    mask = torch.randint(-(2**31), 2**31 - 1, (3, words), dtype=torch.int32, generator=gen)
    logits = torch.randn(3, vocab, generator=gen)
    expected = logits.masked_fill(~unpack_bitmask(mask, vocab), float("-inf"))
    assert torch.equal(logits + bitmask_penalties(mask, vocab), expected)


def test_a_row_allowing_nothing_is_found_even_with_stray_bits_past_the_vocabulary() -> None:
    vocab = 40  # two words; bits 40..63 of the second word are not tokens
    mask = torch.zeros(3, 2, dtype=torch.int32)
    mask[0, 1] = 1 << 20  # a stray bit only
    mask[1, 1] = 1 << 7  # token 39
    mask[2, 0] = 1  # token 0
    assert rows_allowing_nothing(mask, vocab) == [True, False, False]


class OnlyEvenHook:
    def __init__(self, force: int | None = None) -> None:
        self.force = force
        self.accepted: list[int] = []

    def forced_token(self) -> int | None:
        return self.force

    def fill_bitmask(self, row: torch.Tensor) -> bool:
        assert row.dtype == torch.int32 and bool((row == -1).all())  # pre-filled: all allowed
        row.fill_(0x55555555)  # bits 0, 2, 4, ...: even token ids
        return True

    def accept_token(self, token_id: int) -> None:
        self.accepted.append(token_id)

    def is_terminated(self) -> bool:
        return False


def test_hook_masks_and_forced_tokens() -> None:
    logits = torch.zeros(3, V)
    logits[:, 51] = 10.0  # odd favourite
    logits[:, 40] = 5.0
    rows = [seq(SamplingParams(), OnlyEvenHook()), seq(SamplingParams()), seq(SamplingParams(), OnlyEvenHook(force=7))]
    tokens, _ = Sampler(V, torch.device("cpu"))(logits, rows)
    assert tokens == [40, 51, 7]


def test_logprobs_report_the_chosen_token_and_top_alternatives() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2] + [1e-9] * (V - 3)]))
    _, lps = Sampler(V, torch.device("cpu"))(logits, [seq(SamplingParams(logprobs=2))])
    lp = lps[0]
    assert lp is not None and lp.token_id == 0
    assert lp.logprob == pytest.approx(torch.log(torch.tensor(0.5)).item(), abs=1e-4)
    assert list(lp.top) == [0, 1]


# -- penalties and min_p (vLLM's semantics; HF's CTRL rule for repetition) ---------------------------
def history(params: SamplingParams, prompt: list[int], output: list[int]) -> Sequence:
    s = Sequence("p", prompt, params)
    s.token_ids.extend(output)
    return s


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    logits = torch.zeros(1, V)
    logits[0, 1], logits[0, 2], logits[0, 9], logits[0, 50] = 4.0, -2.0, 3.0, 1.0
    s = history(SamplingParams(repetition_penalty=2.0), prompt=[1, 1], output=[2])
    Sampler(V, torch.device("cpu"))._apply_penalties(logits, [s])
    assert logits[0, 1] == 2.0 and logits[0, 2] == -4.0  # the prompt's token and the output's, once each
    assert logits[0, 9] == 3.0 and logits[0, 50] == 1.0  # unseen tokens keep their logits


def test_frequency_and_presence_penalties_count_only_the_output() -> None:
    logits = torch.zeros(1, V)
    s = history(SamplingParams(frequency_penalty=0.5, presence_penalty=1.0), prompt=[7, 7, 7], output=[3, 3, 4])
    Sampler(V, torch.device("cpu"))._apply_penalties(logits, [s])
    assert logits[0, 3] == pytest.approx(-(2 * 0.5 + 1.0))
    assert logits[0, 4] == pytest.approx(-(1 * 0.5 + 1.0))
    assert logits[0, 7] == 0.0  # prompt tokens are not penalised by frequency/presence


def test_penalties_steer_greedy_decoding_away_from_a_repeat() -> None:
    logits = torch.zeros(1, V)
    logits[0, 5], logits[0, 6] = 2.0, 1.5
    plain = history(SamplingParams(), prompt=[1], output=[5])
    penalised = history(SamplingParams(presence_penalty=1.0), prompt=[1], output=[5])
    sampler = Sampler(V, torch.device("cpu"))
    assert sampler(logits.clone(), [plain])[0] == [5]
    assert sampler(logits.clone(), [penalised])[0] == [6]
    # a batch mixing both: each row gets only its own penalties
    assert sampler(logits.repeat(2, 1), [plain, penalised])[0] == [5, 6]


def test_min_p_keeps_only_tokens_near_the_most_likely() -> None:
    logits = torch.full((1, V), -30.0)
    logits[0, 10], logits[0, 11], logits[0, 12] = 0.0, -0.5, -3.0  # p(12) / p(10) = e^-3 < 0.1
    s = seq(SamplingParams(temperature=1.0, min_p=0.1, seed=3))
    drawn = set(draw(s, 200, logits))
    assert drawn == {10, 11}


@pytest.mark.parametrize(
    "bad",
    [
        {"repetition_penalty": 0.0},
        {"repetition_penalty": float("nan")},
        {"frequency_penalty": 2.5},
        {"presence_penalty": -3.0},
        {"min_p": 1.5},
        {"ignore_eos": 1},
    ],
)
def test_out_of_range_penalties_are_refused_at_construction(bad: dict[str, object]) -> None:
    from parley.local_engine.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match=next(iter(bad))):
        SamplingParams(**bad)  # type: ignore[arg-type]
