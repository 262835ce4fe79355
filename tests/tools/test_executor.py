"""`ToolExecutor`: timeouts, bounded retries, at-most-once by call id, parallelism, safe errors."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

from parley.protocol import ToolCall, ToolResult
from parley.tools import RetryableToolError, Tool, ToolContext, ToolDefinitionError, ToolError, ToolExecutor, tool


def call(name: str, call_id: str = "c1", **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


class Counter:
    def __init__(self) -> None:
        self.calls: list[Any] = []


# -- timeouts and cancellation -------------------------------------------------------------------


async def test_async_tool_is_cancelled_at_its_timeout() -> None:
    state = {"cancelled": False}

    @tool(timeout_s=0.2)
    async def slow() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        return "never"

    start = time.monotonic()
    [result] = await ToolExecutor([slow]).execute([call("slow")])
    assert result.is_error and "timed out after 0.2 s" in result.content
    assert time.monotonic() - start < 1.5
    assert state["cancelled"]


async def test_sync_tool_timeout_does_not_block_the_loop() -> None:
    release = threading.Event()

    @tool(timeout_s=0.2)
    def blocking() -> str:
        release.wait(5)
        return "late"

    start = time.monotonic()
    [result] = await ToolExecutor([blocking]).execute([call("blocking")])
    release.set()
    assert result.is_error and "timed out" in result.content
    assert time.monotonic() - start < 1.5


async def test_executor_default_timeout_applies_when_the_tool_has_none() -> None:
    @tool
    async def slow() -> str:
        await asyncio.sleep(10)
        return "never"

    [result] = await ToolExecutor([slow], default_timeout_s=0.1).execute([call("slow")])
    assert result.is_error and "0.1 s" in result.content


async def test_cancelling_the_batch_cancels_the_calls_and_records_only_finished_ones() -> None:
    cancelled = asyncio.Event()

    @tool
    async def fast() -> str:
        return "done"

    @tool
    async def slow() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    records: dict[str, ToolResult] = {}
    task = asyncio.ensure_future(
        ToolExecutor([fast, slow]).execute([call("fast", "a"), call("slow", "b")], records=records)
    )
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()
    assert list(records) == ["a"] and records["a"].content == "done"


# -- retries ---------------------------------------------------------------------------------------


async def test_idempotent_tool_retries_retryable_errors_with_growing_backoff() -> None:
    stamps: list[float] = []

    @tool(idempotent=True, retries=3)
    def flaky() -> str:
        stamps.append(time.monotonic())
        raise RetryableToolError("service busy")

    executor = ToolExecutor([flaky], backoff_s=0.05, jitter=False)
    [result] = await executor.execute([call("flaky")])
    assert len(stamps) == 4  # one call + 3 retries, no more
    assert result.is_error and "after 4 attempts" in result.content and "service busy" in result.content
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert gaps[0] >= 0.045 and gaps[1] >= 0.095 and gaps[2] >= 0.195  # 0.05, 0.1, 0.2


async def test_backoff_is_capped_and_jitter_stays_within_bounds() -> None:
    executor = ToolExecutor([], backoff_s=1.0, max_backoff_s=2.0)
    delays = [executor._delay(attempt, RetryableToolError()) for attempt in (1, 2, 3, 8) for _ in range(20)]
    assert all(0.5 <= d <= 2.0 for d in delays)
    assert executor._delay(1, RetryableToolError(retry_after_s=1.8)) >= 1.8  # a hint raises the delay
    assert executor._delay(1, RetryableToolError(retry_after_s=60)) <= 2.0  # but not past the cap


async def test_retry_until_success_and_the_context_counts_attempts() -> None:
    attempts: list[int] = []

    @tool(idempotent=True, retries=5)
    async def eventually(ctx: ToolContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RetryableToolError("not yet")
        return "ok"

    [result] = await ToolExecutor([eventually], backoff_s=0.001).execute([call("eventually")])
    assert (result.is_error, result.content, attempts) == (False, "ok", [1, 2, 3])


async def test_an_error_with_a_true_retryable_attribute_is_retried() -> None:
    class Transient(Exception):
        retryable = True

    counter = Counter()

    @tool(idempotent=True, retries=2)
    def f() -> str:
        counter.calls.append(1)
        raise Transient("x")

    await ToolExecutor([f], backoff_s=0.001).execute([call("f")])
    assert len(counter.calls) == 3


async def test_errors_not_marked_retryable_are_not_retried() -> None:
    counter = Counter()

    @tool(idempotent=True, retries=3)
    def f() -> str:
        counter.calls.append(1)
        raise ValueError("bad input")

    [result] = await ToolExecutor([f], backoff_s=0.001).execute([call("f")])
    assert len(counter.calls) == 1 and result.is_error and "ValueError: bad input" in result.content


async def test_timeouts_are_not_retried() -> None:
    counter = Counter()

    @tool(idempotent=True, retries=3, timeout_s=0.05)
    async def f() -> str:
        counter.calls.append(1)
        await asyncio.sleep(1)
        return "late"

    await ToolExecutor([f], backoff_s=0.001).execute([call("f")])
    assert len(counter.calls) == 1


async def test_non_idempotent_tools_are_never_retried() -> None:
    counter = Counter()

    @tool
    def charge_card() -> str:
        counter.calls.append(1)
        raise RetryableToolError("gateway timeout")

    [result] = await ToolExecutor([charge_card], backoff_s=0.001).execute([call("charge_card")])
    assert len(counter.calls) == 1 and result.is_error
    with pytest.raises(ToolDefinitionError, match="idempotent"):
        Tool(lambda: None, name="charge_twice", retries=1)


# -- at most once by call id ------------------------------------------------------------------------


async def test_recorded_calls_are_never_executed_again() -> None:
    counter = Counter()

    @tool
    def send_email(to: str) -> str:
        counter.calls.append(to)
        return f"sent to {to}"

    executor = ToolExecutor([send_email])
    records: dict[str, ToolResult] = {}
    first = await executor.execute([call("send_email", "c1", to="a@x")], records=records)
    assert records == {"c1": first[0]}

    # A resumed run (possibly in another process: the records went through JSON) replays the batch.
    restored = {k: ToolResult.model_validate_json(v.model_dump_json()) for k, v in records.items()}
    again = await ToolExecutor([send_email]).execute(
        [call("send_email", "c1", to="a@x"), call("send_email", "c2", to="b@x")], records=restored
    )
    assert counter.calls == ["a@x", "b@x"]
    assert again[0] == first[0] and again[1].content == "sent to b@x"
    assert set(restored) == {"c1", "c2"}


async def test_failed_and_invalid_calls_are_recorded_too() -> None:
    @tool
    def f(x: int) -> int:
        raise ValueError("boom")

    records: dict[str, ToolResult] = {}
    await ToolExecutor([f]).execute([call("f", "bad", x="1"), call("f", "err", x=1)], records=records)
    assert records["bad"].is_error and "x: Input should be a valid integer" in records["bad"].content
    assert records["err"].is_error and "boom" in records["err"].content


async def test_duplicate_call_ids_in_a_batch_run_once() -> None:
    counter = Counter()

    @tool
    def f(n: int) -> int:
        counter.calls.append(n)
        return n

    results = await ToolExecutor([f]).execute([call("f", "same", n=1), call("f", "same", n=2)])
    assert counter.calls == [1]
    assert not results[0].is_error and results[1].is_error and "duplicate tool call id" in results[1].content


async def test_concurrent_batches_with_the_same_call_id_share_one_execution() -> None:
    counter = Counter()

    @tool
    async def f() -> str:
        counter.calls.append(1)
        await asyncio.sleep(0.1)
        return "once"

    executor = ToolExecutor([f])
    a, b = await asyncio.gather(executor.execute([call("f", "x")]), executor.execute([call("f", "x")]))
    assert counter.calls == [1] and a == b


# -- parallelism ---------------------------------------------------------------------------------


async def test_independent_sync_calls_overlap() -> None:
    barrier = threading.Barrier(3, timeout=3)  # breaks unless all three run at the same time

    @tool
    def meet(n: int) -> int:
        barrier.wait()
        return n

    results = await ToolExecutor([meet]).execute([call("meet", str(i), n=i) for i in range(3)])
    assert [r.content for r in results] == ["0", "1", "2"] and not any(r.is_error for r in results)


async def test_independent_async_calls_overlap_and_keep_order() -> None:
    @tool
    async def nap(n: int) -> int:
        await asyncio.sleep(0.3 - n * 0.1)
        return n

    start = time.monotonic()
    results = await ToolExecutor([nap]).execute([call("nap", str(i), n=i) for i in range(3)])
    assert time.monotonic() - start < 0.55
    assert [r.call_id for r in results] == ["0", "1", "2"]


async def test_max_concurrency_bounds_the_overlap() -> None:
    running = {"now": 0, "peak": 0}

    @tool
    async def f(n: int) -> int:
        running["now"] += 1
        running["peak"] = max(running["peak"], running["now"])
        await asyncio.sleep(0.02)
        running["now"] -= 1
        return n

    await ToolExecutor([f], max_concurrency=2).execute([call("f", str(i), n=i) for i in range(6)])
    assert running["peak"] == 2


# -- policy, deferred, unknown ----------------------------------------------------------------------


async def test_deferred_tools_are_never_executed() -> None:
    @tool(deferred=True)
    def ask_manager(question: str) -> str:
        raise AssertionError("a deferred tool must not run here")

    records: dict[str, ToolResult] = {}
    executor = ToolExecutor([ask_manager])
    [result] = await executor.execute([call("ask_manager", question="raise?")], records=records)
    assert result.is_error and "deferred" in result.content
    assert records == {}  # the caller's result is still to come
    assert executor.is_deferred(call("ask_manager")) and not executor.is_deferred(call("other"))


@pytest.mark.parametrize("name", ["nope", "__import__", "os.system", "tools/../shell", "echo ", "ECHO"])
async def test_unknown_tool_names_list_the_available_tools(name: str) -> None:
    @tool
    def echo(text: str) -> str:
        return text

    [result] = await ToolExecutor([echo]).execute([ToolCall(id="1", name=name, arguments="{}")])
    assert result.is_error and "unknown tool" in result.content and "available tools: echo" in result.content


async def test_invalid_arguments_never_reach_the_function() -> None:
    counter = Counter()

    @tool
    def f(n: int) -> int:
        counter.calls.append(n)
        return n

    results = await ToolExecutor([f]).execute(
        [
            ToolCall(id="1", name="f", arguments='{"n": "5"}'),
            ToolCall(id="2", name="f", arguments='{"n": 1, "n": 2}'),
            ToolCall(id="3", name="f", arguments='{"n": NaN}'),
        ]
    )
    assert counter.calls == [] and all(r.is_error for r in results)
    assert "duplicate" in results[1].content and "NaN" in results[2].content


# -- results ---------------------------------------------------------------------------------------


class Forecast(BaseModel):
    city: str
    temps: list[float]


@dataclasses.dataclass
class Point:
    x: int
    y: int


@pytest.mark.parametrize(
    "value, text",
    [
        ("plain text", "plain text"),
        (None, ""),
        ({"a": 1, "b": [1, 2]}, '{"a":1,"b":[1,2]}'),
        (Forecast(city="Paris", temps=[1.5]), '{"city":"Paris","temps":[1.5]}'),
        (Point(1, 2), '{"x":1,"y":2}'),
        (42, "42"),
        (b"bytes \xff", "bytes \ufffd"),
    ],
)
async def test_results_are_rendered_as_text_or_compact_json(value: Any, text: str) -> None:
    @tool
    def f() -> Any:
        return value

    [result] = await ToolExecutor([f]).execute([call("f")])
    assert (result.is_error, result.content) == (False, text)


async def test_an_unserialisable_result_is_an_error_not_a_repr() -> None:
    class Secretive:
        def __repr__(self) -> str:
            return "<Secretive password=hunter2>"

    @tool
    def f() -> Any:
        return Secretive()

    [result] = await ToolExecutor([f]).execute([call("f")])
    assert result.is_error and "cannot be serialised" in result.content and "hunter2" not in result.content


async def test_oversized_results_are_truncated_and_marked() -> None:
    @tool(max_result_chars=200)
    def big() -> str:
        return "x" * 10_000

    @tool
    def also_big() -> str:
        return "y" * 10_000

    executor = ToolExecutor([big, also_big], max_result_chars=500)
    one, two = await executor.execute([call("big", "1"), call("also_big", "2")])
    assert len(one.content) <= 200 and one.content.endswith("of 10000 characters]")
    assert "[truncated: showing" in one.content
    assert len(two.content) <= 500 and "[truncated" in two.content


# -- errors are safe -------------------------------------------------------------------------------


async def test_tool_exceptions_become_short_safe_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_API_KEY", "env-secret-123456")

    @tool
    def leaky() -> str:
        raise RuntimeError(
            "\x1b[31mcould not open /home/alice/.ssh/id_rsa via https://bob:pa55w0rd@internal.example/x "
            "with token=abcd1234efgh and sk-abcdefghijklmnopqrstuv, env env-secret-123456\x1b[0m" + "!" * 5000
        )

    [result] = await ToolExecutor([leaky]).execute([call("leaky")])
    text = result.content
    assert result.is_error and text.startswith("tool 'leaky' failed: RuntimeError: could not open")
    for leaked in ("/home/alice", "pa55w0rd", "abcd1234efgh", "sk-abcdef", "env-secret-123456", "\x1b", "Traceback"):
        assert leaked not in text
    assert "id_rsa" in text  # the last path component stays: it is what the model needs to fix its call
    assert len(text) < 600


async def test_tool_errors_are_reported_with_their_message() -> None:
    @tool
    def lookup(city: str) -> str:
        raise ToolError(f"no city called {city!r}")

    [result] = await ToolExecutor([lookup]).execute([call("lookup", city="Atlantis")])
    assert result.content == "tool 'lookup' failed: no city called 'Atlantis'"


async def test_sys_exit_in_a_tool_is_an_error_result_not_a_crash() -> None:
    @tool
    def quitter() -> str:
        sys.exit(3)

    [result] = await ToolExecutor([quitter]).execute([call("quitter")])
    assert result.is_error and "SystemExit" in result.content


# -- registry and context --------------------------------------------------------------------------


async def test_context_is_passed_per_call() -> None:
    @tool
    async def who(ctx: ToolContext) -> str:
        return f"{ctx.call_id}/{ctx.tool_name}/{ctx.tenant}/{ctx.deps}"

    results = await ToolExecutor([who]).execute(
        [call("who", "a"), call("who", "b")], context=ToolContext(tenant="acme", deps="db")
    )
    assert [r.content for r in results] == ["a/who/acme/db", "b/who/acme/db"]


def test_registry_accepts_plain_functions_and_refuses_duplicate_names() -> None:
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    executor = ToolExecutor([add])
    assert [s.name for s in executor.specs] == ["add"]
    assert executor.execute_sync([call("add", a=1, b=2)])[0].content == "3"
    with pytest.raises(ToolDefinitionError, match="two tools"):
        ToolExecutor([add, tool(add)])


async def test_execute_sync_refuses_to_nest_in_a_running_loop() -> None:
    with pytest.raises(ToolError, match="await"):
        ToolExecutor([]).execute_sync([])
