"""A memory-capped worker process that builds outlines-core indexes, killed and replaced past a deadline.

A regex DFA can explode (MaskBench saw 188 outlines OOMs; a 36k-char schema regex asked for 4 GiB in one
allocation), so index builds never run in the caller's process: the worker has an address-space cap, and a
build that overruns its deadline, hits the cap or crashes costs the caller a `CompileLimitError`, not the
machine's memory.

Why a plain process and pipe rather than `concurrent.futures.ProcessPoolExecutor`: killing a pool's worker
while it was sending a result left the pool's manager thread blocked forever on the half-read message, and
interpreter exit joins that thread, so the process never exited. Here nothing but the caller reads the pipe;
a killed worker's pipe is closed and never read again, and the worker is a daemon process, which
multiprocessing terminates at exit.
"""

from __future__ import annotations

import threading
from typing import Any

from parley.constrained.errors import CompileLimitError

WORKER_MEMORY_BYTES = 4 << 30


def _serve(conn: Any, memory_limit: int) -> None:
    """Worker body: build an index per request until the parent closes the pipe."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    import outlines_core

    while True:
        try:
            pattern, vocabulary = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[str, Any] = ("ok", outlines_core.Index(pattern, vocabulary))
        except MemoryError:
            reply = ("memory", None)
        except Exception as exc:  # noqa: BLE001 - the caller turns it into a typed error
            reply = ("error", exc if _picklable(exc) else RuntimeError(str(exc)))
        conn.send(reply)


def _picklable(exc: BaseException) -> bool:
    import pickle

    try:
        pickle.dumps(exc)
    except Exception:  # noqa: BLE001
        return False
    return True


class _Worker:
    def __init__(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, WORKER_MEMORY_BYTES), name="parley-outlines-index", daemon=True
        )
        self.process.start()
        child.close()  # only the worker holds its end, so its death reads as end-of-file here

    def build(self, pattern: str, vocabulary: Any, timeout_s: float | None) -> tuple[str, Any]:
        self.conn.send((pattern, vocabulary))
        if not self.conn.poll(timeout_s):
            return "timeout", None
        try:
            status, value = self.conn.recv()
        except (EOFError, OSError):
            return "crashed", None
        return str(status), value

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


_WORKER: list[_Worker] = []
_LOCK = threading.Lock()  # one build at a time: the worker serves one request, in order


def build_index_isolated(pattern: str, vocabulary: Any, timeout_s: float | None) -> Any:
    """Build an outlines-core `Index` in the memory-capped worker; kill it past `timeout_s`.

    Raises CompileLimitError (deadline, memory cap, crash); re-raises what outlines-core raised for a bad
    pattern, for the backend to classify.
    """
    with _LOCK:
        if not _WORKER or not _WORKER[0].process.is_alive():
            if _WORKER:
                _WORKER.pop().kill()
            _WORKER.append(_Worker())
        worker = _WORKER[0]
        status, value = worker.build(pattern, vocabulary, timeout_s)
        if status in ("timeout", "crashed"):
            _WORKER.clear()
            worker.kill()
    if status == "ok":
        return value
    if status == "error":
        raise value
    if status == "timeout":
        raise CompileLimitError(f"outlines-core index build took longer than {timeout_s:g} s (timeout_s)")
    raise CompileLimitError(
        f"outlines-core index build exceeded the worker memory cap ({WORKER_MEMORY_BYTES >> 20} MiB) or crashed"
    )
