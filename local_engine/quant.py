"""Quantised weights, executed quantised: `EngineConfig(quantization="int8")`.

**int8** — weight-only per-output-channel int8 (symmetric, scale = row max / 127), run through PyTorch's
dynamic-quantised linear (`quantized::linear_dynamic`, the fbgemm kernels behind the x86 engine): activations
are quantised to uint8 on the fly, the product accumulates in int32, and the result is rescaled to fp32.
Measured on this project's 2-core AMD EPYC (AVX-512 VNNI) kind: SmolLM2-135M's 120 layer GEMVs take ~5 ms per
token this way against ~17.6 ms through oneDNN fp32 (`../shared/reference/local-engine-speed.md`); PyTorch's
int8 / int4 *weight-only* packed matmuls (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) were slower
than fp32 at batch 1, and `torch._int_mm` with our own row-wise activation quantisation ~2-3x slower than
fbgemm (it repacks the weight on every call). So no kernel is written here: fbgemm is the maintained one.

Batch invariance. fbgemm quantises activations with *one* scale for the whole `[T, K]` input (its min and
max), so a row's result would depend on the rows batched with it. Each row is therefore divided by its own
max |x| (so it lies in [-1, 1]) and the input gets two extra columns holding +1 and -1 (their weight columns
are zero): every batch then has min -1 and max 1, the quantisation scale is the same 2/255 whatever the
company, the int32 accumulation is exact, and the output is multiplied back by the row's max. A row's result
is bitwise the same alone or in any batch (tested). Cost: three small ops per GEMM.

Saturation. On CPUs without VNNI fbgemm multiplies u8 x s8 pairs into int16 (`vpmaddubsw`), which saturates
for 8-bit activations; PyTorch's `reduce_range` (7-bit activations) avoids that. A probe at load checks the
worst case (all activations 1, all weights 127) and uses `reduce_range` only where it saturates.

Activation outliers. Quantising each activation row to 8 bits costs most where a few channels of the residual
stream are much larger than the rest (the inputs of qkv and gate/up): measured on SmolLM2 over 384 tokens of
prose, int8 activations alone moved the next-token distribution by KL 0.060 nats (top-1 agreement with fp32
84 %), int8 weights alone by 0.0067 (96 %). So at load the model runs one short calibration prefill (`calibrate`, a
~110-token chat transcript) recording each input channel's largest |x|, and `Int8Gemm.finish` applies
SmoothQuant's per-channel balancing (alpha 0.5) before packing: KL 0.011, top-1 93 %, perplexity within 1.5 %
of fp32 on three texts (tests/local_engine/test_quant.py, benchmarks/engine_vs_llamacpp.py).

The LM head (tied to the embedding in SmolLM2) stays fp32 by default: the seed document's lesson is that
the output side is the sensitive matrix (4-bit there took perplexity 61 -> 8,123); `quantize_lm_head=True`
puts it through the same int8 kernel (a measured trade, see benchmarks/engine_vs_llamacpp.py).

PyTorch 2.13 marks its quantised tensor types deprecated (pytorch/pytorch#184982); parley pins torch, and when
a build lacks the ops the probe fails and `quantization="int8"` is refused with a clear error at load.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from parley.local_engine.config import QUANTIZATIONS
from parley.local_engine.errors import EngineConfigError
from parley.local_engine.models.gemm import Gemm, WeightGemm
from parley.local_engine.threads import omp_set_num_threads

_PAD = 2  # the +1 / -1 columns that pin fbgemm's activation range (see the module docstring)
SMOOTHING = 0.5  # SmoothQuant's migration strength alpha (0 = off)
_TINY = 1e-30


def check_quantization(value: object, *, field: str = "EngineConfig.quantization") -> str | None:
    """`value` if it names a supported scheme (or is None), else `EngineConfigError` naming `field`."""
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in QUANTIZATIONS:
        raise EngineConfigError(f"{field} must be None or one of {list(QUANTIZATIONS)}, got {value!r}")
    return value.lower()


def _quantized_engine() -> str | None:
    """The quantised engine whose dynamic linear runs fbgemm: "x86" (fbgemm for linear), else "fbgemm"."""
    engines = torch.backends.quantized.supported_engines
    return next((e for e in ("x86", "fbgemm") if e in engines), None)


@dataclass
class Int8Weight:
    """One weight under `Int8Gemm`: dense fp32 `[out, in]` while the model calibrates, then fbgemm's packed
    matrix `[out, in + 2]` (per-channel scales inside) and the per-input-channel smoothing divisor."""

    out_features: int
    in_features: int
    dense: torch.Tensor | None  # until `Int8Gemm.finish` (calibration runs on it)
    act_max: torch.Tensor | None = None  # [in] max |x| per input channel seen during calibration
    packed: Any = None  # torch.ScriptObject (LinearPackedParamsBase) after `finish`
    inv_smooth: torch.Tensor | None = None  # [in]: x is multiplied by this before quantisation


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (q [out, in] int8 in [-127, 127], scale [out] fp32), weight ~= q * scale[:, None]."""
    w = weight.detach().to(torch.float32)
    scale = w.abs().amax(dim=1).clamp_min(_TINY) / 127.0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def _prepack(q: torch.Tensor, scale: torch.Tensor, engine: str) -> Any:
    out = q.shape[0]
    padded = torch.cat([q, torch.zeros(out, _PAD, dtype=torch.int8)], dim=1)
    previous = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = engine  # read at prepack time only (the packed object keeps its kernel)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch 2.13's deprecation notice for quantised tensor types
            qt = torch._make_per_channel_quantized_tensor(
                padded, scale.to(torch.float64), torch.zeros(out, dtype=torch.long), 0
            )
            return torch.ops.quantized.linear_prepack(qt, None)
    finally:
        torch.backends.quantized.engine = previous


