"""Fixtures: the server on 127.0.0.1 over a fake engine (fast), and over the real embedded model (shared)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer, ServerConfig, TenantRegistry, create_app


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


def serve(engine: Any, **config: Any) -> BackgroundServer:
    config.setdefault("model_name", "test-model")
    if isinstance(engine, FakeEngine):
        config.setdefault("constrain_auto_tool_calls", False)  # the byte tokenizer has no grammar support
    return BackgroundServer(create_app(engine, config=ServerConfig(**config)))


@pytest.fixture
def fake_server(fake_engine: FakeEngine) -> Iterator[BackgroundServer]:
    with serve(fake_engine, max_body_bytes=64 * 1024) as server:
        yield server


@pytest.fixture
def tenant_server(fake_engine: FakeEngine) -> Iterator[BackgroundServer]:
    keys = TenantRegistry({"key-a1": "acme", "key-a2": "acme", "key-b": "globex"})
    with serve(fake_engine, tenants=keys) as server:
        yield server
