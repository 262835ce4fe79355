"""The code that runs *inside* a sandbox: launcher, restrictions, cell runner, safe file reads.

This module is shipped into the sandbox as a single file (the host hands its source over a memfd), so
it imports only the standard library and nothing of parley. The host imports it too, for the pieces
both sides share (`read_beneath`, `check_relpath`, the syscall glue behind the Landlock probe).

Two entry modes (`python3 -I -S inside.py MODE ...`):

* ``bwrap REQUEST_PATH RESULT_FD``: bubblewrap already built the namespaces and installed seccomp;
  we set the rlimits, write the input files, run the target, collect artifacts, report.
* ``process REQUEST_FD RESULT_FD``: no namespaces. This process stays outside the restrictions as a
  small supervisor (a child subreaper, so daemons that `setsid` away are still ours to kill); its forked
  child sets rlimits, drops to the sandbox uid (when root), sets `no_new_privs`, applies Landlock and
  seccomp as the request says, then runs the target. The host collects artifacts itself.

Everything this file reports travels as one JSON object on RESULT_FD, bound to the run's nonce. The
host treats it as untrusted: the user's code runs in this same process and can forge any of it.
"""

from __future__ import annotations

import _ast
import binascii
import builtins
import errno
import json
import os
import resource
import stat
import sys
import time

# Startup time is the sandbox's latency: import only what every run needs (no `typing`, `ast`, `ctypes`,
# `signal` or `traceback` at module level; each is imported where it is used).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# --- syscall glue --------------------------------------------------------------------------------------

SYS_OPENAT2 = 437
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
SECCOMP_MODE_FILTER = 2
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

# Landlock filesystem rights, by the ABI that introduced them.
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

_libc: Any = None


def libc() -> Any:
    """The C library with errno capture (loaded lazily: the host imports this module too)."""
    import ctypes

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
        _libc.prctl.restype = ctypes.c_int
    return _libc


def _check(result: int, what: str) -> int:
    import ctypes

    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def prctl(option: int, arg: int = 0, arg3: int = 0) -> int:
    import ctypes

    return _check(
        libc().prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(arg3), ctypes.c_ulong(0),
                     ctypes.c_ulong(0)),
        f"prctl({option})",
    )


# --- safe reads beneath a directory ----------------------------------------------------------------------


def check_relpath(name: str) -> str:
    """Validate a work-dir-relative file name: ASCII, relative, no `..`, no empty or dash-led parts."""
    if not isinstance(name, str) or not name or len(name) > 255:
        raise ValueError("file name must be a non-empty string of at most 255 characters")
    if not name.isascii() or any(ord(c) < 0x20 or c in "\\\x7f" for c in name):
        raise ValueError(f"file name {name!r} must be printable ASCII without backslashes")
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") or p.startswith("-") for p in parts):
        raise ValueError(f"file name {name!r} must be relative, without '.', '..', empty or '-'-led parts")
    return name


def _openat2(dir_fd: int, path: str, flags: int) -> int:
    import ctypes

    class _OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

    how = _OpenHow(flags, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    fd = libc().syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(path)),
                        ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    return int(_check(fd, "openat2"))


def _open_walk(dir_fd: int, path: str, flags: int) -> int:
    """Fallback for kernels without openat2: one component at a time, never following a symlink."""
    parts = path.split("/")
    current = os.dup(dir_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            os.close(current)
            current = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=current)
    finally:
        os.close(current)


