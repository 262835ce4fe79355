"""GGUF K-quant files (Q4_K_M, Q5_K_M, Q6_K and the 32-value types they fall back to) run on their own blocks.

Each block type is decoded from random but valid bytes (finite fp16 scales, every other byte arbitrary) and
must dequantise bitwise to gguf-py's dequantisation, which is also what the loader's fp32 copy holds; the
kernel then computes with exactly those weights. A tiny Llama GGUF mixing the types as llama.cpp's `*_M`
mixes do runs in q8 mode on its blocks alone and agrees with the fp32 engine over the same file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from parley.local_engine import Engine, EngineConfig, ModelLoadError, SamplingParams, quant4  # noqa: E402
from parley.local_engine.quant4 import BLOCK_TYPES, GroupGemm, RowQuant, cat_rows, decode_gguf_blocks  # noqa: E402

from .conftest import prompts_of, tiny_hf_model  # noqa: E402
from .gguf_writer import write_gguf  # noqa: E402

CPU = torch.device("cpu")
Q = gguf.GGMLQuantizationType
SCALE_BYTES = {  # byte offsets of the fp16 fields of each block (set to small finite values)
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
K_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1")


def random_blocks(kind: str, rows: int, cols: int, seed: int = 0, scale: float = 0.01) -> np.ndarray:
    """`uint8 [rows, bytes per row]` of `kind`: arbitrary bytes, finite fp16 scales of about `scale`."""
    rng = np.random.default_rng(seed)
    per_block, size = BLOCK_TYPES[kind]
    raw = rng.integers(0, 256, size=(rows, cols // per_block, size), dtype=np.uint8)
    for at in SCALE_BYTES[kind]:
        fp16 = (rng.standard_normal((rows, cols // per_block, 1)) * scale).astype(np.float16)
        raw[:, :, at : at + 2] = fp16.view(np.uint8)
    return raw.reshape(rows, -1)


def reference(x: torch.Tensor, rq: RowQuant) -> torch.Tensor:
    """The kernel's arithmetic in float64: activations quantised per group of 32 as the kernel does, times the
    dequantised weights."""
    cs = rq.col_scale if rq.col_scale is not None else torch.ones(x.shape[1])
    v = (x * cs).view(x.shape[0], -1, 32)
    amax = v.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    xq = (torch.round(v * inv) * (amax / 127.0)).view(x.shape).double()
    return xq @ RowQuant(rq.bits, rq.q, rq.d, rq.m).dequantize().double().t()


@pytest.mark.parametrize("kind", sorted(BLOCK_TYPES))
def test_every_block_type_decodes_bitwise_to_gguf_py_dequantisation(kind: str) -> None:
    rows, cols = 12, 512
    blocks = random_blocks(kind, rows, cols, seed=len(kind))
    expected = gguf.quants.dequantize(blocks, getattr(Q, kind)).reshape(rows, cols)
    rq = decode_gguf_blocks(kind, blocks, (rows, cols))
    assert np.array_equal(rq.dequantize().numpy(), expected)
    assert rq.source == f"gguf:{kind}" and rq.bits == (4 if kind in quant4.FOUR_BIT_TYPES else 8)
    # K-quant scales are products (fp16 x 6/8-bit integer) kept exactly in fp32; the 32-value types' stay fp16
    assert rq.d.dtype == (torch.float32 if kind.endswith("_K") else torch.float16)
    assert rq.scale_width == (16 if kind == "Q6_K" else 32)
    if kind.endswith("_K"):  # a K-quant row is whole 256-value super-blocks (llama.cpp writes no others)
        with pytest.raises(ValueError, match="whole blocks"):
            decode_gguf_blocks(kind, blocks, (rows * 4, cols // 4))


def test_rows_of_different_types_are_widened_exactly_into_one_layout() -> None:
    """A Q4_K_M layer's q (Q4_K), k (Q5_0) and v (Q6_K) share the qkv GEMM: the stacked weights are the three
    tensors' values unchanged (8-bit, 16-wide fp32 scales, zero minimums where a type has none)."""
    parts = [decode_gguf_blocks(kind, random_blocks(kind, rows, 256, seed=i), (rows, 256))
             for i, (kind, rows) in enumerate([("Q4_K", 32), ("Q5_0", 16), ("Q6_K", 16)])]
    stacked = cat_rows(parts)
    assert isinstance(stacked, RowQuant)
    assert (stacked.bits, stacked.scale_width, stacked.d.dtype) == (8, 16, torch.float32) and stacked.m is not None
    assert stacked.source == "gguf:Q4_K+gguf:Q5_0+gguf:Q6_K"
    assert torch.equal(stacked.dequantize(), torch.cat([p.dequantize() for p in parts]))
    same = cat_rows([parts[0], parts[0]])  # one layout: nothing widened
    assert (same.bits, same.source) == (4, "gguf:Q4_K")


