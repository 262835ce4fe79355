"""The attack battery of reference/sandbox.md §4 (rows A–F and the H language escapes), one test per case.

Each case is asserted for both OS tiers (bwrap = T2, landlock = T1 where the reference names a T1
outcome) and for two callers: root (CI) and uid 65534 (via setpriv, with the system Python and a copy of
the stdlib-only `parley.sandbox`). Observations come from `battery.py`, run once per (tier, caller) in a
subprocess. Beyond its own expectation, every case asserts the common containment rules: no canary in
anything that came back, no sandbox process left behind, the run inside its wall limit, the host alive.
Row G (arguments from JSON) is covered where the sandbox takes them: `test_sandbox_api.py` (argv, file
names, sizes), `test_artifacts.py` (paths, symlinks, the B5 race) and `test_result_channel.py` (strict JSON).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from parley.sandbox import Sandbox
from parley.sandbox.detect import find_interpreter
from tests.conftest import REPO_ROOT

HERE = Path(__file__).resolve().parent
# The uid-65534 harness needs a Python it can reach (the venv's may live under /root): the sandbox's own.
_INTERPRETER = find_interpreter()
SYSTEM_PYTHON = _INTERPRETER.executable if _INTERPRETER else "/usr/bin/python3"
CANARIES = ("hunter2-canary", "A9-SECRET")
TIERS = ["bwrap", "landlock"]
CALLERS = ["root", "uid65534"]

Check = Callable[[dict[str, Any], str, dict[str, Any]], None]
CHECKS: dict[str, Check] = {}


def case(*names: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        for name in names:
            CHECKS[name] = check
        return check

    return register


# --- running the harness ----------------------------------------------------------------------------------

_cache: dict[tuple[str, str], dict[str, Any]] = {}


def _skip_reason(tier: str, caller: str) -> str | None:
    if os.geteuid() != 0:
        return "the battery's callers (root, uid 65534) need the tests to start as root"
    reason = Sandbox.probe().get(tier)
    if reason:
        return f"tier {tier} unavailable here: {reason}"
    if caller == "uid65534" and (shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON)):
        return "setpriv or a world-readable Python is missing (needed to run the battery as uid 65534)"
    return None


def _unprivileged_tree() -> str:
    """A world-readable copy of what the uid-65534 harness imports: parley._root, parley.sandbox, battery."""
    root = tempfile.mkdtemp(prefix="parley-battery-")
    package = Path(root, "parley")
    (package / "sandbox").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(REPO_ROOT / "sdk" / "_root.py", package / "_root.py")
    for source in (REPO_ROOT / "sandbox").glob("*.py"):
        shutil.copy(source, package / "sandbox" / source.name)
    shutil.copy(HERE / "battery.py", Path(root) / "battery.py")
    for dirpath, _, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return root


_running: dict[tuple[str, str], tuple[subprocess.Popen[str], str, str]] = {}


def _start(tier: str, caller: str) -> None:
    outdir = tempfile.mkdtemp(prefix="parley-battery-out-")
    os.chmod(outdir, 0o1777)
    out = os.path.join(outdir, "obs.json")
    env = {"PATH": "/usr/bin:/bin"}
    if caller == "root":
        argv = [sys.executable, str(HERE / "battery.py"), tier, out]
    else:
        tree = _unprivileged_tree()
        env["PYTHONPATH"] = tree
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON,
                os.path.join(tree, "battery.py"), tier, out]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    _running[(tier, caller)] = (proc, out, outdir)


def observations(tier: str, caller: str) -> dict[str, Any]:
    """The harness's observations for (tier, caller). Both callers of a tier run concurrently (the battery
    is mostly waiting on kills and sleeps), which keeps the whole file well under two minutes."""
    key = (tier, caller)
    if key in _cache:
        return _cache[key]
    reason = _skip_reason(tier, caller)
    if reason:
        pytest.skip(reason)
    if key not in _running:
        for other in CALLERS:
            if (tier, other) not in _running and _skip_reason(tier, other) is None:
                _start(tier, other)
    proc, out, outdir = _running[key]
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"battery harness died (host not alive?): {output[-3000:]}"
    with open(out) as handle:
        _cache[key] = json.load(handle)
    shutil.rmtree(outdir, ignore_errors=True)
    return _cache[key]


# --- the common containment rules -------------------------------------------------------------------------


def _contained(obs: dict[str, Any], meta: dict[str, Any], name: str) -> None:
    dumped = json.dumps(obs)
    for canary in CANARIES:
        assert canary not in dumped, f"{name}: canary {canary!r} came back"
    assert meta["leftover"] == [], f"sandbox processes left behind: {meta['leftover']}"
    run = obs.get("run")
    if run is not None and name != "D5":  # D5 has its own, longer wall limit
        assert run["duration_s"] <= 5.0 + 3.0, f"{name}: ran {run['duration_s']} s, past the wall limit"
    assert meta["marker_exists"] is False, "a host marker file was created"
    assert all(v == 0 for v in meta["listeners"].values()), f"a host listener was reached: {meta['listeners']}"


def denied(obs: dict[str, Any], *excs: str, errnos: tuple[int, ...] = ()) -> None:
    probe = obs["probe"]
    assert probe["ok"] is False, f"expected a failure, got {probe}"
    if excs:
        assert probe["exc"] in excs, probe
    if errnos:
        assert probe["errno"] in errnos, probe


def t1(tier: str) -> bool:
    return tier == "landlock"


# --- A. secrets -----------------------------------------------------------------------------------------


@case("A1", "A2_canary_file", "A2_ssh_key", "A2_aws_credentials")
def _secret_files(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, "PermissionError" if t1(tier) else "FileNotFoundError")


@case("A3")
def _environment(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert set(o["probe"]["v"]) <= {"HOME", "LC_CTYPE", "PATH", "PWD", "TMPDIR"}


@case("A4", "A5_parent_environ")
def _launcher_environ(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    if t1(tier):
        denied(o, "PermissionError")
    else:
        keys = {entry.split("=", 1)[0] for entry in o["probe"]["v"].split("\0") if entry}
        assert keys <= {"PATH", "LC_ALL"}, keys


@case("A5_proc_listing")
def _proc_listing(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    if t1(tier):
        denied(o, "PermissionError")
    else:
        assert set(o["probe"]["v"]) <= {1, 2, 3}, o["probe"]["v"]


@case("A5_host_cmdline")
def _host_cmdline(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, "PermissionError" if t1(tier) else "FileNotFoundError")


@case("A6")
def _fds(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    fds = o["probe"]["v"]
    assert fds[:3] == [0, 1, 2] and len(fds) <= 4, f"unexpected open fds {fds} (only stdio + the result pipe)"


@case("A7")
def _ps(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["visible"] == [], "the code was visible in a host process's argv"


@case("A8_hostname")
def _hostname(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    # T1 has no UTS namespace: the host name stays visible (a documented gap of the Landlock tier).
    assert o["probe"]["v"] == (meta["host_hostname"] if t1(tier) else "sandbox")


@case("A8_mountinfo")
def _mountinfo(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    if t1(tier):
        denied(o, "PermissionError")
        return
    text = o["probe"]["v"]
    for host_path in ("/work", "/root", "/home", "parley-canary", "/etc"):
        assert host_path not in text, f"{host_path} is mounted in the sandbox"


@case("A9")
def _other_sandbox(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["first"]["exit_code"] == 0
    assert all(str(v).startswith("ERR:") for v in (o["run"]["value"] or {}).values())


# --- B. filesystem --------------------------------------------------------------------------------------


@case("B1")
def _ro_usr(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, errnos=(13,) if t1(tier) else (30,))
    assert o["host_paths"]["/usr/pwned"] is False


@case("B2")
def _ephemeral_root(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    if t1(tier):
        denied(o, "PermissionError")
    else:
        assert o["probe"]["ok"] is True  # the sandbox's own tmpfs root
    assert not any(v for k, v in o["host_paths"].items() if k.startswith("/pwned-"))


@case("B3")
def _dotdot(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o)
    assert not any(v for k, v in o["host_paths"].items() if k.startswith("/etc/parley-pwned-"))


ARTIFACT = {"B4_absolute": "abs-link.txt", "B4_canary": "canary-link.txt", "B4_proc_root": "proc-root-link.txt",
            "B4_dir_link": "dir-link/etc/shadow"}


@case(*ARTIFACT)
def _symlinked_artifact(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    name = o["artifact"]
    run = o["run"]
    assert name in run["file_errors"] and name not in run["files"], run["file_errors"]
    assert run["files"] == {"plain.txt": "plain"}


@case("B6")
def _fifo(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert "regular" in o["run"]["file_errors"]["fifo.txt"]
    assert o["elapsed_s"] < 3.0


@case("B7")
def _hardlink(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, errnos=(1, 18))


@case("B8")
def _setuid_plant(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["probe"]["v"]
    assert v["st_uid"] != 0 and v["my_uid"] != 0
    assert v["euid_when_run"] == str(v["my_uid"]), "a planted setuid binary changed the uid"


@case("B9")
def _tmp_fill(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["probe"]["v"]
    if t1(tier):
        assert v == {"written": 0, "errno": 13}  # /tmp is outside the Landlock rules
    else:
        assert v["errno"] == 28 and v["written"] <= 4, v


@case("B10")
def _workdir_fill(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["run"]["value"]
    if t1(tier):
        assert v["written"] == 100  # no size-capped tmpfs without namespaces (documented gap) ...
        assert o["workdir_left"] is False  # ... but the work dir goes with the run
    else:
        assert v["errno"] == 28 and v["written"] < 100, v


@case("B11")
def _big_file(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["limit"] == "file_size" and o["run"]["error"]["errno"] == 27


@case("B12")
def _many_files(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["limit"] in ("wall", "file_size", None)
    assert o["elapsed_s"] < 2.0 + 6.0, "cleanup was not bounded"
    assert o["workdir_left"] is False


@case("B13")
def _mknod(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, errnos=(1,))


# --- C. network -----------------------------------------------------------------------------------------


@case("C1", "C4", "C9")
def _loopback(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, "PermissionError")  # seccomp: no AF_INET/AF_INET6 socket at all


@case("C2", "C7")
def _routes(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["probe"]["v"]
    assert v["inet_socket"] == "ERR:1"
    if t1(tier):
        return
    routes = [line for line in v["route"].splitlines()[1:] if line.strip()]
    assert routes == [], f"IPv4 routes in the sandbox: {routes}"
    interfaces = [line.split(":")[0].strip() for line in v["dev"].splitlines()[2:] if ":" in line]
    assert interfaces == ["lo"], interfaces
    assert "169.254" not in v["route"] and "a9fe" not in v["route"].lower()


@case("C3")
def _resolver(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["probe"]["v"]
    assert v["resolv_conf"].startswith("ERR:") and v["AF_INET"] == "ERR:1" and v["AF_INET6"] == "ERR:1"


@case("C5")
def _abstract_socket(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, "PermissionError" if t1(tier) else "ConnectionRefusedError")


@case("C6_docker_sock", "C6_dbus_system", "C6_nscd")
def _host_sockets(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, "FileNotFoundError", "PermissionError")


@case("C8_packet", "C8_netlink")
def _raw_sockets(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, errnos=(1,))


# --- D. resources and liveness --------------------------------------------------------------------------


@case("D1")
def _fork_bomb(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["run"]["value"]
    assert v["errno"] == 11 and v["kids"] <= 64, v


@case("D2")
def _threads(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["probe"]["v"]
    assert v["started"] < 500 and "thread" in v["error"]


@case("D3")
def _big_alloc(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, "MemoryError")


@case("D4")
def _mmap(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, errnos=(12,))


@case("D5")
def _busy_loop(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["limit"] == "cpu" and o["run"]["exit_code"] == 128 + 24  # SIGXCPU, before the 10 s wall
    assert o["run"]["duration_s"] < 10.0


@case("D6_sleep")
def _sleep(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    run = o["run"]
    assert run["timed_out"] and run["limit"] == "wall" and run["exit_code"] == 137
    assert 1.5 <= run["duration_s"] < 1.5 + 1.5


@case("D6_input")
def _input(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["error"]["type"] == "EOFError" and o["run"]["duration_s"] < 3.0


@case("D7")
def _stdout_flood(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    run = o["run"]
    assert run["limit"] == "output" and run["stdout_truncated"] and run["stdout_len"] == 64 * 1024
    assert run["duration_s"] < 3.0


@case("D8_stderr")
def _stderr_flood(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    run = o["run"]
    assert run["limit"] == "output" and run["stderr_truncated"] and run["stderr_len"] == 64 * 1024
    assert run["duration_s"] < 3.0


@case("D8_invalid_utf8")
def _invalid_utf8(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["exit_code"] == 0 and "\ufffd" in o["run"]["stdout"]


@case("D9")
def _fd_exhaustion(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["probe"]["v"]
    assert v["errno"] == 24 and v["opened"] < 64


@case("D10")
def _daemon(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["value"] == "daemon started"
    assert o["survivors"] == [], "a setsid daemon outlived its sandbox"


@case("D11")
def _caller_killed(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["seen_before"], "the sandboxed process never started"
    assert o["survivors"] == [], "sandbox processes outlived a SIGKILLed caller"


@case("D12_bigint", "D12_regex")
def _cpu_bombs(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["limit"] in ("cpu", "wall") and o["run"]["duration_s"] < 3.0 + 3.0


@case("D13")
def _many_sandboxes(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    # The host keeps answering (a 50 ms heartbeat on its event loop); p90 because this 2-core machine is
    # shared with other test runs, which add their own scheduling noise to single samples.
    assert o["p90_lag_s"] < 0.2 and o["max_lag_s"] < 2.0, "the host stopped answering"  # seen: 1.37 s, 2 cores busy
    assert all(limit in ("cpu", "wall") for limit in o["limits"])
    assert all(d < 4.0 + 3.0 for d in o["durations"])
    if meta["euid"] == 0:  # one uid per sandbox: each has its own process budget
        assert all(30 <= forks <= 64 for forks in o["forks"]), o["forks"]
    else:
        assert all(0 <= forks <= 64 for forks in o["forks"]), o["forks"]


@case("D14", "D14_core_limit")
def _abort(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    if "probe" in o:
        assert o["probe"]["v"] == [0, 0]
    else:
        assert o["run"]["exit_code"] == 128 + 6 and o["run"]["result_error"] == "no result was reported"


# --- E. process and kernel surface ------------------------------------------------------------------------


@case("E1")
def _kill_host(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, "PermissionError" if t1(tier) else "ProcessLookupError")


@case("E2")
def _kill_all(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    run = o["run"]
    assert run["value"] == "survived" or run["error"]["type"] in ("ProcessLookupError", "PermissionError")


@case("E3_pid1", "E3_ppid", "E4", "E5", "E6_io_uring", "E6_bpf", "E6_perf_event_open", "E6_userfaultfd",
      "E6_keyctl", "E12_mount", "E12_chroot", "E12_pivot_root")
def _seccomp_denied(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, errnos=(1,))


@case("E7")
def _tiocsti(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, errnos=(1, 25))


@case("E8")
def _su(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["probe"]["v"] if o["probe"]["ok"] else {"rc": 1, "out": ""}
    assert v["rc"] != 0 and v["out"].strip() != "0"


@case("E9_subprocess", "E9_ctypes_system")
def _subprocess(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["probe"]["ok"] and o["probe"]["v"] not in ("", "0")  # allowed, contained, unprivileged


@case("E10")
def _dev(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    if t1(tier):
        denied(o, "PermissionError")
        return
    allowed = {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "fd", "stdin", "stdout",
               "stderr", "core"}
    assert set(o["probe"]["v"]) <= allowed, set(o["probe"]["v"]) - allowed


@case("E11_proc_sys", "E11_sys")
def _kernel_knobs(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    denied(o, "PermissionError", "FileNotFoundError", "OSError")


@case("E13")
def _fd_garbage(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["result_error"] is not None and o["run"]["value"] is None


# --- F. result channel ----------------------------------------------------------------------------------


@case("F1_pickle", "F1_prefixed", "F3_truncated", "F3_invalid_utf8", "F5_nan", "F5_infinity", "F5_overflow", "F6")
def _rejected_payload(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["result_error"] is not None and o["run"]["value"] is None
    assert o["marker_exists"] is False


@case("F2")
def _huge_result(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["limit"] == "result_size" and "cap" in o["run"]["result_error"]
    assert o["run"]["duration_s"] < 3.0


@case("F3_lone_surrogate")
def _surrogate(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["result_error"] is None and o["run"]["value"] == "a\ufffdb"


@case("F4")
def _deep_result(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert "deep" in o["run"]["result_error"]


@case("F7_stdout_forgery")
def _stdout_forgery(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["run"]["value"] == "genuine" and "forged" in o["run"]["stdout"]


@case("F7_wrong_nonce")
def _wrong_nonce(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert "nonce" in o["run"]["result_error"] and o["run"]["value"] is None


@case("F8_ansi_flood")
def _ansi_flood(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    run = o["run"]
    assert run["limit"] is None and run["stderr_len"] < 64 * 1024, "the traceback flooded stderr"
    message = run["error"]["message"]
    assert "\x1b" not in message and len(message) <= 4200


@case("F8_credentials")
def _credentials(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    message = o["run"]["error"]["message"]
    assert "s3cr3t-f8" not in message and "[REDACTED]" in message


@case("F9")
def _late_result(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    run = o["run"]
    assert run["timed_out"] and run["value"] is None and run["result_error"].startswith("discarded")


# --- H. language escapes (no in-process layer: the OS must contain each) ---------------------------------


@case("H1", "H6")
def _popen_escape(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["probe"]["ok"], o["probe"]  # the escape itself works: in-process policy is no boundary
    assert o["probe"]["v"]["stdout"] == ""


@case("H2", "H3", "H4", "H5", "H7", "H8", "H9", "H10", "H11", "H12")
def _builtins_escape(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    assert o["probe"]["ok"], o["probe"]
    v = o["probe"]["v"]
    assert v["file"].startswith("ERR:") and v["env"] is None


@case("H13")
def _ctypes_escape(o: dict[str, Any], tier: str, meta: dict[str, Any]) -> None:
    v = o["probe"]["v"]
    assert v["fd"] == -1 and v["read"] == "" and v["env"] == 0


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_attack_is_contained(name: str, tier: str, caller: str) -> None:
    obs = observations(tier, caller)
    meta = obs["_meta"]
    assert name in obs, f"case {name} produced no observation (its probe run failed: {obs.get('_cheap_run')})"
    CHECKS[name](obs[name], tier, meta)
    _contained(obs[name], meta, name)


def test_battery_has_every_row() -> None:
    rows = {re.match(r"[A-H]\d+", name).group() for name in CHECKS}  # type: ignore[union-attr]
    expected = {f"A{i}" for i in range(1, 10)} | {f"B{i}" for i in range(1, 14)} - {"B5"} | \
        {f"C{i}" for i in range(1, 10)} | {f"D{i}" for i in range(1, 15)} | {f"E{i}" for i in range(1, 14)} | \
        {f"F{i}" for i in range(1, 10)} | {f"H{i}" for i in range(1, 14)}
    assert expected <= rows, sorted(expected - rows)  # B5 (a host-side race) lives in test_artifacts.py
    assert len(CHECKS) >= 81
