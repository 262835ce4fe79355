"""The served model id: the model's own name by default (``SmolLM2-135M-Instruct``, never ``float32``),
`--served-model-name NAME[,ALIAS...]` to override, and requests naming any alias accepted."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer, ServerConfig, create_app
from parley.server.cli import add_serve_command, build_config, served_names


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="parley")
    add_serve_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def listed(server: BackgroundServer) -> tuple[list[str], list[str]]:
    openai_ids = [m["id"] for m in httpx.get(server.base_url + "/v1/models", timeout=30).json()["data"]]
    anthropic = httpx.get(server.base_url + "/v1/models", headers={"anthropic-version": "2023-06-01"}, timeout=30)
    return openai_ids, [m["id"] for m in anthropic.json()["data"]]


def chat(server: BackgroundServer, model: str) -> httpx.Response:
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)


def message(server: BackgroundServer, model: str) -> httpx.Response:
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(server.base_url + "/v1/messages", json=body, timeout=120)


def test_served_names_split_commas_and_repeats_in_order() -> None:
    assert served_names([]) == [] and served_names(None) == []
    assert served_names(["a,b", "c", " b , d ,"]) == ["a", "b", "c", "d"]
    assert served_names("solo") == ["solo"]


def test_without_the_flag_the_engines_own_name_is_served() -> None:
    config = build_config(parse(), "SmolLM2-135M-Instruct")
    assert config.model_name == "SmolLM2-135M-Instruct" and config.model_aliases == ()


def test_the_flag_names_the_listed_id_then_aliases() -> None:
    config = build_config(parse("--served-model-name", "gpt-4o,smol", "--served-model-name", "local"), "Ignored")
    assert config.model_name == "gpt-4o" and config.model_aliases == ("smol", "local")
    assert config.serves("gpt-4o") and config.serves("smol") and config.serves("local")
    assert not config.serves("Ignored") and not config.serves("gpt-4")


def test_create_app_without_a_name_lists_the_engines_model_name() -> None:
    engine = FakeEngine(model_id="Fake-1B.Q8_0@0123456789abcdef/float32", model_name="Fake-1B")
    with BackgroundServer(create_app(engine, config=ServerConfig(constrain_auto_tool_calls=False))) as server:
        assert listed(server) == (["Fake-1B"], ["Fake-1B"])
        assert httpx.get(server.base_url + "/health", timeout=30).json()["model"] == "Fake-1B"
        assert chat(server, "Fake-1B").status_code == 200
        assert chat(server, "float32").status_code == 404


@pytest.fixture(scope="module")
def aliased() -> Iterator[BackgroundServer]:
    config = build_config(parse("--served-model-name", "primary,alias-one", "--served-model-name", "alias-two"), "x")
    engine = FakeEngine(model_id="fake@id/float32", model_name="Fake")
    with BackgroundServer(create_app(engine, config=ServerConfig(
        model_name=config.model_name, model_aliases=config.model_aliases, constrain_auto_tool_calls=False,
    ))) as server:
        yield server


def test_only_the_first_name_is_listed(aliased: BackgroundServer) -> None:
    assert listed(aliased) == (["primary"], ["primary"])


@pytest.mark.parametrize("name", ["primary", "alias-one", "alias-two", "fake@id/float32"])
def test_requests_naming_any_alias_are_served(aliased: BackgroundServer, name: str) -> None:
    response = chat(aliased, name)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == name  # echoed as asked, as OpenAI and vLLM do
    assert message(aliased, name).status_code == 200


@pytest.mark.parametrize("name", ["Fake", "alias", "primary,alias-one", "float32"])
def test_other_names_are_a_404_naming_the_served_id(aliased: BackgroundServer, name: str) -> None:
    response = chat(aliased, name)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model" and "'primary'" in error["message"]
    assert message(aliased, name).status_code == 404


# -- the real engine ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_engine() -> Iterator[Any]:
    from parley.local_engine import Engine

    engine = Engine.from_pretrained(device="cpu", dtype="float32")
    yield engine
    engine.close()


@pytest.mark.model
def test_the_embedded_model_is_served_as_smollm2_135m_instruct(real_engine: Any) -> None:
    assert real_engine.model_name == "SmolLM2-135M-Instruct"
    # the default mode (auto_mode.py): the file's Q4_1 blocks, an 8-bit LM head, n-gram speculation
    assert real_engine.model_id.startswith("SmolLM2-135M-Instruct.Q4_1@")
    assert real_engine.model_id.endswith("/float32+q4+head")
    config = build_config(parse(), real_engine.model_name)  # what `parley serve` does
    with BackgroundServer(create_app(real_engine, config=config)) as server:
        [model] = httpx.get(server.base_url + "/v1/models", timeout=30).json()["data"]
        assert model["root"].startswith("SmolLM2-135M-Instruct.Q4_1@")  # the served root names the mode
        assert model["root"].endswith("/float32+q4+head8+ngram")
        openai_ids, anthropic_ids = listed(server)
        assert openai_ids == ["SmolLM2-135M-Instruct"] and anthropic_ids == ["SmolLM2-135M-Instruct"]
        response = chat(server, "SmolLM2-135M-Instruct")
        assert response.status_code == 200, response.text
        assert chat(server, "float32").status_code == 404
    with BackgroundServer(create_app(real_engine)) as server:  # no config at all: the same name
        assert listed(server)[0] == ["SmolLM2-135M-Instruct"]


def test_an_engine_without_a_model_name_is_named_from_its_id() -> None:
    from types import SimpleNamespace

    from parley.server.app import served_name_of

    def engine(model_id: str, **kwargs: Any) -> Any:
        return SimpleNamespace(model_id=model_id, **kwargs)

    assert served_name_of(engine("Tiny-1B.Q4_0@0123/float32")) == "Tiny-1B.Q4_0"
    assert served_name_of(engine("models/tiny/bfloat16")) == "tiny"
    assert served_name_of(engine("plain")) == "plain"
    assert served_name_of(engine("x@y/float32", model_name="Named")) == "Named"
