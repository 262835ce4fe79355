"""The bubblewrap command line: the tier-(a) policy, spelled out flag by flag.

bubblewrap is a toolkit, not a policy: the protection is exactly what these arguments say (its own
SECURITY.md). Every flag below answers an observed attack from sandbox.md:

* `--unshare-all --unshare-user --disable-userns`: no network (netns with only `lo`), private pid/ipc/uts
  namespaces, and no nested user namespace (`unshare(CLONE_NEWUSER)` gets ENOSPC);
* `--die-with-parent` + the pid namespace: killing bwrap kills every sandbox process, daemons included;
* `--new-session`: no TIOCSTI into the caller's terminal (CVE-2017-5226; seccomp denies it as well);
* `--clearenv` + a scrubbed environment for bwrap itself (bwrap's pid 1 keeps bwrap's environment, so
  `--clearenv` alone leaks host secrets through `/proc/1/environ`);
* `--uid/--gid 65534`, `--cap-drop ALL`, `--hostname sandbox`;
* read-only `/usr` (+ the interpreter prefix), no `/etc`, `/home`, `/root`, `/run` or sockets at all;
* `--size N --tmpfs` for `/tmp` and the `/scratch` work dir (a plain `--tmpfs` took 900 MiB);
* `--seccomp FD` with the deny-list from `parley.sandbox.seccomp`.

Code and the request travel as `--ro-bind-data` files from memfds, never on the command line.
"""

from __future__ import annotations

import os

from parley.sandbox.detect import Interpreter
from parley.sandbox.limits import Limits, MiB

WORKDIR = "/scratch"
CONTROL_DIR = "/.parley"
INSIDE_PATH = f"{CONTROL_DIR}/inside.py"
REQUEST_PATH = f"{CONTROL_DIR}/request.json"
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "HOME": WORKDIR, "LC_CTYPE": "C.UTF-8", "PWD": WORKDIR}


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def base_argv(bwrap: str, interpreter: Interpreter, limits: Limits) -> list[str]:
    """Everything but the control files, seccomp and the command."""
    args = [
        bwrap,
        "--unshare-all", "--unshare-user", "--disable-userns",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
        "--clearenv",
    ]
    for key, value in SANDBOX_ENV.items():
        args += ["--setenv", key, value]
    args += _system_binds()
    if not (interpreter.prefix == "/usr" or interpreter.prefix.startswith("/usr/")):
        args += ["--ro-bind", interpreter.prefix, interpreter.prefix]
    if not interpreter.executable.startswith(("/usr/", interpreter.prefix + "/")):
        args += ["--ro-bind", interpreter.executable, interpreter.executable]
    size = str(limits.tmpfs_mb * MiB)
    args += [
        "--proc", "/proc", "--dev", "/dev",
        "--size", size, "--perms", "1777", "--tmpfs", "/tmp",
        "--size", size, "--perms", "0700", "--tmpfs", WORKDIR,
        "--chdir", WORKDIR,
    ]
    return args


def run_argv(bwrap: str, interpreter: Interpreter, limits: Limits, *, inside_fd: int, request_fd: int,
             seccomp_fd: int, result_fd: int) -> list[str]:
    """The full command line of one run (the fds are memfds/pipes passed with `pass_fds`)."""
    return [
        *base_argv(bwrap, interpreter, limits),
        "--ro-bind-data", str(inside_fd), INSIDE_PATH,
        "--ro-bind-data", str(request_fd), REQUEST_PATH,
        "--seccomp", str(seccomp_fd),
        "--", interpreter.executable, "-I", "-S", INSIDE_PATH, "bwrap", REQUEST_PATH, str(result_fd),
    ]


def bwrap_probe_argv(bwrap: str, interpreter: Interpreter, limits: Limits) -> list[str]:
    """A sandbox with the real policy (minus seccomp) that prints `ok`: proves userns and mounts work."""
    return [*base_argv(bwrap, interpreter, limits), "--", interpreter.executable, "-I", "-S", "-c", "print('ok')"]
