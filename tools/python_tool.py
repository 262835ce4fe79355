"""The ready-made `python` tool: model-written code run in an OS sandbox, never in this process.

    agent = Agent(backend, tools=[python_tool()])

Each call runs the code in a fresh `parley.sandbox` process (bubblewrap, or Landlock + seccomp where
namespaces are unavailable): no network, no host files, CPU/memory/wall limits. The result the model
reads is plain text: the exit status, which limit fired if one did, and the captured stdout and stderr
(each capped on its own, so a stdout flood cannot hide the traceback). In-process Python
"sandboxes" are not security boundaries (see `reference/sandbox.md`), so there is no fallback to
`exec`: without a working sandbox the tool answers with an error.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from typing import Annotated, Any, Protocol

from pydantic import Field

from parley.tools.errors import ToolDefinitionError, ToolError
from parley.tools.results import render_result, truncate
from parley.tools.tool import Tool, run_in_daemon_thread

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
MAX_CODE_CHARS = 100_000
_STREAM_CHARS = 8_000
_TIMEOUT_SLACK_S = 10.0

DESCRIPTION = (
    "Run Python 3 code in an isolated sandbox and return its exit code, stdout and stderr. "
    "Each call starts a fresh interpreter: no state is kept between calls, there is no network access "
    "and no access to the host's files. Use print() to show results."
)


class ExecResultLike(Protocol):
    """The fields of `parley.sandbox.ExecResult` this tool needs (`value`, `value_repr`, `result_error`,
    `stdout_truncated` and `stderr_truncated` are read when present)."""

    @property
    def exit_code(self) -> int | None: ...
    @property
    def stdout(self) -> Any: ...
    @property
    def stderr(self) -> Any: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def limit(self) -> Any: ...


class SandboxLike(Protocol):
    """What this tool needs of a sandbox: `run_python`, async (as `parley.sandbox.Sandbox`) or blocking."""

    def run_python(self, code: str, *, timeout_s: float, memory_mb: int) -> Any: ...


def _text(stream: Any) -> str:
    if stream is None:
        return ""
    if isinstance(stream, bytes | bytearray):
        return bytes(stream).decode("utf-8", errors="replace")
    return str(stream)


def format_exec_result(result: ExecResultLike, *, timeout_s: float, stream_chars: int = _STREAM_CHARS) -> str:
    """The model-facing text of a sandbox run: status line(s), then stdout and stderr, each capped."""
    limit = getattr(result, "limit", None)
    limit_name = getattr(limit, "value", limit)
    if result.timed_out:
        status = f"timed out after {timeout_s:g} s (the process was killed)"
    elif limit_name:
        status = f"stopped by the {limit_name} limit (exit code {result.exit_code})"
    else:
        status = f"exit code {result.exit_code}"
    lines = [f"status: {status}"]
    value, value_repr = getattr(result, "value", None), getattr(result, "value_repr", None)
    if value is not None:
        lines.append("result: " + truncate(render_result(value), stream_chars)[0])
    elif value_repr:
        lines.append("result: " + truncate(str(value_repr), stream_chars)[0])
    for label, stream in (("stdout", result.stdout), ("stderr", result.stderr)):
        text, _ = truncate(_text(stream), stream_chars)
        if getattr(result, f"{label}_truncated", False):
            text += f"\n[{label} was cut at the sandbox's output limit]"
        if text:
            lines.append(f"{label}:\n{text.rstrip(chr(10))}")
    result_error = getattr(result, "result_error", None)
    if result_error:
        lines.append(f"note: the result channel was rejected ({result_error})")
    if len(lines) == 1:
        lines.append("(no output)")
    return "\n".join(lines)


def python_tool(
    sandbox: SandboxLike | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    name: str = "python",
    description: str = DESCRIPTION,
    needs_approval: bool = False,
) -> Tool:
    """A `Tool` that runs model-written Python through `sandbox` (default: `Sandbox.detect()` on first use).

    `timeout_s` is the wall-clock limit enforced by the sandbox (the process group is killed);
    `memory_mb` caps its address space. Sandbox errors marked `retryable` are retried once.
    """
    if not timeout_s > 0:
        raise ToolDefinitionError(f"python_tool: timeout_s must be positive, got {timeout_s!r}")
    if memory_mb < 32:
        raise ToolDefinitionError(f"python_tool: memory_mb must be at least 32 (the sandbox floor), got {memory_mb!r}")
    chosen: list[SandboxLike] = [sandbox] if sandbox is not None else []
    lock = threading.Lock()  # not an asyncio.Lock: the tool may serve several event loops

    def resolve() -> SandboxLike:
        with lock:
            if not chosen:
                sandbox_module = importlib.import_module("parley.sandbox")
                chosen.append(sandbox_module.Sandbox.detect())
            return chosen[0]

    async def python(
        code: Annotated[str, Field(max_length=MAX_CODE_CHARS, description="Python 3 source code to run.")],
    ) -> str:
        if not code.strip():
            raise ToolError("no code given")
        box = await run_in_daemon_thread(resolve)  # detection probes run processes: keep them off the loop
        if inspect.iscoroutinefunction(box.run_python):
            result = await box.run_python(code, timeout_s=timeout_s, memory_mb=memory_mb)
        else:
            result = await run_in_daemon_thread(lambda: box.run_python(code, timeout_s=timeout_s, memory_mb=memory_mb))
        return format_exec_result(result, timeout_s=timeout_s)

    return Tool(
        python,
        name=name,
        description=description,
        needs_approval=needs_approval,
        timeout_s=timeout_s + _TIMEOUT_SLACK_S,
        retries=1,
        idempotent=True,
        max_result_chars=2 * _STREAM_CHARS + 1_000,
    )
