"""The compiled decode step (`EngineConfig(compile=True)`): it falls back to eager with one warning when it
cannot run, and, compiled, gives eager's tokens. Compiling the tiny model's two graphs (batch 1 and >= 2) takes
about a minute on 2 cores, cold; it runs wherever a C++ compiler is on PATH."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from parley.local_engine import EngineConfig, SamplingParams  # noqa: E402
from parley.local_engine import compile as compile_mod  # noqa: E402
from tests.local_engine.conftest import engine_from_hf  # noqa: E402

CFG = dict(num_kv_blocks=128, block_size=4, max_num_batched_tokens=64)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 60))]


def test_without_a_cpp_compiler_the_engine_warns_once_and_runs_eager(tiny_hf: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(compile_mod, "cpp_compiler", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = engine_from_hf(tiny_hf, EngineConfig(**CFG, compile=True))
    try:
        notes = [w for w in caught if "compiled decode step" in str(w.message) or "runs eager" in str(w.message)]
        assert len(notes) == 1 and "C++ compiler" in str(notes[0].message)
        stats = engine.stats()
        assert stats["compiled"] is False and stats["compile_s"] is None
        assert engine.generate(PROMPTS, SamplingParams(max_tokens=8))[0].token_ids  # eager, fine
    finally:
        engine.close()


def test_a_failing_compile_falls_back_to_eager(tiny_hf: Any, monkeypatch: Any) -> None:
    def broken(self: Any, *args: Any) -> Any:
        raise RuntimeError("simulated Inductor failure")

    monkeypatch.setattr(compile_mod.CompiledDecode, "_run", broken)
    with pytest.warns(RuntimeWarning, match="simulated Inductor failure"):
        engine = engine_from_hf(tiny_hf, EngineConfig(**CFG, compile=True))
    try:
        assert engine.stats()["compiled"] is False
        assert len(engine.generate(PROMPTS, SamplingParams(max_tokens=6))) == 3
    finally:
        engine.close()


def test_the_config_flag_is_validated() -> None:
    from parley.local_engine.errors import EngineConfigError

    with pytest.raises(EngineConfigError, match=r"EngineConfig\.compile"):
        EngineConfig(compile="yes")  # type: ignore[arg-type]


@pytest.mark.skipif(compile_mod.cpp_compiler() is None, reason="no C++ compiler on PATH")
def test_compiled_decode_gives_eager_tokens(tiny_hf: Any) -> None:
    eager = engine_from_hf(tiny_hf, EngineConfig(**CFG))
    compiled = engine_from_hf(tiny_hf, EngineConfig(**CFG, compile=True, speculation="ngram"))
    try:
        stats = compiled.stats()
        assert stats["compiled"] is True and stats["compile_s"] > 0
        p = SamplingParams(max_tokens=24, ignore_eos=True)
        ref = [o.token_ids for o in eager.generate(PROMPTS, p)]
        assert [o.token_ids for o in compiled.generate(PROMPTS, p)] == ref  # batch >= 2 (and verify rows)
        assert [compiled.generate([q], p)[0].token_ids for q in PROMPTS] == ref  # batch 1
    finally:
        eager.close()
        compiled.close()
