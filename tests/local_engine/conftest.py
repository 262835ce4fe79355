"""Fixtures: tiny random-weight Llama models (fast, no files) and the embedded SmolLM2 (marked `model`)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from parley.local_engine import Engine, EngineConfig, quant4  # noqa: E402
from parley.local_engine.models.llama import LlamaArch, LlamaModel  # noqa: E402

TINY = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.05,
)


class ByteTokenizer:
    """Token i (>= 3) decodes to chr(i); enough for stop-string tests without a tokenizer file."""

    eos_token_id = 2

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids if i >= 3)


def tiny_hf_model(seed: int = 0, **overrides: Any) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**{**TINY, **overrides})
    model = transformers.LlamaForCausalLM(cfg).eval()
    # Random init is near-uniform; sharpen it so outputs vary and greedy choices are rarely near-ties.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


def engine_from_hf(hf: Any, config: EngineConfig | None = None, dtype: Any = None, model_id: str = "tiny") -> Engine:
    dtype = dtype or torch.float32
    arch = LlamaArch.from_hf_config(hf.config.to_dict())
    net = LlamaModel.from_hf_state_dict(arch, hf.state_dict(), torch.device("cpu"), dtype)
    return Engine.from_model(net, ByteTokenizer(), model_id=model_id, eos_token_ids=frozenset({2}), config=config)


def tiny_quantized_engine(hf: Any, quantization: str, *, quantize_lm_head: bool = False) -> Engine:
    """`hf` loaded with `quantization` ("int8", "q4", "q8"), with the small pool the quantisation tests use."""
    arch = LlamaArch.from_hf_config(hf.config.to_dict())
    net = LlamaModel.from_hf_state_dict(arch, hf.state_dict(), torch.device("cpu"), torch.float32,
                                        quantization=quantization, quantize_lm_head=quantize_lm_head)
    cfg = EngineConfig(num_kv_blocks=256, block_size=4, max_num_batched_tokens=64)
    return Engine.from_model(net, ByteTokenizer(), model_id=f"tiny/float32+{quantization}",
                             eos_token_ids=frozenset({2}), config=cfg)


def prompts_of(lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Random prompts of the given lengths over the tiny model's ordinary byte ids (seeded: the same every run)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 320) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def tiny_hf() -> Any:
    return tiny_hf_model()


@pytest.fixture
def tiny_engine(tiny_hf: Any) -> Iterator[Engine]:
    engine = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=256, block_size=4, max_num_batched_tokens=64))
    yield engine
    engine.close()


# benchmarks/gpu_check.sh runs the model tests on CUDA by setting this; CPU otherwise.
DEVICE = os.environ.get("PARLEY_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def smol_engine() -> Iterator[Engine]:
    """The embedded model unquantised in fp32, without speculation: the parity tests hold it to transformers."""
    engine = Engine.from_pretrained(None, device=DEVICE, dtype="float32",
                                    config=EngineConfig(quantization=None, speculation=None))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def smol_hf(smol_engine: Engine) -> Any:
    """HF transformers' own model over the same dequantised weights, from the engine's cache folder."""
    from parley.local_engine import loader

    files = loader.resolve(None)
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(files.folder), dtype=torch.float32, local_files_only=True
    ).to(DEVICE).eval()


@pytest.fixture(scope="session")
def kernel() -> Any:
    """The group kernel's C++ extension (q4/q8 GEMMs, row ops, the fused decode step), built here at most once
    per machine, then loaded from torch's cache; without a compiler the tests that take it skip."""
    if quant4.compiler() is None:
        pytest.skip("no C++ compiler on PATH (the quantised modes fall back to dequantised fp32 weights)")
    ext, why = quant4.kernel_module()
    assert ext is not None, why  # a compiler is here: the build must work
    return ext
