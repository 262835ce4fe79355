"""`Sandbox` as callers use it: detection and fail-closed policy, running code and commands, limits,
request validation, sync/async entry points, cancellation and the error tree."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import stat
import struct
import tempfile
from pathlib import Path

import pytest

import parley.sandbox.detect as detect
from parley.sandbox import (
    ArtifactError,
    Limits,
    ResultChannelError,
    Sandbox,
    SandboxError,
    SandboxLaunchError,
    SandboxRequestError,
    SandboxUnavailable,
    seccomp,
)

AVAILABLE = Sandbox.probe()
SAFE = [t for t in ("bwrap", "landlock") if AVAILABLE[t] is None]


@pytest.fixture(params=SAFE or [pytest.param("none", marks=pytest.mark.skip(reason="no OS sandbox tier here"))])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return Sandbox.detect(tier=request.param, limits=Limits(timeout_s=10))


# --- detection ------------------------------------------------------------------------------------------


def test_i1_probe_is_deterministic_and_detect_takes_the_best_safe_tier() -> None:
    assert Sandbox.probe() == AVAILABLE
    if not SAFE:
        pytest.skip("no OS sandbox tier on this machine")
    assert Sandbox.detect().tier == SAFE[0]


def test_with_no_safe_tier_detect_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("parley.sandbox.sandbox.probe_tier", lambda tier, interp: f"{tier} disabled for the test")
    with pytest.raises(SandboxUnavailable) as caught:
        Sandbox.detect()
    assert caught.value.code == "unavailable" and not caught.value.retryable
    assert set(caught.value.reasons) == {"bwrap", "landlock"}  # the unsafe tier was not even considered


def test_the_unsafe_tier_runs_only_when_named() -> None:
    sandbox = Sandbox.detect(tier="unsafe-process")
    assert sandbox.tier == "unsafe-process"
    assert sandbox.run_python_sync("6 * 7").value == 42


@pytest.mark.skipif(AVAILABLE["landlock"] is not None, reason="Landlock ABI >= 6 unavailable")
def test_i3_ubuntu_userns_restriction_falls_back_to_landlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bwrap that fails like Ubuntu >= 23.10's AppArmor userns restriction (sandbox.md §2 traps)."""
    folder = Path(tempfile.mkdtemp(prefix="parley-fake-bwrap-"))  # reachable by the dropped uid
    try:
        folder.chmod(0o755)
        shim = folder / "bwrap"
        shim.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
        shim.chmod(0o755)
        monkeypatch.setattr("parley.sandbox.detect.find_bwrap", lambda: str(shim))
        with pytest.raises(SandboxUnavailable, match="uid map"):
            Sandbox.detect(tier="bwrap")
        assert Sandbox.detect().tier == "landlock"
    finally:
        shutil.rmtree(folder)


def test_an_unknown_tier_is_a_request_error() -> None:
    with pytest.raises(SandboxRequestError):
        Sandbox.detect(tier="docker")  # type: ignore[arg-type]


def test_the_interpreter_is_reachable_by_an_unprivileged_uid() -> None:
    interpreter = detect.find_interpreter()
    assert interpreter is not None
    assert os.stat(interpreter.executable).st_mode & stat.S_IROTH


# --- running --------------------------------------------------------------------------------------------


def test_a_cell_returns_stdout_stderr_and_its_last_expression(sandbox: Sandbox) -> None:
    result = sandbox.run_python_sync("import sys\nprint('out')\nprint('err', file=sys.stderr)\n{'x': [1, 2]}")
    assert result.ok and result.exit_code == 0 and result.limit is None and not result.timed_out
    assert (result.stdout, result.stderr, result.value) == ("out\n", "err\n", {"x": [1, 2]})
    assert result.tier == sandbox.tier and result.duration_s > 0 and result.kind == "exec_result"


def test_input_files_go_in_and_collected_files_come_back(sandbox: Sandbox) -> None:
    code = "data = open('in/a.txt').read()\nopen('out.bin', 'wb').write(data.upper().encode())\nlen(data)"
    result = sandbox.run_python_sync(code, files={"in/a.txt": "hello", "b.bin": b"\x00\x01"},
                                     collect=["out.bin", "missing.txt"])
    assert result.value == 5 and result.files == {"out.bin": b"HELLO"}
    assert set(result.file_errors) == {"missing.txt"}


def test_a_non_json_value_comes_back_as_repr(sandbox: Sandbox) -> None:
    result = sandbox.run_python_sync("{1, 2}")
    assert result.value is None and result.value_repr == "{1, 2}"


def test_an_exception_is_reported_not_raised(sandbox: Sandbox) -> None:
    result = sandbox.run_python_sync("1 / 0")
    assert result.exit_code == 1 and not result.ok and result.error is not None
    assert result.error["type"] == "ZeroDivisionError" and "ZeroDivisionError" in result.stderr
    assert "/root" not in result.stderr and "/work" not in result.stderr  # no host paths in tracebacks
    assert "inside.py" not in result.stderr and "/proc/self/fd" not in result.stderr  # nor runner frames
    assert "1 / 0" in result.stderr  # the cell's own source line is shown


def test_a_syntax_error_is_reported(sandbox: Sandbox) -> None:
    result = sandbox.run_python_sync("def broken(:\n    pass")
    assert result.exit_code == 1 and result.error is not None and result.error["type"] == "SyntaxError"
    assert '"<cell>", line 1' in result.stderr


def test_sys_exit_sets_the_exit_code(sandbox: Sandbox) -> None:
    assert sandbox.run_python_sync("import sys\nsys.exit(3)").exit_code == 3