@pytest.mark.parametrize("kind", [*K_TYPES, "mixed"])
def test_kernel_computes_the_dequantised_weights_bitwise_invariantly(kernel: Any, kind: str) -> None:
    """Tolerance: the int32 group sums are exact, so the kernel differs from the float64 product of the same
    quantised activations and weights only by fp32 rounding of one multiply-add per group (16 groups here):
    ~1e-7 relative measured, bound 2e-5 of the largest output (the bound test_quant4 uses)."""
    k = 512
    if kind == "mixed":
        rq = cat_rows([decode_gguf_blocks(t, random_blocks(t, 16, k, seed=i), (16, k))
                       for i, t in enumerate(["Q4_K", "Q6_K", "Q5_1", "Q8_0"])])
    else:
        rq = decode_gguf_blocks(kind, random_blocks(kind, 40, k, seed=3), (40, k))
    rq = rq.scale_columns(torch.rand(k, generator=torch.Generator().manual_seed(4)) + 0.5)
    fast, scalar = GroupGemm(CPU, torch.float32, bits=8), GroupGemm(CPU, torch.float32, bits=8, use_simd=False)
    w = fast.prepare(rq)
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(5)) * 2
    x[3] = 0.0
    out = fast(x, w)
    ref = reference(x, rq)
    assert float((out.double() - ref).abs().max()) <= 2e-5 * float(ref.abs().max())
    assert torch.equal(scalar(x, w), out)  # the scalar path does the identical operations
    for i in range(7):  # each row alone equals its row in the batch (every 4-row block remainder)
        assert torch.equal(fast(x[i : i + 1], w), out[i : i + 1])
    assert torch.equal(fast(x[:6], w), out[:6]) and not out[3].any()


# ---------------------------------------------------------------- a tiny Llama GGUF of mixed K-quant layers
LAYER_TYPES = [  # per layer: q, k, v, o, gate, up, down (as llama.cpp's *_M mixes put them, and then some)
    {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
     "ffn_up": "Q5_K", "ffn_down": "Q6_K"},
    {"attn_q": "Q5_K", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q5_1", "ffn_gate": "Q6_K",
     "ffn_up": "Q6_K", "ffn_down": "Q4_K"},
]
SCALES = {"Q4_K": 0.004, "Q5_K": 0.002, "Q6_K": 0.0005, "Q5_0": 0.02, "Q5_1": 0.02, "Q8_0": 0.004}


