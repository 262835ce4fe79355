"""q4 through PyTorch's int4 kernel (quant4_cuda.py), the GPU's q4. Off a GPU its CPU twin runs the same
scale/zero rule (bf16 activations), so these tests check the weights' meaning, the dense fallbacks and a whole
model; benchmarks/gpu_check.sh runs the CUDA op itself, whose packing is checked at load by a probe."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from parley.local_engine.config import SamplingParams  # noqa: E402
from parley.local_engine.errors import EngineConfigError  # noqa: E402
from parley.local_engine.models import decoder  # noqa: E402
from parley.local_engine.models.gemm import WeightGemm  # noqa: E402
from parley.local_engine.models.llama import LlamaArch, LlamaModel  # noqa: E402
from parley.local_engine.quant4 import RowQuant, quantize_q4, quantize_q8  # noqa: E402
from parley.local_engine.quant4_cuda import Int4Gemm, unavailable_reason  # noqa: E402
from parley.local_engine.runner import ModelRunner  # noqa: E402
from parley.local_engine.scheduler import ScheduledSeq  # noqa: E402
from parley.local_engine.sequence import Sequence  # noqa: E402

CPU, BF16 = torch.device("cpu"), torch.bfloat16
pytestmark = pytest.mark.skipif(unavailable_reason(CPU, BF16) is not None, reason="this torch lacks the int4 ops")


def _gemm() -> Int4Gemm:
    return Int4Gemm(CPU, BF16)


def test_four_bit_groups_mean_d_q_plus_m_with_the_folded_norm_on_the_activations() -> None:
    gen = torch.Generator().manual_seed(0)
    plain = quantize_q4(torch.randn(96, 256, generator=gen))
    norm = torch.rand(256, generator=gen) + 0.5
    x = torch.randn(5, 256, generator=gen).to(BF16)
    gemm = _gemm()
    w = gemm.prepare(plain.scale_columns(norm))
    assert w.packed is not None and w.dense is None and w.source == "float"
    got = gemm(x, w, torch.ones(96, dtype=BF16)).float()
    want = (x * norm.to(BF16)).float() @ plain.dequantize().t() + 1
    assert torch.allclose(got, want, atol=0.02 * float(want.abs().max()))


def test_a_float_weight_is_quantised_by_q4_1s_rule() -> None:
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, 128).to(BF16)
    gemm = _gemm()
    got = gemm(x, gemm.prepare(w)).float()
    want = x.float() @ quantize_q4(w).dequantize().t()
    assert torch.allclose(got, want, atol=0.02 * float(want.abs().max()))


def test_eight_bit_groups_odd_shapes_and_the_head_stay_dense_with_the_same_values() -> None:
    gen = torch.Generator().manual_seed(2)
    q8 = quantize_q8(torch.randn(64, 128, generator=gen))
    odd = torch.randn(60, 128, generator=gen)  # 60 rows: not a multiple of 8
    gemm, head = _gemm(), Int4Gemm(CPU, BF16, head=True)
    for g, w, ref in ((gemm, q8, q8.dequantize()), (gemm, odd, odd), (head, odd, odd)):
        prepared = g.prepare(w)
        assert prepared.packed is None and prepared.dense is not None
        assert torch.equal(prepared.dense, ref.to(BF16).t())
    assert head.kernel == "dense" and gemm.kernel.startswith("aten-int4pack")


def test_float32_activations_are_refused_with_the_reason() -> None:
    with pytest.raises(EngineConfigError, match="bf16"):
        Int4Gemm(CPU, torch.float32)


class DequantizedGemm:
    """The same 4-bit weights, dequantised to dense bf16: the reference the int4 kernel must match."""

    kernel = "dequantized"

    def prepare(self, weight: Any) -> torch.Tensor:
        rq = weight if isinstance(weight, RowQuant) else quantize_q4(weight)
        return rq.dequantize().to(BF16).t()

    def __call__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.mm(x, w) if bias is None else torch.addmm(bias, x, w)


def _logits(model: Any, ids: list[int]) -> torch.Tensor:
    runner = ModelRunner(model, num_blocks=16, block_size=16)
    seq = Sequence("r", ids, SamplingParams())
    seq.block_table = list(range(16))
    input_ids, positions, batch, _ = runner.prepare([ScheduledSeq(seq, len(ids), 0, True)])
    return model.compute_logits(model.forward(input_ids, positions, runner.kv_cache, batch)).float()


def test_a_whole_model_in_q4_bf16_matches_its_dequantised_weights(tiny_hf: Any, monkeypatch: Any) -> None:
    arch = LlamaArch.from_hf_config(tiny_hf.config.to_dict())
    sd = tiny_hf.state_dict()
    q4 = LlamaModel.from_hf_state_dict(arch, sd, CPU, BF16, quantization="q4")
    assert isinstance(q4.gemm, Int4Gemm) and q4.layers[0].qkv.packed is not None
    monkeypatch.setattr(decoder, "make_gemm", lambda *a, head=False, **k: (WeightGemm(CPU, BF16) if head
                                                                          else DequantizedGemm()))
    ref = LlamaModel.from_hf_state_dict(arch, sd, CPU, BF16, quantization="q4")
    ids = list(range(5, 45))
    a, b = _logits(q4, ids), _logits(ref, ids)
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    # bf16 rounding through a sharpened random net: most positions agree to 1e-3, the worst measured 0.962
    assert cosine.median() > 0.999 and cosine.min() > 0.95, cosine
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (benchmarks/gpu_check.sh runs this on one)")
def test_the_cuda_int4_kernel_computes_the_dequantised_product() -> None:
    cuda = torch.device("cuda")
    if unavailable_reason(cuda, BF16) is not None:
        pytest.skip(f"int4 kernel unavailable: {unavailable_reason(cuda, BF16)}")
    gen = torch.Generator().manual_seed(3)
    plain = quantize_q4(torch.randn(1536, 576, generator=gen))  # SmolLM2's gate/up shape
    norm = torch.rand(576, generator=gen) + 0.5
    x = torch.randn(7, 576, generator=gen).to(BF16)
    gemm = Int4Gemm(cuda, BF16)
    w = gemm.prepare(plain.scale_columns(norm))
    assert w.packed is not None
    got = gemm(x.to(cuda), w).float().cpu()
    want = (x * norm.to(BF16)).float() @ plain.dequantize().t()
    assert torch.allclose(got, want, atol=0.02 * float(want.abs().max()))
