"""OpenAI-compatible routes: `POST /v1/chat/completions` and `GET /v1/models`.

The request is validated strictly (`openai_schema`), converted to a `Conversation` and a `WireTurn`,
and run as one local turn (the SDK's `LocalTurn`). Responses follow the Chat Completions shapes:
`chat.completion`, or SSE `chat.completion.chunk`s ending in `data: [DONE]`, with tool-call deltas
assembled by `index` (id and name only in the first) and, with `stream_options.include_usage`, one
last chunk whose `choices` is empty and whose `usage` counts cached prompt tokens in
`prompt_tokens_details`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from parley.backends.base import ModelRequest, NamedToolChoice, SamplingSettings, ToolChoice
from parley.constrained import Choice, Grammar, Regex
from parley.protocol import (
    Conversation,
    ProtocolError,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolSpec,
)
from parley.protocol import openai as openai_wire
from parley.reasoning import Reasoning
from parley.server import openai_schema as oa
from parley.server.chat_choices import many_choices
from parley.server.context import (
    arrival_of,
    deadline_from,
    endpoint,
    read_json,
    run_or_cancel_on_disconnect,
    state_of,
    tenant_of,
)
from parley.server.errors import ApiError, invalid
from parley.server.streaming import SSE_HEADERS, observe_end, sse_data
from parley.server.tenants import cache_salt
from parley.server.turn import LogprobChunk, ServerTurn, TurnEnd, WireTurn
from parley.server.validation import validate_as


# -- request -> conversation ---------------------------------------------------------------------
def to_conversation(request: oa.ChatCompletionRequest) -> Conversation:
    """The validated messages, decoded by the one Chat Completions decoder (`parley.protocol.openai`)."""
    try:
        conversation, _ = openai_wire.decode_request(request.model_dump(by_alias=True, exclude_none=True))
    except ProtocolError as exc:
        raise invalid(str(exc), exc.param or "messages") from None
    return conversation


def to_wire_turn(request: oa.ChatCompletionRequest, salt: str, deadline_s: float | None) -> WireTurn:
    tools = [
        ToolSpec(
            name=t.function.name,
            description=t.function.description or "",
            parameters=t.function.parameters
            if t.function.parameters is not None
            else {"type": "object", "properties": {}},
            strict=bool(t.function.strict),
        )
        for t in request.tools or []
    ]
    choice: ToolChoice = "auto" if tools else "none"
    if isinstance(request.tool_choice, oa.NamedToolChoiceParam):
        choice = NamedToolChoice(request.tool_choice.function.name)
    elif request.tool_choice is not None:
        choice = request.tool_choice
    fmt = request.response_format
    schema: dict[str, Any] | None = None
    schema_param = "response_format.json_schema.schema"
    if isinstance(fmt, oa.JsonSchemaFormat):
        schema = fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {}
    elif isinstance(fmt, oa.JsonObjectFormat):
        schema, schema_param = {"type": "object"}, "response_format"
    constraint, constraint_param = None, "structured_outputs"
    so = request.structured_outputs
    if so is not None and so.json_ is not None:
        schema, schema_param = _schema_of(so.json_), "structured_outputs.json"
    elif so is not None:
        constraint, constraint_param = _constraint_of(so)
    elif request.grammar is not None:
        constraint, constraint_param = Grammar(request.grammar), "grammar"
    if schema is not None and (choice == "required" or isinstance(choice, NamedToolChoice)):
        raise invalid(f"{schema_param.split('.')[0]} cannot be combined with a forced tool_choice", schema_param)
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    model_request = ModelRequest(
        conversation=to_conversation(request),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        output_schema=schema,
        reasoning=Reasoning(budget_tokens=request.thinking_token_budget)
        if request.thinking_token_budget is not None
        else None,
        tenant=salt,
        sampling=request.settings(
            SamplingSettings(
                max_tokens=request.token_limit,
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k,
                seed=request.seed,
                stop=stop,
            ),
            frequency_penalty=request.frequency_penalty,
            presence_penalty=request.presence_penalty,
        ),
    )
    max_tokens_param = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    return WireTurn(
        request=model_request,
        logprobs=(request.top_logprobs or 0) if request.logprobs else None,
        deadline_s=deadline_s,
        params={"output_schema": schema_param, "max_tokens": max_tokens_param, "conversation": "messages",
                "output_constraint": constraint_param},
        constraint=constraint,
    )


def _schema_of(value: dict[str, Any] | str) -> dict[str, Any]:
    """`structured_outputs.json`: a schema, or its JSON text (vLLM takes both)."""
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise invalid(f"structured_outputs.json is not JSON: {exc}", "structured_outputs.json") from None
    if not isinstance(parsed, dict):
        raise invalid("structured_outputs.json must be a JSON Schema object", "structured_outputs.json")
    return parsed


def _constraint_of(so: oa.StructuredOutputs) -> tuple[Regex | Choice | Grammar, str]:
    if so.regex is not None:
        return Regex(so.regex), "structured_outputs.regex"
    if so.choice is not None:
        return Choice(tuple(so.choice)), "structured_outputs.choice"
    assert so.grammar is not None
    return Grammar(so.grammar), "structured_outputs.grammar"


# -- responses -----------------------------------------------------------------------------------
def _usage(end: TurnEnd) -> dict[str, Any]:
    return {
        "prompt_tokens": end.prompt_tokens,
        "completion_tokens": end.output_tokens,
        "total_tokens": end.prompt_tokens + end.output_tokens,
        "prompt_tokens_details": {"cached_tokens": end.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": end.reasoning_tokens},
    }


def _logprob_json(chunk: LogprobChunk) -> list[dict[str, Any]]:
    return [
        {
            "token": e.token,
            "logprob": e.logprob,
            "bytes": e.bytes,
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))} for t, v in e.top],
        }
        for e in chunk.entries
    ]


def _message_json(end: TurnEnd) -> dict[str, Any]:
    message = end.message
    out: dict[str, Any] = {
        "role": "assistant",
        "content": message.text if message.text or not message.tool_calls else None,
    }
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return out


async def _complete(turn: ServerTurn, model: str, completion_id: str, created: int, request: Request) -> dict[str, Any]:
    logprobs: list[dict[str, Any]] = []
    end: TurnEnd | None = None
    async for item in turn.events():
        if isinstance(item, LogprobChunk):
            logprobs.extend(_logprob_json(item))
        elif isinstance(item, TurnEnd):
            end = item
    assert end is not None
    observe_end(state_of(request).metrics, end)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": _message_json(end),
                "logprobs": {"content": logprobs} if turn.logprobs is not None else None,
                "finish_reason": end.finish_reason,
            }
        ],
        "usage": _usage(end),
        "system_fingerprint": None,
    }


async def _stream(
    turn: ServerTurn, model: str, completion_id: str, created: int, include_usage: bool, request: Request
) -> AsyncIterator[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }
        if include_usage:
            body["usage"] = None
        return sse_data(body)

    try:
        yield chunk({"role": "assistant", "content": ""})
        async for item in turn.events():
            if isinstance(item, TextDelta):
                yield chunk({"content": item.text})
            elif isinstance(item, ReasoningDelta):
                yield chunk({"reasoning_content": item.text})
            elif isinstance(item, ToolCallStart):
                call = {
                    "index": item.index,
                    "id": item.id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": ""},
                }
                yield chunk({"tool_calls": [call]})
            elif isinstance(item, ToolCallDelta):
                yield chunk({"tool_calls": [{"index": item.index, "function": {"arguments": item.arguments_delta}}]})
            elif isinstance(item, ToolCallEnd):
                continue
            elif isinstance(item, LogprobChunk):
                yield chunk({"content": ""}, logprobs={"content": _logprob_json(item)})
            elif isinstance(item, TurnEnd):
                observe_end(state_of(request).metrics, item)
                yield chunk({}, finish=item.finish_reason)
                if include_usage:
                    yield sse_data(
                        {
                            "id": completion_id,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "choices": [],
                            "usage": _usage(item),
                        }
                    )
    except ApiError as exc:
        yield sse_data(exc.body("openai"))
    finally:
        await turn.close()
    yield "data: [DONE]\n\n"


@endpoint("openai", "chat_completions")
async def chat_completions(request: Request) -> Response:
    state = state_of(request)
    tenant = tenant_of(request)
    body = await read_json(request)
    parsed = validate_as(oa.ChatCompletionRequest, body)
    state.check_model(parsed.model)
    wire = to_wire_turn(parsed, cache_salt(tenant, parsed.cache_salt), deadline_from(request, parsed.deadline_s))
    if parsed.n is not None and parsed.n > 1:  # n independent draws (chat_choices)
        include = bool(parsed.stream and parsed.stream_options and parsed.stream_options.include_usage)
        return await many_choices(request, state, wire, parsed.n, model=parsed.model, created=int(time.time()),
                                  completion_id="chatcmpl-" + uuid.uuid4().hex, stream=bool(parsed.stream),
                                  include_usage=include)
    turn = ServerTurn(state, wire, arrival=arrival_of(request))
    completion_id = "chatcmpl-" + turn.request_id
    created = int(time.time())
    await run_or_cancel_on_disconnect(request, turn.start())
    if parsed.stream:
        include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
        stream = _stream(turn, parsed.model, completion_id, created, include_usage, request)
        return StreamingResponse(
            stream, media_type="text/event-stream", headers=SSE_HEADERS, background=BackgroundTask(turn.close)
        )
    try:
        result = await run_or_cancel_on_disconnect(
            request, _complete(turn, parsed.model, completion_id, created, request)
        )
    finally:
        await turn.close()
    return JSONResponse(result)


@endpoint("openai", "models")
async def list_models(request: Request) -> Response:
    """The served model, in OpenAI's list shape, or Anthropic's when the client sends `anthropic-version`."""
    state = state_of(request)
    tenant_of(request)
    if "anthropic-version" in request.headers:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.created))
        entry = {
            "type": "model",
            "id": state.config.model_name,
            "display_name": state.config.model_name,
            "created_at": created,
        }
        return JSONResponse({"data": [entry], "has_more": False, "first_id": entry["id"], "last_id": entry["id"]})
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": state.config.model_name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "parley",
                    "root": f"{state.engine.model_id.split('/', 1)[0]}/{state.engine.mode}",
                    "max_model_len": state.engine.max_model_len,
                }
            ],
        }
    )
