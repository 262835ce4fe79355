"""Cheap per-thread control of the CPU thread counts of PyTorch's OpenMP team and of MKL.

A decode step on CPU is ~120 weight GEMMs interleaved with ~600 tiny ops (norms, RoPE, attention on a
few hundred keys). The GEMMs want every core; the tiny ops do not, and each parallel region they open
costs a fork/join that, on a busy 2-core machine, can take longer than the op itself (a 2-thread region
waits for a thread the OS has not scheduled).
`torch.set_num_threads` is the wrong tool to switch per op: it also clears oneDNN's primitive cache,
resizes a thread pool and sets MKL's *process-wide* count. Two runtime calls do what is needed, for the
calling thread only, in ~100 ns:

- `omp_set_num_threads` (the OpenMP runtime torch loaded): the team size of ATen's parallel loops and oneDNN;
- `mkl_set_num_threads_local` (MKL, linked into torch on x86): MKL ignores OpenMP's setting once a count was
  set explicitly, so the batched matmuls of attention need this one to run on one thread.

Both are looked up in the libraries already loaded; when absent (no OpenMP, no MKL) nobody toggles.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import lru_cache

_OPENMP_RUNTIMES = ("libgomp", "libiomp", "libomp")
_MKL_HOSTS = ("libtorch_cpu", "libmkl_rt", "libmkl_core")


def _loaded(names: tuple[str, ...]) -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if any(n in line for n in names)]
    except OSError:
        return []
    return [p for p in dict.fromkeys(paths) if p.startswith("/")]


@lru_cache(maxsize=1)
def omp_set_num_threads() -> Callable[[int], None] | None:
    """The OpenMP runtime's `omp_set_num_threads`, or None when none is loaded."""
    for path in _loaded(_OPENMP_RUNTIMES):
        try:
            fn = ctypes.CDLL(path).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int]
        fn.restype = None
        return fn
    return None


@lru_cache(maxsize=1)
def mkl_set_num_threads_local() -> Callable[[int], None] | None:
    """MKL's thread-local thread count setter, or None when MKL is not loaded or does not behave as expected.

    The exported symbol is MKL's Fortran-convention entry (the count passed by reference). It is checked once
    against `mkl_get_max_threads` before use, so a library with another convention is left alone.
    """
    import torch  # noqa: F401 - MKL is linked into torch; make sure it is loaded before looking

    for path in _loaded(_MKL_HOSTS):
        try:
            lib = ctypes.CDLL(path)
            setter, getter = lib.mkl_set_num_threads_local, lib.mkl_get_max_threads
        except (OSError, AttributeError):
            continue
        setter.restype = ctypes.c_int
        getter.restype = ctypes.c_int

        def set_local(n: int, setter: Callable[..., int] = setter) -> None:
            setter(ctypes.byref(ctypes.c_int(n)))

        probe = 1 if getter() != 1 else 2
        set_local(probe)
        works = getter() == probe
        set_local(0)  # 0 = back to the process-wide setting
        return set_local if works else None
    return None


FEWER_THREADS_MARGIN = 0.85
"""One thread replaces all of them only when its probed median per token is below this fraction of theirs.

Why a margin: since the quantised decode step runs as one C++ region (models/fused_decode.py), 2 threads are
~1.4x faster than 1 on a quiet 2-core machine, but a short probe beside a streaming HTTP server (its event loop
and client take turns on the cores) is noisy; choosing 1 thread on a near tie then costs ~30 % for the next 512
steps. A busy other core, which this class exists for, makes 2 threads ~2x slower: still far past the margin."""


GIVE_UP_RATIO = 3.0
"""A probe step this many times slower per token than the other count's fastest ends that count's probe.

Why: beside a busy multi-threaded process a 2-thread step took ~0.5 s (2 tok/s, a spinning team whose second
thread waits for a core) against ~10 ms on 1 thread; each re-probe then stalled the stream for 4 such steps."""


FIRST_REPROBE = 64
"""Steps of a bucket after its first choice before it is probed again (then every `reprobe_every`).

Why: the first probe runs in the first request's first steps, the noisiest of a server's life (its event loop
starts the stream, the fused step's second thread wakes for the first time); a wrong first choice was kept for
512 steps, and in `parley serve` 1 thread was chosen in 4 of 5 starts where 2 threads then ran ~25 % faster."""


