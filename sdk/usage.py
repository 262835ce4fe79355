"""Provider usage objects -> one normalised `Usage`, never double counting.

The trap (reference table): Anthropic's ``input_tokens`` *excludes* cache reads and writes, while
OpenAI's ``prompt_tokens`` (Chat) and ``input_tokens`` (Responses) *include* the cached tokens. The
normalised ledger always holds the uncached remainder in `Usage.input_tokens`, so
``input + cache_read + cache_write`` is the whole prompt for every provider. Reasoning tokens are
part of the output everywhere; `Usage.reasoning_tokens` only says how many of them.

The provider's own object is kept in `Usage.raw`; the cost comes from `parley.pricing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parley.pricing import with_cost
from parley.protocol import Usage


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return max(0, int(value))


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _get(mapping: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(key)
    return mapping


def from_anthropic(raw: Mapping[str, Any], *, model: str | None = None) -> Usage:
    """Anthropic Messages usage: ``input_tokens`` is already the uncached remainder.

    Server-side compaction reports its own sampling as ``usage.iterations`` entries of type
    ``compaction``, whose tokens the top-level fields leave out: they are added here (billed too)."""
    parts = [raw, *(entry for entry in raw.get("iterations") or []
                    if isinstance(entry, Mapping) and entry.get("type") == "compaction")]
    write = sum(_int(p.get("cache_creation_input_tokens")) for p in parts)
    split_5m = sum(_int(_get(p, "cache_creation", "ephemeral_5m_input_tokens")) for p in parts)
    split_1h = sum(_int(_get(p, "cache_creation", "ephemeral_1h_input_tokens")) for p in parts)
    usage = Usage(
        input_tokens=sum(_int(p.get("input_tokens")) for p in parts),
        cache_read_tokens=sum(_int(p.get("cache_read_input_tokens")) for p in parts),
        cache_write_tokens=max(write, split_5m + split_1h),
        cache_write_5m_tokens=split_5m,
        cache_write_1h_tokens=split_1h,
        output_tokens=sum(_int(p.get("output_tokens")) for p in parts),
        requests=1,
        raw=[dict(raw)],
    )
    return with_cost(usage, "anthropic", model) if model else usage


def from_openai(raw: Mapping[str, Any], *, model: str | None = None, provider: str = "openai") -> Usage:
    """OpenAI Chat Completions or Responses usage: cached tokens are subtracted from the prompt count.

    No ``cached_tokens`` figure (vLLM without ``--enable-prompt-tokens-details``, SGLang, a stream without
    usage) leaves `Usage.cache_read_tokens` None: unknown, not 0. vLLM's ``created_cache_tokens`` (the
    prompt blocks it computed and cached in this request) are cache writes, like OpenAI's
    ``cache_write_tokens``."""
    if "prompt_tokens" in raw:  # Chat Completions (also vLLM / SGLang)
        prompt = _int(raw.get("prompt_tokens"))
        details = raw.get("prompt_tokens_details") or {}
        output = _int(raw.get("completion_tokens"))
        reasoning = _int(_get(raw, "completion_tokens_details", "reasoning_tokens"))
    else:  # Responses API
        prompt = _int(raw.get("input_tokens"))
        details = raw.get("input_tokens_details") or {}
        output = _int(raw.get("output_tokens"))
        reasoning = _int(_get(raw, "output_tokens_details", "reasoning_tokens"))
    reported = _get(details, "cached_tokens")
    read = min(prompt, _int(reported))
    written = _int(_get(details, "cache_write_tokens")) or _int(_get(details, "created_cache_tokens"))  # vLLM's name
    write = min(prompt - read, written)
    usage = Usage(
        input_tokens=prompt - read - write,
        cache_read_tokens=read if _is_count(reported) else None,
        cache_write_tokens=write,
        output_tokens=output,
        reasoning_tokens=min(reasoning, output),
        requests=1,
        raw=[dict(raw)],
    )
    return with_cost(usage, provider, model) if model else usage
