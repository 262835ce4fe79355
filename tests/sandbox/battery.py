"""The sandbox attack battery (reference/sandbox.md §4), as a harness that records observations.

Run as a script (`python battery.py TIER OUT.json`) it sets up the host fixtures — an env canary, a
world-readable canary file and fake credentials outside the work dir, loopback TCP (v4, v6), UDP and
abstract-unix listeners — runs every probe in sandboxes of TIER and writes one observation per case.
`test_battery.py` runs it as root and as uid 65534 (via setpriv, with the system Python and a copy of
the stdlib-only `parley.sandbox`), then asserts each case on its own.

Network rule: probes only ever address listeners opened here on 127.0.0.1 / [::1]; egress is proven
by routes, interfaces and denied socket families, never by sending anywhere else.

Cheap probes share one sandbox run (each still reported and asserted separately); probes that kill,
flood or exhaust get their own run.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import threading
import time
from typing import Any

from parley.sandbox import ExecResult, Limits, Sandbox

ENV_CANARY = "hunter2-canary"
FILE_CANARY = "hunter2-canary-file"
WALL_S = 5.0
LIMITS = Limits(timeout_s=WALL_S, memory_mb=512, cpu_s=3, file_size_mb=16, open_files=64, processes=64,
                tmpfs_mb=64, output_bytes=64 * 1024)

PRELUDE = r'''
import ctypes, errno, json, os, socket, stat, subprocess, sys, time
R = {}
def probe(name, fn):
    try:
        R[name] = {"ok": True, "v": fn()}
    except BaseException as e:
        R[name] = {"ok": False, "exc": type(e).__name__, "errno": getattr(e, "errno", None), "msg": str(e)[:300]}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sysc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
def read(path, n=65536):
    with open(path, "rb") as f:
        return f.read(n).decode("latin-1")
def write(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)
    return True
def result_fd():
    for fd in range(3, 1024):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                return fd
        except OSError:
            pass
def nonce():
    f = sys._getframe()
    while f is not None:
        if "request" in f.f_locals:
            return f.f_locals["request"]["nonce"]
        f = f.f_back
def _isopen(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
def emit(raw):
    fd = result_fd()
    os.write(fd, raw)
    os._exit(0)
CTX = json.loads(%r)
'''

CHEAP = r'''
probe("A1", lambda: read("/etc/shadow"))
probe("A2_canary_file", lambda: read(CTX["canary_file"]))
probe("A2_ssh_key", lambda: read(CTX["fake_home"] + "/.ssh/id_rsa"))
probe("A2_aws_credentials", lambda: read(CTX["fake_home"] + "/.aws/credentials"))
probe("A3", lambda: dict(os.environ))
probe("A4", lambda: read("/proc/1/environ"))
probe("A5_proc_listing", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
probe("A5_parent_environ", lambda: read("/proc/%d/environ" % os.getppid()))
probe("A5_host_cmdline", lambda: read("/proc/%d/cmdline" % CTX["harness_pid"]))
probe("A6", lambda: [fd for fd in range(1024) if _isopen(fd)])
probe("A8_hostname", lambda: socket.gethostname())
probe("A8_mountinfo", lambda: read("/proc/self/mountinfo"))
probe("B1", lambda: write("/usr/pwned"))
probe("B2", lambda: write("/pwned-" + CTX["tag"]))
probe("B3", lambda: write("../../etc/parley-pwned-" + CTX["tag"]))
def b7():
    os.link("/usr/bin/python3", "py-hardlink")
    return True
probe("B7", b7)
def b8():
    import shutil
    shutil.copy("/usr/bin/id", "id-copy")
    os.chmod("id-copy", 0o4755)
    st = os.stat("id-copy")
    out = subprocess.run(["./id-copy", "-u"], capture_output=True, text=True).stdout.strip()
    return {"st_uid": st.st_uid, "mode": oct(st.st_mode), "euid_when_run": out, "my_uid": os.getuid()}
probe("B8", b8)
def b9():
    written, err = 0, None
    for i in range(60):
        try:
            with open("/tmp/fill-%d" % i, "wb") as f:
                f.write(b"\0" * (15 << 20))
            written += 1
        except OSError as e:
            err = e.errno
            break
    for i in range(written + 1):
        try:
            os.unlink("/tmp/fill-%d" % i)
        except OSError:
            pass
    return {"written": written, "errno": err}
probe("B9", b9)
probe("B13", lambda: os.mknod("blockdev", stat.S_IFBLK | 0o600, os.makedev(8, 0)))
def c_tcp(host, port, family):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(1)
    s.connect((host, port))
    return "connected"
probe("C1", lambda: c_tcp("127.0.0.1", CTX["tcp_port"], socket.AF_INET))
def c2():
    out = {}
    for name in ("route", "dev", "ipv6_route"):
        try:
            out[name] = read("/proc/net/" + name)
        except OSError as e:
            out[name] = "ERR:" + type(e).__name__
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        out["inet_socket"] = "created"
    except OSError as e:
        out["inet_socket"] = "ERR:%s" % e.errno
    return out
probe("C2", c2)
def c3():
    out = {}
    try:
        out["resolv_conf"] = read("/etc/resolv.conf")
    except OSError as e:
        out["resolv_conf"] = "ERR:" + type(e).__name__
    for fam in ("AF_INET", "AF_INET6"):
        try:
            socket.socket(getattr(socket, fam), socket.SOCK_DGRAM)
            out[fam] = "created"
        except OSError as e:
            out[fam] = "ERR:%s" % e.errno
    return out
probe("C3", c3)
def c4():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"udp-probe", ("127.0.0.1", CTX["udp_port"]))
    return "sent"
probe("C4", c4)
def c5():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    s.connect("\0" + CTX["abstract_name"])
    return "connected"
probe("C5", c5)
probe("C6_docker_sock", lambda: socket.socket(socket.AF_UNIX).connect("/var/run/docker.sock"))
probe("C6_dbus_system", lambda: socket.socket(socket.AF_UNIX).connect("/run/dbus/system_bus_socket"))
probe("C6_nscd", lambda: socket.socket(socket.AF_UNIX).connect("/run/nscd/socket"))
probe("C7", c2)
probe("C8_packet", lambda: socket.socket(17, socket.SOCK_RAW, 0x0300))
probe("C8_netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
probe("C9", lambda: c_tcp("::1", CTX["tcp6_port"], socket.AF_INET6))
def d2():
    import threading
    started, err = 0, None
    threads = []
    for _ in range(500):
        t = threading.Thread(target=time.sleep, args=(0.3,))
        try:
            t.start()
        except RuntimeError as e:
            err = str(e)
            break
        threads.append(t)
        started += 1
    for t in threads:
        t.join()
    return {"started": started, "error": err}
probe("D2", d2)
probe("D3", lambda: len(bytearray(4 << 30)))
def d4():
    import mmap
    m = mmap.mmap(-1, 8 << 30)
    for off in range(0, 8 << 30, 1 << 20):
        m[off] = 1
    return "touched"
probe("D4", d4)
def d9():
    fds, err = [], None
    try:
        for _ in range(10000):
            fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        err = e.errno
    for fd in fds:
        os.close(fd)
    return {"opened": len(fds), "errno": err}
probe("D9", d9)
import resource
probe("D14_core_limit", lambda: resource.getrlimit(resource.RLIMIT_CORE))
probe("E1", lambda: os.kill(CTX["harness_pid"], 9))
probe("E3_pid1", lambda: sysc(101, 16, 1, 0, 0))
probe("E3_ppid", lambda: sysc(101, 16, os.getppid(), 0, 0))
def e4():
    buf = ctypes.create_string_buffer(64)
    local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 64)
    remote = (ctypes.c_void_p * 2)(0x400000, 64)
    return sysc(310, 1, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
probe("E4", e4)
probe("E5", lambda: sysc(272, 0x10000000))
probe("E6_io_uring", lambda: sysc(425, 1, ctypes.addressof(ctypes.create_string_buffer(120))))
probe("E6_bpf", lambda: sysc(321, 0, 0, 0))
probe("E6_perf_event_open", lambda: sysc(298, ctypes.addressof(ctypes.create_string_buffer(128)), 0, -1, -1, 0))
probe("E6_userfaultfd", lambda: sysc(323, 0))
probe("E6_keyctl", lambda: sysc(250, 0, -3, 0))
def e7():
    import fcntl, termios
    return fcntl.ioctl(0, termios.TIOCSTI, b"x")
probe("E7", e7)
def e8():
    p = subprocess.run(["/usr/bin/su", "-c", "id -u"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                       timeout=3)
    return {"rc": p.returncode, "out": p.stdout[-200:], "err": p.stderr[-200:]}
probe("E8", e8)
probe("E9_subprocess", lambda: subprocess.run(["/usr/bin/id", "-u"], capture_output=True, text=True).stdout.strip())
def e9b():
    r, w = os.pipe()
    saved = os.dup(1)
    os.dup2(w, 1)
    try:
        libc.system(b"id -u")
    finally:
        os.dup2(saved, 1)
        os.close(w)
    return os.read(r, 100).decode().strip()
probe("E9_ctypes_system", e9b)
probe("E10", lambda: sorted(os.listdir("/dev")))
probe("E11_proc_sys", lambda: write("/proc/sys/kernel/core_pattern", b"|/tmp/x"))
probe("E11_sys", lambda: write("/sys/fs/cgroup/pids.max", b"max"))
probe("E12_mount", lambda: sysc(165, ctypes.addressof(ctypes.create_string_buffer(b"none")),
                                 ctypes.addressof(ctypes.create_string_buffer(b"/tmp")),
                                 ctypes.addressof(ctypes.create_string_buffer(b"tmpfs")), 0, 0))
probe("E12_chroot", lambda: os.chroot("/tmp"))
probe("E12_pivot_root", lambda: sysc(155, ctypes.addressof(ctypes.create_string_buffer(b".")),
                                      ctypes.addressof(ctypes.create_string_buffer(b"."))))
'''

# H: language escapes. Each obtains its primitive and uses it to go for the canaries: the OS must hold.
LANGUAGE_ESCAPES = r'''
def steal(opener, getenv):
    out = {}
    try:
        out["file"] = opener(CTX["canary_file"]).read()
    except BaseException as e:
        out["file"] = "ERR:" + type(e).__name__
    try:
        out["env"] = getenv("SBX_TEST_SECRET")
    except BaseException as e:
        out["env"] = "ERR:" + type(e).__name__
    return out
def h1():
    popen = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "Popen"][0]
    p = popen(["/usr/bin/cat", CTX["canary_file"]], stdout=-1, stderr=-1)
    out, err = p.communicate()
    return {"stdout": out.decode("latin-1"), "rc": p.returncode}
probe("H1", h1)
def h2():
    try:
        raise ValueError
    except ValueError as e:
        b = e.__traceback__.tb_frame.f_globals["__builtins__"]
    b = b if isinstance(b, dict) else vars(b)
    return steal(b["open"], b["__import__"]("os").environ.get)
probe("H2", h2)
def h3():
    import warnings
    b = warnings.catch_warnings()._module.__builtins__
    return steal(b["open"], b["__import__"]("os").environ.get)
probe("H3", h3)
def h4():
    import importlib.machinery
    os_ = importlib.machinery.BuiltinImporter().load_module("posix")
    return steal(lambda p: open(os_.open(p, 0), closefd=True), lambda k: os_.environ.get(k.encode()))
probe("H4", h4)
def h5():
    import random
    return steal(open, random._os.environ.get)
probe("H5", h5)
def h6():
    import importlib
    sp = importlib.import_module("subprocess")
    return {"stdout": sp.run(["/usr/bin/cat", CTX["canary_file"]], capture_output=True).stdout.decode("latin-1")}
probe("H6", h6)
probe("H7", lambda: steal(getattr(getattr((), "__class__"), "__base__").__subclasses__ and open, os.environ.get))
def h8():
    b = (lambda: 0).__getattribute__("__globals__")["__builtins__"]
    return steal((b if isinstance(b, dict) else vars(b))["open"], os.getenv)
probe("H8", h8)
probe("H9", lambda: {"fmt": "{0.__class__}".format(1), **steal(open, os.getenv)})
def h10():
    def gen():
        yield 1
    g = gen()
    frame = g.gi_frame
    b = sys._getframe().f_globals["__builtins__"]
    return {"frame": type(frame).__name__, **steal((b if isinstance(b, dict) else vars(b))["open"], os.getenv)}
probe("H10", h10)
def h11():
    ns = {}
    exec("try:\n    raise ExceptionGroup('g', [OSError('x')])\nexcept* OSError as eg:\n    caught = eg\n", ns)
    return {"caught": type(ns["caught"]).__name__, **steal(open, os.getenv)}
probe("H11", h11)
def h12():
    class Sneaky:
        def __enter__(self):
            return __import__("os")
        def __exit__(self, *a):
            return False
        def __iadd__(self, other):
            return __import__("subprocess")
    with Sneaky() as os_:
        s = Sneaky()
        s += 1
        return {"sub": s.__name__, **steal(open, os_.getenv)}
probe("H12", h12)
def h13():
    import ctypes as c
    buf = c.create_string_buffer(256)
    lc = c.CDLL(None)
    fd = lc.open(CTX["canary_file"].encode(), 0)
    n = lc.read(fd, buf, 255) if fd >= 0 else -1
    return {"fd": fd, "read": buf.value.decode("latin-1") if n > 0 else "", "env": (lc.getenv(b"SBX_TEST_SECRET") or 0)}
probe("H13", h13)
'''


def summarize(result: ExecResult) -> dict[str, Any]:
    """The JSON-able parts of an ExecResult a check may look at."""
    return {
        "exit_code": result.exit_code, "timed_out": result.timed_out, "limit": result.limit,
        "duration_s": round(result.duration_s, 3), "stdout": result.stdout[-4000:], "stderr": result.stderr[-4000:],
        "stdout_len": len(result.stdout), "stderr_len": len(result.stderr),
        "stdout_truncated": result.stdout_truncated, "stderr_truncated": result.stderr_truncated,
        "value": result.value, "value_repr": result.value_repr, "error": result.error,
        "result_error": result.result_error, "files": {k: v.decode("latin-1") for k, v in result.files.items()},
        "file_errors": result.file_errors,
    }


class Listeners:
    """Loopback listeners that count what reaches them (nothing should)."""

    def __init__(self, abstract_name: str) -> None:
        self.counts = {"tcp": 0, "tcp6": 0, "udp": 0, "abstract": 0}
        self.tcp = self._stream(socket.AF_INET, ("127.0.0.1", 0), "tcp")
        self.tcp6 = self._stream(socket.AF_INET6, ("::1", 0), "tcp6")
        self.abstract = self._stream(socket.AF_UNIX, "\0" + abstract_name, "abstract")
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        threading.Thread(target=self._recv_udp, daemon=True).start()

    def _stream(self, family: int, address: Any, key: str) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind(address)
        sock.listen(16)
        threading.Thread(target=self._accept, args=(sock, key), daemon=True).start()
        return sock

    def _accept(self, sock: socket.socket, key: str) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self.counts[key] += 1
            conn.close()

    def _recv_udp(self) -> None:
        while True:
            try:
                self.udp.recv(4096)
            except OSError:
                return
            self.counts["udp"] += 1


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (via /proc/*/stat parent links)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    parents[int(entry)] = int(fields[1])
            except (OSError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent:
                found.append(child)
                frontier.append(child)
    return found


def processes_with(marker: str) -> list[int]:
    hits = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        hits.append(int(entry))
            except OSError:
                continue
    return hits


class Battery:
    def __init__(self, tier: str) -> None:
        self.tier = tier
        self.tag = os.urandom(4).hex()
        self.base = tempfile.mkdtemp(prefix="parley-canary-")
        os.chmod(self.base, 0o755)
        self.canary_file = os.path.join(self.base, "secret.txt")
        self.fake_home = os.path.join(self.base, "home")
        self.marker = os.path.join(self.base, "host-marker")
        for path in (self.canary_file, f"{self.fake_home}/.ssh/id_rsa", f"{self.fake_home}/.aws/credentials"):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.chmod(os.path.dirname(path), 0o755)
            with open(path, "w") as handle:
                handle.write(FILE_CANARY)
            os.chmod(path, 0o644)
        os.environ["SBX_TEST_SECRET"] = ENV_CANARY
        self.listeners = Listeners(f"sbx-abstract-canary-{self.tag}")
        self.sandbox = Sandbox.detect(tier=tier, limits=LIMITS)  # type: ignore[arg-type]
        self.obs: dict[str, Any] = {}
        self.ctx = {
            "canary_file": self.canary_file, "fake_home": self.fake_home, "harness_pid": os.getpid(),
            "tag": self.tag, "tcp_port": self.listeners.tcp.getsockname()[1],
            "tcp6_port": self.listeners.tcp6.getsockname()[1], "udp_port": self.listeners.udp.getsockname()[1],
            "abstract_name": f"sbx-abstract-canary-{self.tag}", "marker": self.marker,
        }

    def code(self, body: str) -> str:
        return PRELUDE % json.dumps(self.ctx) + body

    def record(self, case: str, result: ExecResult, **extra: Any) -> None:
        self.obs[case] = {"run": summarize(result), **extra}

    async def run(self, body: str, **kwargs: Any) -> ExecResult:
        return await self.sandbox.run_python(self.code(body), **kwargs)

    # --- groups ------------------------------------------------------------------------------------------

    async def cheap(self) -> None:
        result = await self.run(CHEAP + "\nR\n")
        probes = result.value if isinstance(result.value, dict) else {}
        for case, value in probes.items():
            self.obs[case] = {"probe": value, "run": summarize(result),
                              "host_paths": {p: os.path.exists(p) for p in
                                             ("/usr/pwned", f"/pwned-{self.tag}", f"/etc/parley-pwned-{self.tag}")}}
        self.obs["_cheap_run"] = summarize(result)

    async def escapes(self) -> None:
        result = await self.run(LANGUAGE_ESCAPES + "\nR\n")
        for case, value in (result.value or {}).items():
            self.obs[case] = {"probe": value, "run": summarize(result)}
        self.obs["_escape_run"] = summarize(result)

    async def artifacts(self) -> None:
        body = r'''
os.symlink("/etc/shadow", "abs-link.txt")
os.symlink(CTX["canary_file"], "canary-link.txt")
os.symlink("/proc/self/root/etc/shadow", "proc-root-link.txt")
os.symlink("/", "dir-link")
os.mkfifo("fifo.txt")
write("plain.txt", b"plain")
'''
        started = time.monotonic()
        result = await self.run(body, collect=["abs-link.txt", "canary-link.txt", "proc-root-link.txt",
                                                "dir-link/etc/shadow", "fifo.txt", "plain.txt"])
        artifacts = {"B4_absolute": "abs-link.txt", "B4_canary": "canary-link.txt",
                     "B4_proc_root": "proc-root-link.txt", "B4_dir_link": "dir-link/etc/shadow", "B6": "fifo.txt"}
        for case, name in artifacts.items():
            self.record(case, result, elapsed_s=time.monotonic() - started, artifact=name)

    async def single(self, case: str, body: str, **kwargs: Any) -> None:
        started = time.monotonic()
        result = await self.run(body, **kwargs)
        self.record(case, result, elapsed_s=time.monotonic() - started,
                    marker_exists=os.path.exists(self.marker))

    async def a7_ps(self) -> None:
        secret = f"A7-CODE-MARKER-{self.tag}"
        task = asyncio.ensure_future(self.run(f"# {secret}\ntime.sleep(1.0)\n"))
        await asyncio.sleep(0.6)
        visible = processes_with(secret)
        self.record("A7", await task, visible=visible)

    async def a9_other_sandbox(self) -> None:
        first = asyncio.ensure_future(self.run(
            "write('other-secret.txt', b'A9-SECRET')\nprint(os.getcwd(), flush=True)\ntime.sleep(1.5)\n"))
        await asyncio.sleep(0.5)
        second = await self.run(r'''
import glob
found = {}
for pattern in ("/tmp/*/other-secret.txt", "/scratch/other-secret.txt", "/proc/*/root/scratch/other-secret.txt",
                "/proc/*/cwd/other-secret.txt"):
    for path in glob.glob(pattern):
        try:
            found[path] = read(path)
        except OSError as e:
            found[path] = "ERR:" + type(e).__name__
found
''')
        self.record("A9", second, first=summarize(await first))

    async def b10_b12(self) -> None:
        await self.single("B10", r'''
written, err = 0, None
for i in range(100):
    try:
        write("fill-%d" % i, b"\0" * (1 << 20))
        written += 1
    except OSError as e:
        err = e.errno
        break
{"written": written, "errno": err, "cwd": os.getcwd()}
''')
        cwd = (self.obs["B10"]["run"]["value"] or {}).get("cwd")
        self.obs["B10"]["workdir_left"] = bool(cwd and cwd != "/scratch" and os.path.exists(cwd))
        await self.single("B12", r'''
print(os.getcwd(), flush=True)
n = 0
try:
    for n in range(1000000):
        os.close(os.open("e%d" % n, os.O_CREAT | os.O_WRONLY, 0o600))
except OSError as e:
    print("stopped", n, e.errno)
''', timeout_s=2.0)
        cwd = self.obs["B12"]["run"]["stdout"].split("\n")[0]
        self.obs["B12"]["workdir_left"] = bool(cwd.startswith("/") and cwd != "/scratch" and os.path.exists(cwd))

    async def d10_daemon(self) -> None:
        marker = f"41.{int.from_bytes(os.urandom(3), 'little')}"
        await self.single("D10", f'''
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/sleep", ["/usr/bin/sleep", "{marker}"])
    os._exit(0)
os.waitpid(pid, 0)
time.sleep(0.2)
"daemon started"
''')
        await asyncio.sleep(0.3)
        self.obs["D10"]["survivors"] = processes_with(marker)

    def d11_runtime_killed(self) -> None:
        import signal
        import subprocess

        marker = f"42.{int.from_bytes(os.urandom(3), 'little')}"
        script = (
            "import sys\nfrom parley.sandbox import Sandbox\n"
            f"Sandbox.detect(tier={self.tier!r}).run_sync(['/usr/bin/sleep', '{marker}'], timeout_s=30)\n"
        )
        child = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ))
        deadline = time.monotonic() + 10
        while not processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = processes_with(marker)
        child.send_signal(signal.SIGKILL)
        child.wait()
        time.sleep(1.0)
        self.obs["D11"] = {"seen_before": seen, "survivors": processes_with(marker)}

    async def d13_many(self) -> None:
        body = r'''
kids, err = 0, None
for _ in range(300):
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        kids += 1
    except OSError as e:
        err = e.errno
        break
print("forks", kids, err, flush=True)
while True:
    pass
'''
        lags: list[float] = []

        async def heartbeat(stop: asyncio.Event) -> None:
            while not stop.is_set():
                before = time.monotonic()
                await asyncio.sleep(0.05)
                lags.append(time.monotonic() - before - 0.05)

        stop = asyncio.Event()
        beat = asyncio.ensure_future(heartbeat(stop))
        limits = LIMITS.with_overrides(cpu_s=1, timeout_s=4.0)
        results = await asyncio.gather(*(self.run(body, limits=limits) for _ in range(6)))
        stop.set()
        await beat
        forks = [int(r.stdout.split()[1]) if r.stdout.startswith("forks") else -1 for r in results]
        lags.sort()
        self.obs["D13"] = {"forks": forks, "max_lag_s": lags[-1], "p90_lag_s": lags[int(len(lags) * 0.9)],
                           "limits": [r.limit for r in results],
                           "durations": [r.duration_s for r in results]}

    async def all(self) -> dict[str, Any]:
        t0 = time.monotonic()
        await asyncio.gather(self.cheap(), self.escapes(), self.artifacts(), self.a7_ps(), self.a9_other_sandbox())
        run = self.single
        channel = [
            ("E2", "os.kill(-1, 9)\n'survived'\n", {}),
            ("E13", "for fd in range(3, 1024):\n    try:\n        os.write(fd, b'garbage\\x00{]')\n"
                    "    except OSError:\n        pass\n", {}),
            ("F1_pickle", "import pickle\nclass P:\n    def __reduce__(self):\n"
                          "        return (os.system, ('touch ' + CTX['marker'],))\nemit(pickle.dumps(P()))\n", {}),
            ("F1_prefixed", "emit(b'pickle:' + __import__('base64').b64encode(b'cos\\nsystem\\n'))\n", {}),
            ("F2", "fd = result_fd()\nchunk = b'[' * (1 << 20)\nwhile True:\n    os.write(fd, chunk)\n", {}),
            ("F3_truncated", "emit(('{\"nonce\": \"%s\", \"ok\": true, \"value\": [1, 2' % nonce()).encode())\n", {}),
            ("F3_invalid_utf8", "emit(b'{\"nonce\": \"' + nonce().encode() + b'\", \"value\": \"\\xff\\xfe\"}')\n", {}),
            ("F3_lone_surrogate", "emit(('{\"nonce\": \"%s\", \"ok\": true, \"value\": \"a\\\\ud800b\"}' % nonce())"
                                  ".encode())\n", {}),
            ("F4", "emit(b'[' * 100000 + b']' * 100000)\n", {}),
            ("F5_nan", "emit(('{\"nonce\": \"%s\", \"value\": NaN}' % nonce()).encode())\n", {}),
            ("F5_infinity", "emit(('{\"nonce\": \"%s\", \"value\": Infinity}' % nonce()).encode())\n", {}),
            ("F5_overflow", "emit(('{\"nonce\": \"%s\", \"value\": 1e999}' % nonce()).encode())\n", {}),
            ("F6", "emit(('{\"nonce\": \"%s\", \"value\": %s}' % (nonce(), '7' * 5000)).encode())\n", {}),
            ("F7_stdout_forgery", "print(json.dumps({'nonce': nonce(), 'ok': True, 'value': 'forged'}))\n"
                                  "print('<<END-OF-RESULT>>')\n'genuine'\n", {}),
            ("F7_wrong_nonce", "emit(b'{\"nonce\": \"0000\", \"ok\": true, \"value\": \"forged\"}')\n", {}),
            ("F8_ansi_flood", "raise RuntimeError('\\x1b[2J' + 'A' * 10_000_000)\n", {}),
            ("F8_credentials", "raise ConnectionError('failed https://user:s3cr3t-f8@example.invalid/x')\n", {}),
            ("F9", "time.sleep(2.5)\nemit(('{\"nonce\": \"%s\", \"ok\": true, \"value\": \"late\"}' % nonce())"
                   ".encode())\n", {"timeout_s": 1.5}),
            ("D1", "kids, err = 0, None\nfor _ in range(300):\n    try:\n        if os.fork() == 0:\n"
                   "            time.sleep(3)\n            os._exit(0)\n        kids += 1\n    except OSError as e:\n"
                   "        err = e.errno\n        break\n{'kids': kids, 'errno': err}\n", {}),
            # A long wall limit so that RLIMIT_CPU (1 s) fires first even on a busy shared machine.
            ("D5", "while True:\n    pass\n", {"limits": LIMITS.with_overrides(cpu_s=1, timeout_s=10.0)}),
            ("D6_sleep", "time.sleep(1000)\n", {"timeout_s": 1.5}),
            ("D6_input", "input()\n", {"timeout_s": 3.0}),
            ("D7", "while True:\n    print('A' * 100)\n", {}),
            ("D8_stderr", "while True:\n    sys.stderr.write('E' * 4096)\n", {}),
            ("D8_invalid_utf8", "sys.stdout.buffer.write(b'ok \\xff\\xfe\\xc3 done\\n' * 10)\n", {}),
            ("D12_bigint", "x = 10 ** (10 ** 8)\n", {"limits": LIMITS.with_overrides(cpu_s=1, timeout_s=3.0)}),
            ("D12_regex", "import re\nre.match('(a+)+$', 'a' * 40 + 'b')\n",
             {"limits": LIMITS.with_overrides(cpu_s=1, timeout_s=3.0)}),
            ("D14", "os.abort()\n", {}),
            ("B11", "with open('big.bin', 'wb') as f:\n    for _ in range(1024):\n"
                    "        f.write(b'\\0' * (1 << 20))\n", {}),
        ]
        cpu_timed = ("D5", "D12_bigint", "D12_regex")
        sem = asyncio.Semaphore(4)

        async def limited(case: str, body: str, kwargs: dict[str, Any]) -> None:
            async with sem:
                await run(case, body, **kwargs)

        await asyncio.gather(*(limited(*c) for c in channel if c[0] not in cpu_timed))
        for case, body, kwargs in channel:
            if case in cpu_timed:
                await run(case, body, **kwargs)
        await self.b10_b12()
        await self.d10_daemon()
        self.d11_runtime_killed()
        await self.d13_many()
        await asyncio.sleep(0.3)
        self.obs["_meta"] = {"leftover": descendants(os.getpid()), "tier": self.tier, "euid": os.geteuid(),
                             "elapsed_s": time.monotonic() - t0,
                             "listeners": dict(self.listeners.counts), "marker_exists": os.path.exists(self.marker),
                             "harness_pid": os.getpid(), "host_hostname": socket.gethostname(),
                             "canary_file": self.canary_file}
        return self.obs


def main() -> None:
    tier, out = sys.argv[1], sys.argv[2]
    obs = asyncio.run(Battery(tier).all())
    with open(out, "w") as handle:
        json.dump(obs, handle, default=str)


if __name__ == "__main__":
    main()
