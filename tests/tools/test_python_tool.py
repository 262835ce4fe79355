"""The ready `python` tool runs model-written code in `parley.sandbox`, never in this process."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from parley.protocol import ToolCall
from parley.tools import ToolDefinitionError, ToolExecutor, python_tool
from parley.tools.python_tool import format_exec_result


@dataclasses.dataclass
class FakeResult:
    exit_code: int | None = 0
    stdout: Any = ""
    stderr: Any = ""
    timed_out: bool = False
    limit: Any = None
    duration_s: float = 0.01
    value: Any = None
    value_repr: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    result_error: str | None = None


class FakeSandbox:
    """Records what it was asked to run; blocking like a thin third-party adapter would be."""

    def __init__(self, result: FakeResult) -> None:
        self.result = result
        self.calls: list[tuple[str, float, int]] = []

    def run_python(self, code: str, *, timeout_s: float, memory_mb: int) -> FakeResult:
        self.calls.append((code, timeout_s, memory_mb))
        return self.result


def run(tool_code: str, sandbox: Any = None, **options: Any) -> tuple[bool, str]:
    python = python_tool(sandbox, **options)
    call = ToolCall(id="c", name="python", arguments={"code": tool_code})
    [result] = asyncio.run(ToolExecutor([python]).execute([call]))
    return result.is_error, result.content


def test_the_tool_offers_one_code_parameter() -> None:
    spec = python_tool(FakeSandbox(FakeResult())).spec
    assert spec.name == "python" and "sandbox" in spec.description
    assert list(spec.parameters["properties"]) == ["code"] and spec.parameters["required"] == ["code"]


def test_code_and_limits_reach_the_sandbox_and_output_comes_back() -> None:
    box = FakeSandbox(FakeResult(stdout="hello\n", stderr="warn\n", value=[1, 2]))
    is_error, text = run("print('hello')", box, timeout_s=3, memory_mb=128)
    assert box.calls == [("print('hello')", 3, 128)]
    assert not is_error
    assert text == "status: exit code 0\nresult: [1,2]\nstdout:\nhello\nstderr:\nwarn"


@pytest.mark.parametrize(
    "result, expected",
    [
        (FakeResult(exit_code=137, timed_out=True, limit="wall"), "status: timed out after 10 s"),
        (FakeResult(exit_code=137, limit="memory"), "status: stopped by the memory limit (exit code 137)"),
        (FakeResult(exit_code=0), "status: exit code 0\n(no output)"),
        (FakeResult(value_repr="<object at 0x1>"), "result: <object at 0x1>"),
        (FakeResult(stdout="x", stdout_truncated=True), "[stdout was cut at the sandbox's output limit]"),
        (FakeResult(result_error="not JSON"), "note: the result channel was rejected (not JSON)"),
        (FakeResult(stdout=b"bytes \xff"), "stdout:\nbytes \ufffd"),
    ],
)
def test_exec_results_are_described_plainly(result: FakeResult, expected: str) -> None:
    assert expected in format_exec_result(result, timeout_s=10)


def test_a_stdout_flood_cannot_hide_stderr() -> None:
    text = format_exec_result(FakeResult(stdout="A" * 100_000, stderr="Traceback: boom"), timeout_s=1)
    assert "[truncated" in text and text.endswith("stderr:\nTraceback: boom")


def test_empty_code_and_bad_options_are_refused() -> None:
    box = FakeSandbox(FakeResult())
    assert run("   ", box) == (True, "tool 'python' failed: no code given")
    assert box.calls == []
    with pytest.raises(ToolDefinitionError):
        python_tool(box, timeout_s=0)
    with pytest.raises(ToolDefinitionError):
        python_tool(box, memory_mb=1)


def test_an_async_sandbox_is_awaited() -> None:
    class AsyncSandbox:
        async def run_python(self, code: str, *, timeout_s: float, memory_mb: int) -> FakeResult:
            await asyncio.sleep(0)
            return FakeResult(stdout=code)

    assert run("1", AsyncSandbox()) == (False, "status: exit code 0\nstdout:\n1")


# -- the real sandbox ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_sandbox() -> Any:
    from parley.sandbox import Sandbox, SandboxUnavailable

    try:
        return Sandbox.detect()
    except SandboxUnavailable as exc:
        pytest.skip(f"no OS sandbox here (needs bubblewrap with user namespaces, or Landlock + seccomp): {exc}")


def test_real_sandbox_runs_code_and_returns_output_and_value(real_sandbox: Any) -> None:
    is_error, text = run("import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7", real_sandbox)
    assert not is_error
    assert text.startswith("status: exit code 0\nresult: 42\nstdout:\nout\nstderr:\nerr")


def test_real_sandbox_reports_exceptions_without_failing_the_call(real_sandbox: Any) -> None:
    is_error, text = run("1 / 0", real_sandbox)
    assert not is_error  # the code failed, the tool worked: the model reads the traceback and fixes its code
    assert "status: exit code 1" in text and "ZeroDivisionError" in text


def test_real_sandbox_kills_code_at_the_timeout(real_sandbox: Any) -> None:
    is_error, text = run("import time\ntime.sleep(30)", real_sandbox, timeout_s=1)
    assert not is_error and "status: timed out after 1 s" in text


def test_real_sandbox_hides_host_secrets_and_files(
    real_sandbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SBX_TEST_SECRET", "hunter2-canary")
    canary = tmp_path / "canary.txt"
    canary.write_text("hunter2-file-canary")
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(os.environ.get('SBX_TEST_SECRET'))\n"
        f"try:\n    print(open({str(canary)!r}).read())\nexcept OSError as e:\n    print(type(e).__name__)\n"
    )
    is_error, text = run(code, real_sandbox)
    assert not is_error and "hunter2" not in text
    assert "None" in text and ("FileNotFoundError" in text or "PermissionError" in text)


def test_tool_arguments_with_shell_metacharacters_are_just_code(real_sandbox: Any, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    is_error, text = run(f"print('$(touch {marker})'); print(\"`touch {marker}`\")", real_sandbox)
    assert not is_error and not marker.exists() and f"$(touch {marker})" in text