def read_beneath(root_fd: int, name: str, cap: int) -> bytes:
    """Read regular file `name` under directory fd `root_fd`, refusing anything that leaves it.

    openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) refuses `..`, absolute paths
    and every symlink (ELOOP/EXDEV); `fstat` on the opened fd (not the path: no TOCTOU) refuses FIFOs and
    devices; `O_NONBLOCK` means a FIFO swapped in cannot hang us; reads stop at `cap` bytes.
    Raises `ValueError` (bad name), `OSError` (refused or missing) or `OverflowError` (over `cap`).
    """
    check_relpath(name)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = _openat2(root_fd, name, flags)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        fd = _open_walk(root_fd, name, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, f"{name}: not a regular file")
        if info.st_size > cap:
            raise OverflowError(f"{name}: {info.st_size} bytes exceeds the {cap}-byte cap")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(65536, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:
                raise OverflowError(f"{name}: exceeds the {cap}-byte cap")
        return b"".join(chunks)
    finally:
        os.close(fd)


# --- restrictions (applied by the process-mode child to itself) -------------------------------------------


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is unavailable."""
    import ctypes

    try:
        version = libc().syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                                 ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def fs_rights(abi: int) -> int:
    """Every filesystem right the given ABI knows (all of them are 'handled', i.e. denied by default)."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def landlock_restrict(read_paths: list[str], write_paths: list[str], abi: int) -> None:
    """Restrict this process (and its future children) to read `read_paths`, read-write `write_paths`.

    TCP bind/connect are handled with no allowed port (ABI >= 4); abstract unix sockets and signals are
    scoped to the domain (ABI >= 6). UDP and other families are seccomp's job (Landlock is TCP-only).
    """
    import ctypes

    handled = fs_rights(abi)
    fields = [("fs", ctypes.c_uint64)]
    values = [handled]
    if abi >= 4:
        fields.append(("net", ctypes.c_uint64))
        values.append(NET_BIND_TCP | NET_CONNECT_TCP)
    if abi >= 6:
        fields.append(("scoped", ctypes.c_uint64))
        values.append(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    attr_type = type("RulesetAttr", (ctypes.Structure,), {"_fields_": fields})
    attr = attr_type(*values)
    ruleset = int(_check(libc().syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
                                        ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0)),
                         "landlock_create_ruleset"))

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    read_rights = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    try:
        for paths, rights in ((read_paths, read_rights), (write_paths, handled)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    if not stat.S_ISDIR(os.fstat(fd).st_mode):
                        rights &= FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
                    rule = PathBeneath(rights & handled, fd)
                    _check(libc().syscall(ctypes.c_long(SYS_LANDLOCK_ADD_RULE), ctypes.c_int(ruleset),
                                          ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule),
                                          ctypes.c_uint32(0)), f"landlock_add_rule({path})")
                finally:
                    os.close(fd)
        _check(libc().syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)


def seccomp_install(program: bytes) -> None:
    """Install a classic-BPF seccomp filter (8-byte instructions); `no_new_privs` must already be set."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _check(libc().prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog),
                        ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")


RLIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "as_bytes": resource.RLIMIT_AS,
    "fsize_bytes": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "core": resource.RLIMIT_CORE,
}


def apply_rlimits(limits: dict[str, int]) -> None:
    """Set soft = hard for each limit (CPU gets a 1 s hard margin so SIGXCPU names the cause first)."""
    for key, value in limits.items():
        which = RLIMITS[key]
        hard = value + 1 if key == "cpu_s" else value
        resource.setrlimit(which, (value, hard))


# --- the target ----------------------------------------------------------------------------------------


def _write_files(files: dict[str, str]) -> None:
    for name, data in files.items():
        check_relpath(name)
        parent = os.path.dirname(name)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(binascii.a2b_base64(data))
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


def _error_info(exc: BaseException) -> dict[str, Any]:
    info: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)[:2000]}
    if isinstance(exc, OSError) and exc.errno is not None:
        info["errno"] = exc.errno
    return info


def _print_traceback(exc: BaseException, code: str, line_cap: int = 2000, total_cap: int = 16000) -> None:
    """Like the interpreter's report (with the cell's source lines), but bounded: a 10 MB exception
    message must not flood stderr."""
    import linecache
    import traceback

    linecache.cache["<cell>"] = (len(code), None, code.splitlines(True), "<cell>")

    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
        tb = tb.tb_next  # drop this runner's own frame: the user's cell is where the story starts
    lines = traceback.format_exception(type(exc), exc, tb)
    text = "".join(line if len(line) <= line_cap else line[:line_cap] + "...[truncated]\n" for line in lines)
    if len(text) > total_cap:
        text = text[: total_cap // 4] + "\n...[traceback truncated]...\n" + text[-total_cap // 2:]
    sys.stderr.write(text)


def _run_cell(code: str) -> dict[str, Any]:
    """Run `code` as a notebook cell: the value of a final expression statement becomes the result."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        tree = compile(code, "<cell>", "exec", _ast.PyCF_ONLY_AST)
        assert isinstance(tree, _ast.Module)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], _ast.Expr) else None
        assert last is None or isinstance(last, _ast.Expr)
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is None:
            return {"ok": True, "value": None}
        value = eval(compile(_ast.Expression(last.value), "<cell>", "eval"), namespace)
    except SystemExit as exc:
        code_ = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return {"ok": code_ == 0, "value": None, "exit_code": code_}
    except BaseException as exc:  # the user's failure is data, reported on stderr and the channel
        _print_traceback(exc, code)
        return {"ok": False, "value": None, "error": _error_info(exc), "exit_code": 1}
    try:
        json.dumps(value, allow_nan=False)
        return {"ok": True, "value": value}
    except (TypeError, ValueError, RecursionError):
        return {"ok": True, "value": None, "value_repr": repr(value)[:10000]}


