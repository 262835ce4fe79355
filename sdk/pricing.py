"""Prices and per-model facts, loaded from data files (``parley/data/*.json``), never hard-coded.

`price_for(provider, model)` gives a `Price` (USD per million tokens, `Decimal`) or None for a
model the table does not know: the ledger then records ``cost=None`` instead of a guess.
`model_info(provider, model)` gives the facts the backends need (minimum cacheable length,
thinking mode, whether ``reasoning_effort`` is accepted).

Model ids match exactly, or after stripping a date suffix (``-20250514``, ``@20250514``) or
``-latest``; prefixes never match, so ``claude-opus-4-6`` is not priced as ``claude-opus-4``.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from parley.protocol import Usage

MILLION = Decimal(1_000_000)
_DATE_SUFFIX = re.compile(r"(?:[-@]\d{8}|-latest)$")


def data_dir() -> Path:
    # resolve(): in a strict editable install this module is a symlink into the source tree.
    return Path(__file__).resolve().parent / "data"


def data_path(name: str) -> Path:
    """The data file to read: `$PARLEY_DATA_DIR/<name>` when present (prices change; users keep their
    own table), else the shipped one."""
    override = os.environ.get("PARLEY_DATA_DIR")
    if override and (Path(override) / name).is_file():
        return Path(override) / name
    return data_dir() / name


@functools.cache
def load_data(name: str) -> dict[str, Any]:
    path = data_path(name)
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        from parley.errors import ConfigurationError

        raise ConfigurationError(f"cannot read parley data file {path}: {exc}") from None
    return data


def model_key(model: str, table: dict[str, Any]) -> str | None:
    """The table key for `model` (exact, or with a date/latest suffix stripped), else None."""
    candidates = [model, _DATE_SUFFIX.sub("", model)]
    if "/" in model:  # "anthropic/claude-..." or vLLM-style org/model
        candidates += [c.rsplit("/", 1)[-1] for c in list(candidates)]
    return next((c for c in candidates if c in table), None)


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal

    def cost(self, usage: Usage) -> Decimal:
        """The price of `usage`; cache writes without a reported TTL split are billed at the 5m rate."""
        unsplit = max(0, usage.cache_write_tokens - usage.cache_write_5m_tokens - usage.cache_write_1h_tokens)
        total = (
            usage.input_tokens * self.input
            + (usage.cache_read_tokens or 0) * self.cache_read
            + (usage.cache_write_5m_tokens + unsplit) * self.cache_write_5m
            + usage.cache_write_1h_tokens * self.cache_write_1h
            + usage.output_tokens * self.output
        )
        return total / MILLION


def price_for(provider: str, model: str) -> Price | None:
    table = load_data("pricing.json")["providers"].get(provider)
    if table is None:
        return None
    key = model_key(model, table["models"])
    if key is None:
        return None
    entry = table["models"][key]
    multipliers = table.get("multipliers", {})
    base_in = Decimal(entry["input"])

    def rate(name: str, default: Decimal) -> Decimal:
        if name in entry:
            return Decimal(entry[name])
        if name in multipliers:
            return base_in * Decimal(multipliers[name])
        return default

    return Price(
        input=base_in,
        output=Decimal(entry["output"]),
        cache_read=rate("cache_read", base_in),
        cache_write_5m=rate("cache_write_5m", base_in),
        cache_write_1h=rate("cache_write_1h", base_in),
    )


def with_cost(usage: Usage, provider: str, model: str) -> Usage:
    """`usage` with `cost` filled in: None when the model's price is unknown, or when the server did not
    say how much of the prompt came from its cache (the price of those tokens is then unknown too)."""
    price = price_for(provider, model)
    known = price is not None and usage.cache_read_tokens is not None
    return usage.model_copy(update={"cost": price.cost(usage) if known and price is not None else None})


def model_info(provider: str, model: str) -> dict[str, Any]:
    """Per-model facts from ``models.json``; unknown models get the provider default (or {})."""
    data = load_data("models.json")
    table: dict[str, Any] = data.get(provider, {})
    key = model_key(model, table)
    if key is not None:
        return {"known": True, **table[key]}
    return {"known": False, **data.get(f"{provider}_default", {})}