def test_a_memory_limit_is_named(sandbox: Sandbox) -> None:
    result = sandbox.run_python_sync("x = bytearray(200 * 1024 * 1024)", memory_mb=64)
    assert result.limit == "memory" and result.error is not None and result.error["type"] == "MemoryError"


def test_commands_run_with_the_work_dir_as_cwd(sandbox: Sandbox) -> None:
    result = sandbox.run_sync(["/usr/bin/cat", "note.txt"], files={"note.txt": "from the host"})
    assert result.ok and result.stdout == "from the host"


def test_a_missing_command_is_exit_127(sandbox: Sandbox) -> None:
    result = sandbox.run_sync(["no-such-command-xyz"])
    assert result.exit_code == 127 and "cannot execute" in result.stderr


@pytest.mark.parametrize("argument", [
    "a.txt; touch /tmp/parley-g1-marker #", "$(id)", "`id`", "a | id", "a && id", "a\nid",  # G1
    "--output=/etc/passwd", "-rf",                                                          # G2
    "~/x", "$HOME/x", "${IFS}",                                                             # G14
])
def test_g1_g2_g14_arguments_are_literal(sandbox: Sandbox, argument: str) -> None:
    result = sandbox.run_sync(["/usr/bin/printf", "%s", "--", argument])
    assert result.ok and result.stdout in (argument, "--" + argument)
    assert not os.path.exists("/tmp/parley-g1-marker")


async def test_async_runs_are_concurrent_and_independent(sandbox: Sandbox) -> None:
    results = await asyncio.gather(*(sandbox.run_python(f"{i} * 2") for i in range(4)))
    assert [r.value for r in results] == [0, 2, 4, 6]


async def test_the_sync_wrapper_works_inside_a_running_loop(sandbox: Sandbox) -> None:
    assert sandbox.run_python_sync("'from a thread'").value == "from a thread"


async def test_cancelling_a_run_kills_it(sandbox: Sandbox) -> None:
    marker = f"43.{os.getpid()}"
    task = asyncio.ensure_future(sandbox.run(["/usr/bin/sleep", marker], timeout_s=30))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                survivors.append(pid)
        except OSError:
            pass
    assert survivors == []


# --- request validation (G3, G5, G6, G7) ----------------------------------------------------------------


@pytest.mark.parametrize("files", [
    {"../../etc/passwd": "x"}, {"/etc/passwd": "x"}, {"sub/../../x": "x"}, {"a\x00b": "x"},
    {"\uff0e\uff0e\uff0fx": "x"}, {"-rf": "x"}, {"ok.txt": 5}, ["not", "a", "mapping"],
])
def test_hostile_file_names_are_refused_before_anything_runs(files: object) -> None:
    sandbox = Sandbox.detect(tier="unsafe-process")
    with pytest.raises(SandboxRequestError) as caught:
        sandbox.run_python_sync("1", files=files)
    assert caught.value.code == "invalid_request"


@pytest.mark.parametrize("kwargs", [
    {"code": "print(1)\x00"}, {"code": "#" * (5 * 1024 * 1024)}, {"code": 5},
    {"code": "1", "timeout_s": 0}, {"code": "1", "timeout_s": math.nan}, {"code": "1", "memory_mb": 1},
    {"code": "1", "collect": ["../x"]},
])
def test_bad_python_requests_are_refused(kwargs: dict[str, object]) -> None:
    sandbox = Sandbox.detect(tier="unsafe-process")
    code = kwargs.pop("code")
    with pytest.raises(SandboxRequestError):
        sandbox.run_python_sync(code, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("argv", ["ls -la", [], [""], ["ls", "a\x00b"]])
def test_bad_argv_is_refused(argv: object) -> None:
    with pytest.raises(SandboxRequestError):
        Sandbox.detect(tier="unsafe-process").run_sync(argv)  # type: ignore[arg-type]


# --- errors and the seccomp program ---------------------------------------------------------------------


def test_every_error_has_a_stable_code_and_retryability() -> None:
    table = {SandboxError: ("sandbox_error", False), SandboxUnavailable: ("unavailable", False),
             SandboxRequestError: ("invalid_request", False), SandboxLaunchError: ("launch_failed", True),
             ResultChannelError: ("bad_result", False), ArtifactError: ("artifact_refused", False)}
    for cls, (code, retryable) in table.items():
        error = cls("x")
        assert (error.code, error.retryable) == (code, retryable)
        assert isinstance(error, SandboxError)
    assert issubclass(ArtifactError, ResultChannelError)


@pytest.mark.skipif(not seccomp.supported(), reason="no seccomp syscall table for this architecture")
def test_the_seccomp_program_checks_the_architecture_first() -> None:
    program = seccomp.build_filter()
    assert len(program) % 8 == 0 and len(program) // 8 < 4096
    code, _, jf, k = struct.unpack("<HBBI", program[:8])
    assert (code, k) == (0x20, 4)  # load seccomp_data.arch
    code, _, _, k = struct.unpack("<HBBI", program[8:16])
    assert k == seccomp.AUDIT_ARCH_X86_64
    returns = {struct.unpack("<HBBI", program[i:i + 8])[3] for i in range(0, len(program), 8)
               if struct.unpack("<HBBI", program[i:i + 8])[0] == 0x06}
    assert returns == {seccomp.RET_ALLOW, seccomp.RET_ERRNO | 1, seccomp.RET_ERRNO | 38, seccomp.RET_KILL_PROCESS}
