"""LocalBackend's wiring, with a scripted engine (real tokenizer, no weights): prompt rendering, hooks,
tenant salt, usage mapping and call ids. The fake engine plays the engine's part of the hook protocol,
so the constraint hook really judges the scripted tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from parley import Agent, Reasoning, tool
from parley.backends import ModelRequest, NamedToolChoice, SamplingSettings
from parley.protocol import Conversation, Message

pytestmark = pytest.mark.model  # needs the embedded model's tokenizer files


@dataclass
class Delta:
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int


class ScriptedEngine:
    """Emits `script` token by token through the request's hooks, like the engine's sampler would."""

    model_id = "scripted-smollm2"

    def __init__(self, tokenizer: Any, script: str, *, cached: int = 0) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = 49152
        self.script = list(tokenizer.encode(script, add_special_tokens=False))
        self.cached = cached
        self.calls: list[dict[str, Any]] = []
        self.rejected: list[int] = []

    async def stream(
        self, prompt_ids: list[int], params: Any, *, hooks: Any = None, tenant: Any = None, **_: Any
    ) -> AsyncIterator[Delta]:
        self.calls.append({"prompt": prompt_ids, "params": params, "hooks": hooks, "tenant": tenant})
        out: list[int] = []
        script = list(self.script)
        words = (self.vocab_size + 31) // 32
        while script and len(out) < params.max_tokens:
            token = script.pop(0)
            if hooks is not None:
                forced = hooks.forced_token()
                if forced is not None:
                    token = forced  # emitted instead of the script's token, as the sampler would
                else:
                    row = torch.full((words,), -1, dtype=torch.int32)
                    if hooks.fill_bitmask(row) and not (int(row[token // 32]) >> (token % 32)) & 1:
                        self.rejected.append(token)
                hooks.accept_token(token)
            out.append(token)
            yield Delta((token,), False, None, len(prompt_ids), self.cached)
            if token in params.stop_token_ids or (hooks is not None and hooks.is_terminated()):
                break
        yield Delta((), True, "stop", len(prompt_ids), self.cached)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from parley.local_engine import loader

    return loader.load_tokenizer(loader.resolve(None).folder)


@tool
def lookup(city: str) -> str:
    """Weather.

    Args:
        city: The city.
    """
    return f"sunny in {city}"


def backend_for(tokenizer: Any, script: str, **kwargs: Any) -> tuple[Any, ScriptedEngine]:
    from parley.backends.local import LocalBackend

    engine = ScriptedEngine(tokenizer, script, **kwargs)
    return LocalBackend(engine=engine), engine


def req(**kwargs: Any) -> ModelRequest:
    return ModelRequest(conversation=Conversation(messages=[Message.user("weather in Oslo?")]), **kwargs)


async def test_a_required_tool_call_is_constrained_parsed_and_salted(tokenizer: Any) -> None:
    script = '<tool_call>\n{"name": "lookup", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'
    backend, engine = backend_for(tokenizer, script, cached=32)
    response = await backend.generate(req(tools=[lookup.spec], tool_choice="required", tenant="acme"))
    call = engine.calls[0]
    assert call["tenant"] == "acme" and call["hooks"] is not None
    prompt = tokenizer.decode(call["prompt"])
    assert "<tools>" in prompt and '"lookup"' in prompt and prompt.rstrip().endswith("<|im_start|>assistant")
    calls = response.messages[0].tool_calls
    assert [(c.name, c.parsed_arguments()) for c in calls] == [("lookup", {"city": "Oslo"})]
    assert calls[0].id.startswith("call_") and calls[0].id != "call_0"
    usage = response.usage
    assert (usage.cache_read_tokens, usage.input_tokens + usage.cache_read_tokens) == (32, len(call["prompt"]))
    assert usage.raw[0]["cached_tokens"] == 32 and usage.cost == 0


async def test_the_constraint_rejects_a_call_to_a_tool_that_is_not_named(tokenizer: Any) -> None:
    script = '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>'
    backend, engine = backend_for(tokenizer, script)
    await backend.generate(req(tools=[lookup.spec], tool_choice=NamedToolChoice("lookup")))
    assert engine.rejected  # the grammar would never have let the model write this


async def test_auto_leaves_plain_text_unconstrained(tokenizer: Any) -> None:
    backend, engine = backend_for(tokenizer, "It is sunny.<|im_end|>")
    response = await backend.generate(req(tools=[lookup.spec], tool_choice="auto"))
    assert response.messages[0].text == "It is sunny." and not engine.rejected


ANSWER = {"type": "object", "properties": {"temp_c": {"type": "integer"}}, "required": ["temp_c"],
          "additionalProperties": False}


async def test_auto_with_an_output_schema_admits_the_typed_answer(tokenizer: Any) -> None:
    backend, engine = backend_for(tokenizer, '{"temp_c":4}<|im_end|>')
    response = await backend.generate(req(tools=[lookup.spec], tool_choice="auto", output_schema=ANSWER))
    assert response.messages[0].text == '{"temp_c":4}' and not engine.rejected


async def test_auto_with_an_output_schema_admits_a_call_but_not_free_text(tokenizer: Any) -> None:
    script = '<tool_call>{"name":"lookup","arguments":{"city":"Oslo"}}</tool_call><|im_end|>'
    backend, engine = backend_for(tokenizer, script)
    response = await backend.generate(req(tools=[lookup.spec], tool_choice="auto", output_schema=ANSWER))
    assert [c.name for c in response.messages[0].tool_calls] == ["lookup"] and not engine.rejected
    backend, engine = backend_for(tokenizer, "It is sunny.<|im_end|>")
    await backend.generate(req(tools=[lookup.spec], tool_choice="auto", output_schema=ANSWER))
    assert engine.rejected  # neither a call nor the typed answer: the grammar would not allow it


async def test_reasoning_opens_think_and_is_counted(tokenizer: Any) -> None:
    backend, engine = backend_for(
        tokenizer, "one two three four five six seven eight nine ten\n</think>\n\nDone.<|im_end|>"
    )
    agent = Agent(backend, reasoning=Reasoning(budget_tokens=4), sampling=SamplingSettings(max_tokens=30))
    result = await agent.run("think briefly")
    assert tokenizer.decode(engine.calls[0]["prompt"]).rstrip().endswith("<think>")
    assert result.usage.reasoning_tokens == 4
    assert result.messages[-1].reasoning.strip()


async def test_named_tool_that_is_not_offered_is_a_configuration_error(tokenizer: Any) -> None:
    from parley.errors import ConfigurationError

    backend, _ = backend_for(tokenizer, "x")
    with pytest.raises(ConfigurationError, match="not offered"):
        await backend.generate(req(tools=[lookup.spec], tool_choice=NamedToolChoice("nope")))
