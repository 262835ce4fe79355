"""The C++ row ops between the group GEMMs (row_ops_kernel.py): the residual add + RMSNorm and decode attention.

They must compute what the ATen ops they replace compute (to rounding), and a row's result must depend on that
row only: bitwise the same alone, in any batch, and on any number of threads.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from parley.local_engine import quant4  # noqa: E402
from parley.local_engine.models.attention import DecodeGroup, _decode_group_plan  # noqa: E402
from parley.local_engine.models.layers import rms_normalize  # noqa: E402


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def at_threads(n: int, fn: Any) -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def test_the_extension_runs_its_loops_on_every_thread_it_is_given(kernel: Any) -> None:
    assert at_threads(1, kernel.parallel_width) == 1
    assert at_threads(2, kernel.parallel_width) == 2  # built with OpenMP: a serial build answers 1


def test_rms_rows_is_rms_normalize_and_depends_on_its_row_only(kernel: Any) -> None:
    x = torch.randn(70, 576, generator=gen(0)) * 4
    x[3] = 0.0
    batched = kernel.rms_rows(x, 1e-5)
    torch.testing.assert_close(batched, rms_normalize(x, 1e-5), rtol=1e-6, atol=1e-6)
    assert not batched[3].any()
    for i in (0, 3, 69):
        assert torch.equal(kernel.rms_rows(x[i : i + 1].clone(), 1e-5), batched[i : i + 1])
    assert torch.equal(at_threads(1, lambda: kernel.rms_rows(x, 1e-5)), batched)
    odd = torch.randn(5, 37, generator=gen(1))  # a width that is not a multiple of the 8 lanes
    torch.testing.assert_close(kernel.rms_rows(odd, 1e-6), rms_normalize(odd, 1e-6), rtol=1e-6, atol=1e-6)


def test_add_rms_rows_adds_in_place_exactly_and_returns_the_norm_of_the_sum(kernel: Any) -> None:
    residual = torch.randn(9, 576, generator=gen(2))
    delta = torch.randn(9, 576, generator=gen(3))
    expected_sum = residual + delta
    out = kernel.add_rms_rows_(residual, delta, 1e-5)
    assert torch.equal(residual, expected_sum)  # the same fp32 add as residual.add_(delta)
    assert torch.equal(out, kernel.rms_rows(expected_sum, 1e-5))
    strided = torch.randn(9, 1152, generator=gen(4))[:, ::2]  # a view is accepted as the delta
    kernel.add_rms_rows_(residual, strided, 1e-5)
    assert torch.equal(residual, expected_sum + strided)


def test_bad_inputs_are_refused_with_a_clear_error(kernel: Any) -> None:
    with pytest.raises(RuntimeError, match="contiguous 2-D float32"):
        kernel.rms_rows(torch.randn(4, 8, dtype=torch.float64), 1e-5)
    with pytest.raises(RuntimeError, match="shape"):
        kernel.add_rms_rows_(torch.randn(4, 8), torch.randn(4, 9), 1e-5)


def pool_and_query(B: int, L: int, *, H: int = 9, KVH: int = 3, D: int = 64, slots: int = 600) -> tuple[Any, ...]:
    g = gen(B * 1000 + L)
    kvc = torch.randn(2 * KVH, slots, D, generator=g)
    qkv = torch.randn(B, H * D + 2 * KVH * D, generator=g)  # q is a strided view, as in the decoder's buffer
    q = qkv[:, : H * D]
    gather = torch.stack([torch.randperm(slots, generator=g)[:L] for _ in range(B)])
    return kvc, q, gather


def torch_attention(q: Any, kvc: Any, gather: Any, mask: Any, sinks: Any, KVH: int = 3) -> Any:
    group = DecodeGroup(None, 0, q.shape[0], gather, mask)
    return _decode_group_plan(q, group, H=9, KVH=KVH, D=64, kernel=None)(kvc, sinks)


@pytest.mark.parametrize("with_sinks", [False, True])
def test_decode_attention_matches_the_aten_path_with_padding_and_sinks(kernel: Any, with_sinks: bool) -> None:
    B, L = 4, 128
    kvc, q, gather = pool_and_query(B, L)
    mask = torch.zeros(B, 1, L)
    mask[1, 0, 100:] = float("-inf")  # row 1 has 100 real slots, padded to the bucket
    sinks = torch.randn(3, 3, generator=gen(5)) if with_sinks else None
    expected = torch_attention(q, kvc, gather, mask, sinks)
    got = kernel.decode_attention(q, kvc, gather, mask.view(B, L), torch.empty(0) if sinks is None else sinks, 3, True)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_decode_attention_of_a_row_is_the_same_alone_batched_and_on_any_thread_count(kernel: Any) -> None:
    B, L = 16, 64
    kvc, q, gather = pool_and_query(B, L)
    empty = torch.empty(0)
    batched = kernel.decode_attention(q, kvc, gather, empty, empty, 3, True)
    for i in (0, 7, 15):
        alone = kernel.decode_attention(q[i : i + 1], kvc, gather[i : i + 1].contiguous(), empty, empty, 3, True)
        assert torch.equal(alone, batched[i : i + 1])
    assert torch.equal(at_threads(1, lambda: kernel.decode_attention(q, kvc, gather, empty, empty, 3, True)), batched)
    assert torch.equal(at_threads(2, lambda: kernel.decode_attention(q, kvc, gather, empty, empty, 3, True)), batched)


def test_the_decoder_uses_the_row_ops_in_the_group_modes_only(kernel: Any) -> None:
    from parley.local_engine.models.arch import DecoderArch
    from parley.local_engine.models.decoder import DecoderModel

    arch = DecoderArch(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=32, rms_norm_eps=1e-5, max_position_embeddings=128,
                       tie_word_embeddings=True)
    cpu = torch.device("cpu")
    # the extension as loaded now (a test of the no-compiler fallback reloads it: another module object)
    assert DecoderModel(arch, cpu, torch.float32, quantization="q4").row_ops is quant4.kernel_module()[0]
    assert DecoderModel(arch, cpu, torch.float32).row_ops is None  # fp32 keeps ATen's order (HF parity)


def test_swiglu_rows_is_silu_of_the_gate_times_up_and_per_row(kernel: Any) -> None:
    gate_up = torch.randn(20, 2 * 96, generator=gen(6)) * 6
    got = kernel.swiglu_rows(gate_up, 96)
    expected = torch.nn.functional.silu(gate_up[:, :96]) * gate_up[:, 96:]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert got.is_contiguous() and torch.equal(kernel.swiglu_rows(gate_up[5:6].clone(), 96), got[5:6])
    with pytest.raises(RuntimeError, match="2 \\* inter"):
        kernel.swiglu_rows(gate_up, 95)


def test_decode_attention_in_avx2_is_the_scalar_loops_bitwise(kernel: Any) -> None:
    """The vector path keeps the scalar path's 8 lanes, roundings and sum order; a head width that is not a
    multiple of 8 takes the scalar tail."""
    if kernel.simd_name() == "scalar":
        pytest.skip("this CPU has no AVX2: there is one path only")
    for D, L, with_sinks in ((64, 200, False), (20, 37, True)):
        kvc, q, gather = pool_and_query(3, L, D=D)
        mask = torch.zeros(3, L)
        mask[2, L // 2 :] = float("-inf")
        sinks = torch.randn(3, 3, generator=gen(D)) if with_sinks else torch.empty(0)
        assert torch.equal(kernel.decode_attention(q, kvc, gather, mask, sinks, 3, True),
                           kernel.decode_attention(q, kvc, gather, mask, sinks, 3, False))