@lru_cache(maxsize=1)
def _probe() -> tuple[bool, str]:
    """(reduce_range, "") when the kernel works on this machine, else (False, why it cannot be used)."""
    engine = _quantized_engine()
    if engine is None:
        engines = torch.backends.quantized.supported_engines
        return False, f"this torch build has no fbgemm/x86 quantised engine (it has {engines})"
    try:
        k = 64
        q = torch.full((4, k), 127, dtype=torch.int8)
        packed = _prepack(q, torch.ones(4), engine)
        x = torch.ones(1, k + _PAD)
        x[0, k + 1] = -1.0
        exact = 127.0 * k * (127.0 / 127.5)  # what 8-bit activations give without saturation (1.0 -> 127/127.5)
        got = float(torch.ops.quantized.linear_dynamic(x, packed, False)[0, 0])
        return (abs(got - exact) > 0.01 * exact), ""
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        return False, f"this torch build cannot run quantized::linear_dynamic: {exc}"


def int8_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `quantization="int8"` cannot run here (None: it can)."""
    if device.type != "cpu":
        return f"quantization='int8' runs on CPU (fbgemm); device is {device.type!r}"
    if dtype != torch.float32:
        name = str(dtype).removeprefix("torch.")
        return f"quantization='int8' needs dtype float32 (activations stay fp32); got {name}"
    return _probe()[1] or None


class Int8Gemm:
    """`WeightGemm`'s interface over int8 weights: `prepare(W)` once, `gemm(x, prepared, bias) -> x @ W.T + bias`.

    Two phases. `prepare` keeps the fp32 weight; calls before `finish()` compute in fp32 and record each input
    channel's largest |x| (the model runs a short calibration prefill at load, `calibrate`). `finish()` then
    packs every weight in int8 with SmoothQuant's per-channel balancing (below) and drops the fp32 copies.
    Results are batch invariant row by row (see the module docstring). Not thread safe (one engine thread).
    """

    kernel = "fbgemm-int8-dynamic"

    def __init__(self, device: torch.device, dtype: torch.dtype, *, smoothing: float | None = None) -> None:
        why = int8_unavailable_reason(device, dtype)
        if why is not None:
            raise EngineConfigError(why)
        engine = _quantized_engine()
        assert engine is not None
        self.engine = engine
        self.reduce_range = _probe()[0]
        self.smoothing = SMOOTHING if smoothing is None else smoothing
        self._pending: list[Int8Weight] = []
        self._omp = omp_set_num_threads()
        # The C++ entry of the op: calling `torch.ops.quantized.linear_dynamic` (or its overload) first scans the
        # arguments in Python for fake script objects (torch/_ops.py `_must_dispatch_in_python`), ~8 us per call,
        # 1 ms per decode step of SmolLM2. `_op` is private to torch (pinned); the public call is the fallback.
        overload = torch.ops.quantized.linear_dynamic.default
        self._linear = getattr(overload, "_op", overload)
        self._buffers: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()

    def prepare(self, weight: torch.Tensor) -> Int8Weight:
        w = Int8Weight(weight.shape[0], weight.shape[1], weight.detach().to(torch.float32).contiguous())
        self._pending.append(w)
        return w

    def finish(self) -> None:
        """Pack every prepared weight (smoothed where calibration saw it) and drop the fp32 copies."""
        for w in self._pending:
            assert w.dense is not None
            dense = w.dense
            if w.act_max is not None and self.smoothing > 0:
                # SmoothQuant (Xiao et al. 2023): divide input channel j by s_j = a_j^alpha / w_j^(1-alpha) and
                # multiply the weight's column j by it; the product is unchanged, while activation outliers
                # (a few channels of the residual stream) move into the weight, which int8 per row absorbs.
                a = w.act_max.clamp_min(1e-5)
                col = dense.abs().amax(dim=0).clamp_min(1e-5)
                smooth = (a.pow(self.smoothing) / col.pow(1.0 - self.smoothing)).clamp_(1e-2, 1e2)
                dense = dense * smooth
                w.inv_smooth = smooth.reciprocal()
            q, scale = quantize_rows(dense)
            w.packed = _prepack(q, scale, self.engine)
            w.dense = None
            w.act_max = None
        self._pending.clear()

    def _buffer(self, rows: int, k: int) -> torch.Tensor:
        """A `[rows, k + 2]` input buffer whose last two columns hold +1 and -1 (kept for a few shapes)."""
        key = (rows, k)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.empty(rows, k + _PAD)
            buf[:, k] = 1.0
            buf[:, k + 1] = -1.0
            self._buffers[key] = buf
            if len(self._buffers) > 16:
                self._buffers.popitem(last=False)
        else:
            self._buffers.move_to_end(key)
        return buf

    def __call__(self, x: torch.Tensor, prepared: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        w = prepared
        if w.packed is None:  # calibrating: fp32, recording the input's range per channel
            assert w.dense is not None
            seen = x.detach().abs().amax(dim=0)
            w.act_max = seen if w.act_max is None else torch.maximum(w.act_max, seen)
            out = x @ w.dense.t()
            return out if bias is None else out.add_(bias)
        rows, k = x.shape
        # The scaling ops around the kernel touch a few KB: on a small step they run on one thread (a parallel
        # region's fork/join costs more than they do, badly so on a busy machine; see threads.py), the kernel
        # on the caller's count.
        threads = torch.get_num_threads()
        omp = self._omp if rows <= 64 and threads > 1 else None
        if omp is not None:
            omp(1)
        buf = self._buffer(rows, k)
        xs = buf[:, :k]
        if w.inv_smooth is not None:
            torch.mul(x, w.inv_smooth, out=xs)
        else:
            xs.copy_(x)
        amax = torch.linalg.vector_norm(xs, float("inf"), dim=1, keepdim=True).clamp_min_(_TINY)
        xs.div_(amax)
        if omp is not None:
            omp(threads)
        out = self._linear(buf, w.packed, self.reduce_range)
        if omp is not None:
            omp(1)
        out.mul_(amax)
        if bias is not None:
            out.add_(bias)
        if omp is not None:
            omp(threads)
        return out


CALIBRATION_TOKENS = 128
"""Length of the fallback calibration prefill (seeded pseudo-random ids) for a model loaded without a tokenizer."""

CALIBRATION_MESSAGES: tuple[tuple[str, str], ...] = (
    ("system", "You are a careful assistant. Answer briefly and call tools when they help."),
    ("user", "How do tides work? Then write a Python function that returns the larger of two numbers, and "
             "look up tomorrow's weather in Lisbon."),
    ("assistant", "The Moon's gravity pulls the ocean into two bulges, and the Earth turns beneath them, so most "
                  "coasts see two high tides a day.\n\n```python\ndef larger(a, b):\n    return a if a > b "
                  "else b\n```\n\n"
                  '{"name": "get_forecast", "arguments": {"city": "Lisbon", "days": 1, "unit": "celsius"}}'),
)
"""The calibration transcript: chat-formatted like real prompts (special tokens at the start carry the largest
activations, which pseudo-random ids never produce: calibrated on those, SmolLM2's greedy answers changed), with
prose, code and JSON. It shares no text with the benchmark's perplexity file or the tests' prompts."""


def calibration_ids(tokenizer: Any) -> list[int] | None:
    """The calibration transcript in the model's own chat format (plain text when it has none)."""
    messages = [{"role": r, "content": c} for r, c in CALIBRATION_MESSAGES]
    try:
        if getattr(tokenizer, "chat_template", None):
            out = tokenizer.apply_chat_template(messages)
            ids = out["input_ids"] if hasattr(out, "keys") else out
        else:
            ids = tokenizer.encode("\n\n".join(c for _, c in CALIBRATION_MESSAGES))
        return [int(t) for t in ids] or None
    except Exception:  # noqa: BLE001 - any tokenizer failure: calibrate on the fallback ids instead
        return None


@torch.inference_mode()
def calibrate(model: Any, ids: list[int] | None = None, *, num_tokens: int = CALIBRATION_TOKENS,
              seed: int = 0) -> None:
    """Run one prefill of `ids` (`calibration_ids(tokenizer)`; None: seeded pseudo-random ids) through `model`,
    whose `Int8Gemm`s record activation ranges, then pack every int8 weight. Called by
    `DecoderModel.from_hf_state_dict` in int8 mode."""
    from parley.local_engine.config import SamplingParams
    from parley.local_engine.runner import ModelRunner
    from parley.local_engine.scheduler import ScheduledSeq
    from parley.local_engine.sequence import Sequence

    gemms = [g for g in (model.gemm, model.head_gemm) if isinstance(g, Int8Gemm)]
    if not gemms:
        return
    if ids is None:
        n = max(2, min(num_tokens, model.arch.max_position_embeddings - 1))
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.arch.vocab_size, (n,), generator=gen).tolist()
    ids = [int(t) for t in ids][: model.arch.max_position_embeddings - 1]
    n = len(ids)
    block = 16
    blocks = -(-n // block)
    runner = ModelRunner(model, num_blocks=blocks, block_size=block)
    seq = Sequence("calibration", ids, SamplingParams())
    seq.block_table = list(range(blocks))
    input_ids, positions, batch, _ = runner.prepare([ScheduledSeq(seq, n, 0, True)])
    model.compute_logits(model.forward(input_ids, positions, runner.kv_cache, batch))
    del runner
    for g in gemms:
        g.finish()


def quantization_unavailable_reason(scheme: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `quantization=scheme` cannot run here (None: it can; q4/q8 without a compiler still run, dequantised)."""
    from parley.local_engine.quant4 import GROUP_SCHEMES, group_unavailable_reason

    if scheme in GROUP_SCHEMES:
        return group_unavailable_reason(scheme, device, dtype)
    return int8_unavailable_reason(device, dtype)


def make_gemm(device: torch.device, dtype: torch.dtype, quantization: str | None, *, head: bool = False) -> Gemm:
    """The GEMM for weights under `quantization` (None: `WeightGemm`, fp32 oneDNN / torch.mm). `head`: the LM
    head's, which in q4 mode runs 8-bit groups (4 bits on the output side cost far more, quant4.py)."""
    scheme = check_quantization(quantization, field="quantization")
    if scheme is None:
        return WeightGemm(device, dtype)
    if scheme == "q4" and (device.type != "cpu" or dtype != torch.float32):
        from parley.local_engine.quant4_cuda import Int4Gemm  # q4 on a GPU: PyTorch's int4 kernel

        return Int4Gemm(device, dtype, head=head)
    if scheme in ("q4", "q8"):
        from parley.local_engine.quant4 import GroupGemm

        return GroupGemm(device, dtype, bits=8 if head or scheme == "q8" else 4)
    return Int8Gemm(device, dtype)
