"""Resource limits of one sandboxed run, validated once, shared by every tier.

Why each limit (sandbox.md §2, §4): CPU time catches busy loops (`RLIMIT_CPU` misses sleeps, so the wall
clock is enforced from outside too); address space catches `bytearray(4 GiB)` but not tmpfs pages (hence
the sized tmpfs); file size stops one huge file; open files stops fd exhaustion; processes stops fork bombs
(counted per uid, which is why root runs drop to a fresh uid); core 0 leaves no dumps; byte caps on
stdout, stderr, the result channel and artifacts bound what the host buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from parley.sandbox.errors import SandboxRequestError

MiB = 1024 * 1024

LimitName = Literal["wall", "cpu", "memory", "output", "file_size", "open_files", "processes", "result_size"]


@dataclass(frozen=True)
class Limits:
    """Per-run limits. `cpu_s=None` means "the wall timeout, rounded up"."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    cpu_s: int | None = None
    file_size_mb: int = 16
    open_files: int = 64
    processes: int = 64
    tmpfs_mb: int = 64
    output_bytes: int = 64 * 1024
    result_bytes: int = 1 * MiB
    artifact_bytes: int = 8 * MiB
    kind: Literal["limits"] = "limits"

    def with_overrides(self, **changes: object) -> Limits:
        """A copy with the non-None `changes` applied, validated."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None}).validated()  # type: ignore[arg-type]

    def validated(self) -> Limits:
        """Return self after checking every value is in a sane range (raises `SandboxRequestError`)."""

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise SandboxRequestError(f"invalid sandbox limit: {what}")

        need(isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and 0 < self.timeout_s <= 3600,
             "timeout_s must be in (0, 3600]")
        need(isinstance(self.memory_mb, int) and 32 <= self.memory_mb <= 1 << 20, "memory_mb must be in [32, 2**20]")
        need(self.cpu_s is None or (isinstance(self.cpu_s, int) and 1 <= self.cpu_s <= 3600),
             "cpu_s must be in [1, 3600]")
        for name in ("file_size_mb", "open_files", "processes", "tmpfs_mb", "output_bytes", "result_bytes",
                     "artifact_bytes"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 1, f"{name} must be a positive integer")
        need(self.open_files >= 16, "open_files must be at least 16 (the interpreter needs some)")
        return self

    @property
    def effective_cpu_s(self) -> int:
        return self.cpu_s if self.cpu_s is not None else max(1, math.ceil(self.timeout_s))

    def rlimits(self) -> dict[str, int]:
        """The rlimit table the in-sandbox code applies to itself (keys of `inside.RLIMITS`)."""
        return {
            "cpu_s": self.effective_cpu_s,
            "as_bytes": self.memory_mb * MiB,
            "fsize_bytes": self.file_size_mb * MiB,
            "nofile": self.open_files,
            "nproc": self.processes,
            "core": 0,
        }
