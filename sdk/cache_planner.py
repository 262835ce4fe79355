"""Anthropic prompt-cache planner: where to put the (at most four) ``cache_control`` breakpoints.

The rules it follows (platform.claude.com prompt-caching docs):

* at most 4 breakpoints per request, counting the ones the caller set (``Message.cache``);
* the cache key is the whole prefix in the order tools -> system -> messages, so breakpoints go on
  the stable parts: the last tool, the last system block, and the last block of the conversation
  (the next request extends it and reads it back);
* a lookup only looks back 20 blocks from each breakpoint: when more blocks than that were added
  since the last write, an extra breakpoint goes on the previously written position;
* mixed TTLs must put 1h entries before 5m ones;
* a prefix shorter than the model's minimum cacheable length (data: ``models.json``) is not cached
  at all (the request still succeeds) - the planner leaves such breakpoints out and records a warning.

The planner also predicts the cache reads of each request from what it wrote before, and the
`CacheLedger` compares the prediction with the reported usage (a hit rate per backend). Token
counts are estimates (about 4 characters per token) unless a counter is supplied.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from parley.caching import CachePolicy
from parley.errors import ConfigurationError
from parley.protocol import Usage

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
Ttl = Literal["5m", "1h"]
Section = Literal["tools", "system", "messages"]


def estimate_tokens(block: Any) -> int:
    """A rough token count (JSON characters / 4): good enough to compare with cache minimums."""
    return max(1, len(json.dumps(block, ensure_ascii=False, separators=(",", ":"))) // 4)


@dataclass(frozen=True, slots=True)
class Breakpoint:
    section: Section
    position: int
    """Index in the request's block sequence (tools, then system blocks, then message blocks)."""
    ttl: Ttl
    prefix_tokens: int
    placed_by: Literal["planner", "caller"]


@dataclass
class CachePlan:
    breakpoints: list[Breakpoint] = field(default_factory=list)
    predicted_read_tokens: int = 0
    predicted_write_tokens: int = 0
    prompt_tokens_estimate: int = 0
    warnings: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


