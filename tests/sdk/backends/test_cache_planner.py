"""The Anthropic cache planner: four breakpoints at most, 1h before 5m, 20-block lookback, minimums."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from parley.cache_planner import LOOKBACK_BLOCKS, CachePlanner
from parley.caching import CachePolicy
from parley.errors import ConfigurationError
from parley.protocol import Usage

BIG = "x" * 8000  # ~2,000 tokens by the planner's estimate


def _body(n_messages: int = 2, *, tools: int = 1, marks: dict[int, str] | None = None) -> dict[str, Any]:
    messages = []
    for i in range(n_messages):
        block: dict[str, Any] = {"type": "text", "text": f"message {i}"}
        if marks and i in marks:
            block["cache_control"] = {"type": "ephemeral", "ttl": marks[i]}
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": [block]})
    return {
        "model": "m", "max_tokens": 10,
        "tools": [{"name": f"t{i}", "description": BIG, "input_schema": {"type": "object"}} for i in range(tools)],
        "system": [{"type": "text", "text": BIG}],
        "messages": messages,
    }


def _marks(body: dict[str, Any]) -> list[tuple[str, Any]]:
    out = [("tools", t.get("cache_control")) for t in body["tools"] if "cache_control" in t]
    out += [("system", b.get("cache_control")) for b in body["system"] if "cache_control" in b]
    out += [("messages", b.get("cache_control")) for m in body["messages"] for b in m["content"]
            if "cache_control" in b]
    return out


def test_stable_parts_get_breakpoints_with_long_ttl_first() -> None:
    body = _body()
    plan = CachePlanner(min_tokens=1024).plan(body, CachePolicy(long_ttl_for_tools_and_system=True))
    assert _marks(body) == [("tools", {"type": "ephemeral", "ttl": "1h"}), ("system", {"type": "ephemeral",
                                                                                       "ttl": "1h"}),
                            ("messages", {"type": "ephemeral"})]
    assert [bp.ttl for bp in plan.breakpoints] == ["1h", "1h", "5m"] and plan.predicted_read_tokens == 0
    assert plan.predicted_write_tokens == plan.prompt_tokens_estimate


def test_never_more_than_four_breakpoints_counting_the_callers() -> None:
    body = _body(6, marks={0: "5m", 2: "5m", 4: "5m"})
    plan = CachePlanner(min_tokens=1).plan(body, CachePolicy())
    assert len(plan.breakpoints) == 4 and len(_marks(body)) == 4
    assert sum(bp.placed_by == "caller" for bp in plan.breakpoints) == 3
    with pytest.raises(ConfigurationError, match="Anthropic allows 4"):
        CachePlanner(min_tokens=1).plan(_body(6, marks={i: "5m" for i in range(5)}), CachePolicy())


def test_1h_marks_must_precede_5m_marks() -> None:
    with pytest.raises(ConfigurationError, match="1h entries first"):
        CachePlanner(min_tokens=1).plan(_body(3, marks={0: "5m", 2: "1h"}), None)
    # The planner's own 1h marks after a caller's 5m one are downgraded instead.
    body = _body(2, tools=2)
    body["tools"][0]["cache_control"] = {"type": "ephemeral"}
    plan = CachePlanner(min_tokens=1).plan(body, CachePolicy(long_ttl_for_tools_and_system=True))
    assert [(bp.placed_by, bp.ttl) for bp in plan.breakpoints] == [
        ("caller", "5m"), ("planner", "5m"), ("planner", "5m"), ("planner", "5m")]
    assert all(mark == {"type": "ephemeral"} for _, mark in _marks(body))


def test_below_the_minimum_nothing_is_marked_and_a_warning_says_so() -> None:
    body = _body(2, tools=0)
    body["system"] = [{"type": "text", "text": "short"}]
    plan = CachePlanner(min_tokens=4096).plan(body, CachePolicy())
    assert _marks(body) == [] and plan.predicted_write_tokens == 0
    assert any("below the model's minimum cacheable length (4096)" in w for w in plan.warnings)


def test_second_request_predicts_a_read_through_the_lookback() -> None:
    planner = CachePlanner(min_tokens=1024)
    first = _body(2)
    plan = planner.plan(first, CachePolicy())
    planner.record(plan, Usage(cache_write_tokens=plan.prompt_tokens_estimate, requests=1))
    second = _body(6)  # four more blocks: within the 20-block lookback of the new last breakpoint
    plan2 = planner.plan(second, CachePolicy())
    assert plan2.predicted_read_tokens == plan.prompt_tokens_estimate
    planner.record(plan2, Usage(cache_read_tokens=plan2.predicted_read_tokens, input_tokens=10, requests=1))
    assert planner.ledger.requests == 2 and planner.ledger.predicted_read_tokens == plan.prompt_tokens_estimate
    assert 0 < planner.ledger.hit_rate <= planner.ledger.predicted_hit_rate + 1e-9


def test_more_than_twenty_new_blocks_get_an_extra_breakpoint_on_the_previous_write() -> None:
    planner = CachePlanner(min_tokens=1024)
    plan = planner.plan(_body(2), CachePolicy())
    planner.record(plan, Usage(requests=1))
    body = _body(2 + LOOKBACK_BLOCKS + 5)
    plan2 = planner.plan(body, CachePolicy())
    positions = [bp.position for bp in plan2.breakpoints]
    previous_last = plan.breakpoints[-1].position
    assert previous_last in positions and len(positions) == 4
    assert plan2.predicted_read_tokens == plan.prompt_tokens_estimate
    # Without the extra mark the old entry would be out of reach of the last breakpoint's lookback.
    assert positions[-1] - previous_last >= LOOKBACK_BLOCKS


def test_changing_tools_or_thinking_invalidates_the_prediction() -> None:
    planner = CachePlanner(min_tokens=1024)
    body = _body(2)
    plan = planner.plan(copy.deepcopy(body), CachePolicy())
    planner.record(plan, Usage(requests=1))
    changed_tools = _body(4)
    changed_tools["tools"][0]["description"] = BIG + "!"
    assert planner.plan(changed_tools, CachePolicy()).predicted_read_tokens == 0
    with_thinking = _body(4)
    with_thinking["thinking"] = {"type": "enabled", "budget_tokens": 2048}
    read = planner.plan(with_thinking, CachePolicy()).predicted_read_tokens
    assert 0 < read < plan.prompt_tokens_estimate  # tools+system still hit; messages do not