def write_kquant_gguf(path: Path) -> Any:
    hf = tiny_hf_model(seed=4, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    shapes = {"attn_q": (256, 256), "attn_k": (128, 256), "attn_v": (128, 256), "attn_output": (256, 256),
              "ffn_gate": (512, 256), "ffn_up": (512, 256), "ffn_down": (256, 512)}
    blocks = {}
    for i, types in enumerate(LAYER_TYPES):
        for j, (module, kind) in enumerate(types.items()):
            rows, cols = shapes[module]
            raw = random_blocks(kind, rows, cols, seed=10 * i + j, scale=SCALES[kind])
            blocks[f"blk.{i}.{module}.weight"] = (getattr(Q, kind), raw)
    write_gguf(hf, path, name="tiny-kquants", blocks=blocks)
    return hf


@pytest.fixture(scope="module")
def kquant_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kquants") / "tiny-kquants.Q4_K_M.gguf"
    write_kquant_gguf(path)
    return path


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kquant-cache"))


def test_overlay_loads_every_k_quant_in_q8_mode_and_the_4_bit_ones_in_q4_mode(kquant_file: Path,
                                                                               cache: None) -> None:
    from parley.local_engine import loader
    from parley.local_engine.gguf_weights import loadable_types, overlay

    files = loader.resolve(kquant_file)
    state = loader.load_state_dict(files.folder)
    expected = {f"model.layers.{i}.{hf}.weight": kind for i, types in enumerate(LAYER_TYPES)
                for module, kind in types.items()
                for hf in [{"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                            "ffn_down": "mlp.down_proj"}[module]]}
    q8 = dict(state)
    report = overlay(files.source, q8, "q8", num_heads=4, num_kv_heads=2)
    assert report.direct == expected and not report.skipped  # q/k rows: llama.cpp's permutation found and undone
    for name in expected:
        assert torch.equal(q8[name].dequantize(), state[name])
    q4 = dict(state)
    report = overlay(files.source, q4, "q4", num_heads=4, num_kv_heads=2)
    assert report.direct == {n: t for n, t in expected.items() if t in loadable_types("q4")}
    assert "requantised to 4 bits in q4 mode" in report.skipped["model.layers.0.mlp.down_proj.weight"]
    cut = kquant_file.with_name("cut.gguf")
    data = kquant_file.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])  # inside the last tensor (a K-quant down projection)
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        overlay(cut, dict(state), "q8", num_heads=4, num_kv_heads=2)


def test_a_k_quant_file_runs_on_its_blocks_and_matches_the_fp32_engine(kernel: Any, kquant_file: Path,
                                                                       cache: None) -> None:
    """q8 mode over the file's own blocks vs the fp32 engine over the same file dequantised: they differ only
    by int8 activations per group of 32. Bound: mean |log p| difference under 4 % of mean |log p| (as for the
    Q4_1 tiny model in test_quant4), greedy batch == solo bitwise."""
    from parley.local_engine.evaluate import token_logprobs

    cfg = EngineConfig(num_kv_blocks=64, block_size=4, max_num_batched_tokens=32)
    q8 = Engine.from_pretrained(kquant_file, device="cpu", dtype="float32", quantization="q8", config=cfg)
    fp32 = Engine.from_pretrained(kquant_file, device="cpu", dtype="float32", quantization=None, config=cfg)
    try:
        layer0, layer1 = q8.model.layers
        assert layer0.qkv.source == "gguf:Q4_K+gguf:Q6_K" and layer0.down.source == "gguf:Q6_K"
        assert layer1.qkv.source == "gguf:Q5_K+gguf:Q5_0+gguf:Q8_0" and layer1.o.source == "gguf:Q5_1"
        assert layer0.gate_up.source == "gguf:Q4_K+gguf:Q5_K" and layer1.down.bits == 4
        ids = prompts_of([40], seed=6)[0]
        got, ref = token_logprobs(q8.model, ids), token_logprobs(fp32.model, ids)
        assert torch.isfinite(got).all()
        assert float((got - ref).abs().mean()) < 0.04 * float(ref.abs().mean())
        greedy = SamplingParams(max_tokens=8, ignore_eos=True)
        prompts = prompts_of([5, 17, 30], seed=7)
        together = [o.token_ids for o in q8.generate(prompts, greedy)]
        assert together == [q8.generate([p], greedy)[0].token_ids for p in prompts]
    finally:
        q8.close()
        fp32.close()


def test_a_cut_k_quant_file_is_a_load_error_naming_it(kquant_file: Path, cache: None) -> None:
    cut = kquant_file.with_name("tiny-kquants-cut.gguf")
    data = kquant_file.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelLoadError, match="tiny-kquants-cut.gguf"):
        Engine.from_pretrained(cut, device="cpu", dtype="float32", quantization="q8")
