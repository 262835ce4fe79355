"""The engine thread: the step loop that owns the scheduler, the block pool, the KV cache and every `Sequence`.

Split from engine.py at the thread boundary, as vLLM splits `EngineCore` from its front end: `Engine` is
the code callers' threads run (validation, admission, submission, waiting), `EngineCore` is the only code
the engine thread runs. They meet at three points, and nowhere else: a thread-safe command queue
(`add`, `abort`, `stop`); per-request sinks the core feeds with deltas, outputs and errors (a stream's
`delivery.LoopSink`, whose items of one step reach its event loop in one wakeup through the `Outbox`,
or a plain queue for the blocking API), so the asyncio side never blocks and never touches engine
state; and `Admission`, the one piece of state both threads change, under its lock. A step: drop
requests past their deadline, schedule, run the model, sample, append tokens, finish what finished
(returning its blocks), emit deltas; then the step's stream items leave together.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from parley.local_engine.block_manager import BlockManager
from parley.local_engine.delivery import LoopSink, Outbox
from parley.local_engine.errors import EngineError, RequestAborted
from parley.local_engine.outputs import GenerationOutput, StreamDelta, TokenLogprob
from parley.local_engine.runner import CausalLM, ModelRunner
from parley.local_engine.sampler import Sampler
from parley.local_engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from parley.local_engine.sequence import Sequence
from parley.local_engine.speculative import NgramDrafter
from parley.local_engine.step_timer import StepTimer
from parley.local_engine.threads import DecodeThreads, omp_set_num_threads
from parley.local_engine.tokenizer import Tokenizer

Sink = Callable[[Any], None]
_DEADLINE = "deadline"


_RUNNING: weakref.WeakSet[EngineCore] = weakref.WeakSet()


def _stop_running_loops() -> None:
    """At interpreter exit, end every step loop still running, between two steps: a daemon thread frozen by
    finalization inside a fused step (an OpenMP team in C++) aborted the process with "terminate called
    without an active exception" when a script ended while an engine was generating."""
    for core in list(_RUNNING):
        core.stop(timeout=10)


atexit.register(_stop_running_loops)


