"""Tier (b): Landlock + seccomp + rlimits in a supervised child, for hosts without user namespaces.

Landlock is only as good as its path list (sandlock with `/etc` readable read `/etc/shadow` as root), so
the list is short: the system and interpreter trees read-only, `/dev/null` and the per-run work dir
read-write, nothing else (no `/etc`, `/home`, `/root`, `/proc`, `/run`). TCP is denied by Landlock (ABI 4)
and every non-unix socket by seccomp (Landlock does not cover UDP); signals and abstract unix sockets are
scoped to the sandbox (ABI 6). Root callers drop to a fresh uid in the child. The supervisor process stays
outside the restrictions as a child subreaper so it can kill daemons that `setsid` away.

Known gaps against tier (a), by construction: the host's `/proc` listing and hostname stay visible
(without namespaces there is nothing to hide them with), and the work dir is a host directory bounded
per file (RLIMIT_FSIZE) rather than by a sized tmpfs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from parley.sandbox import inside
from parley.sandbox.detect import Interpreter

READ_ONLY_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache")
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")


def make_workdir(drop: tuple[int, int] | None) -> str:
    """A fresh 0700 work dir owned by the sandbox uid (so nothing in it is ever root-owned)."""
    path = tempfile.mkdtemp(prefix="parley-sbx-")
    if drop is not None:
        os.chown(path, drop[0], drop[1])
    return path


def remove_workdir(path: str) -> None:
    """Delete a work dir written by untrusted code (rmtree never follows symlinks out of it)."""
    shutil.rmtree(path, ignore_errors=True)


def landlock_rules(interpreter: Interpreter, workdir: str, abi: int) -> dict[str, Any]:
    """The request's `landlock` section: read-only and read-write path lists plus the ABI to target."""
    read = [p for p in READ_ONLY_SYSTEM if os.path.exists(p)]
    for extra in (interpreter.prefix, os.path.dirname(interpreter.executable)):
        if extra not in read and not extra.startswith("/usr/"):
            read.append(extra)
    return {"read": read, "write": [workdir, *WRITABLE_DEVICES], "abi": abi}


def sandbox_env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "LC_CTYPE": "C.UTF-8", "PWD": workdir, "TMPDIR": workdir}


def landlock_abi() -> int:
    """The running kernel's Landlock ABI (0 when unavailable)."""
    return inside.landlock_abi()
