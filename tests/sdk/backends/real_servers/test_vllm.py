"""What only vLLM has: created-cache tokens counted as writes, and ``cache_salt`` keeping tenants apart."""

from __future__ import annotations

import uuid

import pytest

from parley.protocol import Message
from tests.sdk.backends.real_servers.conftest import RunningServer
from tests.sdk.backends.real_servers.test_common import LEASE, backend, request

pytestmark = [pytest.mark.real_server, pytest.mark.model,
              pytest.mark.parametrize("real_server", ["vllm"], indirect=True)]


async def test_created_cache_tokens_are_the_ledgers_cache_writes(real_server: RunningServer) -> None:
    model = backend(real_server)
    system = Message.system(f"{uuid.uuid4()} You answer questions about this lease. {LEASE}")  # nothing cached yet
    try:
        first = await model.generate(request(system, Message.user("What happens on day 2?")))
    finally:
        await model.aclose()
    details = first.usage.raw[0]["prompt_tokens_details"]
    assert details["created_cache_tokens"] > 500 and first.usage.cache_read_tokens == details["cached_tokens"]
    assert first.usage.cache_write_tokens == details["created_cache_tokens"]
    assert first.usage.prompt_tokens == first.usage.raw[0]["prompt_tokens"]  # nothing counted twice


async def test_a_tenant_never_reads_another_tenants_cached_prefix(real_server: RunningServer) -> None:
    model = backend(real_server)
    system = Message.system(f"{uuid.uuid4()} You answer questions about this lease. {LEASE}")
    try:
        await model.generate(request(system, Message.user("Day 4?"), tenant="acme"))
        same_tenant = await model.generate(request(system, Message.user("Day 5?"), tenant="acme"))
        other_tenant = await model.generate(request(system, Message.user("Day 5?"), tenant="globex"))
    finally:
        await model.aclose()
    assert same_tenant.usage.cache_read_tokens is not None and same_tenant.usage.cache_read_tokens > 500
    assert other_tenant.usage.cache_read_tokens == 0  # tenant -> cache_salt: a different first block hash
