"""OpenAI Responses routes: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.

A Responses request is the same one local turn as a chat completion: `input` (text, or items decoded
by `parley.protocol.openai_responses.decode_input`, the SDK's own Responses decoder) after the
`instructions`, function tools and `tool_choice`, `text.format` as the output schema (with tools
on auto the engine's one grammar allows a call or the typed answer, as on chat), `reasoning` as
the thinking budget, `max_output_tokens` as the token limit. The answer is a `response` object,
or with `stream` its documented event sequence (`responses_items`) between `response.created` /
`response.in_progress` and `response.completed` (or `.incomplete` at the token limit, `.failed`
after an `error` event when the engine drops the turn). Errors are OpenAI's error object, naming
the client's field (`input[2].call_id`, `text.format.schema`, `previous_response_id`).

With a responses store (`ServerConfig.responses_store`), `store` (default true, as OpenAI's)
keeps each response for its tenant and `previous_response_id` continues from it; without one,
nothing is kept, responses say `"store": false`, and `previous_response_id` is a 400 that says why.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from parley.backends.base import ModelRequest, NamedToolChoice, SamplingSettings, ToolChoice
from parley.protocol import Conversation, Message, ProtocolError, ToolSpec
from parley.protocol import openai_responses as responses_wire
from parley.reasoning import Reasoning
from parley.server import responses_schema as rs
from parley.server.context import (
    arrival_of,
    deadline_from,
    endpoint,
    read_json,
    run_or_cancel_on_disconnect,
    state_of,
    tenant_of,
)
from parley.server.errors import ApiError, ErrorKind, invalid
from parley.server.responses_items import ResponseWriter, new_id, usage_json
from parley.server.responses_store import ResponseStore
from parley.server.streaming import SSE_HEADERS, observe_end, sse_event
from parley.server.tenants import cache_salt
from parley.server.turn import ServerTurn, TurnEnd, WireTurn
from parley.server.validation import validate_as

__all__ = ["create_response", "delete_response", "get_response", "store_of"]


def store_of(request: Request) -> ResponseStore | None:
    store: ResponseStore | None = getattr(request.app.state, "parley_responses", None)
    return store


# -- request -> turn -------------------------------------------------------------------------------
def _reindexed(message: str, param: str | None, offset: int) -> ApiError:
    """An error about `input[k]` of the chain (stored items first) named at the client's own index."""
    if offset and param and param.startswith("input["):
        k = int(param[len("input[") : param.index("]")])
        if k < offset:
            return invalid(f"the stored conversation of previous_response_id cannot be read: {message}",
                           "previous_response_id")
        new = f"input[{k - offset}]"
        old = f"input[{k}]"
        return invalid(message.replace(old, new, 1), new + param[len(old) :])
    return invalid(message, param or "input")


def to_conversation(instructions: str | None, items: list[dict[str, Any]], offset: int) -> Conversation:
    try:
        messages = responses_wire.decode_input(items)
    except ProtocolError as exc:
        raise _reindexed(str(exc), exc.param, offset) from None
    head = [Message.system(instructions)] if instructions else []
    return Conversation(messages=head + messages)


def _reasoning(parsed: rs.ResponsesRequest) -> Reasoning | None:
    """`reasoning.effort` as the local budget for it ("none": no reasoning); vLLM's token budget wins."""
    asked = parsed.reasoning.effort if parsed.reasoning is not None else None
    effort = None if asked == "none" else asked
    if parsed.thinking_token_budget is not None:
        return Reasoning(effort=effort, budget_tokens=parsed.thinking_token_budget)
    return Reasoning(effort=effort) if effort is not None else None


