"""`Sandbox`: pick a tier once, then run code or commands in a fresh, limited, isolated child per call.

Shape of one run (all tiers): the request (code, input files, limits, a fresh nonce) is written to a
memfd and handed over as a file, never argv; the launcher starts with a scrubbed environment in its own
session, stdin `/dev/null`, nothing inherited but the listed fds; stdout and stderr are drained
concurrently with byte caps (a flood is killed as soon as it passes the cap); the result arrives on a
separate pipe as strict JSON; the wall clock is enforced here, from outside, by killing the whole process
group (and, for bwrap, the pid namespace with it). The async methods are the implementation; the `*_sync`
methods run them to completion (in a worker thread when called from inside a running event loop).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Coroutine, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal, TypeVar

from parley.sandbox import bwrap as bwrap_policy
from parley.sandbox import inside, landlock, seccomp
from parley.sandbox.detect import (
    LAUNCHER_ENV,
    SAFE_TIERS,
    TIERS,
    Interpreter,
    Tier,
    find_bwrap,
    find_interpreter,
    probe_tier,
    sandbox_ids,
)
from parley.sandbox.errors import (
    ArtifactError,
    ResultChannelError,
    SandboxLaunchError,
    SandboxRequestError,
    SandboxUnavailable,
)
from parley.sandbox.limits import LimitName, Limits, MiB
from parley.sandbox.result import (
    ExecResult,
    classify_limit,
    decode_files,
    parse_channel,
    sanitize_text,
)

T = TypeVar("T")
MAX_INPUT_FILES = 1000
MAX_CODE_BYTES = 4 * 1024 * 1024  # a cell larger than this is an attack or a mistake, never code
FileData = bytes | str


@cache
def _inside_source() -> bytes:
    return Path(inside.__file__).read_bytes()


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, even when an event loop is already running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class Sandbox:
    """An isolation tier plus defaults; cheap to keep, safe to share across tasks and threads."""

    def __init__(self, tier: Tier, *, interpreter: Interpreter, limits: Limits | None = None,
                 bwrap: str | None = None, redact: Sequence[str] = ()) -> None:
        if tier not in TIERS:
            raise SandboxRequestError(f"unknown sandbox tier {tier!r}; expected one of {', '.join(TIERS)}")
        self.tier: Tier = tier
        self.interpreter = interpreter
        self.limits = (limits or Limits()).validated()
        self.bwrap = bwrap
        self.redact = tuple(s for s in redact if s)
        self._landlock_abi = landlock.landlock_abi() if tier == "landlock" else 0

    def __repr__(self) -> str:
        return f"Sandbox(tier={self.tier!r}, python={self.interpreter.executable!r})"

    # --- construction -------------------------------------------------------------------------------

    @staticmethod
    def probe(*, python: str | None = None) -> dict[str, str | None]:
        """Each tier mapped to why it is unusable here (None = usable). Deterministic; cached per process."""
        interpreter = find_interpreter(python)
        return {tier: probe_tier(tier, interpreter) for tier in TIERS}

    @classmethod
    def detect(cls, *, tier: Tier | Literal["auto"] = "auto", python: str | None = None,
               limits: Limits | None = None, redact: Sequence[str] = ()) -> Sandbox:
        """The best safe tier (bwrap, then Landlock), or exactly `tier` when named.

        Raises `SandboxUnavailable` (with per-tier reasons) when no safe tier works. The unsafe tier
        ("unsafe-process": rlimits, scrubbed env and wall kill, no isolation) is never chosen
        automatically; name it explicitly to accept it.
        """
        interpreter = find_interpreter(python)
        wanted: tuple[Tier, ...] = SAFE_TIERS if tier == "auto" else (tier,)
        if tier != "auto" and tier not in TIERS:
            raise SandboxRequestError(f"unknown sandbox tier {tier!r}; expected 'auto' or one of {', '.join(TIERS)}")
        reasons: dict[str, str] = {}
        for candidate in wanted:
            reason = probe_tier(candidate, interpreter)
            if reason is None and interpreter is not None:
                bwrap = find_bwrap() if candidate == "bwrap" else None
                return cls(candidate, interpreter=interpreter, limits=limits, bwrap=bwrap, redact=redact)
            reasons[candidate] = reason or "unavailable"
        summary = "; ".join(f"{name}: {why}" for name, why in reasons.items())
        raise SandboxUnavailable(f"no sandbox tier is usable here ({summary})", reasons=reasons)

    # --- public API -------------------------------------------------------------------------------------

    async def run_python(self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None,
                         files: Mapping[str, FileData] | None = None, collect: Sequence[str] = (),
                         limits: Limits | None = None) -> ExecResult:
        """Run `code` as a notebook cell in a fresh sandbox; a final expression's value is `result.value`."""
        if not isinstance(code, str) or "\x00" in code:
            raise SandboxRequestError("code must be a string without NUL characters")
        if len(code) > MAX_CODE_BYTES // 4 and len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise SandboxRequestError(f"code is larger than {MAX_CODE_BYTES} bytes")
        return await self._execute({"kind": "python", "code": code}, timeout_s, memory_mb, files, collect, limits)

    async def run(self, argv: Sequence[str], *, timeout_s: float | None = None, memory_mb: int | None = None,
                  files: Mapping[str, FileData] | None = None, collect: Sequence[str] = (),
                  limits: Limits | None = None) -> ExecResult:
        """Run a command (argv list, no shell) in a fresh sandbox, with the work dir as cwd."""
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) and a and "\x00" not in a for a in argv):
            raise SandboxRequestError("argv must be a non-empty list of non-empty strings without NUL characters")
        if sum(len(a) for a in argv) > MAX_CODE_BYTES:
            raise SandboxRequestError(f"argv is larger than {MAX_CODE_BYTES} bytes")
        return await self._execute({"kind": "argv", "argv": list(argv)}, timeout_s, memory_mb, files, collect, limits)

    def run_python_sync(self, code: str, **kwargs: Any) -> ExecResult:
        """Blocking `run_python`."""
        return run_sync(self.run_python(code, **kwargs))

    def run_sync(self, argv: Sequence[str], **kwargs: Any) -> ExecResult:
        """Blocking `run`."""
        return run_sync(self.run(argv, **kwargs))

    # --- one run ----------------------------------------------------------------------------------------

    def _prepare_files(self, files: Mapping[str, FileData] | None, collect: Sequence[str],
                       limits: Limits) -> tuple[dict[str, str], list[str]]:
        encoded: dict[str, str] = {}
        total = 0
        if files is not None and not isinstance(files, Mapping):
            raise SandboxRequestError("files must be a mapping of relative name to bytes or str")
        if len(files or {}) > MAX_INPUT_FILES:
            raise SandboxRequestError(f"at most {MAX_INPUT_FILES} input files")
        for name, data in (files or {}).items():
            try:
                inside.check_relpath(name)
            except ValueError as exc:
                raise SandboxRequestError(str(exc)) from None
            raw = data.encode("utf-8") if isinstance(data, str) else data
            if not isinstance(raw, bytes):
                raise SandboxRequestError(f"file {name!r}: content must be bytes or str")
            total += len(raw)
            encoded[name] = base64.b64encode(raw).decode("ascii")
        if total > limits.tmpfs_mb * MiB:
            raise SandboxRequestError(f"input files total {total} bytes, over the {limits.tmpfs_mb} MiB work dir")
        names = list(collect)
        for name in names:
            try:
                inside.check_relpath(name)
            except ValueError as exc:
                raise SandboxRequestError(str(exc)) from None
        return encoded, names

    async def _execute(self, target: dict[str, Any], timeout_s: float | None, memory_mb: int | None,
                       files: Mapping[str, FileData] | None, collect: Sequence[str],
                       limits: Limits | None) -> ExecResult:
        limits = (limits or self.limits).with_overrides(timeout_s=timeout_s, memory_mb=memory_mb)
        encoded, collect_names = self._prepare_files(files, collect, limits)
        nonce = secrets.token_hex(16)
        request: dict[str, Any] = {
            **target, "nonce": nonce, "files": encoded, "collect": collect_names, "limits": limits.rlimits(),
            "artifact_cap": limits.artifact_bytes,
        }
        drop = sandbox_ids() if os.geteuid() == 0 else None
        workdir: str | None = None
        opened: list[int] = []
        try:
            result_r, result_w = os.pipe()
            opened += [result_r, result_w]
            inside_fd = _memfd("parley-inside", _inside_source())
            opened.append(inside_fd)
            popen_kwargs: dict[str, Any] = {}
            if self.tier == "bwrap":
                assert self.bwrap is not None
                request.update(workdir=bwrap_policy.WORKDIR, env=dict(bwrap_policy.SANDBOX_ENV))
                request_fd = _memfd("parley-request", json.dumps(request).encode())
                seccomp_fd = _memfd("parley-seccomp", seccomp.build_filter())
                opened += [request_fd, seccomp_fd]
                argv = bwrap_policy.run_argv(self.bwrap, self.interpreter, limits, inside_fd=inside_fd,
                                             request_fd=request_fd, seccomp_fd=seccomp_fd, result_fd=result_w)
                pass_fds: tuple[int, ...] = (inside_fd, request_fd, seccomp_fd, result_w)
                env, cwd = dict(LAUNCHER_ENV), "/"
                if drop is not None:
                    popen_kwargs = {"user": drop[0], "group": drop[1], "extra_groups": []}
            else:
                workdir = landlock.make_workdir(drop)
                env = landlock.sandbox_env(workdir)
                request.update(workdir=workdir, env=env)
                if drop is not None:
                    request["drop"] = {"uid": drop[0], "gid": drop[1]}
                if self.tier == "landlock":
                    request["landlock"] = landlock.landlock_rules(self.interpreter, workdir, self._landlock_abi)
                    request["seccomp"] = base64.b64encode(seccomp.build_filter()).decode("ascii")
                request_fd = _memfd("parley-request", json.dumps(request).encode())
                opened.append(request_fd)
                argv = [self.interpreter.executable, "-I", "-S", f"/proc/self/fd/{inside_fd}", "process",
                        str(request_fd), str(result_w)]
                pass_fds = (inside_fd, request_fd, result_w)
                cwd = workdir
            started = time.monotonic()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    pass_fds=pass_fds, env=env, cwd=cwd, start_new_session=True, **popen_kwargs,
                )
            except OSError as exc:
                raise SandboxLaunchError(f"could not start the sandbox: {exc.strerror or exc}") from None
            for fd in opened[1:]:
                os.close(fd)
            opened = [result_r]
            return await self._supervise(proc, result_r, opened, limits, nonce, started, drop, workdir,
                                         collect_names)
        finally:
            for fd in opened:
                try:
                    os.close(fd)
                except OSError:
                    pass
            if workdir is not None:
                landlock.remove_workdir(workdir)

    async def _supervise(self, proc: asyncio.subprocess.Process, result_r: int, opened: list[int], limits: Limits,
                         nonce: str, started: float, drop: tuple[int, int] | None, workdir: str | None,
                         collect_names: list[str]) -> ExecResult:
        loop = asyncio.get_running_loop()
        result_reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(result_reader),
                                                    os.fdopen(result_r, "rb", buffering=0))
        opened.clear()  # the transport owns the fd now
        overflow: set[str] = set()

        def on_overflow(which: str) -> None:
            overflow.add(which)
            self._kill_now(proc)

        assert proc.stdout is not None and proc.stderr is not None
        drains = [
            asyncio.ensure_future(_drain(proc.stdout, limits.output_bytes, lambda: on_overflow("stdout"))),
            asyncio.ensure_future(_drain(proc.stderr, limits.output_bytes, lambda: on_overflow("stderr"))),
            asyncio.ensure_future(_drain(result_reader, limits.result_bytes, lambda: on_overflow("result"))),
        ]
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), limits.timeout_s)
            except asyncio.TimeoutError:
                timed_out = True
                await self._kill(proc, drop)
            duration = time.monotonic() - started
            await asyncio.wait(drains, timeout=1.0)
        except BaseException:
            await self._kill(proc, drop)
            raise
        finally:
            for task in drains:
                task.cancel()
            transport.close()
            subprocess_transport = getattr(proc, "_transport", None)
            if subprocess_transport is not None and proc.returncode is not None:
                subprocess_transport.close()  # pipes still held by an escaped process must not outlive the run
        (out, out_cut), (err, err_cut), (channel, channel_cut) = (
            task.result() if task.done() and not task.cancelled() else (b"", False) for task in drains
        )
        return self._build_result(proc.returncode, out, err, channel, out_cut, err_cut, channel_cut, timed_out,
                                  overflow, limits, nonce, duration, workdir, collect_names)

    def _build_result(self, returncode: int | None, out: bytes, err: bytes, channel: bytes, out_cut: bool,
                      err_cut: bool, channel_cut: bool, timed_out: bool, overflow: set[str], limits: Limits,
                      nonce: str, duration: float, workdir: str | None, collect_names: list[str]) -> ExecResult:
        exit_code = None if returncode is None else (128 - returncode if returncode < 0 else returncode)
        payload: dict[str, Any] = {}
        result_error: str | None = None
        if timed_out:
            result_error = "discarded: the run timed out"
        elif channel_cut or "result" in overflow:
            result_error = f"result exceeds the {limits.result_bytes}-byte cap"
        else:
            try:
                payload = parse_channel(channel, cap=limits.result_bytes, nonce=nonce)
            except ResultChannelError as exc:
                result_error = str(exc)
        error = payload.get("error")
        if isinstance(error, dict):
            error = {
                "type": sanitize_text(str(error.get("type", "")), cap=100),
                "message": sanitize_text(str(error.get("message", "")), redact=self.redact),
                **({"errno": error["errno"]} if isinstance(error.get("errno"), int) else {}),
            }
        else:
            error = None
        limit: LimitName | None
        if timed_out:
            limit = "wall"
        elif "stdout" in overflow or "stderr" in overflow:
            limit = "output"
        elif "result" in overflow or channel_cut:
            limit = "result_size"
        else:
            limit = classify_limit(exit_code, error, cpu_s=limits.effective_cpu_s, cpu_used_s=duration)
        files: dict[str, bytes] = {}
        file_errors: dict[str, str] = {}
        if not timed_out and collect_names:
            if workdir is None:
                files, file_errors = decode_files(payload.get("files"), limits.artifact_bytes)
                raw_errors = payload.get("file_errors")
                if isinstance(raw_errors, dict):
                    file_errors.update({str(k): sanitize_text(str(v), cap=200) for k, v in raw_errors.items()})
            else:
                files, file_errors = collect_artifacts(workdir, collect_names, limits.artifact_bytes)
        value_repr = payload.get("value_repr")
        return ExecResult(
            exit_code=exit_code,
            stdout=self._text(out),
            stderr=self._text(err),
            timed_out=timed_out,
            limit=limit,
            duration_s=duration,
            tier=self.tier,
            value=payload.get("value"),
            value_repr=value_repr if isinstance(value_repr, str) else None,
            error=error,
            files=files,
            file_errors=file_errors,
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
            result_error=result_error,
        )

    def _text(self, data: bytes) -> str:
        text = data.decode("utf-8", "replace")
        for secret in self.redact:
            text = text.replace(secret, "[REDACTED]")
        return text

    # --- killing ----------------------------------------------------------------------------------------

    @staticmethod
    def _kill_now(proc: asyncio.subprocess.Process) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def _kill(self, proc: asyncio.subprocess.Process, drop: tuple[int, int] | None) -> None:
        """Kill the whole run. bwrap: the group (the pid namespace dies with bwrap). Process tiers: ask the
        supervisor to kill its subtree (it is a subreaper), then the group, then (root) every process of
        the run's uid, which catches anything that escaped both."""
        if proc.returncode is None and self.tier != "bwrap":
            try:
                os.kill(proc.pid, signal.SIGTERM)
                await asyncio.wait_for(asyncio.shield(proc.wait()), 1.0)
            except (ProcessLookupError, asyncio.TimeoutError):
                pass
        self._kill_now(proc)
        if drop is not None and self.tier != "bwrap":
            _kill_uid(self.interpreter.executable, drop[0])
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), 5.0)
        except asyncio.TimeoutError:
            pass


