"""`Engine.model_name`: the model's own name for display and serving, apart from `model_id` (cache identity)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from parley.local_engine import Engine, EngineConfig, loader
from tests.local_engine.conftest import ByteTokenizer, tiny_hf_model, torch


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Llama-3.2-1B-Instruct"),
        ("tinyllama.IQ3_XS.gguf", "tinyllama"),
        ("model-f16.gguf", "model"),
        ("model.BF16.gguf", "model"),
        ("Qwen2.5-7B.gguf", "Qwen2.5-7B"),
        ("plain.gguf", "plain"),
    ],
)
def test_a_gguf_is_named_without_its_quantisation(file: str, name: str) -> None:
    assert loader.gguf_model_name(Path(file)) == name


def test_a_folder_is_named_by_itself_or_its_hub_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "my-finetune"
    plain.mkdir()
    assert loader.folder_model_name(plain) == "my-finetune"
    snapshot = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-360M-Instruct" / "snapshots" / "a1b2c3"
    snapshot.mkdir(parents=True)
    assert loader.folder_model_name(snapshot) == "SmolLM2-360M-Instruct"
    monkeypatch.chdir(plain)
    assert loader.folder_model_name(Path(".")) == "my-finetune"


def _net() -> Any:
    from parley.local_engine.models.llama import LlamaArch, LlamaModel

    hf = tiny_hf_model()
    arch = LlamaArch.from_hf_config(hf.config.to_dict())
    return LlamaModel.from_hf_state_dict(arch, hf.state_dict(), torch.device("cpu"), torch.float32)


@pytest.mark.parametrize(
    ("model_id", "model_name", "expected"),
    [
        ("tiny", None, "tiny"),
        ("Tiny-1B.Q4_0@0123456789abcdef/float32", None, "Tiny-1B.Q4_0"),
        ("org/tiny/bfloat16", None, "tiny"),
        ("anything@hash/float32", "Given-Name", "Given-Name"),
    ],
)
def test_model_name_comes_from_the_caller_or_the_id(model_id: str, model_name: str | None, expected: str) -> None:
    engine = Engine.from_model(_net(), ByteTokenizer(), model_id=model_id, model_name=model_name,
                               config=EngineConfig(num_kv_blocks=8, block_size=4, quantization=None))
    try:
        assert engine.model_name == expected
        assert engine.model_id == model_id  # the cache identity is untouched
    finally:
        engine.close()


@pytest.mark.model  # borrows the embedded model's tokenizer files
def test_a_hf_folder_loads_under_its_folder_name(tmp_path: Path) -> None:
    embedded = loader.resolve(None).folder
    folder = tmp_path / "Tiny-Chat-v2"
    folder.mkdir()
    hf = tiny_hf_model(vocab_size=49152)
    hf.config._name_or_path = "/somewhere/else/base-model"  # a fine-tune's config names its base model
    hf.save_pretrained(str(folder))
    for tokenizer_file in embedded.glob("tokenizer*"):
        shutil.copy(tokenizer_file, folder / tokenizer_file.name)
    for extra in ("special_tokens_map.json",):
        if (embedded / extra).is_file():
            shutil.copy(embedded / extra, folder / extra)
    engine = Engine.from_pretrained(folder, device="cpu", dtype="float32",
                                    config=EngineConfig(num_kv_blocks=8, block_size=4, quantization=None))
    try:
        assert engine.model_name == "Tiny-Chat-v2"
        assert engine.model_id.startswith("Tiny-Chat-v2@") and engine.model_id.endswith("/float32")
    finally:
        engine.close()
