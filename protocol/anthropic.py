"""Anthropic Messages API wire JSON <-> parley envelopes.

Requests: system and developer messages become the top-level ``system`` blocks; user text, images
(``image`` blocks, ``source`` ``base64`` or ``url``), PDF documents (``document`` blocks, likewise) and
tool results become user-role content blocks, with every ``tool_result`` placed in the user message
right after the assistant message holding its ``tool_use`` (the API rejects anything else); a tool
result's attachments go inside its ``tool_result`` as image/document blocks after its text; assistant
messages become ``thinking`` / ``redacted_thinking`` / ``text`` / ``tool_use`` blocks. Thinking
blocks are sent back unchanged, but only with an Anthropic signature: reasoning from another
provider (or unsigned local reasoning) is dropped, since the API rejects it. ``Message.cache``
becomes ``cache_control`` on the message's last block. A ``compaction`` block (server-side
compaction, the ``compact_20260112`` edit) is decoded as a `CompactionPart` holding the block
verbatim (``content``, and ``encrypted_content`` / ``signature`` / ``tool_changes`` when present;
streamed as ``compaction_delta`` events) and sent back unchanged in its assistant message; the
API itself ignores every block before it.

Responses (and streamed events, via `StreamDecoder`) come back as assistant `Message`s whose
reasoning parts carry ``provider="anthropic"``. Usage is returned raw: normalising it into
`Usage` is the SDK's job (``parley.usage``).

`decode_request` turns a request body back into envelopes with the API's own rules; it is the
decoder of ``parley serve``'s ``/v1/messages``, so those rules have one home.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from parley.protocol.envelope import (
    IMAGE_MEDIA_TYPES,
    PDF_MEDIA_TYPE,
    CacheMark,
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
    decode_base64,
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

PROVIDER = "anthropic"
ToolChoiceMode = Literal["auto", "none", "required"]
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "pause_turn": "pause_turn",
    "refusal": "refusal",
    "compaction": "compaction",
}
_ID_OK = re.compile(r"^[a-zA-Z0-9_-]+$")
_ID_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def tool_id(call_id: str) -> str:
    """An id valid for Anthropic (``^[a-zA-Z0-9_-]+$``): kept when valid, else rewritten deterministically."""
    if _ID_OK.match(call_id):
        return call_id
    cleaned = _ID_BAD_CHARS.sub("_", call_id) or "id"
    return f"{cleaned}_{sum(call_id.encode()) % 997:03d}"


def cache_control(mark: CacheMark | None) -> dict[str, Any] | None:
    """``cache_control`` JSON for a mark; the 5m default is left implicit, as in the docs."""
    if mark is None:
        return None
    return {"type": "ephemeral", "ttl": "1h"} if mark.ttl == "1h" else {"type": "ephemeral"}


def encode_tools(tools: Sequence[ToolSpec], *, cache_last: CacheMark | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools:
        entry: dict[str, Any] = {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
        if tool.strict:
            entry["strict"] = True
        out.append(entry)
    control = cache_control(cache_last)
    if out and control:
        out[-1]["cache_control"] = control
    return out


def encode_tool_choice(
    mode: ToolChoiceMode = "auto", *, tool_name: str | None = None, parallel: bool = True
) -> dict[str, Any]:
    """``tool_choice``: auto | any (parley's ``required``) | tool (+name) | none."""
    choice: dict[str, Any]
    if tool_name is not None:
        choice = {"type": "tool", "name": tool_name}
    elif mode == "required":
        choice = {"type": "any"}
    elif mode in ("auto", "none"):
        choice = {"type": mode}
    else:
        raise ProtocolError(f"unknown tool choice {mode!r}")
    if not parallel and choice["type"] != "none":
        choice["disable_parallel_tool_use"] = True
    return choice


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def media_block(part: ImagePart | DocumentPart) -> dict[str, Any]:
    """An ``image`` or ``document`` block: ``source`` ``{type: url, url}`` or ``{type: base64, media_type, data}``."""
    if part.url is not None:
        source: dict[str, Any] = {"type": "url", "url": part.url}
    else:
        source = {"type": "base64", "media_type": part.media_type, "data": part.base64()}
    block: dict[str, Any] = {"type": part.kind, "source": source}
    if isinstance(part, DocumentPart) and part.title:
        block["title"] = part.title
    return block


def _result_block(result: ToolResult) -> dict[str, Any]:
    content: str | list[dict[str, Any]] = result.content
    if result.attachments:  # text first, then the images/documents, inside the tool_result
        content = [_text_block(result.content)] if result.content else []
        content += [media_block(part) for part in result.attachments]
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id(result.call_id), "content": content}
    if result.is_error:
        block["is_error"] = True
    return block


