"""The SDK and the server run the same local turn: same prompt, same sampling, same hooks, same answer.

Each case is one request, sent once as a `ModelRequest` through `LocalBackend` and once over HTTP
to `parley serve` (OpenAI and Anthropic endpoints, in process), each over its own `FakeEngine`
with the same script and the real SmolLM2 tokenizer, so the grammars really judge the tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from parley.backends import LocalBackend, ModelRequest, NamedToolChoice, SamplingSettings
from parley.backends.base import ToolChoice
from parley.local_engine.hooks import ComposedHook
from parley.local_engine.testing import FakeEngine, Submission
from parley.protocol import Conversation, Message, ToolSpec
from parley.reasoning import Reasoning
from parley.server import ServerConfig, create_app

pytestmark = pytest.mark.model  # the embedded model's tokenizer files

LOOKUP = ToolSpec(
    name="lookup",
    description="Current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                "additionalProperties": False},
)
ANSWER = {"type": "object", "properties": {"temp_c": {"type": "integer"}}, "required": ["temp_c"],
          "additionalProperties": False}
CALL = '<tool_call>{"name":"lookup","arguments":{"city":"Oslo"}}</tool_call><|im_end|>'
QUESTION = "Weather in Oslo?"


@dataclass
class Case:
    script: str
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    schema: dict[str, Any] | None = None
    budget: int | None = None
    stop: tuple[str, ...] = ()
    max_tokens: int = 64
    anthropic: bool = True
    """False: Anthropic's own minimum thinking budget (1024) rules the case out there."""
    wire: bool = True
    """False: both endpoints refuse this combination (a documented 400); the SDK runs it."""


CASES = {
    "auto tools + schema, the model calls": Case(CALL, [LOOKUP], "auto", ANSWER),
    "auto tools + schema, the model answers": Case('{"temp_c":4}<|im_end|>', [LOOKUP], "auto", ANSWER),
    "auto tools + schema, free text is refused": Case("It is sunny.<|im_end|>", [LOOKUP], "auto", ANSWER),
    "required tools": Case(CALL, [LOOKUP], "required"),
    "required tools + schema": Case(CALL, [LOOKUP], "required", ANSWER, wire=False),
    "schema + thinking": Case('cold there\n</think>{"temp_c":4}<|im_end|>', schema=ANSWER, budget=1024,
                              max_tokens=1100),
    "thinking past its budget": Case("a b c d e f g h\n</think>\n\nDone.<|im_end|>", budget=4, anthropic=False),
    "named tool": Case(CALL, [LOOKUP], NamedToolChoice("lookup")),
    "stop strings": Case("one two STOP three<|im_end|>", stop=("STOP",)),
    "tools off: a call is text": Case(CALL, [LOOKUP], "none"),
}


def _request(case: Case) -> ModelRequest:
    return ModelRequest(
        conversation=Conversation(messages=[Message.user(QUESTION)]),
        tools=case.tools,
        tool_choice=case.tool_choice,
        parallel_tool_calls=False,
        output_schema=case.schema,
        reasoning=Reasoning(budget_tokens=case.budget) if case.budget is not None else None,
        sampling=SamplingSettings(max_tokens=case.max_tokens, temperature=0.0, stop=case.stop),
    )


def _openai_body(case: Case) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": case.max_tokens,
        "temperature": 0, "parallel_tool_calls": False,
    }
    if case.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                            "parameters": t.parameters}} for t in case.tools]
        choice = case.tool_choice
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}} if isinstance(
            choice, NamedToolChoice) else choice
    if case.schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": case.schema}}
    if case.budget is not None:
        body["thinking_token_budget"] = case.budget
    if case.stop:
        body["stop"] = list(case.stop)
    return body


def _anthropic_body(case: Case) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": QUESTION}],
                            "max_tokens": case.max_tokens, "temperature": 0}
    if case.tools:
        body["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters}
                         for t in case.tools]
        choice = case.tool_choice
        tool_choice: dict[str, Any] = {"type": {"auto": "auto", "required": "any", "none": "none"}.get(
            str(choice), "tool")}
        if isinstance(choice, NamedToolChoice):
            tool_choice["name"] = choice.name
        if tool_choice["type"] != "none":
            tool_choice["disable_parallel_tool_use"] = True
        body["tool_choice"] = tool_choice
    if case.schema is not None:
        body["output_config"] = {"format": {"type": "json_schema", "schema": case.schema}}
    if case.budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": case.budget}
    if case.stop:
        body["stop_sequences"] = list(case.stop)
    return body


@dataclass
class Outcome:
    text: str
    reasoning: str
    calls: list[tuple[str, dict[str, Any]]]
    finish: str
    submission: Submission
    rejected: list[int]


def _hook_kinds(sub: Submission) -> list[str]:
    hook = sub.hook
    hooks = hook.hooks if isinstance(hook, ComposedHook) else [hook] if hook is not None else []
    return sorted(type(h).__name__ for h in hooks)


