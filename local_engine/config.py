"""Engine and request configuration: plain dataclasses, validated at construction, torch-free.

`EngineConfig` sizes the engine (KV pool, batching budget, admission); `SamplingParams` is what one
request asks for. Both fail early (`EngineConfigError`, `InvalidRequestError`: both `EngineError`s, so
`ParleyError`s; the first is also a `ValueError`) so bad input never reaches
the step loop, where an exception would hurt every request in the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parley.local_engine.errors import EngineConfigError, InvalidRequestError

QUANTIZATIONS: tuple[str, ...] = ("int8", "q4", "q8")
"""`EngineConfig.quantization` values (quant.py implements them; this module stays torch-free)."""
SPECULATION_METHODS: tuple[str, ...] = ("ngram",)
"""`EngineConfig.speculation` values (speculative.py)."""
AUTO = "auto"
"""The default of `quantization` and `speculation`: chosen at load from the device and the file (auto_mode.py)."""


def normalize_quantization(value: object, *, field: str = "EngineConfig.quantization") -> str | None:
    """A `quantization` value as stored: None, "auto" or a scheme, lower-case; "none"/"off"/"fp32" mean None."""
    if value is None:
        return None
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("none", "off", "fp32", "float"):
            return None
        if lowered == AUTO or lowered in QUANTIZATIONS:
            return lowered
    raise EngineConfigError(f"{field} must be None, {AUTO!r} or one of {list(QUANTIZATIONS)}, got {value!r}")


@dataclass(frozen=True)
class EngineConfig:
    """How the engine is sized. Every field has a CPU-friendly default.

    - `block_size`: tokens per KV block. 16 (not 256) so short shared system prompts still hit the cache.
    - `kv_cache_bytes` / `num_kv_blocks`: KV pool size; `num_kv_blocks` wins when both are set.
    - `max_num_batched_tokens`: per-step token budget shared by decodes and prefill chunks.
    - `max_num_seqs`: most sequences running at once.
    - `max_waiting`: bounded admission queue; beyond it `QueueFullError` (an `AdmissionError`).
    - `max_model_len`: context cap (None = the model's own).
    - `enable_prefix_caching`: reuse full KV blocks across requests with the same hash chain.
    - `num_threads`: torch intra-op threads on CPU (None = every core this process may use).
    - `quantization`: how layer weights are stored and run: "auto" (the default: chosen at load from the device
      and the file, see auto_mode.py; on CPU fp32 a 4-bit GGUF runs "q4", anything else "q8"), None (the
      engine's dtype; "none" is accepted too) or "int8" (weight-only
      per-channel int8 through fbgemm's dynamic-int8 linear, CPU fp32 only; see quant.py), "q4" (4-bit groups of
      32 with scale and minimum, GGUF Q4_0/Q4_1 blocks loaded as they are) or "q8" (8-bit groups of 32, GGUF
      Q8_0), both through parley's own C++ kernel (quant4.py). Part of the model identity, so prefix-cached KV
      is never shared across modes.
    - `quantize_lm_head`: with `quantization`, run the LM head (and tied embedding's matrix) quantised too
      (int8: per channel; q4 and q8: 8-bit groups). None (the default) = the mode's measured choice: 8-bit
      groups when "auto" picked q4/q8, else off (the output side is the sensitive matrix; auto_mode.py).
    - `speculation`: "auto" (the default: "ngram" when loading a checkpoint, see auto_mode.py), None or
      "ngram": prompt-lookup drafts verified in one forward (speculative.py). Tokens are those of plain
      decoding (greedy, and seeded sampling draw for draw); it pauses itself per request when few drafts are
      accepted.
    - `speculative_tokens`: the most tokens drafted per step and request.
    - `speculative_max_batch`: drafts are attached only while at most this many sequences decode in a step
      (a large batch is no longer bound by reading the weights, so verifying drafts would cost compute).
    - `adaptive_threads`: on CPU, time decode steps on every thread and on one and keep the faster per batch
      size (threads.py `DecodeThreads`: on a busy machine a 2-thread team waits for a descheduled thread at
      every GEMM); False = every step uses `num_threads`.
    - `compile`: run decode steps through a `torch.compile`d step (CPU, Inductor's C++ backend; compile.py),
      compiled when the engine starts; without a C++ compiler, or for a model it does not cover, the engine
      warns once and runs eager.
    - `cuda_graphs`: on CUDA, replay decode steps from CUDA graphs, one per batch and context bucket, captured
      on first use (cuda_graphs.py); ignored on CPU. False runs every step eager.
    - `stream_interval_s`: streamed tokens are handed to the consumers' event loops at most this often (a
      request's first and last tokens, and failures, at once); 0 = after every step. Each hand-over wakes the
      loop, which then competes with the step's threads for the cores: in `parley serve` on 2 cores, 20 ms
      (bursts of ~3 tokens at ~150 tok/s) streamed ~5 % faster than every step, with less spread.
    """

    block_size: int = 16
    kv_cache_bytes: int = 512 * 1024 * 1024
    num_kv_blocks: int | None = None
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_waiting: int = 4096
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    num_threads: int | None = None
    quantization: str | None = AUTO
    quantize_lm_head: bool | None = None
    speculation: str | None = AUTO
    speculative_tokens: int = 4
    speculative_max_batch: int = 4
    compile: bool = False
    adaptive_threads: bool = True
    cuda_graphs: bool = True
    stream_interval_s: float = 0.02

    def __post_init__(self) -> None:
        least = {"block_size": 1, "kv_cache_bytes": 1, "num_kv_blocks": 1, "max_num_batched_tokens": 1,
                 "max_num_seqs": 1, "max_waiting": 0, "max_model_len": 1, "num_threads": 1,
                 "speculative_tokens": 1, "speculative_max_batch": 1}
        optional = ("num_kv_blocks", "max_model_len", "num_threads")
        for name, low in least.items():
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise EngineConfigError(
                    f"EngineConfig.{name} must be an integer >= {low}{' or None' if name in optional else ''}, "
                    f"got {value!r}"
                )
        interval = self.stream_interval_s
        if isinstance(interval, bool) or not isinstance(interval, int | float) or not 0 <= interval <= 1:
            raise EngineConfigError(f"EngineConfig.stream_interval_s must be seconds in [0, 1], got {interval!r}")
        for flag in ("enable_prefix_caching", "compile", "adaptive_threads", "cuda_graphs"):
            if not isinstance(getattr(self, flag), bool):
                raise EngineConfigError(f"EngineConfig.{flag} must be a bool, got {getattr(self, flag)!r}")
        if self.quantize_lm_head is not None and not isinstance(self.quantize_lm_head, bool):
            raise EngineConfigError(
                f"EngineConfig.quantize_lm_head must be a bool or None, got {self.quantize_lm_head!r}"
            )
        object.__setattr__(self, "quantization", normalize_quantization(self.quantization))
        if isinstance(self.speculation, str) and self.speculation.lower() in ("none", "off"):
            object.__setattr__(self, "speculation", None)
        if self.speculation is not None and self.speculation not in (AUTO, *SPECULATION_METHODS):
            raise EngineConfigError(
                f"EngineConfig.speculation must be None, {AUTO!r} or one of {list(SPECULATION_METHODS)}, "
                f"got {self.speculation!r}"
            )
        if self.quantize_lm_head and self.quantization is None:
            raise EngineConfigError("EngineConfig.quantize_lm_head needs EngineConfig.quantization to be set")


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks for. `temperature=0` is greedy; `seed` fixes this request's own random stream.

    `stop_token_ids` and `stop` (strings) end the request with reason "stop"; the end-of-sequence token does
    too unless `ignore_eos`. Until `min_tokens` are out, those tokens cannot be chosen at all (HF's
    `min_new_tokens`). `logprobs=N` returns the chosen token's log-probability and the top N (from the fp32
    logits after penalties and hook masks, before temperature).

    Penalties follow vLLM (and HF for `repetition_penalty`), applied to the logits before everything else, greedy
    included: `repetition_penalty` (> 0, 1 = off) divides the positive logits and multiplies the negative ones of
    every token already in the prompt or the output; `frequency_penalty` and `presence_penalty` (in [-2, 2])
    subtract `frequency * count + presence * (count > 0)` for each token's count in the output so far. `min_p`
    (in [0, 1], 0 = off) drops, after temperature, the tokens less likely than `min_p` times the most likely one.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        # Accept lists for convenience, store tuples so params stay hashable-ish and immutable.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any repetition, frequency or presence penalty changes the logits."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if math.isinf(self.temperature):
            raise InvalidRequestError("temperature must be finite")
        if not isinstance(self.top_p, (int, float)) or math.isnan(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise InvalidRequestError(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise InvalidRequestError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise InvalidRequestError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequestError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if not _number(self.repetition_penalty) or self.repetition_penalty <= 0.0:
            raise InvalidRequestError(
                f"repetition_penalty must be a number > 0 (1 = off), got {self.repetition_penalty!r}"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _number(value) or not -2.0 <= value <= 2.0:
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {value!r}")
        if not _number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty strings")


def _number(value: object) -> bool:
    """A finite int or float (not a bool, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