def _refuse_media(message: Message, index: int, why: str) -> None:
    for j, part in enumerate(message.parts):
        if isinstance(part, ImagePart | DocumentPart):
            where = f"messages[{index}].content[{j}]"
            raise UnsupportedPartError(f"{where}: {why}", where=where, kind=part.kind)


def assistant_blocks(message: Message, *, unsigned_reasoning: bool = False) -> list[dict[str, Any]]:
    """An assistant message's content blocks (thinking, text, tool_use, compaction), in the message's order.

    Unsigned reasoning is dropped (the API rejects it in requests) unless `unsigned_reasoning`, which
    sends it as a ``thinking`` block with an empty signature: what a server without signing keys answers.
    """
    blocks: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ReasoningPart):
            if part.provider not in (None, PROVIDER):
                continue  # another provider's signature or payload means nothing here
            if part.redacted is not None:
                blocks.append({"type": "redacted_thinking", "data": part.redacted})
            elif part.signature is not None or unsigned_reasoning and part.text:
                blocks.append({"type": "thinking", "thinking": part.text, "signature": part.signature or ""})
        elif isinstance(part, TextPart):
            if part.text:
                blocks.append(_text_block(part.text))
        elif isinstance(part, ToolCall):
            blocks.append({"type": "tool_use", "id": tool_id(part.id), "name": part.name,
                           "input": part.parsed_arguments()})
        elif isinstance(part, CompactionPart) and part.provider == PROVIDER:
            blocks.append(dict(part.payload))  # verbatim, as the API returned it
    return blocks


Blocks = list[dict[str, Any]]


def encode_conversation(conversation: Conversation | Sequence[Message]) -> tuple[Blocks, Blocks]:
    """(``system`` blocks, ``messages``) for the Messages API; see the module docstring."""
    messages = list(conversation)
    Conversation.model_construct(messages=messages).check_tool_pairing()
    system: list[dict[str, Any]] = []
    wire: list[dict[str, Any]] = []
    pending: dict[str, str] = {}  # tool_use ids of the last assistant message still awaiting results

    def user_turn() -> list[dict[str, Any]]:
        if not wire or wire[-1]["role"] != "user":
            wire.append({"role": "user", "content": []})
        content: list[dict[str, Any]] = wire[-1]["content"]
        return content

    for index, message in enumerate(messages):
        role = message.role
        if role in (Role.SYSTEM, Role.DEVELOPER):
            _refuse_media(message, index, f"the Anthropic system prompt holds only text, not {role.value} media")
            if message.text:
                system.append(_text_block(message.text))
                _mark(system, message.cache)
            continue
        if role is Role.ASSISTANT:
            if pending:
                names = sorted(pending.values())
                raise ProtocolError(f"tool calls {names} have no result before the next assistant turn")
            _refuse_media(message, index, "assistant messages cannot hold images or documents")
            blocks = assistant_blocks(message)
            if not blocks:
                continue
            wire.append({"role": "assistant", "content": blocks})
            _mark(blocks, message.cache)
            pending = {tool_id(c.id): c.name for c in message.tool_calls}
            continue
        if role not in (Role.USER, Role.TOOL):
            raise ProtocolError(f"role {role!r} has no Anthropic equivalent")
        content = user_turn()
        results = [p for p in message.parts if isinstance(p, ToolResult)]
        first_text = next((i for i, b in enumerate(content) if b["type"] != "tool_result"), len(content))
        for result in results:
            content.insert(first_text, _result_block(result))  # results lead the user turn
            first_text += 1
            pending.pop(tool_id(result.call_id), None)
        for part in message.parts:  # text and media in the message's order, after the results
            if isinstance(part, TextPart) and part.text:
                content.append(_text_block(part.text))
            elif isinstance(part, ImagePart | DocumentPart):
                content.append(media_block(part))
        _mark(content, message.cache)
    wire = [m for m in wire if m["content"]]
    return system, wire


