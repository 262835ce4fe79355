"""vLLM's sampling extensions reach the engine: `min_tokens`, `ignore_eos`, `repetition_penalty`, `min_p`, and
OpenAI's `frequency_penalty` / `presence_penalty`, on chat completions and (the vLLM four) Anthropic messages."""

from __future__ import annotations

import anthropic
import openai

from parley.local_engine.testing import FakeEngine
from parley.server import BackgroundServer

USER = [{"role": "user", "content": "hi"}]


def test_chat_completions_carries_every_extension_into_the_engine_request(
    fake_server: BackgroundServer, fake_engine: FakeEngine
) -> None:
    client = openai.OpenAI(base_url=fake_server.base_url + "/v1", api_key="k", max_retries=0, timeout=20)
    reply = client.chat.completions.create(
        model="test-model",
        messages=USER,  # type: ignore[arg-type]
        max_tokens=64,
        frequency_penalty=0.5,
        presence_penalty=-0.25,
        extra_body={"min_tokens": 3, "ignore_eos": True, "repetition_penalty": 1.2, "min_p": 0.05},
    )
    assert reply.choices[0].message.content == fake_engine.replies
    params = fake_engine.last.params
    assert (params.min_tokens, params.ignore_eos, params.repetition_penalty, params.min_p) == (3, True, 1.2, 0.05)
    assert (params.frequency_penalty, params.presence_penalty) == (0.5, -0.25)
    assert params.stop_token_ids == ()  # ignore_eos: the end-of-turn id does not stop the turn either


def test_absent_extensions_leave_the_engine_defaults(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    client = openai.OpenAI(base_url=fake_server.base_url + "/v1", api_key="k", max_retries=0, timeout=20)
    client.chat.completions.create(model="test-model", messages=USER, max_tokens=8)  # type: ignore[arg-type]
    params = fake_engine.last.params
    assert (params.min_tokens, params.ignore_eos, params.repetition_penalty, params.min_p) == (0, False, 1.0, 0.0)
    assert (params.frequency_penalty, params.presence_penalty) == (0.0, 0.0)
    assert params.stop_token_ids  # the codec's end-of-turn ids


def test_anthropic_messages_carries_the_vllm_extensions(fake_server: BackgroundServer, fake_engine: FakeEngine) -> None:
    client = anthropic.Anthropic(base_url=fake_server.base_url, api_key="k", max_retries=0, timeout=20)
    client.messages.create(
        model="test-model",
        max_tokens=32,
        messages=USER,  # type: ignore[arg-type]
        extra_body={"min_tokens": 2, "repetition_penalty": 1.1, "min_p": 0.1},
    )
    params = fake_engine.last.params
    assert (params.min_tokens, params.repetition_penalty, params.min_p, params.ignore_eos) == (2, 1.1, 0.1, False)
