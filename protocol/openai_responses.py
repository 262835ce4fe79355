"""OpenAI Responses API wire JSON (``/v1/responses``) <-> parley envelopes.

Requests (`build_request`): the conversation becomes ``input`` items in order:

* system / developer messages -> ``{"type": "message", "role": "system"|"developer", "content"}``;
* user text -> ``{"type": "message", "role": "user", "content"}`` (with images or PDFs, a list of
  ``input_text`` / ``input_image`` (``image_url``: the URL or a data URL) / ``input_file``
  (``file_url``, or the bytes as ``file_data``) parts); assistant text -> the same with
  ``role: "assistant"``;
* a `ToolCall` -> ``{"type": "function_call", "call_id", "name", "arguments"}`` and a `ToolResult`
  -> ``{"type": "function_call_output", "call_id", "output"}`` (ids shortened as for Chat); a
  result with images or documents sends ``output`` as a list: ``input_text`` (its text, when not
  empty) then ``input_image`` / ``input_file`` items, the shapes of user content;
* a `CompactionPart` this provider produced (a ``compaction`` item: server-side compaction through
  ``context_management``, or ``/responses/compact``) -> the item exactly as received;
* a `ReasoningPart` this provider produced -> ``{"type": "reasoning", "id", "summary",
  "encrypted_content"}``, unchanged (a summary of several parts goes back as one part holding the
  same text: the model reads the encrypted content, the summary is only for people). Without
  ``encrypted_content`` an item can only be sent back by id when the response was stored
  (``store=True``); otherwise it is left out (the API answers 404 "Items are not persisted when
  `store` is set to false" for it). Reasoning of other providers (or unsigned text) is never sent.

Tools are Responses function tools (``{"type": "function", "name", "description", "parameters",
"strict"}``, ``strict`` always explicit since the API defaults it to true), a forced tool is
``{"type": "function", "name"}``, structured output is ``text.format`` (`text_format`).

`decode_input` reads ``input`` items back into envelopes (the inverse of `encode_input`: assistant
items in a row make one assistant message, each ``function_call_output`` a tool message).

Responses (`decode_response`, `StreamDecoder`): the ``output`` items become one assistant message,
in order: a ``compaction`` item -> `CompactionPart` (the item verbatim), a ``reasoning`` item ->
`ReasoningPart` (``text`` = the summary texts joined by blank
lines, or the raw ``reasoning_text`` content; ``signature`` = the item id; ``redacted`` = its
``encrypted_content``; ``provider``), ``output_text`` / ``refusal`` -> `TextPart`, a
``function_call`` -> `ToolCall` (``id`` = ``call_id``). Streams map ``response.output_text.delta``
to `TextDelta`, ``response.reasoning_summary_text.delta`` (and ``response.reasoning_text.delta``)
to `ReasoningDelta`, ``response.output_item.added`` of a function call to `ToolCallStart`,
``response.function_call_arguments.delta`` to `ToolCallDelta`, its ``response.output_item.done``
to `ToolCallEnd`, and ``response.completed`` (or ``.incomplete``) to the final message and usage;
``error`` and ``response.failed`` set `StreamDecoder.error`. Usage is the raw ``usage`` object
(``input_tokens`` includes ``input_tokens_details.cached_tokens``; the SDK's normaliser splits it).

`ResponseChain` remembers which stored response ended which conversation prefix, so a backend can
send ``previous_response_id`` and only the new items.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.protocol.envelope import (
    CompactionPart,
    Conversation,
    DocumentPart,
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
)
from parley.protocol.errors import ProtocolError, UnsupportedPartError
from parley.protocol.events import (
    ErrorEvent,
    Event,
    MessageEnd,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from parley.protocol.openai import DecodedResponse, ToolChoiceMode, strict_json_schema, tool_id
from parley.protocol.tool_spec import ToolSpec

ENCRYPTED_REASONING = "reasoning.encrypted_content"
SUMMARY_JOINER = "\n\n"


# -- requests ------------------------------------------------------------------------------------------
def encode_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools:
        parameters = strict_json_schema(tool.parameters) if tool.strict else tool.parameters
        out.append({"type": "function", "name": tool.name, "description": tool.description,
                    "parameters": parameters, "strict": bool(tool.strict)})
    return out


def encode_tool_choice(mode: ToolChoiceMode = "auto", *, tool_name: str | None = None) -> str | dict[str, Any]:
    if tool_name is not None:
        return {"type": "function", "name": tool_name}
    if mode not in ("auto", "none", "required"):
        raise ProtocolError(f"unknown tool choice {mode!r}")
    return mode


def text_format(schema: Mapping[str, Any], *, name: str = "output", strict: bool = True) -> dict[str, Any]:
    """``text.format`` for a JSON Schema (strict mode rewrites it into OpenAI's subset)."""
    safe_name = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)[:64] or "output"
    body = strict_json_schema(schema) if strict else dict(schema)
    return {"type": "json_schema", "name": safe_name, "schema": body, "strict": strict}