def _mark(blocks: list[dict[str, Any]], mark: CacheMark | None) -> None:
    control = cache_control(mark)
    if control and blocks:
        blocks[-1]["cache_control"] = control


def build_request(
    model: str,
    conversation: Conversation | Sequence[Message],
    tools: Sequence[ToolSpec] = (),
    *,
    max_tokens: int,
    tool_choice: ToolChoiceMode = "auto",
    tool_name: str | None = None,
    parallel_tool_calls: bool = True,
    stream: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """A complete Messages API request body (``extra`` is merged in: thinking, temperature, ...)."""
    system, messages = encode_conversation(conversation)
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": messages}
    if system:
        body["system"] = system
    if tools:
        body["tools"] = encode_tools(tools)
        if tool_choice != "auto" or tool_name is not None or not parallel_tool_calls:
            body["tool_choice"] = encode_tool_choice(tool_choice, tool_name=tool_name, parallel=parallel_tool_calls)
    if stream:
        body["stream"] = True
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


# -- responses ---------------------------------------------------------------------------------
@dataclass
class DecodedResponse:
    message: Message
    stop_reason: str | None
    finish_reason: str
    usage: dict[str, Any]
    id: str | None = None
    model: str | None = None


def decode_block(block: Mapping[str, Any]) -> Part | None:
    """One response content block as a part (None for block types parley does not model)."""
    kind = block.get("type")
    try:
        if kind == "text":
            return TextPart(text=block["text"])
        if kind == "thinking":
            return ReasoningPart(text=block["thinking"], signature=block.get("signature") or None, provider=PROVIDER)
        if kind == "redacted_thinking":
            return ReasoningPart(redacted=block["data"], provider=PROVIDER)
        if kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False, separators=(",", ":"))
            return ToolCall(id=block["id"], name=block["name"], arguments=arguments)
        if kind == "compaction":
            return compaction_part(block)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed {kind} block in an Anthropic response: {exc}") from None
    return None


def compaction_part(block: Mapping[str, Any]) -> CompactionPart:
    """A ``compaction`` block (server-side compaction, ``compact_20260112``), kept verbatim."""
    payload = {k: v for k, v in block.items() if k != "cache_control"}
    content = block.get("content")
    return CompactionPart(provider=PROVIDER, payload=payload, text=content if isinstance(content, str) else "")


def decode_response(body: Mapping[str, Any]) -> DecodedResponse:
    """A Messages API response body as an assistant message plus its stop reason and raw usage."""
    content = body.get("content")
    if body.get("type") == "error":
        raise ProtocolError(f"Anthropic error response: {body.get('error')}")
    if not isinstance(content, list):
        raise ProtocolError("an Anthropic response needs a 'content' list")
    parts = [part for block in content if isinstance(block, Mapping) and (part := decode_block(block))]
    stop = body.get("stop_reason")
    return DecodedResponse(
        message=Message(role=Role.ASSISTANT, parts=parts),
        stop_reason=stop,
        finish_reason=FINISH_REASONS.get(stop or "", stop or "stop"),
        usage=dict(body.get("usage") or {}),
        id=body.get("id"),
        model=body.get("model"),
    )