def _kill_uid(python: str, uid: int) -> None:
    """kill(-1, SIGKILL) as `uid`: every process of that (per-run) uid except the killer itself."""
    subprocess.run([python, "-I", "-S", "-c", "import os; os.kill(-1, 9)"], user=uid, group=uid, extra_groups=[],
                   env=LAUNCHER_ENV, stdin=subprocess.DEVNULL, capture_output=True, check=False, timeout=10)


def collect_artifacts(workdir: str, names: Sequence[str], cap: int) -> tuple[dict[str, bytes], dict[str, str]]:
    """Read `names` out of a host work dir with `inside.read_beneath` (no symlinks, regular files only)."""
    files: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    root = os.open(workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            try:
                data = read_artifact(root, name, cap - sum(len(v) for v in files.values()))
            except ArtifactError as exc:
                errors[name] = str(exc)
                continue
            files[name] = data
    finally:
        os.close(root)
    return files, errors


def read_artifact(root_fd: int, name: str, cap: int) -> bytes:
    """One artifact, or `ArtifactError` with a short reason (symlink, escape, not regular, too large)."""
    try:
        return inside.read_beneath(root_fd, name, cap)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None
    except OverflowError:
        raise ArtifactError(f"{name}: over the artifact byte cap") from None
    except OSError as exc:
        reason = {40: "is or passes through a symlink", 18: "escapes the work dir", 2: "not found"}.get(
            exc.errno or 0, exc.strerror or "unreadable")
        raise ArtifactError(f"{name}: {reason}") from None


async def _drain(reader: asyncio.StreamReader, cap: int, on_overflow: Any) -> tuple[bytes, bool]:
    """Read until EOF, keeping the first `cap` bytes; past the cap call `on_overflow` once and discard.

    Reading on (and discarding) after the cap matters: a reader that stops leaves the transport paused,
    so it never sees EOF and asyncio never reports the process as finished.
    """
    buffer = bytearray()
    truncated = False
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            return bytes(buffer), truncated
        if truncated:
            continue
        room = cap - len(buffer)
        if len(chunk) > room:
            buffer += chunk[:room]
            truncated = True
            on_overflow()
        else:
            buffer += chunk