def reasoning_item(part: ReasoningPart) -> dict[str, Any]:
    """A reasoning part as the input item it came from (id, summary, encrypted content)."""
    item: dict[str, Any] = {"type": "reasoning", "id": part.signature,
                            "summary": [{"type": "summary_text", "text": part.text}] if part.text else []}
    if part.redacted is not None:
        item["encrypted_content"] = part.redacted
    return item


def encode_input(
    messages: Conversation | Sequence[Message],
    *,
    provider: str = "openai",
    developer_role: bool = True,
    stored: bool = False,
    check_pairing: bool = True,
) -> list[dict[str, Any]]:
    """Responses ``input`` items. ``stored``: earlier responses were stored, so reasoning items
    without encrypted content may be sent by id. ``check_pairing=False`` for a tail that answers
    calls of a stored response (``previous_response_id``)."""
    messages = list(messages)
    if check_pairing:
        Conversation.model_construct(messages=messages).check_tool_pairing()
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.role
        if role in (Role.SYSTEM, Role.DEVELOPER):
            wire_role = "developer" if role is Role.DEVELOPER and developer_role else "system"
            items.append({"type": "message", "role": wire_role, "content": message.text})
        elif role is Role.ASSISTANT:
            items.extend(_assistant_items(message, index, provider=provider, stored=stored))
        elif role in (Role.USER, Role.TOOL):
            _only(message, index, (TextPart, ToolResult, ImagePart, DocumentPart))
            results = [p for p in message.parts if isinstance(p, ToolResult)]
            for j, result in enumerate(results):
                output: str | list[dict[str, Any]] = result.content
                if result.attachments:  # text first, then the images/documents (the documented output list)
                    output = [{"type": "input_text", "text": result.content}] if result.content else []
                    output += [_content_part(part, f"messages[{index}].tool_results[{j}].attachments[{k}]")
                               for k, part in enumerate(result.attachments)]
                items.append({"type": "function_call_output", "call_id": tool_id(result.call_id), "output": output})
            if any(isinstance(p, ImagePart | DocumentPart) for p in message.parts):
                content = [_content_part(p, f"messages[{index}].content[{j}]") for j, p in enumerate(message.parts)
                           if isinstance(p, TextPart | ImagePart | DocumentPart)]
                items.append({"type": "message", "role": "user", "content": content})
                continue
            texts = [p.text for p in message.parts if isinstance(p, TextPart)]
            if texts or (role is Role.USER and not results):
                items.append({"type": "message", "role": "user", "content": "".join(texts)})
        else:
            raise ProtocolError(f"role {role!r} has no Responses API equivalent")
    return items


def _content_part(part: TextPart | ImagePart | DocumentPart, where: str) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "input_text", "text": part.text}
    if isinstance(part, ImagePart):
        return {"type": "input_image", "image_url": part.data_url(), "detail": "auto"}
    if part.data is None:
        return {"type": "input_file", "file_url": part.url}
    return {"type": "input_file", "file_data": part.data_url(), "filename": part.title or "document.pdf"}


def _only(message: Message, index: int, kinds: tuple[type, ...]) -> None:
    for j, part in enumerate(message.parts):
        if not isinstance(part, kinds):
            where = f"messages[{index}].content[{j}]"
            raise UnsupportedPartError(f"{where}: a {message.role.value} message cannot carry a {part.kind!r} part "
                                       "in the Responses API", where=where, kind=part.kind)


def _assistant_items(message: Message, index: int, *, provider: str, stored: bool) -> list[dict[str, Any]]:
    _only(message, index, (TextPart, ReasoningPart, ToolCall, CompactionPart))
    items: list[dict[str, Any]] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            items.append({"type": "message", "role": "assistant", "content": "".join(text)})
            text.clear()

    for part in message.parts:
        if isinstance(part, TextPart):
            if part.text:
                text.append(part.text)
            continue
        flush()
        if isinstance(part, ReasoningPart):
            if part.provider == provider and part.signature and (part.redacted is not None or stored):
                items.append(reasoning_item(part))
        elif isinstance(part, ToolCall):
            items.append({"type": "function_call", "call_id": tool_id(part.id), "name": part.name,
                          "arguments": part.arguments})
        elif isinstance(part, CompactionPart) and part.provider == provider:
            items.append(dict(part.payload))  # opaque: verbatim, only to the provider that made it
    flush()
    return items