@dataclass
class _Block:
    kind: str
    text: str = ""
    signature: str | None = None
    data: str | None = None
    id: str = ""
    name: str = ""
    call_index: int = -1
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class StreamDecoder:
    """Streamed Messages API events (``{"type": ...}`` dicts) -> parley events; never raises.

    `usage` merges ``message_start`` and ``message_delta`` usage (the latter wins: it is cumulative).
    """

    usage: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    message_id: str | None = None
    model: str | None = None
    done: bool = False
    messages: list[Message] = field(default_factory=list)
    _blocks: dict[int, _Block] = field(default_factory=dict)
    _order: list[int] = field(default_factory=list)
    _calls: int = 0

    def feed(self, event: Mapping[str, Any]) -> list[Event]:
        try:
            return self._feed(event)
        except Exception as exc:  # a malformed event is reported, never raised
            return [ErrorEvent(code="malformed_event", message=f"{type(exc).__name__}: {exc}")]

    def _feed(self, event: Mapping[str, Any]) -> list[Event]:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.message_id, self.model = message.get("id"), message.get("model")
            self.usage.update(message.get("usage") or {})
            return []
        if kind == "content_block_start":
            return self._start(int(event["index"]), event["content_block"])
        if kind == "content_block_delta":
            return self._delta(int(event["index"]), event["delta"])
        if kind == "content_block_stop":
            return self._stop(int(event["index"]))
        if kind == "message_delta":
            delta = event.get("delta") or {}
            self.stop_reason = delta.get("stop_reason", self.stop_reason)
            self.usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            return []
        if kind == "message_stop":
            return self.finish()
        if kind == "error":
            error = event.get("error") or {}
            return [ErrorEvent(code=str(error.get("type", "error")), message=str(error.get("message", error)))]
        return []  # ping and future event types

    def _start(self, index: int, block: Mapping[str, Any]) -> list[Event]:
        kind = str(block.get("type"))
        state = _Block(kind=kind)
        self._blocks[index] = state
        self._order.append(index)
        if kind == "text":
            state.text = block.get("text", "")
            return [TextDelta(text=state.text, channel="final")] if state.text else []
        if kind == "thinking":
            state.text, state.signature = block.get("thinking", ""), block.get("signature") or None
            return [ReasoningDelta(text=state.text)] if state.text else []
        if kind == "redacted_thinking":
            state.data = block.get("data", "")
            return []
        if kind == "compaction":  # content (and encrypted_content) arrive in compaction_delta events
            state.payload = dict(block)
            return []
        if kind == "tool_use":
            state.id, state.name, state.call_index = str(block["id"]), str(block["name"]), self._calls
            self._calls += 1
            initial = block.get("input")
            state.text = json.dumps(initial) if initial else ""
            return [ToolCallStart(index=state.call_index, id=state.id, name=state.name)]
        return []

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[Event]:
        state = self._blocks[index]
        kind = delta.get("type")
        if kind == "text_delta":
            state.text += delta["text"]
            return [TextDelta(text=delta["text"], channel="final")]
        if kind == "thinking_delta":
            state.text += delta["thinking"]
            return [ReasoningDelta(text=delta["thinking"])]
        if kind == "compaction_delta":
            for key in ("content", "encrypted_content"):
                if isinstance(delta.get(key), str):
                    state.payload[key] = (state.payload.get(key) or "") + delta[key]
            return []
        if kind == "signature_delta" and state.kind == "compaction":
            state.payload["signature"] = (state.payload.get("signature") or "") + delta["signature"]
            return []
        if kind == "signature_delta":
            state.signature = (state.signature or "") + delta["signature"]
            return [ReasoningDelta(text="", signature=delta["signature"])]
        if kind == "input_json_delta":
            state.text += delta["partial_json"]
            return [ToolCallDelta(index=state.call_index, arguments_delta=delta["partial_json"])]
        return []

    def _stop(self, index: int) -> list[Event]:
        state = self._blocks[index]
        if state.kind != "tool_use":
            return []
        arguments = state.text or "{}"
        events: list[Event] = []
        try:
            valid = isinstance(json.loads(arguments), dict)
        except (ValueError, RecursionError):
            valid = False
        if not valid:
            message = f"tool_use {state.id} input is not a JSON object"
            events.append(ErrorEvent(code="invalid_tool_call", message=message))
        call = ToolCall(id=state.id, name=state.name, arguments=arguments)
        events.append(ToolCallEnd(index=state.call_index, call=call))
        return events

    def message(self) -> Message:
        parts: list[Part] = []
        for index in self._order:
            state = self._blocks[index]
            if state.kind == "text" and state.text:
                parts.append(TextPart(text=state.text))
            elif state.kind == "thinking":
                parts.append(ReasoningPart(text=state.text, signature=state.signature, provider=PROVIDER))
            elif state.kind == "redacted_thinking":
                parts.append(ReasoningPart(redacted=state.data or "", provider=PROVIDER))
            elif state.kind == "tool_use":
                parts.append(ToolCall(id=state.id, name=state.name, arguments=state.text or "{}"))
            elif state.kind == "compaction":
                parts.append(compaction_part({"content": None, **state.payload}))
        return Message(role=Role.ASSISTANT, parts=parts)

    def finish(self) -> list[Event]:
        """The closing `MessageEnd` (also called for ``message_stop``); idempotent."""
        if self.done:
            return []
        self.done = True
        message = self.message()
        self.messages.append(message)
        stop = self.stop_reason
        return [MessageEnd(message=message, finish_reason=FINISH_REASONS.get(stop or "", stop or "stop"))]


