"""`scripts/build_o200k.py`: js-tiktoken's compact ranks -> the official `o200k_base.tiktoken`."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from parley.protocol import harmony
from tests.conftest import REPO_ROOT


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_o200k", REPO_ROOT / "scripts" / "build_o200k.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_package(tmp_path: Path, bpe_ranks: str) -> Path:
    source = "export default " + json.dumps({"pat_str": "x", "special_tokens": {}, "bpe_ranks": bpe_ranks}) + ";\n"
    archive = tmp_path / "js-tiktoken-0.0.0.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        data = source.encode()
        info = tarfile.TarInfo("package/dist/ranks/o200k_base.js")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return archive


def test_compact_ranks_become_one_token_and_rank_per_line_in_rank_order() -> None:
    script = load_script()
    assert script.convert("! 5 Yw==\n! 0 YQ== Yg==\n") == b"YQ== 0\nYg== 1\nYw== 5\n"


def test_a_rebuilt_file_with_the_wrong_hash_is_not_written(tmp_path: Path) -> None:
    script = load_script()
    archive = fake_package(tmp_path, "! 0 YQ== Yg==")
    assert script.read_ranks_json(archive)["bpe_ranks"] == "! 0 YQ== Yg=="
    with pytest.raises(SystemExit, match="expected 446a9538"):
        script.build(tmp_path / "cache", tgz=archive)
    assert not (tmp_path / "cache").exists()


def test_the_cache_location_follows_parley_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path))
    assert harmony.vocabulary_candidates()[0] == tmp_path / "parley" / "o200k_base.tiktoken"


def test_the_cached_vocabulary_is_o200k_harmony() -> None:
    path = harmony.vocabulary_path()
    if path is None:
        pytest.skip("vocabulary file o200k_base.tiktoken not found; run scripts/build_o200k.py")
    encoding = harmony.load_harmony_encoding(path)
    assert encoding.decode_utf8([24912, 2375]) == "hello world"
    assert encoding.token_bytes(9552) == b" \xf0\x9f"
    assert encoding.decode_utf8([200014]) == "<|reserved_200014|>"
    assert encoding.is_special_token(200006) and not encoding.is_special_token(24912)
