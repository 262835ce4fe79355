"""`CachePolicy`: how a request asks for prompt caching.

Local engine: prefix caching is always on, salted by tenant. Anthropic: the cache planner places up
to four `cache_control` breakpoints on stable parts (tools, system, last stable message). OpenAI-
compatible: `prompt_cache_key` and (vLLM) `cache_salt`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True, kw_only=True)
class CachePolicy:
    enabled: bool = True
    ttl: Literal["5m", "1h"] = "5m"
    """TTL for the breakpoints the planner places (Anthropic)."""
    long_ttl_for_tools_and_system: bool = False
    """Mark tools and system with 1h and the conversation with `ttl`."""
    prompt_cache_key: str | None = None
    """OpenAI's `prompt_cache_key` routing hint."""