def _run_argv(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    import subprocess

    try:
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, check=False)
    except OSError as exc:
        print(f"cannot execute {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        return {"ok": False, "error": _error_info(exc), "exit_code": 127}
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    return {"ok": code == 0, "exit_code": code}


def _collect(names: list[str], cap: int) -> tuple[dict[str, str], dict[str, str]]:
    files: dict[str, str] = {}
    errors: dict[str, str] = {}
    budget = cap
    root = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            try:
                data = read_beneath(root, name, budget)
            except (OSError, ValueError, OverflowError) as exc:
                errors[name] = str(exc)[:200]
                continue
            budget -= len(data)
            files[name] = binascii.b2a_base64(data, newline=False).decode("ascii")
    finally:
        os.close(root)
    return files, errors


def _report(result_fd: int, payload: dict[str, Any]) -> None:
    try:
        data = json.dumps(payload, allow_nan=False, default=str).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError) as exc:
        data = json.dumps({"nonce": payload.get("nonce"), "ok": False, "error": _error_info(exc)}).encode()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(result_fd, view):]
    except OSError:
        pass


def run_target(request: dict[str, Any], result_fd: int, *, collect: bool) -> int:
    """Write inputs, run the code or argv, report on `result_fd`; returns the exit status."""
    os.set_inheritable(result_fd, False)
    _write_files(request.get("files") or {})
    if request["kind"] == "python":
        sys.argv = ["<cell>"]
        outcome = _run_cell(request["code"])
    else:
        outcome = _run_argv(request["argv"], request["env"])
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    payload: dict[str, Any] = {"nonce": request["nonce"], **outcome}
    if collect and request.get("collect"):
        payload["files"], payload["file_errors"] = _collect(request["collect"], request["artifact_cap"])
    _report(result_fd, payload)
    return int(outcome.get("exit_code", 0 if outcome.get("ok") else 1))


# --- process mode: supervisor + restricted child ------------------------------------------------------------


def _children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as handle:
                        fields = handle.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == pid:
                    found.append(int(entry))
        return found


def kill_descendants(deadline_s: float = 2.0) -> None:
    """Kill every descendant; orphans reparent to us (subreaper), so loop until none is left."""
    import signal

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        children = _children()
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            if not _children():
                return
        if not children:
            time.sleep(0.005)


def _restrict_child(request: dict[str, Any]) -> None:
    import signal

    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    apply_rlimits(request["limits"])
    drop = request.get("drop")
    if drop:
        os.setgroups([])
        os.setresgid(drop["gid"], drop["gid"], drop["gid"])
        os.setresuid(drop["uid"], drop["uid"], drop["uid"])
    os.chdir(request["workdir"])
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    landlock = request.get("landlock")
    if landlock:
        landlock_restrict(landlock["read"], landlock["write"], landlock["abi"])
    if request.get("seccomp"):
        seccomp_install(binascii.a2b_base64(request["seccomp"]))
    os.environ.clear()
    os.environ.update(request["env"])


def supervise(request: dict[str, Any], result_fd: int) -> int:
    os.closerange(3, result_fd)
    os.closerange(result_fd + 1, 1 << 16)  # e.g. the memfd this script was read from: only intended fds go on
    import signal

    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    def stop(_signum: int, _frame: object) -> None:
        kill_descendants()
        os._exit(128 + signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGUSR1, stop)
    pid = os.fork()
    if pid == 0:
        status = 126
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            _restrict_child(request)
            status = run_target(request, result_fd, collect=False)
        except BaseException as exc:  # setup failure: fail closed, say why on stderr
            print(f"sandbox setup failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            os._exit(status)
    os.close(result_fd)
    _, status = os.waitpid(pid, 0)
    kill_descendants()
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main(argv: list[str]) -> int:
    mode = argv[1]
    if mode == "bwrap":
        with open(argv[2], "rb") as handle:
            request = json.loads(handle.read())
        apply_rlimits(request["limits"])
        os.chdir(request["workdir"])
        return run_target(request, int(argv[3]), collect=True)
    if mode == "process":
        request_fd = int(argv[2])
        with os.fdopen(request_fd, "rb") as handle:
            request = json.loads(handle.read())
        return supervise(request, int(argv[3]))
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os._exit(main(sys.argv))
