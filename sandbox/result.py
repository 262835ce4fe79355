"""`ExecResult` and the host-side rules for reading what a sandbox sends back.

The result channel carries data written by code we do not trust (the user's code shares the process
with our in-sandbox runner and can forge anything on it), so it is parsed like hostile input: a byte cap
before parsing, strict UTF-8, JSON only (never pickle: smolagents' remote executors unpickled results,
CVE-2025-14931), duplicate keys, NaN/Infinity and over-long integers rejected, nesting bounded, lone
surrogates replaced, and the run's nonce checked so stale or forged-elsewhere data is ignored.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import signal
from dataclasses import dataclass, field
from typing import Any, Literal

from parley.sandbox.errors import ResultChannelError
from parley.sandbox.limits import LimitName

MAX_DEPTH = 64
ERROR_TEXT_CAP = 4096
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:]+:[^/@\s]*@")


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one sandboxed run.

    `exit_code` is the target's status (128+N when killed by signal N, None if it never reported);
    `limit` names the limit that ended or broke the run (None when none fired); `value` is the JSON value
    of a python cell's final expression (`value_repr` when it was not JSON-able); `error` describes the
    cell's uncaught exception (type, message; sanitised); `files` holds the artifacts asked for with
    `collect`, `file_errors` why others were refused; `result_error` says why the result channel was
    rejected (the run's stdout/stderr are still returned).
    """

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    limit: LimitName | None
    duration_s: float
    tier: str = ""
    value: Any = None
    value_repr: str | None = None
    error: dict[str, Any] | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    file_errors: dict[str, str] = field(default_factory=dict)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    result_error: str | None = None
    kind: Literal["exec_result"] = "exec_result"

    @property
    def ok(self) -> bool:
        """True when the run exited 0, no limit fired and the result channel was accepted."""
        return self.exit_code == 0 and self.limit is None and not self.timed_out and self.result_error is None


def sanitize_text(text: str, *, cap: int = ERROR_TEXT_CAP, redact: tuple[str, ...] = ()) -> str:
    """Make sandbox text safe to show a model or a terminal: ANSI and control characters escaped,
    URL credentials and the given secrets redacted, length capped (with a marker)."""
    text = _URL_CREDENTIALS.sub(r"\1[REDACTED]@", text)
    for secret in redact:
        if secret:
            text = text.replace(secret, "[REDACTED]")
    text = _ANSI.sub("", text)
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    if len(text) > cap:
        text = text[:cap] + f"... [truncated {len(text) - cap} chars]"
    return text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _float_or_reject(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:20]} overflows to infinity")
    return value


def _normalise(value: Any, depth: int = 0) -> Any:
    """Depth check and lone-surrogate replacement (strict JSON can still carry "\\ud800")."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nesting deeper than {MAX_DEPTH}")
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _has_surrogate(value) else value
    if isinstance(value, list):
        return [_normalise(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {_normalise(k, depth + 1): _normalise(v, depth + 1) for k, v in value.items()}
    return value


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def parse_channel(data: bytes, *, cap: int, nonce: str) -> dict[str, Any]:
    """Parse the result channel's bytes strictly; raises `ResultChannelError` with a short reason."""
    if len(data) > cap:
        raise ResultChannelError(f"result exceeds the {cap}-byte cap")
    if not data:
        raise ResultChannelError("no result was reported")
    try:
        text = data.decode("utf-8")
        payload = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_pairs_without_duplicates,
                             parse_float=_float_or_reject)
        payload = _normalise(payload)
    except UnicodeDecodeError:
        raise ResultChannelError("result is not valid UTF-8") from None
    except RecursionError:
        raise ResultChannelError("result nesting is too deep") from None
    except ValueError as exc:  # JSONDecodeError, duplicate key, NaN, int digits limit, depth
        raise ResultChannelError(f"result is not strict JSON: {str(exc)[:200]}") from None
    if not isinstance(payload, dict):
        raise ResultChannelError("result is not a JSON object")
    if payload.get("nonce") != nonce:
        raise ResultChannelError("result is not bound to this run (nonce mismatch)")
    return payload


def decode_files(raw: Any, cap: int) -> tuple[dict[str, bytes], dict[str, str]]:
    """Decode the runner's base64 artifact map, enforcing the total byte cap."""
    files: dict[str, bytes] = {}
    if not isinstance(raw, dict):
        return files, {}
    errors: dict[str, str] = {}
    total = 0
    for name, encoded in raw.items():
        try:
            data = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else None
        except (binascii.Error, ValueError):
            data = None
        if data is None:
            errors[name] = "malformed artifact encoding"
            continue
        total += len(data)
        if total > cap:
            errors[name] = "artifact byte cap exceeded"
            continue
        files[name] = data
    return files, errors


_SIGNAL_LIMITS: dict[int, LimitName] = {
    signal.SIGXCPU: "cpu",
    signal.SIGXFSZ: "file_size",
}
_ERRNO_LIMITS: dict[int, LimitName] = {27: "file_size", 24: "open_files", 11: "processes", 12: "memory"}


def classify_limit(exit_code: int | None, error: dict[str, Any] | None, *, cpu_s: int,
                   cpu_used_s: float | None = None) -> LimitName | None:
    """Name the limit behind an exit: SIGXCPU/SIGKILL-at-the-CPU-cap, SIGXFSZ, MemoryError, EFBIG, ..."""
    if exit_code is not None and exit_code > 128:
        sig = exit_code - 128
        if sig in _SIGNAL_LIMITS:
            return _SIGNAL_LIMITS[sig]
        if sig == signal.SIGKILL and cpu_used_s is not None and cpu_used_s >= cpu_s:
            return "cpu"
    if error:
        kind = error.get("type")
        if kind == "MemoryError":
            return "memory"
        if kind == "RuntimeError" and "thread" in str(error.get("message", "")):
            return "processes"
        err = error.get("errno")
        if isinstance(err, int) and err in _ERRNO_LIMITS:
            return _ERRNO_LIMITS[err]
    return None
