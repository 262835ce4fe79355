"""The engine: validated submission, a background step loop, blocking and async front ends.

One thread owns the model, the scheduler and every `Sequence`; callers talk to it through a
thread-safe command queue and receive results through per-request sinks (an asyncio queue fed with
`call_soon_threadsafe`, or a plain queue for the blocking API), so the asyncio side never blocks and
never touches engine state. A step: drop requests past their deadline, schedule, run the model,
sample, append tokens, finish what finished (returning its blocks), emit deltas.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from collections.abc import Sequence as Seq
from typing import Any

import torch

from parley.local_engine import loader
from parley.local_engine.block_manager import BlockManager, release_window
from parley.local_engine.config import EngineConfig, SamplingParams
from parley.local_engine.errors import (
    AdmissionError,
    EngineConfigError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    RequestAborted,
)
from parley.local_engine.hooks import ComposedHook, TokenHook
from parley.local_engine.models import registry
from parley.local_engine.models.decoder import DecoderModel
from parley.local_engine.outputs import GenerationOutput, StreamDelta, TokenLogprob
from parley.local_engine.quant import calibration_ids, check_quantization, quantization_unavailable_reason
from parley.local_engine.runner import CausalLM, ModelRunner
from parley.local_engine.sampler import Sampler
from parley.local_engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from parley.local_engine.sequence import Sequence
from parley.local_engine.speculative import NgramDrafter
from parley.local_engine.step_timer import StepTimer
from parley.local_engine.threads import DecodeThreads, omp_set_num_threads

Sink = Callable[[Any], None]
_DEADLINE = "deadline"
_POLL_S = 0.25  # how often a waiting caller checks that the step loop is still alive


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _usable_cores() -> int:
    getaffinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core counts
    return len(getaffinity(0)) if getaffinity else (os.cpu_count() or 1)


def _as_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise EngineConfigError(f"unsupported dtype {dtype!r}; use one of {sorted(names)}")
    return names[dtype]


def _as_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return _default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise EngineConfigError(f"unsupported device {device!r}: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineConfigError(f"device {device!r} asked for CUDA, which this machine (or torch build) lacks")
    return dev


def _name_of(model_id: str) -> str:
    """A display name from an identity such as ``name@hash/dtype`` (or a path)."""
    parts = [p for p in model_id.split("@", 1)[0].replace("\\", "/").split("/") if p]
    if len(parts) > 1 and parts[-1].split("+", 1)[0] in ("float32", "bfloat16", "float16", "float64"):
        parts.pop()  # a dtype suffix is not part of the name
    return parts[-1] if parts else model_id


class Engine:
    """Paged-KV continuous-batching engine over one model on one device."""

    def __init__(
        self,
        model: CausalLM,
        tokenizer: Any,
        *,
        model_id: str,
        vocab_size: int,
        max_model_len: int,
        eos_token_ids: frozenset[int] = frozenset(),
        config: EngineConfig | None = None,
        model_name: str | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        cfg = self.config
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        """The model's identity (name, content hash, dtype): part of every prefix-cache key. Not for display."""
        self.model_name = model_name or _name_of(model_id)
        """The model's own name, e.g. ``SmolLM2-135M-Instruct`` (what `parley serve` lists by default)."""
        self.vocab_size = vocab_size
        self.max_model_len = min(max_model_len, cfg.max_model_len or max_model_len)
        self.eos_token_ids = eos_token_ids
        self.device = model.device
        self.dtype = model.dtype
        self._num_threads = cfg.num_threads or _usable_cores()
        if self.device.type == "cpu" and hasattr(model, "gemm_threads"):
            model.gemm_threads = self._num_threads
        self.decode_threads: DecodeThreads | None = None
        if self.device.type == "cpu" and hasattr(model, "gemm_threads") and cfg.adaptive_threads:
            self.decode_threads = DecodeThreads(self._num_threads)
        num_blocks = cfg.num_kv_blocks
        if num_blocks is None:
            num_blocks = max(cfg.kv_cache_bytes // (model.kv_bytes_per_token() * cfg.block_size), 4)
        self.block_manager = BlockManager(
            num_blocks, cfg.block_size, model_identity=model_id, enable_prefix_caching=cfg.enable_prefix_caching,
            window=release_window(getattr(model, "attention_windows", None)),  # all-windowed: blocks freed early
        )
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_num_seqs=cfg.max_num_seqs,
            max_model_len=self.max_model_len,
        )
        self.runner = ModelRunner(model, num_blocks, cfg.block_size)
        self.compile_s: float | None = None
        if cfg.compile:
            from parley.local_engine.compile import compiled_decode

            compiled = compiled_decode(model)
            if compiled is not None and compiled.warm_up(self.runner.kv_cache, scratch_slot=0):
                self.runner.compiled = compiled
            self.compile_s = None if compiled is None else round(compiled.compile_s, 3)
        self.drafter: NgramDrafter | None = None
        if cfg.speculation == "ngram":
            self.drafter = NgramDrafter(cfg.speculative_tokens)
            self.scheduler.drafter = self.drafter.propose
        self.sampler = Sampler(vocab_size, self.device, eos_token_ids)
        self.timer = StepTimer()
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._by_id: dict[str, Sequence] = {}  # engine-thread view of live requests
        self._sinks: dict[str, Sink] = {}
        self._ids_lock = threading.Lock()
        self._live_ids: set[str] = set()  # ids submitted and not finished (checked at submission)
        self._waiting_count = 0
        self._waiting_tokens = 0  # prompt tokens of requests not yet admitted (deadline estimates)
        self._counter = itertools.count()
        self._closed = False
        self._steps = 0
        self._tokens_generated = 0
        self._failed_steps = 0
        self._failure: EngineError | None = None  # set once the step loop has died; the engine is then unusable
        self._thread = threading.Thread(target=self._loop, name="parley-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        model: str | os.PathLike[str] | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        config: EngineConfig | None = None,
        quantization: str | None = None,
    ) -> Engine:
        """Load a model: None = the embedded SmolLM2, else a .gguf file or a HF folder of a family that
        `models.registry.MODEL_TYPES` lists (Llama, Mistral, Qwen2/2.5, Qwen3, Qwen3-MoE, gpt-oss).

        `quantization` ("int8", "q4" or "q8"; CPU fp32; see quant.py, quant4.py) overrides `config.quantization`.

        Errors are `ParleyError`s: `ModelNotFoundError` (nothing local to load), `ModelLoadError` (unreadable
        files, an unsupported architecture or config field, missing, misshapen or unused weights),
        `EngineConfigError` (a bad `device`/`dtype`/`quantization`, or a quantization this machine cannot run).
        """
        dev = _as_device(device)
        dt = _as_dtype(dtype, dev)
        config = config or EngineConfig()
        if quantization is not None:
            config = dataclasses.replace(config, quantization=check_quantization(quantization, field="quantization"))
        if config.quantization is not None:
            why = quantization_unavailable_reason(config.quantization, dev, dt)
            if why is not None:
                raise EngineConfigError(f"quantization={config.quantization!r} cannot run here: {why}")
        files = loader.resolve(model)
        family, arch = registry.architecture(loader.load_config(files.folder))
        state = loader.load_state_dict(files.folder)
        if config.quantization in ("q4", "q8") and files.source.suffix == ".gguf":
            from parley.local_engine.gguf_weights import overlay

            # the file's Q4_x / Q8_0 layer blocks replace their dequantised copies (gguf_weights.py)
            try:
                overlay(files.source, state, config.quantization, num_heads=arch.num_heads,
                        num_kv_heads=arch.num_kv_heads)
            except (ValueError, OSError, KeyError, IndexError) as exc:  # gguf's reader on a damaged file
                raise ModelLoadError(f"cannot read the quantised blocks of {files.source}: {exc}") from exc
        # Weights are checked before the tokenizer is read (a bad tensor is named, whatever the tokenizer);
        # only a quantized load needs it first, for its calibration prompt.
        tokenizer = loader.load_tokenizer(files.folder) if config.quantization is not None else None
        calibration = calibration_ids(tokenizer) if tokenizer is not None else None
        try:
            net = family.from_hf_state_dict(arch, state, dev, dt, quantization=config.quantization,
                                            quantize_lm_head=config.quantize_lm_head, calibration_ids=calibration)
        except (KeyError, ValueError, RuntimeError) as exc:  # a tensor that cannot be converted
            raise ModelLoadError(f"{files.folder}: {exc}") from exc
        del state
        if tokenizer is None:
            tokenizer = loader.load_tokenizer(files.folder)
        mode = str(dt).removeprefix("torch.")
        if config.quantization is not None:  # KV computed under other weights is never shared (prefix cache key)
            mode += f"+{config.quantization}" + ("+head" if config.quantize_lm_head else "")
        return cls.from_model(
            net, tokenizer, model_id=f"{files.model_id}/{mode}",
            model_name=files.name, eos_token_ids=loader.eos_token_ids(files.folder, tokenizer), config=config,
        )

    @classmethod
    def from_model(
        cls, net: DecoderModel, tokenizer: Any, *, model_id: str, eos_token_ids: frozenset[int] = frozenset(),
        config: EngineConfig | None = None, model_name: str | None = None,
    ) -> Engine:
        """Wrap an already-built model (tests build tiny random ones)."""
        return cls(
            net, tokenizer, model_id=model_id, model_name=model_name, vocab_size=net.arch.vocab_size,
            max_model_len=net.arch.max_position_embeddings, eos_token_ids=eos_token_ids, config=config,
        )

    # ------------------------------------------------------------------ submission (any thread)
    def _validate(self, prompt: Seq[int], params: SamplingParams) -> list[int]:
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"params must be SamplingParams, got {type(params).__name__}")
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"prompt must be a sequence of token ids: {exc}") from exc
        if not ids:
            raise InvalidRequestError("prompt is empty")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"prompt has {len(ids)} tokens; the model's context is {self.max_model_len} (room for >= 1 output)"
            )
        bad = next((t for t in ids if t < 0 or t >= self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"token id {bad} is out of range [0, {self.vocab_size})")
        if self.block_manager.blocks_to_hold(len(ids) + 1, self.config.max_num_batched_tokens) > (
            self.block_manager.num_blocks
        ):
            raise InvalidRequestError(
                f"prompt of {len(ids)} tokens does not fit the KV pool ({self.block_manager.num_blocks} blocks)"
            )
        return ids

    def _joining_batch(self) -> int:
        """Sequences a request arriving now would decode alongside (itself included)."""
        return min(len(self.scheduler.running) + self._waiting_count + 1, self.config.max_num_seqs)

    def _estimate_s(self, ahead_tokens: int, prompt_tokens: int, max_tokens: int) -> float | None:
        return self.timer.estimate_s(batch=self._joining_batch(), ahead_tokens=ahead_tokens,
                                     prompt_tokens=prompt_tokens, max_tokens=max_tokens)

    def _submit(
        self,
        prompt: Seq[int],
        params: SamplingParams,
        sink: Sink,
        *,
        hooks: TokenHook | Seq[TokenHook] | None,
        tenant: str | None,
        request_id: str | None,
        deadline_s: float | None,
    ) -> Sequence:
        if self._closed:
            raise EngineError("the engine is closed")
        self._raise_if_failed()
        ids = self._validate(prompt, params)
        rid = request_id or f"req-{next(self._counter)}-{uuid.uuid4().hex[:8]}"
        hook: Any = None
        if hooks is not None:
            hook = ComposedHook(list(hooks)) if isinstance(hooks, (list, tuple)) else hooks
        now = time.monotonic()
        if deadline_s is not None:
            if not deadline_s > 0:
                raise InvalidRequestError(f"deadline_s must be > 0, got {deadline_s!r}")
            est = self._estimate_s(self._waiting_tokens, len(ids), params.max_tokens)
            if est is not None and est > deadline_s:
                raise AdmissionError(
                    f"request cannot finish within its deadline of {deadline_s:.3f}s (estimated {est:.3f}s)",
                    retry_after_s=max(est - deadline_s, 0.0),
                )
        with self._ids_lock:
            if self._waiting_count >= self.config.max_waiting:
                est = self._estimate_s(self._waiting_tokens, 0, 0)
                raise AdmissionError(
                    f"the waiting queue is full ({self.config.max_waiting} requests)", retry_after_s=est or 1.0
                )
            if rid in self._live_ids:
                raise InvalidRequestError(f"request id {rid!r} is already in flight")
            self._live_ids.add(rid)
            self._waiting_count += 1
            self._waiting_tokens += len(ids)
        seq = Sequence(
            rid, ids, params, hook=hook, tenant=tenant,
            deadline=None if deadline_s is None else now + deadline_s, arrival_time=now,
        )
        seq.counted_waiting = True
        self._commands.put(("add", (seq, sink)))
        return seq

    def abort(self, request_id: str) -> None:
        """Cancel a request: it finishes with reason "abort" and its blocks return to the pool at once."""
        self._commands.put(("abort", request_id))

    # ------------------------------------------------------------------ front ends
    def generate(
        self,
        prompts: Seq[Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        hooks: Seq[TokenHook | None] | None = None,
        tenant: str | None = None,
    ) -> list[GenerationOutput]:
        """Run a batch to completion (blocking). Outputs are in prompt order."""
        params = params if params is not None else SamplingParams()
        plist = list(params) if not isinstance(params, SamplingParams) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequestError("params must be one SamplingParams or one per prompt")
        for prompt, sp in zip(prompts, plist, strict=True):  # validate every prompt before submitting any
            self._validate(prompt, sp)
        results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        seqs = []
        for i, (prompt, sp) in enumerate(zip(prompts, plist, strict=True)):
            hook = hooks[i] if hooks is not None else None

            def sink(item: Any, i: int = i) -> None:
                results.put((i, item))

            seqs.append(self._submit(prompt, sp, sink, hooks=hook, tenant=tenant, request_id=None, deadline_s=None))
        outputs: list[GenerationOutput | None] = [None] * len(prompts)
        pending = len(prompts)
        while pending:
            i, item = self._next_result(results)
            if isinstance(item, BaseException):
                for s in seqs:
                    self.abort(s.request_id)
                raise item
            if isinstance(item, GenerationOutput):
                outputs[i] = item
                pending -= 1
        return [o for o in outputs if o is not None]

    async def stream(
        self,
        prompt_ids: Seq[int],
        params: SamplingParams | None = None,
        *,
        hooks: TokenHook | Seq[TokenHook] | None = None,
        tenant: str | None = None,
        request_id: str | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[StreamDelta]:
        """Async iterator of token deltas; the last has `finished=True`. Leaving early aborts the request.

        Raises `RequestAborted` if the request is dropped past its deadline, `AdmissionError` or
        `InvalidRequestError` at submission.
        """
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Any] = asyncio.Queue()

        def sink(item: Any) -> None:
            loop.call_soon_threadsafe(q.put_nowait, item)

        seq = self._submit(prompt_ids, params or SamplingParams(), sink, hooks=hooks, tenant=tenant,
                           request_id=request_id, deadline_s=deadline_s)
        done = False
        try:
            while True:
                item = await self._next_item(q)
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if isinstance(item, GenerationOutput):
                    continue
                yield item
                if item.finished:
                    done = True
                    return
        finally:
            if not done:
                self.abort(seq.request_id)

    # ------------------------------------------------------------------ waiting on a live loop
    @property
    def failed(self) -> bool:
        """True once the step loop has died; every later submission raises `EngineError`."""
        return self._failure is not None

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._dead_error()

    def _dead_error(self) -> EngineError:
        """A fresh error for a caller whose request can never finish (the loop is gone)."""
        if self._failure is not None:
            err = EngineError(str(self._failure))
            err.__cause__ = self._failure.__cause__
            return err
        if self._closed:
            return EngineError("the engine was closed before the request finished")
        return EngineError("the engine's step loop is not running")

    def _next_result(self, results: queue.SimpleQueue[Any]) -> Any:
        """Next item for a blocking caller; raises instead of waiting forever on a dead step loop."""
        while True:
            try:
                return results.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive():
                    try:
                        return results.get_nowait()  # delivered just before the loop ended
                    except queue.Empty:
                        raise self._dead_error() from None

    async def _next_item(self, q: asyncio.Queue[Any]) -> Any:
        """Next item for a stream; raises instead of awaiting forever on a dead step loop."""
        while True:
            if not q.empty():
                return q.get_nowait()
            try:
                return await asyncio.wait_for(q.get(), timeout=_POLL_S)
            except asyncio.TimeoutError:
                if not self._thread.is_alive():
                    await asyncio.sleep(0)  # let a delivery scheduled just before the loop died land
                    if q.empty():
                        raise self._dead_error() from None

    # ------------------------------------------------------------------ figures and lifetime
    def stats(self) -> dict[str, Any]:
        s: dict[str, Any] = dict(self.block_manager.stats())
        s.update(self.scheduler.stats())
        s.update(
            steps=self._steps, tokens_generated=self._tokens_generated, failed_steps=self._failed_steps,
            failed=self.failed,
            decode_step_s=self.timer.decode_step_s(self._joining_batch()), prefill_token_s=self.timer.prefill_token_s(),
            decode_step_s_by_batch=self.timer.by_batch(),
            model_id=self.model_id, device=str(self.device), dtype=str(self.dtype).removeprefix("torch."),
            window_blocks_skipped=self.runner.window_blocks_skipped,
            model_type=getattr(getattr(self.model, "arch", None), "model_type", None),
            quantization=getattr(self.model, "quantization", None), speculation=self.config.speculation,
            compiled=self.runner.compiled is not None, compile_s=self.compile_s,
            decode_threads=None if self.decode_threads is None else self.decode_threads.stats(),
        )
        if self.drafter is not None:
            s.update(self.drafter.stats())
        return s

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._commands.put(("stop", None))
        self._thread.join(timeout=30)
        if self.runner.compiled is not None:
            self.runner.compiled.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ engine thread
    def _deliver(self, seq: Sequence, item: Any) -> None:
        sink = self._sinks.get(seq.request_id)
        if sink is None:
            return
        try:
            sink(item)
        except RuntimeError:  # the consumer's event loop is gone: nobody is listening
            if not seq.is_finished:
                self._finish(seq, "abort", notify=False)

    def _finish(self, seq: Sequence, reason: str, *, notify: bool = True, error: BaseException | None = None) -> None:
        self._uncount_waiting(seq)
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
        with self._ids_lock:
            self._live_ids.discard(seq.request_id)

    def _uncount_waiting(self, seq: Sequence) -> None:
        """A request leaves the admission queue once: at its first admission or when it ends before."""
        if getattr(seq, "counted_waiting", False):
            seq.counted_waiting = False
            with self._ids_lock:
                self._waiting_count -= 1
                self._waiting_tokens -= seq.num_prompt_tokens

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
            self._failed_steps += 1
        failure = EngineError(f"the engine failed and accepts no more requests: {type(exc).__name__}: {exc}")
        failure.__cause__ = exc
        self._failure = failure
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
                sink(self._dead_error())
            except Exception:  # noqa: BLE001, S110 - a consumer that is gone needs no notice
                pass
        with self._ids_lock:
            self._live_ids.clear()
            self._waiting_count = 0
            self._waiting_tokens = 0

    def _run_loop(self) -> None:
        if self.device.type == "cpu":
            # Thread counts are per thread (OpenMP's team size, MKL's local count): the engine thread sets
            # its own. Bookkeeping and sampling then run on one OpenMP thread (tiny ops); the model raises it
            # to `num_threads` for its weight GEMMs (see threads.py).
            torch.set_num_threads(self._num_threads)
            omp = omp_set_num_threads()
            if omp is not None:
                omp(1)
        while True:
            if not self._drain_commands(block=not self.scheduler.has_work()):
                break
            self._step()
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._finish(seq, "abort", error=RequestAborted("the engine was closed"))

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
            self._uncount_waiting(it.seq)
        for seq in out.finished:
            self._finish_after_schedule(seq)
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
        self._steps += 1
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

    def _finish_after_schedule(self, seq: Sequence) -> None:
        # The scheduler already ended it (pool too small to continue); tell the consumer.
        seq.finish_time = time.monotonic()
        self._emit(seq, final=True)
        self._deliver(seq, self._output(seq))
        self._sinks.pop(seq.request_id, None)
        self._by_id.pop(seq.request_id, None)
        with self._ids_lock:
            self._live_ids.discard(seq.request_id)

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
        self._tokens_generated += 1
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
