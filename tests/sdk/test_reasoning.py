"""The local reasoning budget hook: exactly N reasoning tokens, then the forced end-of-reasoning tokens."""

from __future__ import annotations

import pytest
import torch

from parley.errors import ConfigurationError
from parley.local_engine import ComposedHook, TokenHook
from parley.reasoning import Reasoning, ReasoningBudgetHook, local_budget

END = [900, 901, 902]


def drive(hook: TokenHook, proposals: list[int]) -> list[int]:
    """Play the engine: a forced token wins over the model's proposal."""
    out: list[int] = []
    for proposal in proposals:
        forced = hook.forced_token()
        token = forced if forced is not None else proposal
        hook.accept_token(token)
        out.append(token)
    return out


@pytest.mark.parametrize("budget", [0, 1, 5, 17])
def test_exactly_n_reasoning_tokens_then_the_end_marker(budget: int) -> None:
    hook = ReasoningBudgetHook(budget, END)
    assert isinstance(hook, TokenHook)
    out = drive(hook, list(range(1, 40)))
    assert out[:budget] == list(range(1, budget + 1))
    assert out[budget : budget + 3] == END
    assert out[budget + 3] == budget + 4  # the model is free again after the marker
    assert hook.reasoning_tokens == budget and hook.forced_by_budget and hook.phase == "done"


def test_stop_tokens_are_masked_only_while_reasoning() -> None:
    hook = ReasoningBudgetHook(2, END, stop_token_ids=[2, 63])
    row = torch.full((4,), -1, dtype=torch.int32)
    assert hook.fill_bitmask(row)
    allowed = {i for i in range(128) if int(row[i // 32]) >> (i % 32) & 1}
    assert 2 not in allowed and 63 not in allowed and 3 in allowed and 64 in allowed
    drive(hook, [5, 6, 7, 8, 9])
    assert not hook.fill_bitmask(torch.full((4,), -1, dtype=torch.int32))


def test_a_natural_end_stops_counting_without_forcing() -> None:
    vocab = {1: "I", 2: " think", 3: "</", 4: "think", 5: ">", 6: "Answer"}
    hook = ReasoningBudgetHook(50, END, decode=lambda ids: "".join(vocab[i] for i in ids))
    out = drive(hook, [1, 2, 3, 4, 5, 6, 6])
    assert END[0] not in out and not hook.forced_by_budget
    assert hook.reasoning_tokens == 2 and hook.phase == "done"


def test_composes_with_other_hooks() -> None:
    composed = ComposedHook([ReasoningBudgetHook(1, END)])
    assert drive(composed, [7, 7, 7, 7, 7]) == [7, *END, 7]


def test_budgets_follow_effort_or_the_explicit_cap() -> None:
    assert local_budget(Reasoning(budget_tokens=12)) == 12
    assert local_budget(Reasoning(effort="low")) < local_budget(Reasoning(effort="high"))
    with pytest.raises(ConfigurationError):
        Reasoning(budget_tokens=-1)