class DecodeThreads:
    """Chooses, per decode batch size, how many threads the weight GEMMs of a decode step get: all of them
    (`max_threads`) or one, by timing both on live steps.

    Why: a decode GEMM at batch 1 is a few hundred microseconds of work, and a 2-thread team waits for its
    second thread at every GEMM. On a machine whose other core is busy (other processes), that thread is often
    not scheduled, and a decode step measured ~2x slower on 2 threads than on 1 (SmolLM2 int8: 34 vs 75 tok/s
    in one run; llama.cpp's spin-waiting pool showed the same, 55 vs 95). On a quiet machine 2 threads win.
    Neither is right everywhere, so the engine measures: for each batch bucket (1, 2, 4, ...) the first
    `2 * probe_steps` pure-decode steps alternate between the counts and the faster per token wins (`_choose`),
    then it probes again after `FIRST_REPROBE` steps of that bucket and every `reprobe_every` after that
    (loads change). Prefill steps always get every
    thread. Timings are the engine's own step times; tokens do not depend on the choice (the int8 kernel and
    attention are thread-count invariant; oneDNN fp32 may differ in the last bits).
    """

    def __init__(self, max_threads: int, *, probe_steps: int = 6, reprobe_every: int = 512) -> None:
        self.max_threads = max_threads
        self.candidates = (max_threads, 1) if max_threads > 1 else (max_threads,)
        self.probe_steps = probe_steps
        self.reprobe_every = reprobe_every
        self._state: dict[int, dict[str, object]] = {}

    @staticmethod
    def bucket(batch: int) -> int:
        return 1 if batch <= 1 else 1 << (batch - 1).bit_length()

    def _of(self, batch: int) -> dict[str, object]:
        b = self.bucket(batch)
        state = self._state.get(b)
        if state is None:
            state = self._state[b] = {"choice": self.max_threads, "samples": {c: [] for c in self.candidates},
                                      "since": 0, "reprobe_at": min(FIRST_REPROBE, self.reprobe_every)}
        return state

    def threads_for(self, batch: int) -> int:
        """The GEMM thread count for the next decode step of `batch` rows."""
        if len(self.candidates) == 1:
            return self.max_threads
        state = self._of(batch)
        samples: dict[int, list[float]] = state["samples"]  # type: ignore[assignment]
        pending = [c for c in self.candidates if len(samples[c]) < self.probe_steps]
        if pending:  # probing: alternate, the count with fewer samples first
            return min(pending, key=lambda c: len(samples[c]))
        return int(state["choice"])  # type: ignore[call-overload]

    def record(self, batch: int, threads: int, seconds: float) -> None:
        """A pure-decode step of `batch` rows ran on `threads` GEMM threads in `seconds`."""
        if len(self.candidates) == 1:
            return
        state = self._of(batch)
        samples: dict[int, list[float]] = state["samples"]  # type: ignore[assignment]
        if threads in samples and len(samples[threads]) < self.probe_steps:
            per_token = seconds / max(batch, 1)
            samples[threads].append(per_token)
            others = [min(v) for c, v in samples.items() if c != threads and v]
            if others and per_token > GIVE_UP_RATIO * min(others):  # hopeless: no more steps of it this probe
                samples[threads] += [per_token] * (self.probe_steps - len(samples[threads]))
            if all(len(v) >= self.probe_steps for v in samples.values()):
                state["choice"] = self._choose(samples)
                state["since"] = 0
            return
        state["since"] = int(state["since"]) + 1  # type: ignore[call-overload]
        if int(state["since"]) >= int(state["reprobe_at"]):  # type: ignore[call-overload]
            state["samples"] = {c: [] for c in self.candidates}
            state["reprobe_at"] = self.reprobe_every

    def _choose(self, samples: dict[int, list[float]]) -> int:
        """Every thread, unless fewer are faster per token by more than FEWER_THREADS_MARGIN.

        Each count is scored by the lower median of its probe steps after the first: interference only ever
        slows a step down, so the fast half says what the count can do, and the first step of a count pays
        its warm-up (the fused step's first 2-thread step took 15-27 ms beside 5-6 ms for the next ones). A
        count that is slow at most steps (a busy other core) still scores slow."""
        score = {c: _lower_median(v[1:] if len(v) > 2 else v) for c, v in samples.items()}
        best = min(score, key=lambda c: score[c])
        return best if score[best] < FEWER_THREADS_MARGIN * score[self.max_threads] else self.max_threads

    def stats(self) -> dict[int, int]:
        """Batch bucket -> the thread count chosen for it so far."""
        return {b: int(s["choice"]) for b, s in sorted(self._state.items())}  # type: ignore[call-overload]


def _lower_median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]
