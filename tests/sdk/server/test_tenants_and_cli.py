"""Tenant registry, cache-salt derivation and the `serve` command's configuration."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from parley.server import ApiError, TenantRegistry, add_serve_command, cache_salt
from parley.server.cli import build_config
from parley.server.tenants import ANONYMOUS, api_key_from_headers


def test_salt_is_derived_from_the_tenant_and_length_prefixed() -> None:
    assert cache_salt("acme") == cache_salt("acme")
    assert cache_salt("acme") != cache_salt("globex")
    assert cache_salt("org_1", "2345") != cache_salt("org_12345", "")  # no concatenation ambiguity
    assert cache_salt("acme", "") != cache_salt("acme")  # an explicit empty salt is still a salt
    assert cache_salt("acme", "s") != cache_salt("globex", "s")  # a client salt never crosses tenants


def test_open_registry_serves_everyone_as_anonymous() -> None:
    assert TenantRegistry().tenant_for(None) == ANONYMOUS
    assert TenantRegistry().tenant_for("anything") == ANONYMOUS


def test_keys_map_to_tenants_and_unknown_keys_are_401() -> None:
    registry = TenantRegistry.from_flags(["k1=acme", "k2=acme", "solo"])
    assert registry.tenant_for("k1") == registry.tenant_for("k2") == "acme"
    assert registry.tenant_for("solo").startswith("key-") and "solo" not in registry.tenant_for("solo")
    for bad in (None, "", "k3"):
        with pytest.raises(ApiError) as caught:
            registry.tenant_for(bad)
        assert caught.value.status == 401


def test_registry_from_json_and_line_files(tmp_path: Path) -> None:
    json_file = tmp_path / "keys.json"
    json_file.write_text('{"k1": "acme", "k2": "globex"}')
    assert TenantRegistry.from_file(json_file).tenant_for("k2") == "globex"
    lines = tmp_path / "keys.txt"
    lines.write_text("# team keys\nk1=acme\n\nk9 = initech\n")
    registry = TenantRegistry.from_file(lines)
    assert registry.tenant_for("k1") == "acme" and registry.tenant_for("k9") == "initech"
    bad = tmp_path / "bad.json"
    bad.write_text('{"k1": 5}')
    with pytest.raises(ValueError):
        TenantRegistry.from_file(bad)


def test_api_key_comes_from_bearer_or_x_api_key() -> None:
    assert api_key_from_headers({"authorization": "Bearer abc"}) == "abc"
    assert api_key_from_headers({"x-api-key": "xyz", "authorization": "Bearer abc"}) == "xyz"
    assert api_key_from_headers({"authorization": "Basic abc"}) is None
    assert api_key_from_headers({}) is None


def test_serve_command_parses_into_a_config(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="parley")
    sub = parser.add_subparsers(dest="command")
    add_serve_command(sub)
    keys = tmp_path / "keys.txt"
    keys.write_text("filekey=globex\n")
    args = parser.parse_args(
        ["serve", "--port", "9001", "--api-key", "k1=acme", "--api-keys-file", str(keys), "--max-body-bytes", "1000",
         "--responses-store", str(tmp_path / "responses.db")]
    )
    assert args.port == 9001 and args.host == "127.0.0.1" and args.model is None
    config = build_config(args, "SmolLM2-135M-Instruct")  # the engine's own name, used without --served-model-name
    assert config.model_name == "SmolLM2-135M-Instruct" and config.model_aliases == ()
    assert config.tenants.tenant_for("k1") == "acme" and config.tenants.tenant_for("filekey") == "globex"
    assert config.max_body_bytes == 1000
    assert config.responses_store == str(tmp_path / "responses.db")
    assert build_config(parser.parse_args(["serve"]), "m").responses_store is None  # off by default
