"""LocalBackend's wiring, with the shipped fake engine over the real tokenizer (no weights): prompt
rendering, hooks, tenant salt, usage mapping and call ids. The fake engine plays the engine's part of
the hook protocol, so the constraint hook really judges the scripted tokens."""

from __future__ import annotations

from typing import Any

import pytest

from parley import Agent, Reasoning, tool
from parley.backends import LocalBackend, ModelRequest, NamedToolChoice, SamplingSettings
from parley.local_engine.testing import FakeEngine
from parley.protocol import Conversation, Message

pytestmark = pytest.mark.model  # needs the embedded model's tokenizer files


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


def backend_for(tokenizer: Any, script: str, *, cached: int | None = None) -> tuple[LocalBackend, FakeEngine]:
    engine = FakeEngine(script, tokenizer=tokenizer, vocab_size=49152, cached_tokens=cached)
    return LocalBackend(engine=engine), engine


def req(**kwargs: Any) -> ModelRequest:
    return ModelRequest(conversation=Conversation(messages=[Message.user("weather in Oslo?")]), **kwargs)


async def test_a_required_tool_call_is_constrained_parsed_and_salted(tokenizer: Any) -> None:
    script = '<tool_call>\n{"name": "lookup", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'
    backend, engine = backend_for(tokenizer, script, cached=32)
    response = await backend.generate(req(tools=[lookup.spec], tool_choice="required", tenant="acme"))
    call = engine.submissions[0]
    assert call.tenant == "acme" and call.hook is not None
    prompt = tokenizer.decode(call.prompt_ids)
    assert "<tools>" in prompt and '"lookup"' in prompt and prompt.rstrip().endswith("<|im_start|>assistant")
    calls = response.messages[0].tool_calls
    assert [(c.name, c.parsed_arguments()) for c in calls] == [("lookup", {"city": "Oslo"})]
    assert calls[0].id.startswith("call_") and calls[0].id != "call_0"
    usage = response.usage
    assert (usage.cache_read_tokens, usage.input_tokens + usage.cache_read_tokens) == (32, len(call.prompt_ids))
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
    assert tokenizer.decode(engine.submissions[0].prompt_ids).rstrip().endswith("<think>")
    assert result.usage.reasoning_tokens == 4
    assert result.messages[-1].reasoning.strip()


async def test_named_tool_that_is_not_offered_is_a_configuration_error(tokenizer: Any) -> None:
    from parley.errors import ConfigurationError

    backend, _ = backend_for(tokenizer, "x")
    with pytest.raises(ConfigurationError, match="not offered"):
        await backend.generate(req(tools=[lookup.spec], tool_choice=NamedToolChoice("nope")))
