"""What the engine runs when nobody says: `quantization="auto"` and `speculation="auto"`, the defaults.

A user who types `parley serve` or `LocalBackend()` gets what was measured fastest among the modes that
keep the model's quality, not fp32 (which decodes the embedded SmolLM2 at a quarter of q4's speed). The
choice is made once, at load, from the device, the dtype and the file, and it is recorded
(`Engine.mode`, `stats()["mode_reason"]`, the served model's `root`):

- **not CPU fp32** (a GPU, or `dtype="bfloat16"`): no quantisation. The q8/int8 kernels are CPU fp32 ones;
  q4 runs on CUDA through PyTorch's int4 kernel when asked (quant4_cuda.py), but on one H200 with CUDA graphs
  it decoded 316 against bf16's 300 tok/s at batch 1 and 5,615 against 6,129 at batch 64
  (benchmarks/gpu_decode.py): not enough to spend 4-bit weights' perplexity by default.
- **a CPU without AVX2** (or no C++ compiler to build the kernel): no quantisation; the kernel's scalar path
  is no faster than fp32 at decode and far slower at prefill. With AVX2 (no VNNI), measured on a 2-core AMD
  EPYC: q4 decode 35.5 tok/s against fp32's 10.6 (the scalar path: 11.1).
- **a GGUF whose layer matrices are all 4-bit blocks** (Q4_0, Q4_1, Q4_K): `q4`, the file's blocks run as
  they are (nothing requantised).
- **any other quantised GGUF** (Q8_0, Q5_K, Q6_K, or a mix, as in Q4_K_M files): `q8`. In q8 mode every block
  type parley runs natively is loaded as it is (4-bit blocks stay 4-bit), and only matrices stored in a format
  without a native kernel are quantised to 8 bits.
- **a GGUF of F16/BF16/F32 matrices, or a Hugging Face folder**: `q8`, the fastest mode whose perplexity stays
  within 1 % of the unquantised model. Measured on benchmarks/data/perplexity.txt (703 tokens) with the only
  float checkpoint available here, SmolLM2-135M's fp32 folder: fp32 24.484; q8 24.533 (+0.20 %); q8 with the
  8-bit head 24.515 (+0.13 %); int8 24.920 (+1.78 %, over the bar); q4 quantised at load 38.49 (+57 %, far
  over: min/max 4-bit groups fit a float model badly; 4-bit is used only where a file already is 4-bit).
- **the LM head**: 8-bit groups in q4 and q8 (it reads a quarter of fp32's bytes, and the head is a fifth of
  the model's weights). On the embedded file the tied embedding is stored as Q8_0, so the 8-bit head is
  exactly the file's own blocks; measured cost elsewhere +0.17 % (q4, embedded file) and -0.07 % (q8, fp32
  folder). An explicit `quantize_lm_head` wins.
- **speculation**: n-gram prompt lookup (`"ngram"`), whose tokens are plain decoding's. It pauses itself per
  request when drafts are rejected (speculative.py), and drafts only while at most
  `EngineConfig.speculative_max_batch` sequences decode: in a large batch the GEMMs stop being bound by reading
  the weights, and verifying drafts would cost real compute (vLLM disables drafting by batch size the same way).
  Measured on the embedded model (issue 18): JSON echo 1.44x, prose 1.00-1.01x.

An explicitly named mode is always honoured as given (`quantization=None` or `"none"` runs the engine's dtype).
`Engine.from_model` wraps a model someone already built (a test's tiny random net): it runs as built, and
`"auto"` speculation there means none, since the measurements above are of real checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

AUTO = "auto"
NONE_ALIASES = ("none", "off", "fp32", "float")  # CLI spellings of "no quantisation"
FOUR_BIT_BLOCKS = frozenset({"Q4_0", "Q4_1", "Q4_K"})
FLOAT_BLOCKS = frozenset({"F32", "F16", "BF16", "F64"})


@dataclass(frozen=True)
class ModeChoice:
    """The resolved weights mode and why it was chosen (one line, shown by `parley serve` and `stats()`)."""

    quantization: str | None
    quantize_lm_head: bool
    reason: str


def choose_quantization(
    source: Path, device: torch.device, dtype: torch.dtype, *, quantize_lm_head: bool | None = None
) -> ModeChoice:
    """`quantization="auto"` for the model at `source` (a .gguf file, or a Hugging Face folder)."""
    if device.type != "cpu" or dtype != torch.float32:
        where = f"{device.type}/{str(dtype).removeprefix('torch.')}"
        return ModeChoice(None, False, f"no quantisation on {where} (the q4/q8 kernels are CPU float32)")
    slow = _group_kernel_is_slow()
    if slow is not None:
        return ModeChoice(None, False, f"no quantisation: {slow}")
    head = True if quantize_lm_head is None else quantize_lm_head
    if source.suffix != ".gguf":
        return ModeChoice("q8", head, "a float checkpoint: q8, within 1 % of fp32 perplexity (auto_mode.py)")
    from parley.local_engine.gguf_header import layer_block_types

    types = layer_block_types(source)
    quantised = {t for t in types if t not in FLOAT_BLOCKS}
    listing = ", ".join(f"{n} {t}" for t, n in types.most_common())
    if not quantised:
        return ModeChoice("q8", head, f"float GGUF matrices ({listing}): q8, within 1 % of fp32 perplexity")
    if quantised <= FOUR_BIT_BLOCKS and not set(types) & FLOAT_BLOCKS:
        return ModeChoice("q4", head, f"the file's 4-bit blocks run as they are ({listing})")
    return ModeChoice("q8", head, f"the file's blocks run as they are where parley has a kernel ({listing})")


def _group_kernel_is_slow() -> str | None:
    """Why the q4/q8 kernel would lose to fp32 here (None: it has a SIMD path). Its scalar path decoded at
    fp32's speed and prefilled 11x slower (500 tokens: 26 s against 2.3 s, 2-core AMD EPYC without AVX2 code)."""
    from parley.local_engine.quant4 import kernel_module

    ext, why = kernel_module()
    if ext is None:
        return f"the q4/q8 kernel is unavailable ({why}), and its fallback runs at fp32 speed"
    if not ext.simd_available():
        return "the q4/q8 kernel has no SIMD path on this CPU (it needs AVX2 or AVX-512 VNNI); fp32 is faster"
    return None


def choose_speculation(requested: str | None) -> str | None:
    """`speculation="auto"` -> n-gram drafting (it never changes a token and pauses itself where it does not pay)."""
    return "ngram" if requested == AUTO else requested
