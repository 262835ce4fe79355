"""Cheap per-thread control of PyTorch's OpenMP team size on CPU.

A decode step on CPU is ~120 weight GEMVs interleaved with ~600 tiny ops (norms, RoPE, attention on a
few hundred keys). The GEMVs want every core; the tiny ops do not, and each OpenMP parallel region they
open costs a fork/join that, on a busy 2-core machine, can take longer than the op itself.
`torch.set_num_threads` is the wrong tool to switch per op: it also clears oneDNN's primitive cache and
resizes a thread pool. `omp_set_num_threads` (found in the OpenMP runtime torch already loaded) only sets
the calling thread's team size, in ~100 ns, so the model can run tiny ops on one thread and GEMMs on all.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import lru_cache

_RUNTIMES = ("libgomp", "libiomp", "libomp")


@lru_cache(maxsize=1)
def omp_set_num_threads() -> Callable[[int], None] | None:
    """The OpenMP runtime's `omp_set_num_threads`, or None when none is loaded (then nobody toggles)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if any(r in line for r in _RUNTIMES)]
    except OSError:
        return None
    for path in dict.fromkeys(paths):
        if not path.startswith("/"):
            continue
        try:
            fn = ctypes.CDLL(path).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int]
        fn.restype = None
        return fn
    return None
