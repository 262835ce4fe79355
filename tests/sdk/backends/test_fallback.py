"""`FallbackBackend`: hosted backends against local servers, and test doubles."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from parley import Agent, tool
from parley.backends import (
    BackendCapabilities,
    FallbackBackend,
    FunctionBackend,
    ModelRequest,
    ScriptedBackend,
    ScriptedTurn,
)
from parley.backends.anthropic import AnthropicBackend
from parley.backends.errors import (
    AllBackendsFailed,
    AuthenticationError,
    BadRequestError,
    LocalRequestError,
    ModelAPIError,
    OverloadedError,
    RateLimitError,
    ServerError,
    StreamInterruptedError,
)
from parley.backends.fallback import is_context_length_error, should_fall_back
from parley.backends.openai import OpenAIBackend
from parley.backends.scripted import call
from parley.errors import ConfigurationError
from parley.protocol import (
    Conversation,
    ErrorEvent,
    Event,
    Message,
    MessageEnd,
    TextDelta,
    Usage,
    UsageEvent,
)
from tests.sdk.backends.fake_server import FakeServer, Reply, sse_event

OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
SERVER_ERROR = {"error": {"message": "The server had an error while processing your request.", "type": "server_error",
                          "param": None, "code": None}}
CONTEXT_400 = {"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages "
                                    "resulted in 130000 tokens.", "type": "invalid_request_error",
                         "param": "messages", "code": "context_length_exceeded"}}
PLAIN_400 = {"error": {"message": "Unrecognized request argument supplied: foo", "type": "invalid_request_error",
                       "param": None, "code": None}}


@pytest.fixture
async def second() -> AsyncIterator[FakeServer]:
    fake = await FakeServer().start()
    try:
        yield fake
    finally:
        await fake.stop()


def _openai(server: FakeServer, model: str = "gpt-4o-mini", **kwargs: Any) -> OpenAIBackend:
    kwargs.setdefault("retry_base_delay", 0.0)
    return OpenAIBackend(model, base_url=f"{server.url}/v1", api_key="sk-test", **kwargs)


def _anthropic(server: FakeServer, **kwargs: Any) -> AnthropicBackend:
    kwargs.setdefault("retry_base_delay", 0.0)
    return AnthropicBackend("claude-sonnet-4-5-20250929", api_key="sk-test", base_url=server.url, **kwargs)


def _completion(text: str, **usage: Any) -> dict[str, Any]:
    counts: dict[str, Any] = {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29}
    counts.update(usage)
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": counts}


def _anthropic_message(text: str) -> dict[str, Any]:
    return {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 6, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0}}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return sse_event(None, {"id": "chatcmpl-9", "object": "chat.completion.chunk", "model": "gpt-4o-mini",
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def _stream(text: str) -> list[str]:
    return [_chunk({"role": "assistant", "content": ""}), _chunk({"content": text}), _chunk({}, "stop"),
            sse_event(None, {"id": "chatcmpl-9", "object": "chat.completion.chunk", "choices": [],
                             "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}),
            "data: [DONE]"]


def _request(text: str = "hi") -> ModelRequest:
    return ModelRequest(conversation=Conversation(messages=[Message.user(text)]))


async def _collect(backend: FallbackBackend, request: ModelRequest) -> list[Event]:
    return [event async for event in backend.stream(request)]


class StreamDouble:
    """Streams `events`, then raises `error` (if any): a backend that fails mid-stream."""

    def __init__(self, name: str, events: list[Event], error: BaseException | None = None) -> None:
        self._name = name
        self.events = events
        self.error = error
        self.calls = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities()

    async def generate(self, request: ModelRequest) -> Any:  # pragma: no cover - streams only
        raise NotImplementedError

    async def stream(self, request: ModelRequest) -> AsyncIterator[Event]:
        self.calls += 1
        for event in self.events:
            yield event
        if self.error is not None:
            raise self.error


# -- hosted backends against local servers ------------------------------------------------------------
async def test_primary_answers_529_then_500_and_the_secondary_serves(server: FakeServer, second: FakeServer) -> None:
    server.queue(Reply(529, OVERLOADED), Reply(500, SERVER_ERROR))
    second.queue(Reply(body=_anthropic_message("Hello from the secondary.")))
    primary = _openai(server, max_retries=1)  # its own retry runs first: 529, then 500
    secondary = _anthropic(second)
    backend = FallbackBackend([primary, secondary])
    response = await backend.generate(_request())
    assert response.messages[0].text == "Hello from the secondary."
    assert len(server.requests) == 2 and len(second.requests) == 1
    assert response.model == secondary.name == "anthropic:claude-sonnet-4-5-20250929"
    assert backend.last_served == secondary.name
    [raw] = response.usage.raw
    assert raw["served_by"] == secondary.name and raw["input_tokens"] == 12
    assert response.usage.input_tokens == 12 and response.usage.output_tokens == 6


async def test_the_primary_serves_when_it_answers(server: FakeServer, second: FakeServer) -> None:
    server.queue(Reply(body=_completion("primary")))
    backend = FallbackBackend([_openai(server), _anthropic(second)])
    response = await backend.generate(_request())
    assert response.messages[0].text == "primary" and response.model == "openai:gpt-4o-mini"
    assert response.usage.raw[0]["served_by"] == "openai:gpt-4o-mini" and not second.requests


async def test_context_length_400_falls_through_but_a_plain_400_does_not(server: FakeServer,
                                                                         second: FakeServer) -> None:
    server.queue(Reply(400, CONTEXT_400))
    second.queue(Reply(body=_completion("long-context model", prompt_tokens=130000)))
    backend = FallbackBackend([_openai(server), _openai(second, "gpt-4.1")])
    response = await backend.generate(_request())
    assert response.messages[0].text == "long-context model" and response.model == "openai:gpt-4.1"

    server.queue(Reply(400, PLAIN_400))
    with pytest.raises(BadRequestError) as info:
        await backend.generate(_request())
    assert "Unrecognized request argument" in str(info.value)
    assert len(second.requests) == 1  # the secondary was not asked


async def test_every_backend_failing_raises_one_typed_error_naming_each(server: FakeServer,
                                                                       second: FakeServer) -> None:
    server.queue(Reply(529, OVERLOADED))
    second.queue(Reply(429, {"error": {"message": "Rate limit reached", "type": "requests", "code": None}},
                       headers={"retry-after": "7"}))
    primary, secondary = _openai(server, max_retries=0), _openai(second, "gpt-4.1", max_retries=0)
    backend = FallbackBackend([primary, secondary])
    with pytest.raises(AllBackendsFailed) as info:
        await backend.generate(_request())
    error = info.value
    assert isinstance(error, ModelAPIError)
    assert [(name, type(exc)) for name, exc in error.errors] == [(primary.name, OverloadedError),
                                                                 (secondary.name, RateLimitError)]
    assert primary.name in str(error) and secondary.name in str(error)
    assert error.retryable and error.retry_after == 7 and error.status_code == 429
    assert error.__cause__ is error.errors[-1][1]


async def test_a_stream_that_already_sent_text_does_not_fall_through(server: FakeServer, second: FakeServer) -> None:
    server.queue(Reply(sse=_stream("Partial answer"), cut_after=2))
    second.queue(Reply(sse=_stream("secondary")))
    backend = FallbackBackend([_openai(server), _openai(second, "gpt-4.1")])
    seen: list[Event] = []
    with pytest.raises(StreamInterruptedError):
        async for event in backend.stream(_request()):
            seen.append(event)
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "Partial answer"
    assert not second.requests


async def test_a_stream_that_fails_before_any_event_falls_through(server: FakeServer, second: FakeServer) -> None:
    server.queue(Reply(503, SERVER_ERROR))
    second.queue(Reply(sse=_stream("from the secondary")))
    backend = FallbackBackend([_openai(server, max_retries=0), _openai(second, "gpt-4.1")])
    events = await _collect(backend, _request())
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "from the secondary"
    assert not any(isinstance(e, ErrorEvent) for e in events)
    [usage] = [e.usage for e in events if isinstance(e, UsageEvent)]
    assert usage.raw[0]["served_by"] == "openai:gpt-4.1" and usage.input_tokens == 7


async def test_after_stream_start_restarts_on_the_next_backend_and_says_so(server: FakeServer,
                                                                          second: FakeServer) -> None:
    server.queue(Reply(sse=_stream("Partial answer"), cut_after=2))
    second.queue(Reply(sse=_stream("Whole answer.")))
    backend = FallbackBackend([_openai(server), _openai(second, "gpt-4.1")], after_stream_start=True)
    events = await _collect(backend, _request())
    kinds = [e.kind for e in events]
    restart = kinds.index("error", kinds.index("error") + 1)  # the backend's own error, then the restart
    assert events[kinds.index("error")].code == "stream_interrupted"
    assert isinstance(events[restart], ErrorEvent) and events[restart].code == "fallback_restart"
    assert "openai:gpt-4o-mini" in events[restart].message and "void" in events[restart].message
    assert "".join(e.text for e in events[:restart] if isinstance(e, TextDelta)) == "Partial answer"
    assert "".join(e.text for e in events[restart:] if isinstance(e, TextDelta)) == "Whole answer."
    [end] = [e for e in events if isinstance(e, MessageEnd)]
    assert end.message.text == "Whole answer."


# -- test doubles ---------------------------------------------------------------------------------------
@tool
def lookup(city: str) -> str:
    """Weather for a city."""
    return f"4 C in {city}"


async def test_agent_run_records_which_backend_served_each_turn() -> None:
    primary_calls = 0

    def flaky(request: ModelRequest) -> str | ScriptedTurn:
        nonlocal primary_calls
        primary_calls += 1
        if primary_calls == 1:
            return ScriptedTurn(tool_calls=[call("lookup", {"city": "Oslo"}, id="c1")],
                                usage=Usage(input_tokens=5, output_tokens=2, requests=1))
        raise OverloadedError("overloaded", status_code=529, provider="anthropic")

    secondary = ScriptedBackend(["It is 4 C in Oslo."], name="scripted-secondary")
    backend = FallbackBackend([FunctionBackend(flaky, name="function-primary"), secondary])
    result = await Agent(backend, tools=[lookup]).run("Weather in Oslo?")
    assert result.output == "It is 4 C in Oslo."
    assert [raw["served_by"] for raw in result.state.usage.raw] == ["function-primary", "scripted-secondary"]
    assert result.usage.requests == 2 and result.state.backend == backend.name
    # the secondary saw the whole conversation, the primary's tool call and its result included
    sent = secondary.requests[0].conversation.messages
    assert sent[-2].tool_calls[0].id == "c1" and sent[-1].tool_results[0].content == "4 C in Oslo"


async def test_agent_run_stream_with_a_fallback() -> None:
    primary = StreamDouble("primary", [], OverloadedError("busy", status_code=529))
    backend = FallbackBackend([primary, ScriptedBackend(["Sunny."], name="secondary")])
    items = [item async for item in Agent(backend).run_stream("go")]
    result = items[-1]
    assert result.output == "Sunny." and primary.calls == 1
    assert result.state.usage.raw[0]["served_by"] == "secondary"


async def test_an_error_event_at_the_start_of_a_stream_is_held_and_falls_through() -> None:
    primary = StreamDouble("primary", [ErrorEvent(code="api_error", message="overloaded")],
                           OverloadedError("overloaded", status_code=529))
    backend = FallbackBackend([primary, ScriptedBackend(["ok"], name="secondary")])
    events = await _collect(backend, _request())
    assert not any(isinstance(e, ErrorEvent) for e in events)
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["ok"]


async def test_a_double_that_sent_text_then_failed_is_not_fallen_through_by_default() -> None:
    primary = StreamDouble("primary", [TextDelta(text="Hel")], ServerError("boom", status_code=500))
    secondary = ScriptedBackend(["Hello"], name="secondary")
    backend = FallbackBackend([primary, secondary])
    with pytest.raises(ServerError):
        await _collect(backend, _request())
    assert not secondary.requests


async def test_a_finished_message_is_never_taken_back_even_after_stream_start() -> None:
    done = MessageEnd(message=Message.assistant("Hello"), finish_reason="stop")
    primary = StreamDouble("primary", [TextDelta(text="Hello"), done], ServerError("usage lost", status_code=500))
    secondary = ScriptedBackend(["Hello"], name="secondary")
    backend = FallbackBackend([primary, secondary], after_stream_start=True)
    with pytest.raises(ServerError):
        await _collect(backend, _request())
    assert not secondary.requests


async def test_local_context_length_error_falls_through() -> None:
    def too_long(request: ModelRequest) -> str:
        raise LocalRequestError("prompt of 9000 tokens is past max_model_len 8192", field="conversation",
                                code="context_length_exceeded")

    backend = FallbackBackend([FunctionBackend(too_long, name="local"), ScriptedBackend(["big"], name="hosted")])
    response = await backend.generate(_request())
    assert response.messages[0].text == "big" and response.model == "hosted"


async def test_errors_not_to_fall_through_are_raised_unchanged_with_a_note() -> None:
    def overloaded(request: ModelRequest) -> str:
        raise OverloadedError("overloaded", status_code=529)

    def bad_key(request: ModelRequest) -> str:
        raise AuthenticationError("invalid x-api-key", status_code=401)

    third = ScriptedBackend(["never"], name="third")
    backend = FallbackBackend([FunctionBackend(overloaded, name="a"), FunctionBackend(bad_key, name="b"), third])
    with pytest.raises(AuthenticationError) as info:
        await backend.generate(_request())
    assert any("a: OverloadedError" in note for note in info.value.__notes__)
    assert not third.requests


async def test_on_chooses_what_falls_through() -> None:
    def bad_key(request: ModelRequest) -> str:
        raise AuthenticationError("invalid x-api-key", status_code=401)

    by_type = FallbackBackend([FunctionBackend(bad_key), ScriptedBackend(["ok"])], on=(AuthenticationError,))
    assert (await by_type.generate(_request())).messages[0].text == "ok"

    def overloaded(request: ModelRequest) -> str:
        raise OverloadedError("overloaded", status_code=529)

    only_auth = FallbackBackend([FunctionBackend(overloaded), ScriptedBackend(["ok"])], on=AuthenticationError)
    with pytest.raises(OverloadedError):
        await only_auth.generate(_request())

    def predicate(exc: BaseException) -> bool:
        return should_fall_back(exc) or isinstance(exc, AuthenticationError)

    extended = FallbackBackend([FunctionBackend(bad_key), ScriptedBackend(["ok"])], on=predicate)
    assert (await extended.generate(_request())).messages[0].text == "ok"


def test_context_length_detection() -> None:
    anthropic = BadRequestError("anthropic API error 400: invalid_request_error: prompt is too long: "
                                "208000 tokens > 200000 maximum", status_code=400)
    vllm = BadRequestError("vllm API error 400: This model's maximum context length is 2048 tokens.",
                           status_code=400)
    coded = BadRequestError("openai API error 400", status_code=400, body=CONTEXT_400)
    assert all(is_context_length_error(e) for e in (anthropic, vllm, coded))
    assert not is_context_length_error(BadRequestError("invalid tool schema", status_code=400))
    assert not is_context_length_error(LocalRequestError("bad schema", field="output_schema", code="invalid_schema"))
    assert should_fall_back(ServerError("bad gateway", status_code=502))
    assert not should_fall_back(RuntimeError("a bug"))


def test_configuration_errors_and_identity() -> None:
    with pytest.raises(ConfigurationError):
        FallbackBackend([])
    with pytest.raises(ConfigurationError):
        FallbackBackend([object()])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError):
        FallbackBackend([ScriptedBackend([])], on=())
    with pytest.raises(ConfigurationError):
        FallbackBackend([ScriptedBackend([])], on=42)  # type: ignore[arg-type]
    a = ScriptedBackend([], name="a", capabilities=BackendCapabilities(reasoning=True, structured_output=False))
    b = ScriptedBackend([], name="b", capabilities=BackendCapabilities(prompt_cache=True))
    backend = FallbackBackend([a, b])
    assert backend.name == "fallback(a, b)" and FallbackBackend([a], name="mine").name == "mine"
    caps = backend.capabilities
    assert caps.reasoning and caps.prompt_cache and not caps.structured_output and caps.tools