def _same_turn(sdk: Outcome, wire: Outcome) -> None:
    assert wire.submission.prompt_ids == sdk.submission.prompt_ids
    assert wire.submission.params == sdk.submission.params
    assert _hook_kinds(wire.submission) == _hook_kinds(sdk.submission)
    assert wire.rejected == sdk.rejected
    assert (wire.text, wire.reasoning, wire.calls, wire.finish) == (sdk.text, sdk.reasoning, sdk.calls, sdk.finish)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from parley.local_engine import loader

    return loader.load_tokenizer(loader.resolve(None).folder)


def _engine(tokenizer: Any, case: Case) -> FakeEngine:
    return FakeEngine(case.script, tokenizer=tokenizer, vocab_size=49152)


async def _through_sdk(tokenizer: Any, case: Case) -> Outcome:
    engine = _engine(tokenizer, case)
    response = await LocalBackend(engine=engine).generate(_request(case))
    (message,) = response.messages
    calls = [(c.name, c.parsed_arguments()) for c in message.tool_calls]
    return Outcome(message.text, message.reasoning, calls, response.finish_reason, engine.last, engine.rejected)


async def _post(engine: FakeEngine, path: str, body: dict[str, Any]) -> httpx.Response:
    app = create_app(engine, config=ServerConfig(model_name="m"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        return await client.post(path, json=body)


async def _through_openai(tokenizer: Any, case: Case) -> Outcome:
    engine = _engine(tokenizer, case)
    response = await _post(engine, "/v1/chat/completions", _openai_body(case))
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    message = choice["message"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]
    finish = choice["finish_reason"]
    return Outcome(message["content"] or "", message.get("reasoning_content") or "", calls, finish, engine.last,
                   engine.rejected)


async def _through_anthropic(tokenizer: Any, case: Case) -> Outcome:
    engine = _engine(tokenizer, case)
    response = await _post(engine, "/v1/messages", _anthropic_body(case))
    assert response.status_code == 200, response.text
    body = response.json()
    text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
    reasoning = "".join(b["thinking"] for b in body["content"] if b["type"] == "thinking")
    calls = [(b["name"], b["input"]) for b in body["content"] if b["type"] == "tool_use"]
    finish = {"tool_use": "tool_calls", "max_tokens": "length"}.get(body["stop_reason"], "stop")
    return Outcome(text, reasoning, calls, finish, engine.last, engine.rejected)


@pytest.mark.parametrize("name", list(CASES))
async def test_the_sdk_and_both_endpoints_run_the_same_turn(tokenizer: Any, name: str) -> None:
    case = CASES[name]
    sdk = await _through_sdk(tokenizer, case)
    if not case.wire:
        for path, body, param in (("/v1/chat/completions", _openai_body(case), "response_format"),
                                  ("/v1/messages", _anthropic_body(case), "output_config.format")):
            refused = await _post(_engine(tokenizer, case), path, body)
            assert refused.status_code == 400 and param in refused.text
        return
    if case.anthropic:
        _same_turn(sdk, await _through_anthropic(tokenizer, case))
    _same_turn(sdk, await _through_openai(tokenizer, case))


async def test_what_each_case_does(tokenizer: Any) -> None:
    """The shared behaviour itself, once, through the SDK."""
    outcome = {name: await _through_sdk(tokenizer, case) for name, case in CASES.items()}
    assert outcome["auto tools + schema, the model calls"].calls == [("lookup", {"city": "Oslo"})]
    assert outcome["auto tools + schema, the model answers"].text == '{"temp_c":4}'
    assert outcome["auto tools + schema, free text is refused"].rejected  # the grammar would not allow it
    assert not outcome["auto tools + schema, the model calls"].rejected
    assert outcome["required tools"].calls == [("lookup", {"city": "Oslo"})]
    assert outcome["required tools + schema"].calls == [("lookup", {"city": "Oslo"})]  # the answer comes later
    schema_thinking = outcome["schema + thinking"]
    assert (schema_thinking.reasoning, schema_thinking.text) == ("cold there", '{"temp_c":4}')
    assert not schema_thinking.rejected  # the answer grammar starts after </think>
    assert outcome["thinking past its budget"].reasoning == "a b c d"  # 4 tokens, then </think> was forced
    assert outcome["named tool"].calls == [("lookup", {"city": "Oslo"})]
    assert outcome["stop strings"].text == "one two "
    tools_off = outcome["tools off: a call is text"]
    assert tools_off.calls == [] and '"name": "lookup"' in tools_off.text and tools_off.finish == "stop"


async def test_a_call_cut_off_by_max_tokens_stays_text_in_the_stream_and_the_message(tokenizer: Any) -> None:
    engine = FakeEngine('<tool_call>{"name":"lookup","arguments":{"ci', tokenizer=tokenizer, vocab_size=49152)
    request = ModelRequest(conversation=Conversation(messages=[Message.user(QUESTION)]), tools=[LOOKUP],
                           sampling=SamplingSettings(max_tokens=12))
    events = [event async for event in LocalBackend(engine=engine).stream(request)]
    from parley.protocol import ErrorEvent, MessageEnd, TextDelta

    (end,) = [e for e in events if isinstance(e, MessageEnd)]
    streamed = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert end.message.text == streamed and streamed.startswith("<tool_call>")  # never an empty answer
    assert end.finish_reason == "length" and not end.message.tool_calls
    assert [e.code for e in events if isinstance(e, ErrorEvent)] == ["incomplete_tool_call"]