@dataclass
class CacheLedger:
    """Predicted versus reported cache reads, summed over requests."""

    requests: int = 0
    prompt_tokens: int = 0
    predicted_read_tokens: int = 0
    cache_read_tokens: int = 0
    """Reads the server reported (requests that reported none are counted in `unreported_requests`)."""
    cache_write_tokens: int = 0
    unreported_requests: int = 0
    """Requests whose server did not say how much of the prompt it read from its cache."""
    reported_prompt_tokens: int = 0
    warnings: list[str] = field(default_factory=list)

    def record(self, plan: CachePlan | None, usage: Usage) -> None:
        self.requests += 1
        self.prompt_tokens += usage.prompt_tokens
        if usage.cache_read_tokens is None:
            self.unreported_requests += 1
        else:
            self.cache_read_tokens += usage.cache_read_tokens
            self.reported_prompt_tokens += usage.prompt_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        if plan is not None:
            self.predicted_read_tokens += plan.predicted_read_tokens
            self.warnings.extend(plan.warnings)

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens read from the cache, over the requests whose server reported it."""
        return self.cache_read_tokens / self.reported_prompt_tokens if self.reported_prompt_tokens else 0.0

    @property
    def predicted_hit_rate(self) -> float:
        return min(1.0, self.predicted_read_tokens / self.prompt_tokens) if self.prompt_tokens else 0.0


class CachePlanner:
    """Places breakpoints on Anthropic request bodies and remembers what it expects to be cached."""

    def __init__(
        self,
        *,
        min_tokens: int,
        count_tokens: Callable[[Any], int] = estimate_tokens,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_tokens = min_tokens
        self.count_tokens = count_tokens
        self.clock = clock
        self.ledger = CacheLedger()
        self._written: dict[str, tuple[int, float]] = {}  # prefix hash -> (tokens, expiry)

    def plan(self, body: dict[str, Any], policy: CachePolicy | None) -> CachePlan:
        """Add ``cache_control`` marks to `body` in place and return the plan with its prediction."""
        blocks = _blocks(body)
        plan = CachePlan()
        running, digest = 0, hashlib.sha256()
        message_start = sum(1 for section, _ in blocks if section != "messages")
        for index, (_, block) in enumerate(blocks):
            if index == message_start:  # tool_choice and thinking invalidate the message cache
                digest.update(json.dumps([body.get("tool_choice"), body.get("thinking")], sort_keys=True).encode())
            clean = {k: v for k, v in block.items() if k != "cache_control"}
            digest.update(json.dumps(clean, sort_keys=True, ensure_ascii=False).encode())
            running += self.count_tokens(clean)
            plan.hashes.append(digest.copy().hexdigest())
            plan.tokens.append(running)
        plan.prompt_tokens_estimate = running
        if not blocks:
            return plan
        existing = [
            Breakpoint(section, i, _ttl_of(block["cache_control"]), plan.tokens[i], "caller")
            for i, (section, block) in enumerate(blocks)
            if isinstance(block.get("cache_control"), dict)
        ]
        if len(existing) > MAX_BREAKPOINTS:
            raise ConfigurationError(
                f"{len(existing)} cache breakpoints were set (Message.cache / tools); "
                f"Anthropic allows {MAX_BREAKPOINTS}"
            )
        chosen = list(existing)
        if policy is not None and policy.enabled:
            chosen = self._place(blocks, plan, policy, chosen)
        chosen = _order_ttls(sorted(chosen, key=lambda b: b.position))
        for bp in chosen:
            if bp.placed_by == "planner":
                section_block = blocks[bp.position][1]
                section_block["cache_control"] = {"type": "ephemeral", "ttl": "1h"} if bp.ttl == "1h" else {
                    "type": "ephemeral"}
        plan.breakpoints = chosen
        self._predict(plan)
        return plan

    def _place(
        self,
        blocks: list[tuple[Section, dict[str, Any]]],
        plan: CachePlan,
        policy: CachePolicy,
        chosen: list[Breakpoint],
    ) -> list[Breakpoint]:
        long_ttl: Ttl = "1h" if policy.long_ttl_for_tools_and_system else policy.ttl
        taken = {b.position for b in chosen}
        last_of: dict[Section, int] = {section: i for i, (section, _) in enumerate(blocks)}
        candidates: list[tuple[Section, int, Ttl]] = []
        if "messages" in last_of:
            candidates.append(("messages", last_of["messages"], policy.ttl))
        if "tools" in last_of:
            candidates.append(("tools", last_of["tools"], long_ttl))
        if "system" in last_of:
            candidates.append(("system", last_of["system"], long_ttl))
        if "messages" in last_of:
            previous = self._last_written_position(plan)
            if previous is not None and last_of["messages"] - previous >= LOOKBACK_BLOCKS:
                candidates.append(("messages", previous, policy.ttl))
        for section, position, ttl in candidates:
            if len(chosen) >= MAX_BREAKPOINTS or position in taken:
                continue
            if plan.tokens[position] < self.min_tokens:
                plan.warnings.append(
                    f"{section} prefix of ~{plan.tokens[position]} tokens is below the model's minimum cacheable "
                    f"length ({self.min_tokens}): it will not be cached"
                )
                continue
            chosen.append(Breakpoint(section, position, ttl, plan.tokens[position], "planner"))
            taken.add(position)
        return chosen

    def _last_written_position(self, plan: CachePlan) -> int | None:
        now = self.clock()
        hits = [i for i, h in enumerate(plan.hashes) if (entry := self._written.get(h)) and entry[1] > now]
        return hits[-1] if hits else None

    def _predict(self, plan: CachePlan) -> None:
        now = self.clock()
        best = 0
        for bp in plan.breakpoints:
            for j in range(max(0, bp.position - LOOKBACK_BLOCKS + 1), bp.position + 1):
                entry = self._written.get(plan.hashes[j])
                if entry and entry[1] > now:
                    best = max(best, plan.tokens[j])
        plan.predicted_read_tokens = best
        last = max((bp.prefix_tokens for bp in plan.breakpoints if bp.prefix_tokens >= self.min_tokens), default=0)
        plan.predicted_write_tokens = max(0, last - best)

    def record(self, plan: CachePlan | None, usage: Usage) -> None:
        """After the response: remember the written prefixes and add the request to the ledger."""
        self.ledger.record(plan, usage)
        if plan is None:
            return
        now = self.clock()
        for bp in plan.breakpoints:
            if bp.prefix_tokens >= self.min_tokens:
                self._written[plan.hashes[bp.position]] = (bp.prefix_tokens, now + TTL_SECONDS[bp.ttl])
        for j, h in enumerate(plan.hashes):  # reads refresh the TTL for free
            entry = self._written.get(h)
            if entry and entry[1] > now:
                self._written[h] = (plan.tokens[j], max(entry[1], now + TTL_SECONDS["5m"]))


def _blocks(body: dict[str, Any]) -> list[tuple[Section, dict[str, Any]]]:
    """The request's cacheable blocks in cache-key order (string contents are turned into blocks)."""
    out: list[tuple[Section, dict[str, Any]]] = [("tools", t) for t in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str):
        system = body["system"] = [{"type": "text", "text": system}]
    out += [("system", b) for b in system or []]
    for message in body.get("messages") or []:
        if isinstance(message.get("content"), str):
            message["content"] = [{"type": "text", "text": message["content"]}]
        out += [("messages", b) for b in message.get("content") or []]
    return out


def _ttl_of(control: dict[str, Any]) -> Ttl:
    return "1h" if control.get("ttl") == "1h" else "5m"


def _order_ttls(breakpoints: list[Breakpoint]) -> list[Breakpoint]:
    """1h entries must come before 5m ones: the planner's own late 1h marks become 5m."""
    out: list[Breakpoint] = []
    seen_short = False
    for bp in breakpoints:
        if bp.ttl == "5m":
            seen_short = True
        elif seen_short:
            if bp.placed_by == "caller":
                raise ConfigurationError(
                    f"a 1h cache breakpoint ({bp.section}) comes after a 5m one: Anthropic requires 1h entries first"
                )
            bp = Breakpoint(bp.section, bp.position, "5m", bp.prefix_tokens, bp.placed_by)
        out.append(bp)
    return out
