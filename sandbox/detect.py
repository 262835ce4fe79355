"""Capability probes: which isolation tier can this machine give us, and which interpreter runs inside.

Probes run real (tiny) sandboxes rather than reading sysctls, because the failure modes are only visible
by trying: Ubuntu's AppArmor userns restriction makes bwrap fail with "setting up uid map: Permission
denied" although `bwrap` exists and `max_user_namespaces` is large (sandbox.md §2). Results are cached
per process: a probe costs a few tens of milliseconds.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from typing import Literal

from parley.sandbox import inside, seccomp

Tier = Literal["bwrap", "landlock", "unsafe-process"]
TIERS: tuple[Tier, ...] = ("bwrap", "landlock", "unsafe-process")
SAFE_TIERS: tuple[Tier, ...] = ("bwrap", "landlock")
MIN_LANDLOCK_ABI = 6  # signal and abstract-socket scoping; below that a sandboxed child can signal the host
LAUNCHER_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}


@dataclass(frozen=True)
class Interpreter:
    """A Python interpreter usable inside the sandbox, with the prefix that must be visible there."""

    executable: str
    prefix: str
    version: tuple[int, int]


def _world_accessible(path: str) -> bool:
    """Whether an unprivileged uid can reach `path` (every parent o+x, the file o+r/o+x)."""
    real = os.path.realpath(path)
    parts = real.split("/")
    for end in range(2, len(parts)):
        try:
            if not os.stat("/".join(parts[:end])).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IROTH)


@cache
def _probe_interpreter(executable: str) -> Interpreter | None:
    try:
        out = subprocess.run(
            [executable, "-I", "-S", "-c", "import sys; print(sys.base_prefix); print(*sys.version_info[:2])"],
            capture_output=True, text=True, timeout=10, env=LAUNCHER_ENV, stdin=subprocess.DEVNULL, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split("\n")
    if out.returncode != 0 or len(lines) < 2:
        return None
    major, minor = (int(x) for x in lines[1].split())
    if (major, minor) < (3, 8):
        return None
    return Interpreter(os.path.realpath(executable), os.path.realpath(lines[0]), (major, minor))


def find_interpreter(preferred: str | None = None) -> Interpreter | None:
    """The first world-accessible Python >= 3.8: `preferred`, this process's base interpreter, system ones.

    World-accessible because root runs drop to an unprivileged uid before anything runs inside; an
    interpreter under `/root` (pyenv) would be unreachable there.
    """
    base = getattr(sys, "_base_executable", sys.executable)
    candidates = [preferred] if preferred else [base, "/usr/bin/python3", "/usr/local/bin/python3"]
    for candidate in candidates:
        if candidate and os.path.exists(candidate) and _world_accessible(candidate):
            found = _probe_interpreter(candidate)
            if found is not None:
                return found
    return None


def find_bwrap() -> str | None:
    found = shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
    return os.path.realpath(found) if found else None


def probe_tier(tier: Tier, interpreter: Interpreter | None) -> str | None:
    """Why `tier` is unusable here, or None when it works."""
    if interpreter is None:
        return "no world-accessible Python interpreter found (pass python=...)"
    if tier == "unsafe-process":
        return None
    if not seccomp.supported():
        return "seccomp filter has no syscall table for this architecture"
    if tier == "landlock":
        abi = inside.landlock_abi()
        if abi < MIN_LANDLOCK_ABI:
            return f"Landlock ABI {abi} < {MIN_LANDLOCK_ABI} (needs signal/abstract-socket scoping)"
        return None
    return _probe_bwrap(interpreter)


def _probe_bwrap(interpreter: Interpreter) -> str | None:

    path = find_bwrap()
    if path is None:
        return "bubblewrap (bwrap) is not installed"
    return _cached_bwrap_probe(path, interpreter)


@cache
def _cached_bwrap_probe(path: str, interpreter: Interpreter) -> str | None:
    from parley.sandbox.bwrap import bwrap_probe_argv
    from parley.sandbox.limits import Limits

    argv = bwrap_probe_argv(path, interpreter, Limits())
    drop = sandbox_ids() if os.geteuid() == 0 else None
    try:
        proc = subprocess.run(
            argv, capture_output=True, timeout=20, env=LAUNCHER_ENV, stdin=subprocess.DEVNULL, check=False,
            start_new_session=True, user=drop[0] if drop else None, group=drop[1] if drop else None,
            extra_groups=[] if drop else None,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap probe failed to start: {exc}"
    if proc.returncode != 0 or proc.stdout.strip() != b"ok":
        detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap probe failed (rc {proc.returncode}): {detail[-1] if detail else 'no output'}"
    return None


def sandbox_ids() -> tuple[int, int]:
    """A fresh unprivileged uid/gid for one sandbox (root callers only).

    One uid per sandbox makes RLIMIT_NPROC count only that sandbox's processes (it is ignored for root
    and counts every process of a shared uid), keeps sandboxes from signalling each other, and leaves no
    root-owned file (a planted setuid binary) anywhere.
    """
    uid = 100000 + int.from_bytes(os.urandom(4), "little") % 900000
    return uid, uid