def build_request(
    model: str,
    conversation: Conversation | Sequence[Message],
    tools: Sequence[ToolSpec] = (),
    *,
    tool_choice: ToolChoiceMode = "auto",
    tool_name: str | None = None,
    parallel_tool_calls: bool | None = None,
    stream: bool = False,
    provider: str = "openai",
    developer_role: bool = True,
    store: bool = False,
    include: Sequence[str] = (),
    previous_response_id: str | None = None,
    check_pairing: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """A complete ``/v1/responses`` body (``extra``: max_output_tokens, reasoning, text, ...; None dropped)."""
    body: dict[str, Any] = {
        "model": model,
        "input": encode_input(conversation, provider=provider, developer_role=developer_role,
                              stored=store, check_pairing=check_pairing),
        "store": store,
    }
    if include:
        body["include"] = list(include)
    if previous_response_id is not None:
        body["previous_response_id"] = previous_response_id
    if tools:
        body["tools"] = encode_tools(tools)
        body["tool_choice"] = encode_tool_choice(tool_choice, tool_name=tool_name)
        if parallel_tool_calls is not None:
            body["parallel_tool_calls"] = parallel_tool_calls
    if stream:
        body["stream"] = True
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


# -- responses -----------------------------------------------------------------------------------------
def _reasoning_part(item: Mapping[str, Any], provider: str) -> ReasoningPart:
    summary = [s.get("text") or "" for s in item.get("summary") or [] if isinstance(s, Mapping)]
    content = [c.get("text") or "" for c in item.get("content") or [] if isinstance(c, Mapping)]
    text = SUMMARY_JOINER.join(summary) if summary else "".join(content)
    encrypted = item.get("encrypted_content")
    return ReasoningPart(text=text, signature=str(item["id"]) if item.get("id") else None,
                         redacted=encrypted if isinstance(encrypted, str) else None, provider=provider)


def decode_item(item: Mapping[str, Any], provider: str = "openai") -> tuple[list[Part], bool]:
    """One output item as parts, and whether it held a refusal. Hosted-tool items give no parts."""
    kind = item.get("type")
    if kind == "reasoning":
        return [_reasoning_part(item, provider)], False
    if kind == "compaction":
        return [CompactionPart(provider=provider, payload=dict(item))], False
    if kind == "function_call":
        arguments = item.get("arguments")
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return [ToolCall(id=str(item["call_id"]), name=str(item["name"]), arguments=arguments or "{}")], False
    if kind == "message":
        parts: list[Part] = []
        refused = False
        for content in item.get("content") or []:
            if not isinstance(content, Mapping):
                continue
            if content.get("type") == "output_text" and content.get("text"):
                parts.append(TextPart(text=str(content["text"])))
            elif content.get("type") == "refusal" and content.get("refusal"):
                parts.append(TextPart(text=str(content["refusal"])))
                refused = True
        return parts, refused
    return [], False


# -- input items back to envelopes ----------------------------------------------------------------------
_ASSISTANT_ITEMS = ("reasoning", "function_call", "compaction")


def decode_input(items: str | Sequence[Mapping[str, Any]], *, provider: str = "openai") -> list[Message]:
    """``input`` items as envelopes (see the module docstring); `ProtocolError` names a bad item."""
    if isinstance(items, str):
        return [Message.user(items)]
    messages: list[Message] = []
    names: dict[str, str] = {}
    for index, item in enumerate(items):
        at = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise ProtocolError(f"{at} must be an object", param=at)
        kind = item.get("type", "message")
        role = item.get("role")
        if kind in _ASSISTANT_ITEMS or (kind == "message" and role == "assistant"):
            if kind == "message":
                parts: list[Part] = [TextPart(text=_input_text(item.get("content"), at))]
            else:
                try:
                    parts = decode_item(item, provider)[0]
                except (KeyError, TypeError, ValueError) as exc:
                    raise ProtocolError(f"{at}: malformed {kind} item: {exc}", param=at) from None
            for part in parts:
                if isinstance(part, ToolCall):
                    names[part.id] = part.name
            if messages and messages[-1].role is Role.ASSISTANT:
                messages[-1].parts.extend(parts)
            else:
                messages.append(Message(role=Role.ASSISTANT, parts=parts))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ProtocolError(f"{at}.call_id must be a non-empty string", param=f"{at}.call_id")
            name = names.get(call_id, "")
            text, media = _output_of(item.get("output"), f"{at}.output")
            result = ToolResult(call_id=call_id, name=name, content=text, attachments=media)
            messages.append(Message(role=Role.TOOL, parts=[result], name=name or None))
        elif kind == "message" and role in ("system", "developer"):
            text = _input_text(item.get("content"), at)
            messages.append(Message.system(text) if role == "system" else Message.developer(text))
        elif kind == "message" and role == "user":
            content = item.get("content")
            if isinstance(content, str):
                messages.append(Message.user(content))
            else:
                messages.append(Message(role=Role.USER, parts=list(_input_parts(content, f"{at}.content"))))
        else:
            raise ProtocolError(f"{at}: unsupported input item (type {kind!r}, role {role!r})", param=at)
    return messages


def _input_text(content: Any, at: str) -> str:
    if isinstance(content, str):
        return content
    parts = _input_parts(content, f"{at}.content")
    if any(not isinstance(p, TextPart) for p in parts):
        raise ProtocolError(f"{at}.content: only text is allowed here", param=f"{at}.content")
    return "".join(p.text for p in parts if isinstance(p, TextPart))


def _input_parts(content: Any, at: str) -> list[TextPart | ImagePart | DocumentPart]:
    if not isinstance(content, list):
        raise ProtocolError(f"{at} must be a string or a list of content parts", param=at)
    out: list[TextPart | ImagePart | DocumentPart] = []
    for j, part in enumerate(content):
        where = f"{at}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if not isinstance(part, Mapping):
            raise ProtocolError(f"{where} must be an object", param=where)
        try:
            if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
                out.append(TextPart(text=part["text"]))
            elif kind == "input_image" and isinstance(part.get("image_url"), str):
                out.append(ImagePart(url=part["image_url"]).noted_at(where))  # a data: URL becomes bytes
            elif kind == "input_file" and isinstance(part.get("file_data"), str):
                out.append(DocumentPart(url=part["file_data"], title=part.get("filename")).noted_at(where))
            elif kind == "input_file" and isinstance(part.get("file_url"), str):
                out.append(DocumentPart(url=part["file_url"]).noted_at(where))
            else:
                raise ProtocolError(f"{where}: unsupported content part {kind!r} (or a missing field; uploaded "
                                    "file ids cannot be resolved here)", param=where)
        except ValueError as exc:  # pydantic's ValidationError: a bad data URL, an unknown media type
            raise ProtocolError(f"{where}: malformed {kind}: {exc}", param=where) from None
    return out


def _output_of(output: Any, at: str) -> tuple[str, list[ImagePart | DocumentPart]]:
    if isinstance(output, str):
        return output, []
    parts = _input_parts(output, at)
    text = "".join(p.text for p in parts if isinstance(p, TextPart))
    return text, [p for p in parts if isinstance(p, ImagePart | DocumentPart)]


def _finish(response: Mapping[str, Any], parts: Sequence[Part], refused: bool) -> str:
    if any(isinstance(p, ToolCall) for p in parts):
        return "tool_calls"
    if response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "length" if reason == "max_output_tokens" else str(reason or "length")
    return "refusal" if refused else "stop"


def _message(items: Sequence[Mapping[str, Any]], provider: str) -> tuple[Message, bool]:
    parts: list[Part] = []
    refused = False
    for item in items:
        item_parts, item_refused = decode_item(item, provider)
        parts.extend(item_parts)
        refused = refused or item_refused
    return Message(role=Role.ASSISTANT, parts=parts), refused


def error_of(response: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """For a failed response (``status: failed``) or an ``error`` stream event: an HTTP status
    to map it like an error answer, and an error body in the API's usual ``{"error": {...}}`` shape."""
    if response.get("type") == "error":
        error: Any = response
    elif response.get("status") == "failed" or (response.get("error") and "output" not in response):
        error = response.get("error") or {}
    else:
        return None
    if not isinstance(error, Mapping):
        error = {"message": str(error)}
    code = error.get("code")
    body = {"error": {"message": str(error.get("message") or "the response failed"),
                      "type": str(error.get("type") or code or "server_error"), "param": error.get("param"),
                      "code": code}}
    return _status_of(code), body


def _status_of(code: Any) -> int:
    code = str(code or "")
    if code in ("rate_limit_exceeded", "insufficient_quota"):
        return 429
    if code == "context_length_exceeded" or code.startswith("invalid_") or code == "empty_image_file":
        return 400
    return 500


def decode_response(body: Mapping[str, Any], *, provider: str = "openai") -> DecodedResponse:
    """A Responses API response as one assistant message, finish reason and raw usage."""
    output = body.get("output")
    if not isinstance(output, list):
        raise ProtocolError("a Responses API response needs an 'output' list")
    try:
        message, refused = _message([item for item in output if isinstance(item, Mapping)], provider)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed output item in a Responses API response: {exc}") from None
    refusal = next((p.text for p in message.parts if isinstance(p, TextPart)), None) if refused else None
    return DecodedResponse(message=message, finish_reason=_finish(body, message.parts, refused),
                           usage=dict(body.get("usage") or {}), id=body.get("id"), model=body.get("model"),
                           refusal=refusal)


@dataclass
class _Call:
    index: int
    id: str
    name: str
    arguments: str = ""
    ended: bool = False


@dataclass
class StreamDecoder:
    """Responses stream events (dicts with ``type``) -> parley events. Never raises.

    `finish_reason` is set by ``response.completed`` / ``.incomplete``; `error` (status, body) by
    ``error`` / ``response.failed``; `usage` is the final response's raw usage.
    """

    provider: str = "openai"
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    error: tuple[int, dict[str, Any]] | None = None
    id: str | None = None
    model: str | None = None
    done: bool = False
    messages: list[Message] = field(default_factory=list)
    _items: dict[int, dict[str, Any]] = field(default_factory=dict)
    _calls: dict[int, _Call] = field(default_factory=dict)
    _texts: dict[int, list[str]] = field(default_factory=dict)
    _refusals: dict[int, list[str]] = field(default_factory=dict)
    _final: list[Mapping[str, Any]] | None = None

    def feed(self, event: Mapping[str, Any]) -> list[Event]:
        try:
            return self._feed(event)
        except Exception as exc:
            return [ErrorEvent(code="malformed_chunk", message=f"{type(exc).__name__}: {exc}")]

    def _feed(self, event: Mapping[str, Any]) -> list[Event]:
        kind = event.get("type")
        if kind in ("response.created", "response.in_progress", "response.queued"):
            self._note(event.get("response") or {})
            return []
        if kind == "response.output_item.added":
            return self._item_added(int(event["output_index"]), dict(event["item"]))
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            delta = str(event.get("delta") or "")
            store = self._refusals if kind == "response.refusal.delta" else self._texts
            store.setdefault(int(event["output_index"]), []).append(delta)
            return [TextDelta(text=delta, channel="final")] if delta else []
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            delta = str(event.get("delta") or "")
            return [ReasoningDelta(text=delta)] if delta else []
        if kind == "response.reasoning_summary_part.added" and int(event.get("summary_index") or 0) > 0:
            return [ReasoningDelta(text=SUMMARY_JOINER)]
        if kind == "response.function_call_arguments.delta":
            call = self._calls.get(int(event["output_index"]))
            delta = str(event.get("delta") or "")
            if call is None or not delta:
                return []
            call.arguments += delta
            return [ToolCallDelta(index=call.index, arguments_delta=delta)]
        if kind == "response.output_item.done":
            return self._item_done(int(event["output_index"]), dict(event["item"]))
        if kind in ("response.completed", "response.incomplete"):
            response = event.get("response") or {}
            self._note(response)
            output = response.get("output")
            if isinstance(output, list) and output:
                self._final = [item for item in output if isinstance(item, Mapping)]
            self.usage = dict(response.get("usage") or {})
            message, refused = _message(self._output(), self.provider)
            self.finish_reason = _finish(response, message.parts, refused)
            return []
        if kind in ("error", "response.failed"):
            failed = error_of(event if kind == "error" else (event.get("response") or {"status": "failed"}))
            self.error = failed or (500, {"error": {"message": "the response failed", "type": "server_error"}})
            error = self.error[1]["error"]
            return [ErrorEvent(code=str(error.get("code") or error.get("type") or "error"),
                               message=str(error.get("message")))]
        return []

    def _note(self, response: Mapping[str, Any]) -> None:
        self.id = response.get("id") or self.id
        self.model = response.get("model") or self.model

    def _item_added(self, index: int, item: dict[str, Any]) -> list[Event]:
        self._items[index] = item
        if item.get("type") != "function_call":
            return []
        call = _Call(index=len(self._calls), id=str(item.get("call_id") or f"call_{len(self._calls)}"),
                     name=str(item.get("name") or ""), arguments=str(item.get("arguments") or ""))
        self._calls[index] = call
        return [ToolCallStart(index=call.index, id=call.id, name=call.name)]

    def _item_done(self, index: int, item: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        if item.get("type") == "function_call" and index not in self._calls:
            events += self._item_added(index, {**item, "arguments": ""})
        self._items[index] = item
        call = self._calls.get(index)
        if call is not None and not call.ended:
            final = item.get("arguments")
            if isinstance(final, str) and final != call.arguments:
                if final.startswith(call.arguments):  # deltas were missed: send the rest
                    events.append(ToolCallDelta(index=call.index, arguments_delta=final[len(call.arguments):]))
                call.arguments = final
            events += self._end(call)
        return events

    def _end(self, call: _Call) -> list[Event]:
        call.ended = True
        tool_call = ToolCall(id=call.id, name=call.name, arguments=call.arguments or "{}")
        events: list[Event] = []
        try:
            tool_call.parsed_arguments()
        except ProtocolError as exc:
            events.append(ErrorEvent(code="invalid_tool_call", message=str(exc)))
        if not call.name:
            events.append(ErrorEvent(code="invalid_tool_call", message=f"tool call {call.index} has no name"))
        events.append(ToolCallEnd(index=call.index, call=tool_call))
        return events

    def _output(self) -> list[Mapping[str, Any]]:
        """The final output items: ``response.completed``'s, else what the stream built."""
        if self._final is not None:
            return self._final
        items: list[Mapping[str, Any]] = []
        for index in sorted(set(self._items) | set(self._texts) | set(self._refusals)):
            item = self._items.get(index) or {"type": "message"}
            if item.get("type") == "message" and not item.get("content"):
                content = [{"type": "output_text", "text": "".join(self._texts.get(index, []))},
                           {"type": "refusal", "refusal": "".join(self._refusals.get(index, []))}]
                item = {**item, "content": content}
            call = self._calls.get(index)
            if call is not None:
                item = {**item, "call_id": call.id, "name": call.name, "arguments": call.arguments}
            items.append(item)
        return items

    def message(self) -> Message:
        return _message(self._output(), self.provider)[0]

    def finish(self) -> list[Event]:
        """Close the message: `ToolCallEnd` for calls the stream did not end, then `MessageEnd`."""
        if self.done:
            return []
        self.done = True
        events: list[Event] = []
        for call in self._calls.values():
            if not call.ended:
                events += self._end(call)
        message = self.message()
        self.messages.append(message)
        events.append(MessageEnd(message=message, finish_reason=self.finish_reason or "stop"))
        return events


# -- previous_response_id ----------------------------------------------------------------------------
class ResponseChain:
    """Which stored response ended which conversation (a digest of its messages), most recent kept.

    `remember(messages, id)` after a response (``messages`` = the request's conversation plus the
    assistant message produced); `find(messages)` -> ``(id, n)``: the response that ended the
    longest proper prefix, and its length ``n`` (send only ``messages[n:]``), or None.
    """

    def __init__(self, capacity: int = 256, *, salt: str = "") -> None:
        self.capacity = capacity
        self.salt = salt
        self._ids: OrderedDict[str, str] = OrderedDict()

    def _digests(self, messages: Sequence[Message], scope: str) -> list[str]:
        running = hashlib.sha256(f"{self.salt}\x00{scope}".encode())
        out: list[str] = []
        for message in messages:
            running.update(message.model_dump_json().encode())
            running.update(b"\x00")
            out.append(running.copy().hexdigest())
        return out

    def remember(self, messages: Sequence[Message], response_id: str, *, scope: str = "") -> None:
        if not messages or not response_id:
            return
        key = self._digests(messages, scope)[-1]
        self._ids[key] = response_id
        self._ids.move_to_end(key)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def find(self, messages: Sequence[Message], *, scope: str = "") -> tuple[str, int] | None:
        digests = self._digests(messages, scope)
        for n in range(len(digests) - 1, 0, -1):
            found = self._ids.get(digests[n - 1])
            if found is not None:
                return found, n
        return None
