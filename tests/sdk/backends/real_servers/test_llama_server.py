"""What only llama.cpp's `llama-server` has: GBNF grammars, and ``-np`` parallel slots decoding at once."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from parley.backends.base import SamplingSettings
from parley.protocol import Message
from tests.sdk.backends.real_servers.conftest import LLAMA_SLOTS, RunningServer
from tests.sdk.backends.real_servers.test_common import backend, request

pytestmark = [pytest.mark.real_server, pytest.mark.model,
              pytest.mark.parametrize("real_server", ["llama-server"], indirect=True)]


async def test_a_gbnf_grammar_in_extra_body_constrains_the_answer(real_server: RunningServer) -> None:
    model = backend(real_server, extra_body={"grammar": 'root ::= ("yes" | "no") "."'})
    try:
        response = await model.generate(request(Message.user("Is Paris in France? Answer yes or no.")))
    finally:
        await model.aclose()
    assert response.messages[0].text in ("yes.", "no.")


async def test_a_json_schema_answer_is_the_schemas_shape(real_server: RunningServer) -> None:
    model = backend(real_server)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    try:
        response = await model.generate(request(Message.user("What is 2 + 3? Reply in JSON."), output_schema=schema,
                                                sampling=SamplingSettings(max_tokens=20, temperature=0.0)))
    finally:
        await model.aclose()
    parsed = json.loads(response.messages[0].text)
    assert set(parsed) == {"answer"} and isinstance(parsed["answer"], int)


async def test_parallel_slots_decode_concurrent_requests_at_once(real_server: RunningServer) -> None:
    async with httpx.AsyncClient(timeout=10.0) as client:
        props = (await client.get(f"{real_server.root}/props")).json()
        assert props["total_slots"] == LLAMA_SLOTS
        model = backend(real_server, extra_body={"ignore_eos": True})
        busiest = 0

        async def watch() -> None:
            nonlocal busiest
            while True:
                slots = (await client.get(f"{real_server.root}/slots")).json()
                busiest = max(busiest, sum(bool(s.get("is_processing")) for s in slots))
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:
            answers = await asyncio.gather(*(
                model.generate(request(Message.user(f"Count to {n}."),
                                       sampling=SamplingSettings(max_tokens=96, temperature=0.0)))
                for n in range(3, 3 + LLAMA_SLOTS)))
        finally:
            watcher.cancel()
            await model.aclose()
    assert [a.usage.output_tokens for a in answers] == [96] * LLAMA_SLOTS
    assert busiest >= 2, "the slots decoded side by side"
