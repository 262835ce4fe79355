"""`--quantization`, `--speculation`, `--compile` and `--threads` on every command that loads a model, with the
engine's own defaults; `LocalBackend(quantization=..., engine_config=...)` reaches the engine it loads."""

from __future__ import annotations

from typing import Any

import pytest

from parley.backends.local import LocalBackend, backend
from parley.cli import build_parser
from parley.errors import ConfigurationError
from parley.local_engine import EngineConfig
from parley.local_engine.testing import FakeEngine

pytest.importorskip("torch")


@pytest.mark.parametrize("command", [["serve"], ["chat"], ["demo"], ["bench"]])
def test_every_model_command_defaults_to_the_engines_auto_choices(command: list[str]) -> None:
    from parley._engine_flags import engine_config

    args = build_parser().parse_args(command)
    config = engine_config(args)
    assert (config.quantization, config.speculation, config.compile, config.num_threads) == (
        "auto", "auto", False, None
    )


def test_flags_narrow_the_choice() -> None:
    from parley._engine_flags import engine_config

    args = build_parser().parse_args(
        ["serve", "--quantization", "none", "--speculation", "none", "--compile", "--threads", "1"]
    )
    config = engine_config(args, max_waiting=7)
    assert (config.quantization, config.speculation, config.compile, config.num_threads, config.max_waiting) == (
        None, None, True, 1, 7
    )
    assert engine_config(build_parser().parse_args(["chat", "--quantization", "q8"])).quantization == "q8"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--quantization", "q2"])


def test_bench_measures_the_default_mode_beside_fp32_unless_told() -> None:
    parse = build_parser().parse_args
    assert parse(["bench"]).modes is None and parse(["bench"]).quantization == "auto"
    assert parse(["bench", "--quantization", "q8"]).quantization == "q8"


def test_local_backend_loads_with_the_settings_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    def fake_from_pretrained(model: Any = None, **kwargs: Any) -> FakeEngine:
        seen.append({"model": model, **kwargs})
        return FakeEngine()

    from parley.local_engine import Engine

    monkeypatch.setattr(Engine, "from_pretrained", staticmethod(fake_from_pretrained))
    monkeypatch.setattr(backend, "_ENGINES", {})
    config = EngineConfig(num_threads=1, speculation=None)
    assert isinstance(LocalBackend("m.gguf", quantization="q8", engine_config=config).engine, FakeEngine)
    assert seen[-1] == {"model": "m.gguf", "device": None, "dtype": None, "config": config, "quantization": "q8"}
    LocalBackend("m.gguf", quantization=None).engine  # noqa: B018 - loading is the point
    assert seen[-1]["quantization"] == "none" and seen[-1]["config"] is None
    LocalBackend().engine  # noqa: B018
    assert seen[-1]["quantization"] == "auto"
    assert len(seen) == 3  # one engine per distinct setting; the same settings share it
    LocalBackend("m.gguf", quantization="q8", engine_config=config).engine  # noqa: B018
    assert len(seen) == 3


def test_an_engine_and_load_settings_together_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        LocalBackend(engine=FakeEngine(), quantization="q4")
    with pytest.raises(ConfigurationError, match="not both"):
        LocalBackend(engine=FakeEngine(), engine_config=EngineConfig())