class Admission:
    """Requests submitted and not yet finished, shared by both threads under `lock`.

    The caller's thread adds a request at submission; the engine thread takes it out of the waiting
    count at its first admission (or when it ends before one) and out of `live_ids` when it ends.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live_ids: set[str] = set()  # ids submitted and not finished (checked at submission)
        self.waiting_count = 0
        self.waiting_tokens = 0  # prompt tokens of requests not yet admitted (deadline estimates)

    def left_queue(self, seq: Sequence) -> None:
        """A request leaves the admission queue once: at its first admission or when it ends before."""
        if getattr(seq, "counted_waiting", False):
            seq.counted_waiting = False
            with self.lock:
                self.waiting_count -= 1
                self.waiting_tokens -= seq.num_prompt_tokens

    def ended(self, request_id: str) -> None:
        with self.lock:
            self.live_ids.discard(request_id)

    def clear(self) -> None:
        with self.lock:
            self.live_ids.clear()
            self.waiting_count = 0
            self.waiting_tokens = 0


class EngineCore:
    """The step loop on its own thread. `Engine` builds the parts, shares them, and talks to it through
    `add`, `abort` and `stop`; `steps`, `tokens_generated`, `failed_steps` and `failure` are its figures."""

    def __init__(
        self,
        model: CausalLM,
        tokenizer: Tokenizer,
        *,
        eos_token_ids: frozenset[int],
        block_manager: BlockManager,
        scheduler: Scheduler,
        runner: ModelRunner,
        sampler: Sampler,
        timer: StepTimer,
        drafter: NgramDrafter | None,
        decode_threads: DecodeThreads | None,
        num_threads: int,
        admission: Admission,
        stream_interval_s: float = 0.0,
    ) -> None:
        self.model = model
        self.stream_interval_s = stream_interval_s
        self.tokenizer = tokenizer  # stop strings are matched on decoded text
        self.eos_token_ids = eos_token_ids
        self.block_manager = block_manager
        self.scheduler = scheduler
        self.runner = runner
        self.sampler = sampler
        self.timer = timer
        self.drafter = drafter
        self.decode_threads = decode_threads
        self._num_threads = num_threads
        self._admission = admission
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._by_id: dict[str, Sequence] = {}  # engine-thread view of live requests
        self._sinks: dict[str, Sink] = {}
        self.outbox = Outbox()  # stream items of the current step, flushed once it ends
        self._flushed_at = 0.0
        self.steps = 0
        self.tokens_generated = 0
        self.failed_steps = 0
        self.failure: EngineError | None = None  # set once the step loop has died; the engine is then unusable
        self._thread = threading.Thread(target=self._loop, name="parley-engine", daemon=True)

    # ------------------------------------------------------------------ called from other threads
    def start(self) -> None:
        self._thread.start()
        _RUNNING.add(self)

    def add(self, seq: Sequence, sink: Sink) -> None:
        self._commands.put(("add", (seq, sink)))

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def stop(self, timeout: float = 30) -> None:
        """Ask the loop to end (it fails what it still holds with `RequestAborted`) and wait for it."""
        self._commands.put(("stop", None))
        self._thread.join(timeout=timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def fresh_failure(self) -> EngineError | None:
        """A new copy of the loop's fatal error, one per caller it reaches; None while the loop is healthy."""
        if self.failure is None:
            return None
        err = EngineError(str(self.failure))
        err.__cause__ = self.failure.__cause__
        return err

    # ------------------------------------------------------------------ the engine thread
    def _deliver(self, seq: Sequence, item: Any) -> None:
        sink = self._sinks.get(seq.request_id)
        if sink is None:
            return
        if isinstance(sink, LoopSink):
            middle = isinstance(item, StreamDelta) and not item.finished and seq.num_output_tokens > len(item.token_ids)
            self.outbox.put(sink, item, seq, urgent=not middle)
            return
        try:
            sink(item)
        except RuntimeError:  # the consumer's event loop is gone: nobody is listening
            if not seq.is_finished:
                self._finish(seq, "abort", notify=False)

    def _flush(self) -> None:
        """Send the items queued since the last flush: one wakeup per event loop."""
        if self.outbox:
            self.outbox.flush(self._consumer_gone)
        self._flushed_at = time.monotonic()

    def _flush_due(self) -> None:
        """Flush what must not wait (first and last tokens, failures), what waited `stream_interval_s`, and
        everything once there is no work left (the loop is about to block)."""
        due = self.outbox.urgent or time.monotonic() - self._flushed_at >= self.stream_interval_s
        if due or not self.scheduler.has_work():
            self._flush()

    def _consumer_gone(self, seq: Sequence) -> None:
        if not seq.is_finished:
            self._finish(seq, "abort", notify=False)

    def _finish(self, seq: Sequence, reason: str, *, notify: bool = True, error: BaseException | None = None) -> None:
        """End `seq` and tell its consumer. Also for one the scheduler ended itself (its `finish` is then a no-op)."""
        self._admission.left_queue(seq)
        self.scheduler.finish(seq, "abort" if reason == _DEADLINE else reason)
        seq.finish_time = time.monotonic()
        if notify:
            if error is not None:
                self._deliver(seq, error)
            else:
                self._emit(seq, final=True)
                self._deliver(seq, self._output(seq))
        self._sinks.pop(seq.request_id, None)
        self._by_id.pop(seq.request_id, None)
        self._admission.ended(seq.request_id)

    def _output(self, seq: Sequence) -> GenerationOutput:
        return GenerationOutput(
            request_id=seq.request_id, token_ids=seq.output_token_ids, finish_reason=seq.finish_reason,  # type: ignore[arg-type]
            prompt_tokens=seq.num_prompt_tokens, cached_tokens=seq.num_cached_tokens or 0,
            ttft_s=None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time,
            tpot_s=self._tpot(seq), logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
        )

    @staticmethod
    def _tpot(seq: Sequence) -> float | None:
        n = seq.num_output_tokens
        if n < 2 or seq.first_token_time is None or seq.finish_time is None:
            return None
        return (seq.finish_time - seq.first_token_time) / (n - 1)

    def _emit(self, seq: Sequence, *, final: bool = False) -> None:
        new = seq.output_token_ids[seq.num_emitted :]
        if not new and not final:
            return
        lps = None
        if seq.params.logprobs is not None:
            lps = tuple(seq.logprobs[seq.num_emitted : seq.num_emitted + len(new)])
        seq.num_emitted += len(new)
        self._deliver(
            seq,
            StreamDelta(
                request_id=seq.request_id, token_ids=tuple(new), finished=final,
                finish_reason=seq.finish_reason if final else None,  # type: ignore[arg-type]
                prompt_tokens=seq.num_prompt_tokens, cached_tokens=seq.num_cached_tokens or 0,
                ttft_s=None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time,
                tpot_s=self._tpot(seq) if final else None, logprobs=lps,
            ),
        )

    def _drain_commands(self, block: bool) -> bool:
        """Apply queued commands; returns False when asked to stop."""
        while True:
            try:
                cmd, arg = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            if cmd == "stop":
                return False
            if cmd == "add":
                seq, sink = arg
                self._by_id[seq.request_id] = seq
                self._sinks[seq.request_id] = sink
                self.scheduler.add(seq)
            elif cmd == "abort":
                target = self._by_id.get(arg)
                if target is not None and not target.is_finished:
                    self._finish(target, "abort")

    def _loop(self) -> None:
        """Thread body. Any exception escaping the loop (a bug, a MemoryError in a step) is fatal: the state of
        the scheduler, block pool and KV cache can no longer be trusted, so the engine fails every request it
        holds and refuses new ones rather than serving from corrupt state or leaving callers waiting."""
        try:
            self._run_loop()
        except BaseException as exc:  # noqa: BLE001 - the thread must never die silently
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, Exception):
            self.failed_steps += 1
        failure = EngineError(f"the engine failed and accepts no more requests: {type(exc).__name__}: {exc}")
        failure.__cause__ = exc
        self.failure = failure
        try:
            self._flush()  # what was produced before the failure arrives before it
        except Exception:  # noqa: BLE001, S110 - the failure notices below matter more
            pass
        sinks = list(self._sinks.values())
        self._sinks.clear()
        self._by_id.clear()
        while True:  # requests submitted but not yet picked up by the loop
            try:
                cmd, arg = self._commands.get_nowait()
            except queue.Empty:
                break
            if cmd == "add":
                sinks.append(arg[1])
        for sink in sinks:
            try:
                sink(self.fresh_failure())
            except Exception:  # noqa: BLE001, S110 - a consumer that is gone needs no notice
                pass
        self._admission.clear()

    def _run_loop(self) -> None:
        if self.model.device.type == "cpu":
            # Thread counts are per thread (OpenMP's team size, MKL's local count): the engine thread sets
            # its own. Bookkeeping and sampling then run on one OpenMP thread (tiny ops); the model raises it
            # to `num_threads` for its weight GEMMs (see threads.py).
            torch.set_num_threads(self._num_threads)
            omp = omp_set_num_threads()
            if omp is not None:
                omp(1)
        while True:
            running = self._drain_commands(block=not self.scheduler.has_work())
            self._flush_due()  # aborts answered before the next step (and everything before blocking)
            if not running:
                break
            self._step()
            self._flush_due()
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._finish(seq, "abort", error=RequestAborted("the engine was closed"))
        self._flush()

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            if seq.deadline is not None and now > seq.deadline:
                self._finish(seq, _DEADLINE, error=RequestAborted(
                    f"request {seq.request_id!r} dropped: past its deadline", ))

    def _step(self) -> None:
        self._drop_expired()
        if not self.scheduler.has_work():
            return
        clock = self.timer.clock
        t0 = clock()
        out: SchedulerOutput = self.scheduler.schedule()
        for it in out.items:
            self._admission.left_queue(it.seq)
        for seq in out.finished:  # the scheduler ended it (pool too small to continue); tell the consumer
            self._finish(seq, "length")
        if not out.items:
            return
        pure_decode = all(it.is_decode for it in out.items)
        decode_rows = out.num_tokens if pure_decode else 0
        threads = self._num_threads
        if self.decode_threads is not None:
            threads = self.decode_threads.threads_for(decode_rows) if pure_decode else self._num_threads
            self.model.gemm_threads = threads  # type: ignore[attr-defined]
        logits, rows = self.runner.run(out.items)
        self.scheduler.postprocess(out)
        sampling = [(it, r) for it, r in zip(out.items, rows, strict=True) if r >= 0]
        if sampling and logits is not None:
            self._sample_and_accept(logits, sampling)
        self.steps += 1
        num_decode = sum(1 for it in out.items if it.is_decode)
        elapsed = clock() - t0
        self.timer.record(elapsed, out.num_tokens, num_decode)
        if self.decode_threads is not None and pure_decode:
            self.decode_threads.record(decode_rows, threads, elapsed)

    def _sample_and_accept(self, logits: torch.Tensor, sampling: list[tuple[ScheduledSeq, int]]) -> None:
        """Sample each item's next token; a verifying item (speculative draft of k tokens) continues row by row.

        Round j samples row j of every item still verifying, exactly as a plain step samples its one row (hooks
        asked then told, stop rules, one random draw), so the tokens are those of plain decoding. The drafted
        token j is kept when the sample at row j equals it (its keys/values, written this step, become part of
        the sequence); the first mismatch is emitted as the real token and ends that item's draft.
        """
        live = [(it, r - len(it.draft)) for it, r in sampling]  # (item, logits row of round 0)
        j = 0
        while live:
            rows = [r + j for _, r in live]
            seqs = [it.seq for it, _ in live]
            block = logits if len(rows) == logits.shape[0] and j == 0 else logits[torch.tensor(rows)]
            tokens, lps = self.sampler(block, seqs)
            now = time.monotonic()
            going: list[tuple[ScheduledSeq, int]] = []
            for (it, r), tok, lp in zip(live, tokens, lps, strict=True):
                seq = it.seq
                self._accept(seq, tok, lp, now)
                if not it.draft:
                    continue
                kept = j < len(it.draft) and tok == it.draft[j] and not seq.is_finished
                if kept:
                    seq.num_computed_tokens += 1  # the drafted token's keys/values are now the sequence's
                    going.append((it, r))
                    continue
                assert self.drafter is not None
                self.drafter.record(seq, len(it.draft), j)
                if not seq.is_finished:
                    self.block_manager.commit(seq)
            live = going
            j += 1

    def _accept(self, seq: Sequence, token: int, lp: TokenLogprob | None, now: float) -> None:
        terminated = False
        if seq.error is None and seq.hook is not None:
            try:
                seq.hook.accept_token(token)
                terminated = bool(seq.hook.is_terminated())
            except Exception as exc:  # noqa: BLE001 - a broken hook fails its request, not the batch
                seq.error = f"token hook failed: {type(exc).__name__}: {exc}"
        if seq.error is not None:
            self._finish(seq, "abort", error=EngineError(f"request {seq.request_id!r} failed: {seq.error}"))
            return
        if seq.first_token_time is None:
            seq.first_token_time = now
        reason = self.scheduler.append_token(seq, token, self.eos_token_ids)
        self.tokens_generated += 1
        if lp is not None:
            seq.logprobs.append(lp)
        if reason is None and terminated:
            reason = "stop"
        if reason is None and seq.params.stop and self._hits_stop_string(seq):
            reason = "stop"
        if reason is not None:
            self._finish(seq, reason)
        else:
            self._emit(seq)

    def _hits_stop_string(self, seq: Sequence) -> bool:
        stops = seq.params.stop
        longest = max(len(s) for s in stops)
        out = seq.output_token_ids
        window = out[-(longest + 8) :]  # every token decodes to >= 1 char except partial UTF-8 pieces
        tail = self.tokenizer.decode(window, skip_special_tokens=False)
        prev = self.tokenizer.decode(window[:-1], skip_special_tokens=False) if len(window) > 1 else ""
        # Only a match that ends in the newest token counts, so a stop string is detected exactly once.
        return any(s in tail and s not in prev for s in stops)
