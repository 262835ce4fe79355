"""OpenAI Chat Completions wire JSON <-> parley envelopes (also vLLM and SGLang servers).

Requests: system (and developer, as ``developer`` or ``system``) messages keep their place; an
assistant message is one ``{"role": "assistant", "content", "tool_calls"}`` with arguments as JSON
*strings*; every tool result is its own ``{"role": "tool", "tool_call_id", "content"}`` message.
Reasoning is not sent back (Chat Completions has no field for it). Tool ids are limited to 40
characters and rewritten deterministically when longer. A user message with images or documents
has a content list: ``text`` parts, ``image_url`` parts (the http(s) URL, or a ``data:`` URL of the
bytes) and ``file`` parts (``file_data``: a ``data:application/pdf;base64,...`` URL, ``filename``:
the title); a PDF known only by URL cannot be sent (`UnsupportedPartError`). Tool messages carry
text only, so a tool result's attachments follow the batch's tool messages as one user message
(``Attached to the result of <tool> (call <id>):`` then the media), before the next assistant turn.

Responses and streamed chunks (`StreamDecoder`, which assembles tool-call deltas by ``index``:
id and name arrive only in the first chunk of each call) come back as assistant messages; the
reasoning text of vLLM (``reasoning``) or SGLang (``reasoning_content``) becomes a reasoning
part. `strict_json_schema` rewrites a JSON Schema into OpenAI's strict-mode subset.
`decode_request` turns a request body back into envelopes; it is the decoder of ``parley serve``'s
``/v1/chat/completions``, so its rules have one home.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from parley.protocol.envelope import (
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
from parley.protocol.errors import (
    InvalidArgumentsError,
    OrphanToolResultError,
    ProtocolError,
    UnknownRoleError,
    UnsupportedPartError,
)
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
from parley.protocol.tool_spec import ToolSpec

ToolChoiceMode = Literal["auto", "none", "required"]
MAX_ID_LENGTH = 40
REASONING_FIELDS = ("reasoning", "reasoning_content")


def tool_id(call_id: str) -> str:
    """An id OpenAI accepts (at most 40 characters): long ids are shortened with a stable hash."""
    if 0 < len(call_id) <= MAX_ID_LENGTH:
        return call_id
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:24]
    return f"call_{digest}"


def encode_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
        if tool.strict:
            function["strict"] = True
            function["parameters"] = strict_json_schema(tool.parameters)
        out.append({"type": "function", "function": function})
    return out


def encode_tool_choice(mode: ToolChoiceMode = "auto", *, tool_name: str | None = None) -> str | dict[str, Any]:
    if tool_name is not None:
        return {"type": "function", "function": {"name": tool_name}}
    if mode not in ("auto", "none", "required"):
        raise ProtocolError(f"unknown tool choice {mode!r}")
    return mode


def encode_conversation(
    conversation: Conversation | Sequence[Message], *, developer_role: bool = False
) -> list[dict[str, Any]]:
    """Chat Completions ``messages``; ``developer_role`` keeps developer messages as ``developer``."""
    messages = list(conversation)
    Conversation.model_construct(messages=messages).check_tool_pairing()
    wire: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []  # tool results' media, sent as a user message after the tool messages

    def flush() -> None:
        if held:
            wire.append({"role": "user", "content": list(held)})
            held.clear()

    for index, message in enumerate(messages):
        role = message.role
        if role is not Role.TOOL and not (role is Role.USER and message.tool_results):
            flush()
        if role in (Role.SYSTEM, Role.DEVELOPER, Role.ASSISTANT):
            _refuse_media(message, index, f"{role.value} messages carry text only in Chat Completions")
        if role in (Role.SYSTEM, Role.DEVELOPER):
            wire_role = "developer" if role is Role.DEVELOPER and developer_role else "system"
            wire.append(_named({"role": wire_role, "content": message.text}, message))
        elif role is Role.ASSISTANT:
            entry: dict[str, Any] = {"role": "assistant", "content": message.text or None}
            calls = message.tool_calls
            if calls:
                entry["tool_calls"] = [
                    {"id": tool_id(c.id), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ]
            if entry["content"] is None and not calls:
                continue  # reasoning-only turn: nothing Chat Completions can carry
            wire.append(_named(entry, message))
        elif role in (Role.USER, Role.TOOL):
            results = [p for p in message.parts if isinstance(p, ToolResult)]
            for k, result in enumerate(results):
                wire.append({"role": "tool", "tool_call_id": tool_id(result.call_id), "content": result.content})
                if result.attachments:
                    note = f"Attached to the result of {result.name} (call {tool_id(result.call_id)}):"
                    held.append({"type": "text", "text": note})
                    for m, part in enumerate(result.attachments):
                        held.append(media_part(part, f"messages[{index}].tool_results[{k}].attachments[{m}]"))
            if message.media:
                flush()
                content = [
                    {"type": "text", "text": p.text} if isinstance(p, TextPart) else media_part(p, f"messages[{index}]"
                                                                                             f".content[{j}]")
                    for j, p in enumerate(message.parts) if isinstance(p, TextPart | ImagePart | DocumentPart)
                ]
                wire.append(_named({"role": "user", "content": content}, message))
                continue
            texts = [p.text for p in message.parts if isinstance(p, TextPart)]
            if texts or (role is Role.USER and not message.tool_results):
                flush()
                wire.append(_named({"role": "user", "content": "".join(texts)}, message))
        else:
            raise ProtocolError(f"role {role!r} has no Chat Completions equivalent")
    flush()
    return wire


def media_part(part: ImagePart | DocumentPart, where: str = "part") -> dict[str, Any]:
    """An ``image_url`` part (URL or data URL) or a ``file`` part (a PDF's bytes as ``file_data``)."""
    if isinstance(part, ImagePart):
        return {"type": "image_url", "image_url": {"url": part.data_url()}}
    if part.data is None:
        raise UnsupportedPartError(
            f"{where}: Chat Completions takes a PDF as bytes (file_data), not as a URL: fetch it and pass its bytes",
            where=where, kind=part.kind,
        )
    return {"type": "file", "file": {"file_data": part.data_url(), "filename": part.title or "document.pdf"}}


def _refuse_media(message: Message, index: int, why: str) -> None:
    for j, part in enumerate(message.parts):
        if isinstance(part, ImagePart | DocumentPart):
            where = f"messages[{index}].content[{j}]"
            raise UnsupportedPartError(f"{where}: {why}", where=where, kind=part.kind)


def _named(entry: dict[str, Any], message: Message) -> dict[str, Any]:
    if message.name and message.role is not Role.TOOL:
        entry["name"] = message.name
    return entry


def build_request(
    model: str,
    conversation: Conversation | Sequence[Message],
    tools: Sequence[ToolSpec] = (),
    *,
    tool_choice: ToolChoiceMode = "auto",
    tool_name: str | None = None,
    parallel_tool_calls: bool | None = None,
    stream: bool = False,
    developer_role: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """A complete ``/v1/chat/completions`` body (``extra``: max_tokens, reasoning_effort, ...)."""
    messages = encode_conversation(conversation, developer_role=developer_role)
    body: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        body["tools"] = encode_tools(tools)
        body["tool_choice"] = encode_tool_choice(tool_choice, tool_name=tool_name)
        if parallel_tool_calls is not None:
            body["parallel_tool_calls"] = parallel_tool_calls
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


def response_format(schema: Mapping[str, Any], *, name: str = "output", strict: bool = True) -> dict[str, Any]:
    """``response_format`` for a JSON Schema (strict mode rewrites it, see `strict_json_schema`)."""
    safe_name = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)[:64] or "output"
    body = strict_json_schema(schema) if strict else dict(schema)
    return {"type": "json_schema", "json_schema": {"name": safe_name, "schema": body, "strict": strict}}


def strict_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI strict-mode subset: every object closed, every property required, optional ones nullable."""
    result: dict[str, Any] = _strict(copy.deepcopy(dict(schema)))
    return result


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    for key in ("items", "additionalItems", "not", "if", "then", "else", "contains"):
        if key in node:
            node[key] = _strict(node[key])
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if key in node:
            node[key] = _strict(node[key])
    for key in ("$defs", "definitions"):
        if isinstance(node.get(key), dict):
            node[key] = {k: _strict(v) for k, v in node[key].items()}
    properties = node.get("properties")
    is_object = node.get("type") == "object" or isinstance(properties, dict)
    if is_object:
        properties = properties if isinstance(properties, dict) else {}
        required = set(node.get("required") or [])
        node["properties"] = {
            name: _strict(sub) if name in required else _nullable(_strict(sub)) for name, sub in properties.items()
        }
        node["required"] = list(properties)
        node["additionalProperties"] = False
    return node


def _nullable(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if isinstance(kind, str):
        if kind != "null":
            schema["type"] = [kind, "null"]
        if "enum" in schema and None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
        return schema
    if isinstance(kind, list):
        if "null" not in kind:
            schema["type"] = [*kind, "null"]
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


# -- responses ---------------------------------------------------------------------------------
@dataclass
class DecodedResponse:
    message: Message
    finish_reason: str
    usage: dict[str, Any]
    id: str | None = None
    model: str | None = None
    refusal: str | None = None


def _reasoning_of(payload: Mapping[str, Any]) -> str | None:
    for key in REASONING_FIELDS:
        value = payload.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def decode_response(body: Mapping[str, Any], *, provider: str = "openai") -> DecodedResponse:
    """A Chat Completions response as an assistant message (first choice), finish reason and raw usage."""
    if "error" in body and "choices" not in body:
        raise ProtocolError(f"OpenAI error response: {body['error']}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ProtocolError("a Chat Completions response needs a non-empty 'choices' list")
    choice = choices[0]
    payload = choice.get("message")
    if not isinstance(payload, Mapping):
        raise ProtocolError("choice has no 'message' object")
    parts: list[Part] = []
    reasoning = _reasoning_of(payload)
    if reasoning:
        parts.append(ReasoningPart(text=reasoning, provider=provider))
    content = payload.get("content")
    if isinstance(content, str) and content:
        parts.append(TextPart(text=content))
    refusal = payload.get("refusal")
    try:
        for call in payload.get("tool_calls") or []:
            function = call["function"]
            arguments = function.get("arguments")
            if isinstance(arguments, (dict, list)):
                arguments = json.dumps(arguments, ensure_ascii=False)
            parts.append(ToolCall(id=str(call["id"]), name=str(function["name"]), arguments=arguments or "{}"))
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed tool_calls in a Chat Completions response: {exc}") from None
    finish = str(choice.get("finish_reason") or "stop")
    if isinstance(refusal, str) and refusal:
        parts.append(TextPart(text=refusal))
        finish = "refusal"
    return DecodedResponse(
        message=Message(role=Role.ASSISTANT, parts=parts),
        finish_reason=finish,
        usage=dict(body.get("usage") or {}),
        id=body.get("id"),
        model=body.get("model"),
        refusal=refusal if isinstance(refusal, str) else None,
    )


@dataclass
class _CallState:
    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    started: bool = False


@dataclass
class StreamDecoder:
    """Chat Completions stream chunks (dicts) -> parley events, assembling tool calls by ``index``.

    Never raises: a malformed chunk becomes an `ErrorEvent`. `usage` is the final usage chunk's.
    """

    provider: str = "openai"
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    model: str | None = None
    id: str | None = None
    done: bool = False
    messages: list[Message] = field(default_factory=list)
    _text: str = ""
    _reasoning: str = ""
    _calls: dict[int, _CallState] = field(default_factory=dict)

    def feed(self, chunk: Mapping[str, Any]) -> list[Event]:
        try:
            return self._feed(chunk)
        except Exception as exc:
            return [ErrorEvent(code="malformed_chunk", message=f"{type(exc).__name__}: {exc}")]

    def _feed(self, chunk: Mapping[str, Any]) -> list[Event]:
        if "error" in chunk and "choices" not in chunk:
            error = chunk["error"] if isinstance(chunk["error"], Mapping) else {"message": str(chunk["error"])}
            return [ErrorEvent(code=str(error.get("type") or error.get("code") or "error"),
                               message=str(error.get("message")))]
        self.id = chunk.get("id", self.id)
        self.model = chunk.get("model", self.model)
        if chunk.get("usage"):
            self.usage = dict(chunk["usage"])
        events: list[Event] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # parley asks for one choice
            delta = choice.get("delta") or {}
            reasoning = _reasoning_of(delta)
            if reasoning:
                self._reasoning += reasoning
                events.append(ReasoningDelta(text=reasoning))
            content = delta.get("content")
            if isinstance(content, str) and content:
                self._text += content
                events.append(TextDelta(text=content, channel="final"))
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return events

    def _call_delta(self, call: Mapping[str, Any]) -> list[Event]:
        index = int(call.get("index", len(self._calls)))
        state = self._calls.setdefault(index, _CallState(index=index))
        function = call.get("function") or {}
        state.id = state.id or str(call.get("id") or "")
        state.name += str(function.get("name") or "") if not state.started else ""
        events: list[Event] = []
        if not state.started and state.name:
            state.id = state.id or f"call_{index}"
            state.started = True
            events.append(ToolCallStart(index=index, id=state.id, name=state.name))
        fragment = function.get("arguments")
        if isinstance(fragment, str) and fragment:
            state.arguments += fragment
            if state.started:
                events.append(ToolCallDelta(index=index, arguments_delta=fragment))
        return events

    def message(self) -> Message:
        parts: list[Part] = []
        if self._reasoning:
            parts.append(ReasoningPart(text=self._reasoning, provider=self.provider))
        if self._text:
            parts.append(TextPart(text=self._text))
        for index in sorted(self._calls):
            state = self._calls[index]
            parts.append(ToolCall(id=state.id or f"call_{index}", name=state.name, arguments=state.arguments or "{}"))
        return Message(role=Role.ASSISTANT, parts=parts)

    def finish(self) -> list[Event]:
        """Close the message: `ToolCallEnd` per call (an `ErrorEvent` for unusable ones), then `MessageEnd`."""
        if self.done:
            return []
        self.done = True
        events: list[Event] = []
        message = self.message()
        for index, call in zip(sorted(self._calls), message.tool_calls, strict=True):
            state = self._calls[index]
            if not state.started:
                events.append(ToolCallStart(index=index, id=call.id, name=call.name))
                if state.arguments:
                    events.append(ToolCallDelta(index=index, arguments_delta=state.arguments))
            try:
                call.parsed_arguments()
            except ProtocolError as exc:
                events.append(ErrorEvent(code="invalid_tool_call", message=str(exc)))
            if not call.name:
                events.append(ErrorEvent(code="invalid_tool_call", message=f"tool call {index} has no name"))
            events.append(ToolCallEnd(index=index, call=call))
        self.messages.append(message)
        finish = self.finish_reason or "stop"
        events.append(MessageEnd(message=message, finish_reason=finish))
        return events


# -- requests back to envelopes (the server's decoder; also for proxies, logs and round-trip checks) ----
_PLAIN_ROLES = {"system": Role.SYSTEM, "developer": Role.DEVELOPER, "user": Role.USER}


def _string(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"{where}.{key} must be a non-empty string", param=f"{where}.{key}")
    return value


def _name(entry: Mapping[str, Any], where: str) -> str | None:
    name = entry.get("name")
    if name is not None and not isinstance(name, str):
        raise ProtocolError(f"{where}.name must be a string", param=f"{where}.name")
    return name


def _content_text(content: Any, where: str, *, assistant: bool = False) -> str:
    """``content`` as text: a string, null, or a list of text (and, for the assistant, refusal) parts.

    Image and file parts are refused by name: only user messages carry them.
    """
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ProtocolError(f"{where}: content must be a string or a list of parts", param=where)
    kinds = ("text", "refusal") if assistant else ("text",)
    pieces: list[str] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _MEDIA_KINDS:
            raise ProtocolError(f"{at}: {kind} parts belong in user messages", param=at)
        if not isinstance(part, Mapping) or kind not in kinds:
            raise ProtocolError(f"{at}.type: unsupported content part type {kind!r}", param=f"{at}.type")
        text = part.get(str(kind))
        if not isinstance(text, str):
            raise ProtocolError(f"{at}.{kind} must be a string", param=f"{at}.{kind}")
        pieces.append(text)
    return "".join(pieces)


_MEDIA_KINDS = ("image_url", "file")


def _user_parts(content: Any, where: str) -> list[Part]:
    """A user message's content: its text (joined, as one part), or, when it holds images or files, one
    part per wire part (so ``content[j]`` of the request is ``parts[j]`` of the message)."""
    if not isinstance(content, list) or not any(isinstance(p, Mapping) and p.get("type") in _MEDIA_KINDS
                                                for p in content):
        return [TextPart(text=_content_text(content, where))]
    parts: list[Part] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "image_url":
            parts.append(_image_part(part, at))
        elif kind == "file":
            parts.append(_file_part(part, at))
        elif kind == "text" and isinstance(part, Mapping):
            parts.append(TextPart(text=_text_field(part, at)))
        else:
            raise ProtocolError(f"{at}.type: unsupported content part type {kind!r}", param=f"{at}.type")
    return parts


def _text_field(part: Mapping[str, Any], at: str) -> str:
    text = part.get("text")
    if not isinstance(text, str):
        raise ProtocolError(f"{at}.text must be a string", param=f"{at}.text")
    return text


def _media_error(exc: ValidationError, at: str, what: str) -> ProtocolError:
    errors = exc.errors()
    problem = str(errors[0].get("msg", "invalid")) if errors else "invalid"
    return ProtocolError(f"{at}: malformed {what}: {problem}", param=at)


def _image_part(part: Mapping[str, Any], at: str) -> ImagePart:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else None
    if not isinstance(url, str) or not url:
        raise ProtocolError(f"{at}.image_url.url must be a non-empty string", param=f"{at}.image_url.url")
    try:
        return ImagePart(url=url).noted_at(at)  # a data: URL becomes bytes
    except ValidationError as exc:
        raise _media_error(exc, f"{at}.image_url.url", "image URL") from None


def _file_part(part: Mapping[str, Any], at: str) -> DocumentPart:
    file = part.get("file")
    if not isinstance(file, Mapping):
        raise ProtocolError(f"{at}.file must be an object", param=f"{at}.file")
    data = file.get("file_data")
    if not isinstance(data, str) or not data:
        if file.get("file_id") is not None:
            raise ProtocolError(f"{at}.file.file_id: uploaded file ids cannot be resolved here; send file_data",
                                param=f"{at}.file.file_id")
        raise ProtocolError(f"{at}.file.file_data must be a non-empty string", param=f"{at}.file.file_data")
    title = file.get("filename")
    if title is not None and not isinstance(title, str):
        raise ProtocolError(f"{at}.file.filename must be a string", param=f"{at}.file.filename")
    source = {"url": data} if data[:5].lower() == "data:" else {"data": data}  # raw base64 is accepted too
    try:
        return DocumentPart.model_validate({**source, "title": title}).noted_at(at)
    except ValidationError as exc:
        raise _media_error(exc, f"{at}.file.file_data", "PDF file_data") from None


def _arguments(value: Any, where: str) -> str:
    """Tool-call arguments as the API sends them: a JSON object encoded as a string."""
    try:
        if not isinstance(value, str):
            raise ValueError
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        raise InvalidArgumentsError(f"{where} must be a JSON object encoded as a string", param=where) from None
    if not isinstance(parsed, dict):
        raise InvalidArgumentsError(f"{where} must encode a JSON object", param=where)
    return value


def _assistant(entry: Mapping[str, Any], where: str, names: dict[str, str]) -> Message:
    parts: list[Part] = []
    reasoning = entry.get("reasoning_content") or entry.get("reasoning")  # vLLM's and SGLang's field
    if isinstance(reasoning, str) and reasoning:
        parts.append(ReasoningPart(text=reasoning))
    text = _content_text(entry.get("content"), f"{where}.content", assistant=True)
    if text:
        parts.append(TextPart(text=text))
    calls = entry.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ProtocolError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(call, Mapping) or not isinstance(function, Mapping):
            raise ProtocolError(f"{at} must be an object with a function", param=at)
        call_id = _string(call, "id", at)
        if call_id in names:
            raise ProtocolError(f"{at}.id: duplicate tool call id {call_id!r}", param=f"{at}.id")
        name = _string(function, "name", f"{at}.function")
        arguments = _arguments(function.get("arguments"), f"{at}.function.arguments")
        names[call_id] = name
        parts.append(ToolCall(id=call_id, name=name, arguments=arguments))
    return Message(role=Role.ASSISTANT, parts=parts, name=_name(entry, where))


def decode_request(body: Mapping[str, Any]) -> tuple[Conversation, list[ToolSpec]]:
    """A Chat Completions request body as a conversation and tools; the server decodes with this too.

    User ``image_url`` parts become `ImagePart`s (a ``data:`` URL becomes bytes), ``file`` parts with
    ``file_data`` `DocumentPart`s. Refused, as a `ProtocolError` whose `param` is the JSON path to
    blame: an unknown role (`UnknownRoleError`), images or files outside user messages, other
    non-text content, a tool call id used twice, tool-call
    arguments that are not a JSON object encoded as a string (`InvalidArgumentsError`), and a tool
    message answering no call of an earlier assistant message (`OrphanToolResultError`).
    """
    entries = body.get("messages")
    if not isinstance(entries, list):
        raise ProtocolError("messages must be a list of messages", param="messages")
    messages: list[Message] = []
    names: dict[str, str] = {}  # tool call id -> function name, over all earlier assistant messages
    for index, entry in enumerate(entries):
        where = f"messages[{index}]"
        if not isinstance(entry, Mapping):
            raise ProtocolError(f"{where} must be an object", param=where)
        role = entry.get("role")
        content_at = f"{where}.content"
        if role == "user":
            parts = _user_parts(entry.get("content"), content_at)
            messages.append(Message(role=Role.USER, parts=parts, name=_name(entry, where)))
        elif isinstance(role, str) and role in _PLAIN_ROLES:
            text = _content_text(entry.get("content"), content_at)
            messages.append(Message(role=_PLAIN_ROLES[role], parts=[TextPart(text=text)], name=_name(entry, where)))
        elif role == "assistant":
            messages.append(_assistant(entry, where, names))
        elif role == "tool":
            call_id = entry.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in names:
                raise OrphanToolResultError(
                    f"{where}.tool_call_id: {call_id!r} answers no tool call of an earlier assistant message",
                    param=f"{where}.tool_call_id",
                )
            text = _content_text(entry.get("content"), content_at)
            messages.append(Message.tool(call_id, names[call_id], text))
        else:
            raise UnknownRoleError(f"{where}.role: unknown role {role!r}", param=f"{where}.role")
    tools: list[ToolSpec] = []
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and "name" in function:
            parameters = function.get("parameters")
            tools.append(ToolSpec(name=function["name"], description=function.get("description") or "",
                                  parameters={"type": "object", "properties": {}} if parameters is None else parameters,
                                  strict=bool(function.get("strict"))))
    return Conversation(messages=messages), tools
