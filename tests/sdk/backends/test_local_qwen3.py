"""Qwen3's own chat template in the one local turn: ``<think>`` with ``enable_thinking`` on and off,
hermes ``<tool_call>``s, ``<tool_response>``s in a user turn.

There is no Qwen3 tokenizer on this machine, so the SmolLM2 tokenizer stands in, carrying a
Qwen3-style template written here (the structure of Qwen3's published template: tools in the
system turn, reasoning shown only after the last user query, tool results wrapped as
``<tool_response>`` in a user turn, and the generation prompt's empty think block when thinking is
off). `FakeEngine` drives the hooks as the sampler does, so the grammars judge every scripted token.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from parley import Agent, Reasoning, RunState, tool
from parley.backends import LocalBackend, ModelRequest, SamplingSettings
from parley.backends.local.chat_template import ChatTemplatePrompts
from parley.backends.local.codec import codec_for
from parley.local_engine.testing import FakeEngine
from parley.protocol import Conversation, Message, ToolSpec

pytestmark = pytest.mark.model  # the embedded model's tokenizer files

QWEN3_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within " }}
    {{- "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": " }}
    {{- "<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query_index=messages|length - 1, found=false) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if not ns.found and message.role == "user" %}
        {%- set ns.found = true %}{%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = message.reasoning_content if message.reasoning_content is string else '' %}
        {%- if loop.index0 > ns.last_query_index and reasoning_content %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}
            {{- '<tool_call>\\n{"name": "' + tool_call.function.name + '", "arguments": ' }}
            {{- tool_call.function.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}"""

LOOKUP = ToolSpec(
    name="lookup",
    description="Current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                "additionalProperties": False},
)
ANSWER = {"type": "object", "properties": {"temp_c": {"type": "integer"}}, "required": ["temp_c"],
          "additionalProperties": False}
# What the constrained model writes: the marker policy's grammars are compact JSON (no whitespace),
# so Qwen3's usual `<tool_call>\n{"name": ...}\n</tool_call>` and its blank line after `</think>` are
# masked to the compact form (valid, but not the layout Qwen3 was trained on).
CALL = '<tool_call>{"name":"lookup","arguments":{"city":"Oslo"}}</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from parley.local_engine import loader

    tok = loader.load_tokenizer(loader.resolve(None).folder)  # a fresh object: the template is ours alone
    tok.chat_template = QWEN3_TEMPLATE
    return tok


def request(**kwargs: Any) -> ModelRequest:
    kwargs.setdefault("sampling", SamplingSettings(max_tokens=64))
    return ModelRequest(conversation=Conversation(messages=[Message.user("Weather in Oslo?")]), **kwargs)


async def turn(tokenizer: Any, script: str, **kwargs: Any) -> tuple[Message, FakeEngine, str]:
    engine = FakeEngine(script, tokenizer=tokenizer, vocab_size=49152)
    response = await LocalBackend(engine=engine).generate(request(**kwargs))
    (message,) = response.messages
    return message, engine, tokenizer.decode(engine.last.prompt_ids)


def test_the_models_own_template_is_used_with_its_thinking_switch(tokenizer: Any) -> None:
    codec = codec_for(tokenizer)
    assert isinstance(codec, ChatTemplatePrompts) and codec.codec.style == "native" and codec.thinking_switch
    conversation = Conversation(messages=[Message.user("hi")])
    off = tokenizer.decode(codec.render(conversation, [LOOKUP], reasoning=None))
    on = tokenizer.decode(codec.render(conversation, [LOOKUP], reasoning=Reasoning(budget_tokens=8)))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # the template's own empty block
    assert on.endswith("<|im_start|>assistant\n<think>\n")  # inside an open block, as every family
    assert '"name": "lookup"' in off and "<tools>" in off


async def test_thinking_off_answers_at_once_under_the_schema(tokenizer: Any) -> None:
    message, engine, _ = await turn(tokenizer, '{"temp_c":4}<|im_end|>', output_schema=ANSWER)
    assert (message.text, message.reasoning) == ('{"temp_c":4}', "") and not engine.rejected
    _, engine, _ = await turn(tokenizer, "<think>\nhmm\n</think>\n\n{\"temp_c\":4}<|im_end|>", output_schema=ANSWER)
    assert engine.rejected  # thinking is off: the grammar starts at the first token


async def test_thinking_on_the_budget_is_exact_and_the_grammar_starts_after_think(tokenizer: Any) -> None:
    script = 'one two three four five six seven\n</think>{"temp_c":4}<|im_end|>'
    message, engine, _ = await turn(tokenizer, script, output_schema=ANSWER, reasoning=Reasoning(budget_tokens=64))
    assert message.reasoning.strip() == "one two three four five six seven" and message.text.strip() == '{"temp_c":4}'
    assert not engine.rejected
    hook = engine.last.hook
    budget = next(h for h in getattr(hook, "hooks", [hook]) if type(h).__name__ == "ReasoningBudgetHook")
    assert budget.reasoning_tokens == len(tokenizer.encode("one two three four five six seven\n"))  # not </think>
    script = "a b c d e f g h\n</think>\n\nDone.<|im_end|>"
    message, _, _ = await turn(tokenizer, script, reasoning=Reasoning(budget_tokens=4))
    assert message.reasoning == "a b c d"  # 4 tokens, then "\n</think>" was forced


async def test_a_hermes_call(tokenizer: Any) -> None:
    message, engine, _ = await turn(tokenizer, CALL, tools=[LOOKUP], tool_choice="required")
    assert [(c.name, c.parsed_arguments()) for c in message.tool_calls] == [("lookup", {"city": "Oslo"})]
    assert not engine.rejected
    wrong = '<tool_call>{"name":"lookup","arguments":{"town":"Oslo"}}</tool_call><|im_end|>'
    _, engine, _ = await turn(tokenizer, wrong, tools=[LOOKUP], tool_choice="required")
    assert engine.rejected


class Weather(BaseModel):
    temp_c: int


@tool(needs_approval=True)
def lookup(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city.
    """
    return f"4 C in {city}"


@pytest.mark.parametrize("thinking", [False, True])
async def test_an_agent_calls_pauses_resumes_from_json_and_answers(tokenizer: Any, thinking: bool) -> None:
    think = "I should look it up.\n</think>" if thinking else ""
    reasoning = Reasoning(budget_tokens=64) if thinking else None

    def agent(engine: FakeEngine) -> Agent[Weather]:
        return Agent(LocalBackend(engine=engine), tools=[lookup], output_type=Weather, reasoning=reasoning)

    first = FakeEngine([think + CALL], tokenizer=tokenizer, vocab_size=49152)
    paused = await agent(first).run("Weather in Oslo?")
    assert paused.paused and not first.rejected
    state = RunState.from_json(paused.state.to_json())
    state.approve(paused.interruptions[0].call_id)
    second = FakeEngine([think.replace("look it up", "answer") + '{"temp_c":4}<|im_end|>'], tokenizer=tokenizer,
                        vocab_size=49152)
    done = await agent(second).run(state=RunState.from_json(state.to_json()))
    assert done.output == Weather(temp_c=4) and not second.rejected
    prompt = tokenizer.decode(second.last.prompt_ids)
    assert '<tool_call>\n{"name": "lookup", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>' in prompt
    assert "<|im_start|>user\n<tool_response>\n4 C in Oslo\n</tool_response><|im_end|>" in prompt
    assert ("<think>\nI should look it up.\n</think>" in prompt) is thinking  # after the last query: kept
    assert prompt.endswith("<think>\n" if thinking else "<think>\n\n</think>\n\n")
