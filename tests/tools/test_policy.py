"""Approval predicates fail closed: anything but a clean `False` means "ask a human first"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from parley.protocol import ToolCall
from parley.tools import ToolExecutor, approval_required, tool


def _over_100(args: Mapping[str, Any]) -> bool:
    return bool(args["amount"] > 100)


@tool(needs_approval=_over_100)
def refund(order_id: str, amount: float) -> str:
    return f"refunded {amount} on {order_id}"


def test_bool_options() -> None:
    @tool(needs_approval=True)
    def always(x: int) -> int:
        return x

    @tool
    def never(x: int) -> int:
        return x

    assert always.needs_approval('{"x": 1}') is True
    assert never.needs_approval("garbage") is False  # no policy: validation will reject it at execution


def test_predicate_sees_validated_arguments() -> None:
    assert refund.needs_approval('{"order_id": "A1", "amount": 5}') is False
    assert refund.needs_approval('{"order_id": "A1", "amount": 500}') is True


@pytest.mark.parametrize(
    "arguments",
    [
        "not json",
        '{"order_id": "A1", "amount": NaN}',
        '{"order_id": "A1", "amount": Infinity}',
        '["A1", 5]',
        '"A1"',
        "null",
        '{"order_id": "A1", "amount": 5, "amount": 500}',  # duplicate key hiding a large amount
        '{"order_id": "A1", "amount": "5"}',  # schema: string for a number
        '{"order_id": "A1"}',  # missing field
        '{"order_id": "A1", "amount": 5, "extra": 1}',
        '{"a":' * 40 + "1" + "}" * 40,
    ],
)
def test_malformed_arguments_need_approval(arguments: str) -> None:
    assert refund.needs_approval(arguments) is True


def test_a_predicate_that_raises_needs_approval() -> None:
    @tool(needs_approval=lambda args: 1 / 0 > 0)
    def f(x: int) -> int:
        return x

    assert f.needs_approval('{"x": 1}') is True


@pytest.mark.parametrize("decision", [None, 0, "", "no", [], 0.0])
def test_a_predicate_returning_a_non_bool_needs_approval(decision: Any) -> None:
    @tool(needs_approval=lambda args: decision)
    def f(x: int) -> int:
        return x

    assert f.needs_approval('{"x": 1}') is True


def test_an_async_predicate_needs_approval_and_is_not_left_unawaited() -> None:
    async def predicate(args: Mapping[str, Any]) -> bool:
        return False

    @tool(needs_approval=predicate)  # type: ignore[arg-type]
    def f(x: int) -> int:
        return x

    with pytestwarns_nothing():
        assert f.needs_approval('{"x": 1}') is True


def test_executor_and_function_forms_agree() -> None:
    executor = ToolExecutor([refund])
    big = ToolCall(id="1", name="refund", arguments={"order_id": "A", "amount": 101})
    small = ToolCall(id="2", name="refund", arguments={"order_id": "A", "amount": 1})
    assert executor.needs_approval(big) and approval_required(refund, big.arguments)
    assert not executor.needs_approval(small)
    assert not executor.needs_approval(ToolCall(id="3", name="unknown"))  # unknown tools fail at execution


class pytestwarns_nothing:  # noqa: N801 - reads like pytest.warns
    """Turn any warning (e.g. "coroutine was never awaited") into a test failure."""

    def __enter__(self) -> None:
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc: object) -> None:
        import gc

        gc.collect()
        self._catch.__exit__(*exc)
