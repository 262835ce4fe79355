"""`OpenAIBackend(flavor="auto")` against real vLLM and real llama-server: what a user does first, on both.

Chat, streaming, a typed answer, tools on auto beside a typed answer, required tools, reasoning settings,
the cache ledger on a repeated long prefix, and a stream cancelled mid-way. Greedy decoding throughout, so
the model's answers do not change run to run; where a 135M model's choice is not the point (does it call
the tool?), the test checks what parley guarantees whatever it chooses.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Field

from parley import Agent
from parley.backends import OpenAIBackend
from parley.backends.base import ModelRequest, SamplingSettings
from parley.protocol import Conversation, Message, MessageEnd, TextDelta, ToolCallEnd, ToolSpec, UsageEvent
from parley.reasoning import Reasoning
from parley.tools import tool
from tests.sdk.backends.real_servers.conftest import SERVED_NAME, RunningServer

pytestmark = [pytest.mark.real_server, pytest.mark.model]

GREEDY = SamplingSettings(max_tokens=24, temperature=0.0, seed=0)
WEATHER = ToolSpec(name="get_weather", description="Get the current weather for a city.",
                   parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
DIALECT = {"vllm": "vllm", "llama-server": "llamacpp"}
LEASE = " ".join(f"Clause {n}: on day {n} the tenant waters the plants, sweeps the hall and locks the gate."
                 for n in range(1, 41))  # about 700 tokens: several cache blocks on either server


class Sent:
    """The JSON bodies the backend posted (an httpx request hook), to check what reached the server."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, request: httpx.Request) -> None:
        if request.method == "POST":
            self.bodies.append(json.loads(request.content))


def backend(server: RunningServer, sent: Sent | None = None, **kwargs: Any) -> OpenAIBackend:
    hooks = {"request": [sent]} if sent is not None else {}
    kwargs.setdefault("flavor", "auto")
    if server.name == "vllm":
        kwargs.setdefault("tool_call_parser", "hermes")  # the parser the server was started with
    return OpenAIBackend(SERVED_NAME, base_url=server.base_url, api_key="unused", max_retries=0,
                         http_client=httpx.AsyncClient(timeout=300.0, event_hooks=hooks), **kwargs)


def request(*messages: Message, **kwargs: Any) -> ModelRequest:
    kwargs.setdefault("sampling", GREEDY)
    return ModelRequest(conversation=Conversation(messages=list(messages)), **kwargs)


async def test_auto_detects_the_dialect_and_chats_with_real_usage(real_server: RunningServer) -> None:
    model = backend(real_server)
    try:
        response = await model.generate(request(Message.user("Say hello to Ada."),
                                                sampling=SamplingSettings(max_tokens=8, temperature=0.0)))
    finally:
        await model.aclose()
    assert model.flavor == DIALECT[real_server.name]
    [message] = response.messages
    assert message.text.strip() and not message.tool_calls
    assert response.finish_reason == "length" and response.usage.output_tokens == 8
    assert response.usage.prompt_tokens == response.usage.raw[0]["prompt_tokens"] > 5
    assert response.usage.cost is None  # a self-hosted model has no price


async def test_a_stream_gives_the_same_text_and_usage_as_generate(real_server: RunningServer) -> None:
    model = backend(real_server)
    question = request(Message.user("Name three colours."))
    try:
        whole = await model.generate(question)
        events = [event async for event in model.stream(question)]
    finally:
        await model.aclose()
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    [end] = [e for e in events if isinstance(e, MessageEnd)]
    assert len(deltas) > 1 and "".join(deltas) == end.message.text == whole.messages[0].text
    usage = events[-1]
    assert isinstance(usage, UsageEvent)
    assert usage.usage.output_tokens == whole.usage.output_tokens > 0  # both servers report usage in streams
    assert usage.usage.prompt_tokens == whole.usage.prompt_tokens


class Capital(BaseModel):
    city: str
    country: str


async def test_a_typed_answer_is_enforced_by_the_server(real_server: RunningServer) -> None:
    model = backend(real_server)
    agent = Agent(model, instructions="Answer in JSON.", output_type=Capital,
                  sampling=SamplingSettings(max_tokens=60, temperature=0.0))
    try:
        result = await agent.run("What is the capital of France, and which country is it in?")
    finally:
        await model.aclose()
    assert isinstance(result.output, Capital) and result.output.city.strip()
    [final] = [m for m in result.messages if m.role.value == "assistant"]
    assert json.loads(final.text) == result.output.model_dump()  # nothing but the object was allowed
    assert result.usage.requests == 1


class Forecast(BaseModel):
    # Bounded so the answer always fits max_tokens: greedy SmolLM2 under llama-server built for AVX-512 wrote
    # a 396-character summary that 80 tokens cut off (the servers enforce maxLength in their grammars)
    city: str = Field(max_length=40)
    summary: str = Field(max_length=160)


async def test_tools_on_auto_beside_a_typed_answer_never_send_conflicting_constraints(
        real_server: RunningServer) -> None:
    calls: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return f"Sunny, 22 °C in {city}"

    sent = Sent()
    model = backend(real_server, sent)
    agent = Agent(model, instructions="Use the tools, then answer in JSON.", tools=[get_weather],
                  output_type=Forecast, max_tool_rounds=2,
                  sampling=SamplingSettings(max_tokens=160, temperature=0.0))
    try:
        result = await agent.run("What is the weather in Paris?")
    finally:
        await model.aclose()
    assert isinstance(result.output, Forecast)  # a typed answer, whether or not the model called the tool
    for body in sent.bodies:
        schema_keys = {"structured_outputs", "response_format"} & body.keys()
        if body.get("tools") and body.get("tool_choice") != "none":
            # vLLM: one structural tag (a call or the answer); llama.cpp: no schema while tools may be called
            if real_server.name == "vllm":
                assert set(body["structured_outputs"]) == {"structural_tag"}
            else:
                assert not schema_keys, body
    assert sent.bodies and all(c.strip() for c in calls)