def to_wire_turn(
    parsed: rs.ResponsesRequest, conversation: Conversation, salt: str, deadline_s: float | None
) -> WireTurn:
    tools = [
        ToolSpec(name=t.name, description=t.description or "",
                 parameters=t.parameters if t.parameters is not None else {"type": "object", "properties": {}},
                 strict=t.strict is not False)  # the Responses API's default is strict
        for t in parsed.tools or []
    ]
    choice: ToolChoice = "auto" if tools else "none"
    if isinstance(parsed.tool_choice, rs.NamedFunctionChoice):
        choice = NamedToolChoice(parsed.tool_choice.name)
    elif parsed.tool_choice is not None:
        choice = parsed.tool_choice
    fmt = parsed.output_format
    schema: dict[str, Any] | None = None
    if isinstance(fmt, rs.JsonSchemaFormat):
        schema = fmt.schema_
    elif isinstance(fmt, rs.JsonObjectFormat):
        schema = {"type": "object"}
    request = ModelRequest(
        conversation=conversation,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parsed.parallel_tool_calls is not False,
        output_schema=schema,
        reasoning=_reasoning(parsed),
        tenant=salt,
        sampling=parsed.settings(
            SamplingSettings(max_tokens=parsed.max_output_tokens, temperature=parsed.temperature,
                             top_p=parsed.top_p, top_k=parsed.top_k, seed=parsed.seed)
        ),
    )
    return WireTurn(
        request=request,
        deadline_s=deadline_s,
        params={"output_schema": "text.format.schema" if isinstance(fmt, rs.JsonSchemaFormat) else "text.format",
                "max_tokens": "max_output_tokens", "conversation": "input", "reasoning": "reasoning"},
    )


# -- the response object ---------------------------------------------------------------------------
class _Shell:
    """The fields every copy of one response repeats (created, in progress, completed, stored)."""

    def __init__(self, parsed: rs.ResponsesRequest, model: str, stored: bool) -> None:
        self.id = new_id("resp")
        self.created_at = int(time.time())
        fmt = parsed.text.format if parsed.text is not None and parsed.text.format is not None else None
        self.fields: dict[str, Any] = {
            "instructions": parsed.instructions,
            "tools": [t.model_dump(by_alias=True, exclude_none=True) | {"strict": t.strict is not False}
                      for t in parsed.tools or []],
            "tool_choice": parsed.tool_choice.model_dump() if isinstance(parsed.tool_choice, rs.NamedFunctionChoice)
            else parsed.tool_choice or "auto",
            "parallel_tool_calls": parsed.parallel_tool_calls is not False,
            "temperature": parsed.temperature,
            "top_p": parsed.top_p,
            "max_output_tokens": parsed.max_output_tokens,
            "previous_response_id": parsed.previous_response_id,
            "metadata": parsed.metadata or {},
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "reasoning": {"effort": parsed.reasoning.effort, "summary": parsed.reasoning.summary}
            if parsed.reasoning is not None else None,
            "store": stored,
            "truncation": "disabled",
            "user": parsed.user,
        }
        self.model = model

    def body(self, status: str, output: list[dict[str, Any]], end: TurnEnd | None = None,
             error: dict[str, Any] | None = None) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": list(output), "error": error, "incomplete_details": incomplete,
            **self.fields, "usage": usage_json(end) if end is not None else None,
        }


def _status(end: TurnEnd) -> str:
    return "incomplete" if end.finish_reason == "length" else "completed"