# -- requests back to envelopes (the server's decoder; also for proxies, logs and round-trip checks) ----
_ASSISTANT_ONLY = ("tool_use", "thinking", "redacted_thinking")
_MEDIA = ("image", "document")


def _mark_of(block: Mapping[str, Any]) -> CacheMark | None:
    control = block.get("cache_control")
    if isinstance(control, Mapping):
        return CacheMark(ttl="1h" if control.get("ttl") == "1h" else "5m")
    return None


def _as_blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, Mapping) for b in content):
        raise ProtocolError(f"{where}: content must be a string or a list of blocks", param=where)
    return content


def _text_of(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise ProtocolError(f"{where}.text must be a string", param=f"{where}.text")
    return text


def _texts(content: Any, where: str, *, what: str) -> tuple[str, CacheMark | None]:
    """Text blocks (or a string) joined, and the last cache mark among them (the system prompt)."""
    if content is None or isinstance(content, str):
        return content or "", None
    text: list[str] = []
    mark: CacheMark | None = None
    for j, block in enumerate(_as_blocks(content, where)):
        at = f"{where}[{j}]"
        if block.get("type") in _MEDIA:
            raise ProtocolError(f"{at}: {what} may hold only text blocks (images and documents go in user "
                                "messages)", param=at)
        if block.get("type") != "text":
            raise ProtocolError(f"{at}.type: {what} may hold only text blocks", param=f"{at}.type")
        text.append(_text_of(block, at))
        mark = _mark_of(block) or mark
    return "".join(text), mark


def _media_part(block: Mapping[str, Any], at: str) -> ImagePart | DocumentPart:
    """An ``image`` / ``document`` block as a part; malformed sources are refused naming the field."""
    kind = block.get("type")
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise ProtocolError(f"{at}.source must be an object", param=f"{at}.source")
    source_type = source.get("type")
    fields: dict[str, Any] = {}
    if source_type == "base64":
        media_type = source.get("media_type")
        allowed = IMAGE_MEDIA_TYPES if kind == "image" else (PDF_MEDIA_TYPE,)
        if not isinstance(media_type, str) or media_type.lower().replace("/jpg", "/jpeg") not in allowed:
            raise ProtocolError(f"{at}.source.media_type must be one of {', '.join(allowed)}, not {media_type!r}",
                                param=f"{at}.source.media_type")
        data = source.get("data")
        try:
            if not isinstance(data, str) or not data:
                raise ValueError
            fields = {"data": decode_base64(data), "media_type": media_type}
        except ValueError:
            raise ProtocolError(f"{at}.source.data must be non-empty base64 text", param=f"{at}.source.data") from None
    elif source_type == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url:
            raise ProtocolError(f"{at}.source.url must be a non-empty string", param=f"{at}.source.url")
        fields = {"url": url}
    else:
        raise ProtocolError(f"{at}.source.type: unsupported {kind} source type {source_type!r} (base64 or url)",
                            param=f"{at}.source.type")
    try:
        if kind == "image":
            return ImagePart(**fields).noted_at(at)
        title = block.get("title")
        if title is not None and not isinstance(title, str):
            raise ProtocolError(f"{at}.title must be a string", param=f"{at}.title")
        return DocumentPart(**fields, title=title).noted_at(at)
    except ValidationError as exc:
        problem = exc.errors()[0].get("msg", "invalid") if exc.errors() else "invalid"
        raise ProtocolError(f"{at}: malformed {kind} block: {problem}", param=at) from None


def _result_content(content: Any, where: str) -> tuple[str, list[ImagePart | DocumentPart]]:
    """A ``tool_result``'s content: its text blocks joined, and its image/document blocks."""
    if content is None or isinstance(content, str):
        return content or "", []
    text: list[str] = []
    media: list[ImagePart | DocumentPart] = []
    for j, block in enumerate(_as_blocks(content, where)):
        at = f"{where}[{j}]"
        kind = block.get("type")
        if kind in _MEDIA:
            media.append(_media_part(block, at))
        elif kind == "text":
            text.append(_text_of(block, at))
        else:
            raise ProtocolError(f"{at}.type: tool_result content may hold text, image and document blocks, "
                                f"not {kind!r}", param=f"{at}.type")
    return "".join(text), media


def _unanswered(pending: Mapping[str, str], index: int, param: str) -> ProtocolError:
    ids = ", ".join(sorted(pending))
    return ProtocolError(
        f"messages[{index}]: `tool_use` ids were found without `tool_result` blocks immediately after: {ids}. "
        "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
        param=param,
    )


def _assistant_part(block: Mapping[str, Any], at: str) -> Part:
    if block.get("type") == "tool_use" and not isinstance(block.get("input"), Mapping):
        raise InvalidArgumentsError(f"{at}.input: tool_use input must be a JSON object", param=f"{at}.input")
    try:
        part = decode_block(block)
    except ProtocolError:
        part = None
    if part is None:
        raise ProtocolError(f"{at}: malformed {block.get('type')} block", param=at)
    return part


def decode_request(
    body: Mapping[str, Any], *, allow_prefill: bool = True
) -> tuple[Conversation, list[ToolSpec]]:
    """A Messages API request body as a conversation and tools; the server decodes with this too.

    The rules are the API's: ``tool_result`` blocks only in user messages, each answering a
    ``tool_use`` of the assistant message right before, and every ``tool_use`` answered in the next
    message (Anthropic's own 400 wording); ``tool_use`` ids unique within a message; assistant-only
    blocks (tool_use, thinking) refused in user messages; images and documents only in user messages
    and tool results (`ImagePart`, `DocumentPart`; a result's become its `attachments`). ``thinking`` and
    ``redacted_thinking`` become reasoning parts with ``provider="anthropic"``; the last
    ``cache_control`` among a message's blocks becomes the `CacheMark` of the last message it decodes
    to. A request ending with an assistant message (prefill) is refused unless `allow_prefill`.
    Errors are `ProtocolError`s whose `param` is the JSON path to blame.
    """
    entries = body.get("messages")
    if not isinstance(entries, list):
        raise ProtocolError("messages must be a list of messages", param="messages")
    messages: list[Message] = []
    if body.get("system") is not None:
        text, system_mark = _texts(body["system"], "system", what="system")
        messages.append(Message(role=Role.SYSTEM, parts=[TextPart(text=text)], cache=system_mark))
    pending: dict[str, str] = {}  # tool_use id -> name, awaiting results in the next message
    for i, entry in enumerate(entries):
        where = f"messages[{i}]"
        role = entry.get("role") if isinstance(entry, Mapping) else None
        if role not in ("user", "assistant"):
            raise UnknownRoleError(
                f"{where}.role: unknown role {role!r} (the Messages API has user and assistant)", param=f"{where}.role"
            )
        if pending and role != "user":
            raise _unanswered(pending, i - 1, f"messages[{i - 1}]")
        first = len(messages)
        parts: list[Part] = []
        answered: set[str] = set()
        mark: CacheMark | None = None
        for j, block in enumerate(_as_blocks(entry.get("content"), f"{where}.content")):
            at = f"{where}.content[{j}]"
            kind = block.get("type")
            mark = _mark_of(block) or mark
            if kind in _MEDIA:
                if role != "user":
                    raise ProtocolError(f"{at}: {kind} blocks belong in user messages", param=at)
                parts.append(_media_part(block, at))
            elif kind == "text":
                parts.append(TextPart(text=_text_of(block, at)))
            elif kind == "tool_result":
                if role != "user":
                    raise ProtocolError(f"{at}: tool_result blocks belong in user messages", param=at)
                use_id = block.get("tool_use_id")
                if not isinstance(use_id, str) or use_id not in pending:
                    raise OrphanToolResultError(
                        f"{at}.tool_use_id: {use_id!r} answers no tool_use block of the previous assistant message",
                        param=f"{at}.tool_use_id",
                    )
                if parts:  # text before the results keeps its place
                    messages.append(Message(role=Role.USER, parts=parts))
                    parts = []
                answered.add(use_id)
                content, media = _result_content(block.get("content"), f"{at}.content")
                result = ToolResult(call_id=use_id, name=pending[use_id], content=content,
                                    is_error=bool(block.get("is_error")), attachments=media)
                messages.append(Message(role=Role.TOOL, parts=[result], name=result.name))
            elif kind not in _ASSISTANT_ONLY:
                raise ProtocolError(f"{at}.type: unsupported block type {kind!r}", param=f"{at}.type")
            elif role != "assistant":
                raise ProtocolError(f"{at}: {kind} blocks belong in assistant messages", param=at)
            else:
                parts.append(_assistant_part(block, at))
        if pending.keys() - answered:
            raise _unanswered({k: v for k, v in pending.items() if k not in answered}, i - 1, where)
        calls = [p for p in parts if isinstance(p, ToolCall)]
        if len({c.id for c in calls}) != len(calls):
            raise ProtocolError(f"{where}: tool_use ids must be unique", param=where)
        pending = {c.id: c.name for c in calls}
        if parts or role == "assistant":
            messages.append(Message(role=Role.USER if role == "user" else Role.ASSISTANT, parts=parts))
        if mark is not None and len(messages) > first:
            messages[-1] = messages[-1].model_copy(update={"cache": mark})
    if pending:
        raise _unanswered(pending, len(entries) - 1, f"messages[{len(entries) - 1}]")
    if not allow_prefill and messages and messages[-1].role is Role.ASSISTANT:
        raise ProtocolError(
            "the last message is from the assistant (prefill); this server needs the conversation to end with a "
            "user message",
            param=f"messages[{len(entries) - 1}]",
        )
    tools = [ToolSpec(name=t["name"], description=t.get("description") or "",
                      parameters={"type": "object", "properties": {}} if t.get("input_schema") is None
                      else t["input_schema"],
                      strict=bool(t.get("strict")))
             for t in body.get("tools") or [] if isinstance(t, Mapping) and "name" in t]
    return Conversation(messages=messages), tools