async def test_required_tools_give_calls_whose_arguments_fit_the_schema(real_server: RunningServer) -> None:
    model = backend(real_server)
    try:
        response = await model.generate(request(Message.user("What is the weather in Paris?"), tools=[WEATHER],
                                                tool_choice="required",
                                                sampling=SamplingSettings(max_tokens=60, temperature=0.0)))
        streamed = [e async for e in model.stream(request(Message.user("What is the weather in Paris?"),
                                                          tools=[WEATHER], tool_choice="required",
                                                          sampling=SamplingSettings(max_tokens=60,
                                                                                    temperature=0.0)))]
    finally:
        await model.aclose()
    [message] = response.messages
    if real_server.name == "llama-server" and not message.tool_calls:
        # llama-server's "required" grammar is: any text not containing <tool_call>, then the calls; so a
        # model may talk until the length limit (SmolLM2 does), but it can never stop without a call.
        assert response.finish_reason == "length" and "<tool_call>" not in message.text
        return
    assert message.tool_calls and response.finish_reason == "tool_calls"
    for call in message.tool_calls:
        arguments = call.parsed_arguments()
        assert call.name == "get_weather" and isinstance(arguments, dict) and isinstance(arguments["city"], str)
    ends = [e.call for e in streamed if isinstance(e, ToolCallEnd)]
    assert [(c.name, c.parsed_arguments()) for c in ends] == [(c.name, c.parsed_arguments())
                                                              for c in message.tool_calls]


async def test_reasoning_settings_reach_the_server_or_are_refused_by_name(real_server: RunningServer) -> None:
    from parley.backends.errors import ReasoningSettingError

    model = backend(real_server)
    try:
        if real_server.name == "llama-server":  # no reasoning setting there: refused before anything is sent
            with pytest.raises(ReasoningSettingError, match="llama.cpp"):
                await model.generate(request(Message.user("Hi"), reasoning=Reasoning(effort="low")))
            return
        response = await model.generate(request(Message.user("Hi"), reasoning=Reasoning(effort="low")))
    finally:
        await model.aclose()
    [message] = response.messages  # SmolLM2 does not reason: the answer carries no invented reasoning
    assert message.text.strip() and not message.reasoning


async def test_the_cache_ledger_on_a_repeated_long_prefix_equals_the_servers_figure(
        real_server: RunningServer) -> None:
    model = backend(real_server)
    system = Message.system(f"You answer questions about this lease. {LEASE}")
    try:
        first = await model.generate(request(system, Message.user("What happens on day 3?")))
        second = await model.generate(request(system, Message.user("What happens on day 7?")))
    finally:
        await model.aclose()
    reported = second.usage.raw[0]["prompt_tokens_details"]["cached_tokens"]
    assert second.usage.cache_read_tokens == reported > 500  # the long system prefix came from the cache
    assert second.usage.prompt_tokens == second.usage.raw[0]["prompt_tokens"]
    assert first.usage.cache_read_tokens is not None  # reported (0 or more), never unknown with these flags
    ledger = model.cache_ledger
    assert ledger.requests == 2 and ledger.unreported_requests == 0
    assert ledger.cache_read_tokens == first.usage.cache_read_tokens + reported


async def test_a_stream_cancelled_mid_way_frees_the_server(real_server: RunningServer) -> None:
    # 1500 tokens forced: a minute of decoding for vLLM here, 20 s for llama-server, unless the cancel reaches it
    model = backend(real_server, extra_body={"ignore_eos": True} if real_server.name == "llama-server" else None)
    long_answer = request(Message.user("Write a long story about a lighthouse keeper."),
                          sampling=SamplingSettings(max_tokens=1500, temperature=0.0, min_tokens=1500,
                                                    ignore_eos=True))
    try:
        pieces = 0
        stream = model.stream(long_answer)
        async for event in stream:
            pieces += isinstance(event, TextDelta)
            if pieces == 3:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        await _until_idle(real_server)
        after = await model.generate(request(Message.user("Say yes."),
                                             sampling=SamplingSettings(max_tokens=4, temperature=0.0)))
    finally:
        await model.aclose()
    assert pieces == 3 and after.messages[0].text.strip()


async def _until_idle(server: RunningServer, timeout_s: float = 4.0) -> None:
    """Wait until the server runs no request: vLLM's ``vllm:num_requests_running`` gauge, llama-server's slots."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            if server.name == "vllm":
                text = (await client.get(f"{server.root}/metrics")).text
                running = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                              if line.startswith("vllm:num_requests_running"))
            else:
                slots = (await client.get(f"{server.root}/slots")).json()
                running = sum(bool(slot.get("is_processing")) for slot in slots)
            if running == 0:
                return
            if loop.time() > deadline:
                pytest.fail(f"{server.name} still runs {running} request(s) {timeout_s:.0f} s after the stream "
                            "was cancelled")
            await asyncio.sleep(0.2)