# -- routes ------------------------------------------------------------------------------------------
@endpoint("openai", "responses")
async def create_response(request: Request) -> Response:
    state = state_of(request)
    tenant = tenant_of(request)
    parsed = validate_as(rs.ResponsesRequest, await read_json(request))
    state.check_model(parsed.model)
    store = store_of(request)
    prior: list[dict[str, Any]] = []
    if parsed.previous_response_id is not None:
        if store is None:
            raise invalid("this server keeps no responses (start it with a responses store), so "
                          "previous_response_id cannot be resolved; send the whole conversation as input",
                          "previous_response_id", "store_disabled")
        found = store.get(tenant, parsed.previous_response_id)
        if found is None:
            raise invalid(f"previous response with id {parsed.previous_response_id!r} not found",
                          "previous_response_id", "previous_response_not_found")
        prior = found.context
    new_items = [{"type": "message", "role": "user", "content": parsed.input}] if isinstance(parsed.input, str) \
        else list(parsed.input or [])
    context = prior + new_items
    conversation = to_conversation(parsed.instructions, context, len(prior))
    wire = to_wire_turn(parsed, conversation, cache_salt(tenant, parsed.cache_salt),
                        deadline_from(request, parsed.deadline_s))
    try:
        turn = ServerTurn(state, wire, arrival=arrival_of(request))
    except ApiError as exc:  # a part the codec refuses (an image) is named at the chain's index
        if exc.param and exc.param.startswith("input["):
            raise _reindexed(exc.message, exc.param, len(prior)) from None
        raise
    keep = store if store is not None and parsed.store is not False else None
    shell = _Shell(parsed, parsed.model, stored=keep is not None)
    await run_or_cancel_on_disconnect(request, turn.start())

    def finished(end: TurnEnd, output: list[dict[str, Any]]) -> dict[str, Any]:
        observe_end(state.metrics, end)
        body = shell.body(_status(end), output, end)
        if keep is not None:
            keep.put(tenant, body, context + output)
        return body

    if parsed.stream:
        return StreamingResponse(_stream(turn, shell, finished), media_type="text/event-stream",
                                 headers=SSE_HEADERS, background=BackgroundTask(turn.close))
    try:
        body = await run_or_cancel_on_disconnect(request, _complete(turn, finished))
    finally:
        await turn.close()
    return JSONResponse(body)


async def _complete(turn: ServerTurn, finished: Any) -> dict[str, Any]:
    writer = ResponseWriter()
    async for item in turn.events():
        if isinstance(item, TurnEnd):
            writer.close()
            body: dict[str, Any] = finished(item, writer.output)
            return body
        writer.feed(item)
    raise ApiError("the turn ended without a result", kind=ErrorKind.INTERNAL)


async def _stream(turn: ServerTurn, shell: _Shell, finished: Any) -> AsyncIterator[str]:
    writer = ResponseWriter()

    def send(events: list[dict[str, Any]]) -> str:
        return "".join(sse_event(e["type"], e) for e in events)

    try:
        yield send([writer.event("response.created", response=shell.body("in_progress", [])),
                    writer.event("response.in_progress", response=shell.body("in_progress", []))])
        async for item in turn.events():
            if isinstance(item, TurnEnd):
                events = writer.close()
                body = finished(item, writer.output)
                kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
                yield send([*events, writer.event(kind, response=body)])
            else:
                events = writer.feed(item)
                if events:
                    yield send(events)
    except ApiError as exc:  # the documented codes: a refusal under load, else the server's fault
        code = "rate_limit_exceeded" if exc.kind is ErrorKind.RATE_LIMIT else "server_error"
        error = {"code": code, "message": exc.message}
        yield send([writer.event("error", code=exc.code or code, message=exc.message, param=exc.param),
                    writer.event("response.failed", response=shell.body("failed", writer.output, error=error))])
    finally:
        await turn.close()


def _no_such_response(response_id: str, store: ResponseStore | None) -> ApiError:
    why = "" if store is not None else " (this server keeps no responses)"
    return ApiError(f"no response with id {response_id!r}{why}", kind=ErrorKind.NOT_FOUND, param="response_id")


@endpoint("openai", "responses_get")
async def get_response(request: Request) -> Response:
    tenant = tenant_of(request)
    response_id = str(request.path_params["response_id"])
    store = store_of(request)
    found = store.get(tenant, response_id) if store is not None else None
    if found is None:
        raise _no_such_response(response_id, store)
    return JSONResponse(found.response)


@endpoint("openai", "responses_delete")
async def delete_response(request: Request) -> Response:
    tenant = tenant_of(request)
    response_id = str(request.path_params["response_id"])
    store = store_of(request)
    if store is None or not store.delete(tenant, response_id):
        raise _no_such_response(response_id, store)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
