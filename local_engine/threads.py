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
