"""The weight-GEMM seam and the per-thread thread-count switches the model relies on for CPU speed."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from parley.local_engine.models.gemm import WeightGemm  # noqa: E402
from parley.local_engine.threads import mkl_set_num_threads_local, omp_set_num_threads  # noqa: E402


@pytest.mark.parametrize("rows", [1, 3, 16, 70])
def test_fp32_cpu_gemm_computes_x_times_w_transposed(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 40, generator=gen)
    x = torch.randn(rows, 40, generator=gen)
    gemm = WeightGemm(torch.device("cpu"), torch.float32)
    got = gemm(x, gemm.prepare(w))
    assert got.shape == (rows, 96) and got.dtype == torch.float32 and got.layout == torch.strided
    torch.testing.assert_close(got, x @ w.t(), rtol=1e-5, atol=1e-5)


def test_fp32_cpu_gemm_prefers_onednn_when_the_build_has_it() -> None:
    gemm = WeightGemm(torch.device("cpu"), torch.float32)
    assert gemm.kernel == ("onednn" if torch.backends.mkldnn.is_available() else "torch.mm")


def test_strided_inputs_are_accepted() -> None:
    """The model feeds the gate half of a fused gate/up output, a non-contiguous view."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(24, 32, generator=gen)
    fused = torch.randn(5, 64, generator=gen)
    x = fused[:, :32]
    gemm = WeightGemm(torch.device("cpu"), torch.float32)
    torch.testing.assert_close(gemm(x, gemm.prepare(w)), x @ w.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_other_dtypes_use_plain_torch_mm_and_keep_their_dtype(dtype: torch.dtype) -> None:
    w = torch.randn(8, 16).to(dtype)
    x = torch.randn(2, 16).to(dtype)
    gemm = WeightGemm(torch.device("cpu"), dtype)
    assert gemm.kernel == "torch.mm"
    out = gemm(x, gemm.prepare(w))
    assert out.dtype == dtype
    assert torch.equal(out, torch.mm(x, w.t()))


def test_onednn_can_be_turned_off() -> None:
    gemm = WeightGemm(torch.device("cpu"), torch.float32, prefer_onednn=False)
    w = torch.randn(8, 16)
    assert gemm.kernel == "torch.mm"
    assert gemm.prepare(w).data_ptr() == w.data_ptr()  # a transposed view, no copy


def test_mkl_thread_count_is_set_for_the_calling_thread_only() -> None:
    setter = mkl_set_num_threads_local()
    if setter is None:
        pytest.skip("this torch build links no MKL")
    import ctypes

    from parley.local_engine.threads import _loaded

    getter = next(
        ctypes.CDLL(p).mkl_get_max_threads for p in _loaded(("libtorch_cpu", "libmkl_rt", "libmkl_core"))
    )
    main_before = getter()
    seen: dict[str, int] = {}

    def worker() -> None:
        setter(1)
        seen["worker"] = getter()
        setter(0)
        seen["worker_after_reset"] = getter()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["worker"] == 1
    assert seen["worker_after_reset"] == main_before
    assert getter() == main_before


def test_openmp_setter_is_found_where_torch_uses_openmp() -> None:
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch build has no OpenMP")
    assert omp_set_num_threads() is not None


def test_decode_threads_probes_both_counts_keeps_the_faster_and_probes_again() -> None:
    from parley.local_engine.threads import DecodeThreads

    dt = DecodeThreads(2, probe_steps=3, reprobe_every=10)
    seen = []
    for _ in range(6):  # probing alternates, then the faster per token (1 thread here) wins
        t = dt.threads_for(1)
        seen.append(t)
        dt.record(1, t, 0.010 if t == 1 else 0.030)
    assert sorted(seen) == [1, 1, 1, 2, 2, 2] and dt.threads_for(1) == 1 and dt.stats() == {1: 1}
    assert dt.threads_for(16) in (1, 2)  # another batch bucket probes on its own
    for _ in range(10):
        dt.record(1, 1, 0.010)
    assert dt.threads_for(1) in (1, 2) and len({dt.threads_for(1) for _ in range(1)}) == 1
    for _ in range(6):  # the load changed: 2 threads are now faster
        t = dt.threads_for(1)
        dt.record(1, t, 0.030 if t == 1 else 0.010)
    assert dt.threads_for(1) == 2
    assert DecodeThreads(1).threads_for(4) == 1


def test_decode_threads_keeps_every_thread_on_a_near_tie() -> None:
    from parley.local_engine.threads import FEWER_THREADS_MARGIN, DecodeThreads

    for one, two, expected in ((0.0095, 0.0100, 2), (0.0100 * FEWER_THREADS_MARGIN * 0.99, 0.0100, 1)):
        dt = DecodeThreads(2, probe_steps=3)
        for _ in range(6):
            t = dt.threads_for(1)
            dt.record(1, t, one if t == 1 else two)
        assert dt.threads_for(1) == expected, (one, two)


def test_decode_threads_gives_up_a_hopeless_count_after_one_probe_step() -> None:
    from parley.local_engine.threads import DecodeThreads

    dt = DecodeThreads(2, probe_steps=4)
    asked = []
    for _ in range(5):
        t = dt.threads_for(1)
        asked.append(t)
        dt.record(1, t, 0.500 if t == 2 else 0.010)  # 2 threads 50x slower: a busy other core
    # the first 2-thread step was slow beside nothing yet; the second, 50x the 1-thread step, ends its probe
    assert asked.count(2) == 2 and dt.threads_for(1) == 1


def test_decode_threads_discounts_a_counts_warm_up_step_and_occasional_slow_steps() -> None:
    """The probe samples of a `parley serve` start that chose 1 thread although 2 then ran ~25 % faster: the
    first 2-thread step paid a warm-up, two more met the event loop starting the stream."""
    from parley.local_engine.threads import DecodeThreads

    two = [0.0275, 0.0060, 0.0058, 0.0124, 0.0061, 0.0111]
    one = [0.0104, 0.0082, 0.0083, 0.0082, 0.0081, 0.0084]
    dt = DecodeThreads(2, probe_steps=6)
    for _ in range(12):
        t = dt.threads_for(1)
        dt.record(1, t, (two if t == 2 else one).pop(0))
    assert dt.threads_for(1) == 2 and dt.stats() == {1: 2}


def test_decode_threads_still_leaves_a_count_that_is_slow_at_most_steps() -> None:
    from parley.local_engine.threads import DecodeThreads

    two = [0.0060, 0.0150, 0.0061, 0.0160, 0.0170, 0.0155]  # a busy other core: fast only now and then
    one = [0.0090, 0.0082, 0.0083, 0.0082, 0.0081, 0.0084]
    dt = DecodeThreads(2, probe_steps=6)
    for _ in range(12):
        t = dt.threads_for(1)
        dt.record(1, t, (two if t == 2 else one).pop(0))
    assert dt.threads_for(1) == 1


def test_decode_threads_probes_again_soon_after_its_first_choice() -> None:
    from parley.local_engine.threads import FIRST_REPROBE, DecodeThreads

    dt = DecodeThreads(2, probe_steps=3, reprobe_every=1000)
    for _ in range(6):  # the first probe, in a noisy start: 1 thread looks faster
        t = dt.threads_for(1)
        dt.record(1, t, 0.008 if t == 1 else 0.030)
    assert dt.threads_for(1) == 1
    asked = []
    assert FIRST_REPROBE <= 64
    for _ in range(72):  # the load eased: 2 threads are now faster
        t = dt.threads_for(1)
        asked.append(t)
        dt.record(1, t, 0.008 if t == 1 else 0.005)
    assert 2 in asked and dt.threads_for(1) == 2  # probed again long before reprobe_every (1000 steps)
