"""Fixtures for the hosted-backend tests: a scripted HTTP server on 127.0.0.1 per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.sdk.backends.fake_server import FakeServer


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    fake = await FakeServer().start()
    try:
        yield fake
    finally:
        await fake.stop()
