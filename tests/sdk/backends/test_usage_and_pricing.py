"""Documented usage objects -> the normalised ledger and its cost, never counting a token twice."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from parley.pricing import model_info, price_for, with_cost
from parley.protocol import Usage
from parley.usage import from_anthropic, from_openai

M = Decimal(10**6)

# (provider, model, raw usage as documented, (input, read, write, write_5m, write_1h, output, reasoning), cost)
CASES: list[tuple[str, str, dict[str, Any], tuple[int, ...], Decimal | None]] = [
    # Anthropic prompt-caching docs: first request writes the book to the cache, the second reads it.
    ("anthropic", "claude-sonnet-4-5",
     {"input_tokens": 21, "cache_creation_input_tokens": 188086, "cache_read_input_tokens": 0, "output_tokens": 393},
     (21, 0, 188086, 0, 0, 393, 0),
     (21 * Decimal(3) + 188086 * Decimal("3.75") + 393 * Decimal(15)) / M),
    ("anthropic", "claude-sonnet-4-5-20250929",
     {"input_tokens": 21, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 188086, "output_tokens": 393},
     (21, 188086, 0, 0, 0, 393, 0),
     (21 * Decimal(3) + 188086 * Decimal("0.3") + 393 * Decimal(15)) / M),
    # Mixed TTLs: the cache_creation object splits the writes between 5m and 1h.
    ("anthropic", "claude-opus-4-1",
     {"input_tokens": 2048, "cache_read_input_tokens": 1800, "cache_creation_input_tokens": 248, "output_tokens": 503,
      "cache_creation": {"ephemeral_1h_input_tokens": 100, "ephemeral_5m_input_tokens": 148}},
     (2048, 1800, 248, 148, 100, 503, 0),
     (2048 * Decimal(15) + 1800 * Decimal("1.5") + 148 * Decimal("18.75") + 100 * Decimal(30)
      + 503 * Decimal(75)) / M),
    # Claude 3 Haiku has its own published cache rates (not the multipliers).
    ("anthropic", "claude-3-haiku-20240307",
     {"input_tokens": 100, "cache_creation_input_tokens": 2000, "cache_read_input_tokens": 0, "output_tokens": 10},
     (100, 0, 2000, 0, 0, 10, 0),
     (100 * Decimal("0.25") + 2000 * Decimal("0.30") + 10 * Decimal("1.25")) / M),
    # OpenAI prompt-caching guide: prompt_tokens *includes* the 1920 cached tokens.
    ("openai", "gpt-4o",
     {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
      "prompt_tokens_details": {"cached_tokens": 1920},
      "completion_tokens_details": {"reasoning_tokens": 0, "accepted_prediction_tokens": 0}},
     (86, 1920, 0, 0, 0, 300, 0),
     (86 * Decimal("2.50") + 1920 * Decimal("1.25") + 300 * Decimal(10)) / M),
    # A reasoning model: reasoning tokens are part of completion_tokens, never added on top.
    ("openai", "o4-mini",
     {"prompt_tokens": 75, "completion_tokens": 1186, "total_tokens": 1261,
      "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
      "completion_tokens_details": {"reasoning_tokens": 1024}},
     (75, 0, 0, 0, 0, 1186, 1024),
     (75 * Decimal("1.10") + 1186 * Decimal("4.40")) / M),
    # Responses API shape.
    ("openai", "gpt-4.1",
     {"input_tokens": 1500, "input_tokens_details": {"cached_tokens": 1024}, "output_tokens": 87,
      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 1587},
     (476, 1024, 0, 0, 0, 87, 0),
     (476 * Decimal(2) + 1024 * Decimal("0.5") + 87 * Decimal(8)) / M),
    # Explicit cache writes reported by newer models: carved out of prompt_tokens too.
    ("openai", "gpt-5",
     {"prompt_tokens": 5000, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 1000,
                                                                             "cache_write_tokens": 3000}},
     (1000, 1000, 3000, 0, 0, 10, 0),
     (1000 * Decimal("1.25") + 1000 * Decimal("0.125") + 3000 * Decimal("1.25") + 10 * Decimal(10)) / M),
    # An unknown model: counted, never priced by guess.
    ("openai", "gpt-unknown-9", {"prompt_tokens": 10, "completion_tokens": 1}, (10, None, 0, 0, 0, 1, 0), None),
    ("anthropic", "claude-opus-4-7", {"input_tokens": 10, "output_tokens": 1}, (10, 0, 0, 0, 0, 1, 0), None),
]


@pytest.mark.parametrize(("provider", "model", "raw", "expected", "cost"), CASES)
def test_documented_usage_normalises_without_double_counting(
    provider: str, model: str, raw: dict[str, Any], expected: tuple[int, ...], cost: Decimal | None
) -> None:
    usage = from_anthropic(raw, model=model) if provider == "anthropic" else from_openai(raw, model=model)
    got = (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens, usage.cache_write_5m_tokens,
           usage.cache_write_1h_tokens, usage.output_tokens, usage.reasoning_tokens)
    assert got == expected
    if provider == "anthropic":  # the whole prompt is the sum of the three parts
        total = raw["input_tokens"] + raw.get("cache_read_input_tokens", 0) + raw.get("cache_creation_input_tokens", 0)
    else:  # the provider's own prompt count already includes the cached tokens
        total = raw.get("prompt_tokens", raw.get("input_tokens"))
    assert usage.prompt_tokens == total
    assert usage.cost == cost and usage.requests == 1 and usage.raw == [raw]


def test_ledger_adds_up_and_unknown_cost_poisons_the_total() -> None:
    first = from_anthropic(CASES[0][2], model="claude-sonnet-4-5")
    second = from_anthropic(CASES[1][2], model="claude-sonnet-4-5")
    total = first + second
    assert total.requests == 2 and total.cache_read_tokens == 188086 and total.cache_write_tokens == 188086
    assert total.cost == first.cost + second.cost  # type: ignore[operator]
    assert (total + from_openai({"prompt_tokens": 1}, model="mystery")).cost is None
    assert len(total.raw) == 2


def test_malformed_usage_fields_count_as_zero_not_crash() -> None:
    usage = from_openai({"prompt_tokens": "many", "completion_tokens": None, "prompt_tokens_details": None})
    assert usage.prompt_tokens == 0 and usage.output_tokens == 0
    usage = from_openai({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 50}})
    assert usage.cache_read_tokens == 10 and usage.input_tokens == 0  # never negative


def test_price_lookup_is_exact_after_date_suffix_stripping() -> None:
    assert price_for("anthropic", "claude-sonnet-4-20250514") == price_for("anthropic", "claude-sonnet-4")
    assert price_for("anthropic", "claude-opus-4-7") is None  # no prefix guess from claude-opus-4
    assert price_for("nobody", "x") is None
    price = price_for("anthropic", "claude-haiku-4-5")
    assert price is not None and (price.cache_write_5m, price.cache_write_1h, price.cache_read) == (
        Decimal("1.25"), Decimal("2"), Decimal("0.1"))
    assert with_cost(Usage(input_tokens=10**6, requests=1), "openai", "gpt-5-mini").cost == Decimal("0.25")


def test_model_facts_come_from_data() -> None:
    assert model_info("anthropic", "claude-opus-4-6")["min_cache_tokens"] == 4096
    assert model_info("anthropic", "claude-sonnet-4-6-20260101")["min_cache_tokens"] == 2048
    assert model_info("anthropic", "claude-3-5-haiku-20241022")["thinking"] == "none"
    unknown = model_info("anthropic", "claude-next")
    assert unknown["known"] is False and unknown["min_cache_tokens"] == 1024
    assert model_info("openai", "gpt-4o")["reasoning"] is False


def test_a_user_price_table_overrides_the_shipped_one(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json

    from parley import pricing

    table = {"providers": {"anthropic": {"multipliers": {"cache_write_5m": "1.25", "cache_write_1h": "2",
                                                          "cache_read": "0.1"},
                                          "models": {"my-claude": {"input": "2", "output": "10"}}}}}
    (tmp_path / "pricing.json").write_text(json.dumps(table))
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path))
    pricing.load_data.cache_clear()
    try:
        usage = pricing.with_cost(Usage(input_tokens=1_000_000, output_tokens=1_000_000, requests=1),
                                  "anthropic", "my-claude")
        assert usage.cost == Decimal("12")
        assert pricing.price_for("anthropic", "claude-sonnet-4") is None  # the user's table replaced ours
    finally:
        monkeypatch.delenv("PARLEY_DATA_DIR")
        pricing.load_data.cache_clear()
