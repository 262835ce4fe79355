"""The engine's public face: loading, validated submission, admission, and blocking and async front ends.

Everything here runs on the callers' threads. One background thread owns the model, the scheduler and
every `Sequence`; its step loop is `core.EngineCore`, kept in its own module so that each file holds
one side of the thread boundary. Callers reach it only through the core's command queue (`add`,
`abort`, `stop`) and receive results through per-request sinks; the admission counts both threads
change sit in `core.Admission`, under its lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import queue
import time
import uuid
from collections.abc import AsyncIterator
from collections.abc import Sequence as Seq
from typing import Any

import torch

from parley.local_engine import loader
from parley.local_engine.auto_mode import choose_quantization, choose_speculation
from parley.local_engine.block_manager import BlockManager, release_window
from parley.local_engine.config import AUTO, EngineConfig, SamplingParams, normalize_quantization
from parley.local_engine.core import Admission, EngineCore, Sink
from parley.local_engine.delivery import LoopSink
from parley.local_engine.errors import (
    DeadlineUnreachableError,
    EngineConfigError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    QueueFullError,
)
from parley.local_engine.hooks import ComposedHook, TokenHook
from parley.local_engine.models import registry
from parley.local_engine.models.decoder import DecoderModel
from parley.local_engine.outputs import GenerationOutput, StreamDelta
from parley.local_engine.quant import calibration_ids, quantization_unavailable_reason
from parley.local_engine.runner import CausalLM, ModelRunner
from parley.local_engine.sampler import Sampler
from parley.local_engine.scheduler import Scheduler
from parley.local_engine.sequence import Sequence
from parley.local_engine.speculative import NgramDrafter
from parley.local_engine.step_timer import StepTimer
from parley.local_engine.threads import DecodeThreads
from parley.local_engine.tokenizer import Tokenizer

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


def _as_built(config: EngineConfig, model: Any) -> EngineConfig:
    """`config` with its "auto" fields settled for a model that is already built (from_pretrained settles them
    before building): the net's own quantisation, and no speculation."""
    built = getattr(model, "quantization", None)
    quantization = built if config.quantization in (AUTO, None) else config.quantization
    head = config.quantize_lm_head
    if head is None:
        head = bool(getattr(model, "quantize_lm_head", False))
    speculation = None if config.speculation == AUTO else config.speculation
    if (quantization, head, speculation) == (config.quantization, config.quantize_lm_head, config.speculation):
        return config
    return dataclasses.replace(config, quantization=quantization, quantize_lm_head=head and quantization is not None,
                               speculation=speculation)


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
        tokenizer: Tokenizer,
        *,
        model_id: str,
        vocab_size: int,
        max_model_len: int,
        eos_token_ids: frozenset[int] = frozenset(),
        config: EngineConfig | None = None,
        model_name: str | None = None,
        mode_reason: str | None = None,
    ) -> None:
        self.config = _as_built(config or EngineConfig(), model)
        cfg = self.config
        self.mode_reason = mode_reason or "as built (Engine.from_model)"
        """Why the weights run as they do (auto_mode.py): shown by `parley serve` and `stats()`."""
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
        num_threads = cfg.num_threads or _usable_cores()
        if self.device.type == "cpu" and hasattr(model, "gemm_threads"):
            model.gemm_threads = num_threads
        self.decode_threads: DecodeThreads | None = None
        if self.device.type == "cpu" and hasattr(model, "gemm_threads") and cfg.adaptive_threads:
            self.decode_threads = DecodeThreads(num_threads)
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
            if compiled is not None and compiled.warm_up(self.runner.kv_cache, scratch_slot=self.runner.scratch_slot):
                self.runner.compiled = compiled
            self.compile_s = None if compiled is None else round(compiled.compile_s, 3)
        self.cuda_graphs_off: str | None = None  # why decode steps run eager on CUDA (None: graphed, or CPU)
        if self.device.type == "cuda":
            from parley.local_engine.cuda_graphs import GraphedDecode, unsupported_reason

            self.cuda_graphs_off = "EngineConfig.cuda_graphs is off" if not cfg.cuda_graphs else (
                unsupported_reason(model))
            if self.cuda_graphs_off is None:
                rows = cfg.max_num_seqs + cfg.speculative_max_batch * cfg.speculative_tokens  # verify rows too
                self.runner.graphs = GraphedDecode(model, scratch_slot=self.runner.scratch_slot, max_rows=rows)
        self.drafter: NgramDrafter | None = None
        if cfg.speculation == "ngram":
            self.drafter = NgramDrafter(cfg.speculative_tokens)
            self.scheduler.drafter = self.drafter.propose
            self.scheduler.draft_max_batch = cfg.speculative_max_batch
        self.sampler = Sampler(vocab_size, self.device, eos_token_ids)
        self.timer = StepTimer()
        self._admission = Admission()
        self._counter = itertools.count()
        self._closed = False
        self._core = EngineCore(
            model, tokenizer, eos_token_ids=eos_token_ids, block_manager=self.block_manager,
            scheduler=self.scheduler, runner=self.runner, sampler=self.sampler, timer=self.timer,
            drafter=self.drafter, decode_threads=self.decode_threads, num_threads=num_threads,
            admission=self._admission, stream_interval_s=cfg.stream_interval_s,
        )
        self._core.start()

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

        `quantization` ("auto", None/"none", "int8", "q4" or "q8"; the quantised modes are CPU fp32; see
        auto_mode.py, quant.py, quant4.py) overrides `config.quantization`, whose default is "auto": on CPU
        fp32 a 4-bit GGUF runs q4 and any other model q8, both with an 8-bit LM head; elsewhere the dtype.

        Errors are `ParleyError`s: `ModelNotFoundError` (nothing local to load), `ModelLoadError` (unreadable
        files, an unsupported architecture or config field, missing, misshapen or unused weights),
        `EngineConfigError` (a bad `device`/`dtype`/`quantization`, or a quantization this machine cannot run).
        """
        dev = _as_device(device)
        dt = _as_dtype(dtype, dev)
        config = config or EngineConfig()
        if quantization is not None:
            scheme = normalize_quantization(quantization, field="quantization")
            config = dataclasses.replace(config, quantization=scheme)
        files = loader.resolve(model)
        mode_reason = "as asked"
        if config.quantization == AUTO:
            choice = choose_quantization(files.source, dev, dt, quantize_lm_head=config.quantize_lm_head)
            config = dataclasses.replace(config, quantization=choice.quantization,
                                         quantize_lm_head=choice.quantize_lm_head)
            mode_reason = choice.reason
        config = dataclasses.replace(config, quantize_lm_head=bool(config.quantize_lm_head),
                                     speculation=choose_speculation(config.speculation))
        if config.quantization is not None:
            why = quantization_unavailable_reason(config.quantization, dev, dt)
            if why is not None:
                raise EngineConfigError(f"quantization={config.quantization!r} cannot run here: {why}")
        family, arch = registry.architecture(loader.load_config(files.folder))
        state = loader.load_state_dict(files.folder)
        if config.quantization in ("q4", "q8") and files.source.suffix == ".gguf":
            from parley.local_engine.gguf_weights import overlay

            # the file's layer blocks (Q4_x ... Q6_K: gguf_weights.loadable_types) replace their dequantised copies
            try:
                overlay(files.source, state, config.quantization, num_heads=arch.num_heads,
                        num_kv_heads=arch.num_kv_heads)
            except (ValueError, OSError, KeyError, IndexError) as exc:  # gguf's reader on a damaged file
                raise ModelLoadError(f"cannot read the quantised blocks of {files.source}: {exc}") from exc
        # Weights are checked before the tokenizer is read (a bad tensor is named, whatever the tokenizer);
        # only an int8 load needs it first, for its calibration prompt (quant.py; q4/q8 keep no activation ranges).
        tokenizer = loader.load_tokenizer(files.folder) if config.quantization == "int8" else None
        calibration = calibration_ids(tokenizer) if tokenizer is not None else None
        try:
            net = family.from_hf_state_dict(arch, state, dev, dt, quantization=config.quantization,
                                            quantize_lm_head=bool(config.quantize_lm_head), calibration_ids=calibration)
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
            mode_reason=mode_reason,
        )

    @classmethod
    def from_model(
        cls, net: DecoderModel, tokenizer: Tokenizer, *, model_id: str, eos_token_ids: frozenset[int] = frozenset(),
        config: EngineConfig | None = None, model_name: str | None = None, mode_reason: str | None = None,
    ) -> Engine:
        """Wrap an already-built model (tests build tiny random ones). It runs as built: `"auto"` in `config`
        takes the net's own quantisation and no speculation (auto_mode.py says why)."""
        return cls(
            net, tokenizer, model_id=model_id, model_name=model_name, vocab_size=net.arch.vocab_size,
            max_model_len=net.arch.max_position_embeddings, eos_token_ids=eos_token_ids, config=config,
            mode_reason=mode_reason,
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
        return min(len(self.scheduler.running) + self._admission.waiting_count + 1, self.config.max_num_seqs)

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
            est = self._estimate_s(self._admission.waiting_tokens, len(ids), params.max_tokens)
            if est is not None and est > deadline_s:
                raise DeadlineUnreachableError(
                    f"request cannot finish within its deadline of {deadline_s:.3f}s (estimated {est:.3f}s)",
                    retry_after_s=max(est - deadline_s, 0.0),
                )
        adm = self._admission
        with adm.lock:
            if adm.waiting_count >= self.config.max_waiting:
                est = self._estimate_s(adm.waiting_tokens, 0, 0)
                raise QueueFullError(
                    f"the waiting queue is full ({self.config.max_waiting} requests)", retry_after_s=est or 1.0
                )
            if rid in adm.live_ids:
                raise InvalidRequestError(f"request id {rid!r} is already in flight")
            adm.live_ids.add(rid)
            adm.waiting_count += 1
            adm.waiting_tokens += len(ids)
        seq = Sequence(
            rid, ids, params, hook=hook, tenant=tenant,
            deadline=None if deadline_s is None else now + deadline_s, arrival_time=now,
        )
        seq.counted_waiting = True
        self._core.add(seq, sink)
        return seq

    def abort(self, request_id: str) -> None:
        """Cancel a request: it finishes with reason "abort" and its blocks return to the pool at once."""
        self._core.abort(request_id)

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

        A delta holds the tokens new since the previous one: usually one step's, more when the consumer
        fell behind (unread deltas merge, delivery.py). A step's items reach the loop in one wakeup.

        Raises `RequestAborted` if the request is dropped past its deadline, an `AdmissionError`
        (`QueueFullError`, `DeadlineUnreachableError`) or `InvalidRequestError` at submission.
        """
        sink = LoopSink(asyncio.get_running_loop())
        seq = self._submit(prompt_ids, params or SamplingParams(), sink, hooks=hooks, tenant=tenant,
                           request_id=request_id, deadline_s=deadline_s)
        done = False
        try:
            while True:
                item = await self._next_item(sink)
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
        return self._core.failure is not None

    def _raise_if_failed(self) -> None:
        if self._core.failure is not None:
            raise self._dead_error()

    def _dead_error(self) -> EngineError:
        """A fresh error for a caller whose request can never finish (the loop is gone)."""
        err = self._core.fresh_failure()
        if err is not None:
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
                if not self._core.alive:
                    try:
                        return results.get_nowait()  # delivered just before the loop ended
                    except queue.Empty:
                        raise self._dead_error() from None

    async def _next_item(self, sink: LoopSink) -> Any:
        """Next item for a stream; raises instead of awaiting forever on a dead step loop."""
        while not sink.items:
            await sink.wait(_POLL_S)
            if not sink.items and not self._core.alive:
                await asyncio.sleep(0)  # let a delivery scheduled just before the loop died land
                if not sink.items:
                    raise self._dead_error() from None
        return sink.items.popleft()

    # ------------------------------------------------------------------ figures and lifetime
    @property
    def mode(self) -> str:
        """How the engine runs, in one token: dtype, weights mode, LM head, speculation (``float32+q4+head8+ngram``)."""
        parts = [str(self.dtype).removeprefix("torch.")]
        quantization = getattr(self.model, "quantization", None)
        if quantization is not None:
            parts.append(quantization)
            if getattr(self.model, "quantize_lm_head", False):
                parts.append("head8" if quantization in ("q4", "q8") else "head")
        if self.config.speculation is not None:
            parts.append(self.config.speculation)
        if self.runner.compiled is not None:
            parts.append("compiled")
        if self.runner.graphs is not None:
            parts.append("graphs")
        return "+".join(parts)

    def stats(self) -> dict[str, Any]:
        s: dict[str, Any] = dict(self.block_manager.stats())
        s.update(self.scheduler.stats())
        s.update(
            steps=self._core.steps, tokens_generated=self._core.tokens_generated,
            failed_steps=self._core.failed_steps,
            failed=self.failed,
            decode_step_s=self.timer.decode_step_s(self._joining_batch()), prefill_token_s=self.timer.prefill_token_s(),
            decode_step_s_by_batch=self.timer.by_batch(),
            model_id=self.model_id, device=str(self.device), dtype=str(self.dtype).removeprefix("torch."),
            window_blocks_skipped=self.runner.window_blocks_skipped,
            model_type=getattr(getattr(self.model, "arch", None), "model_type", None),
            quantization=getattr(self.model, "quantization", None), speculation=self.config.speculation,
            quantize_lm_head=bool(getattr(self.model, "quantize_lm_head", False)), mode=self.mode,
            mode_reason=self.mode_reason,
            compiled=self.runner.compiled is not None, compile_s=self.compile_s,
            cuda_graphs=None if self.runner.graphs is None else self.runner.graphs.stats(),
            decode_threads=None if self.decode_threads is None else self.decode_threads.stats(),
        )
        if self.drafter is not None:
            s.update(self.drafter.stats())
        return s

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._core.stop(timeout=30)
        if self.runner.compiled is not None:
            self.runner.compiled.close()
        if self.runner.graphs is not None:
            self.runner.graphs.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
