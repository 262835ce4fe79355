"""Anthropic Messages API wire JSON <-> parley envelopes.

Requests: system and developer messages become the top-level ``system`` blocks; user text and tool
results become user-role content blocks, with every ``tool_result`` placed in the user message right
after the assistant message holding its ``tool_use`` (the API rejects anything else); assistant
messages become ``thinking`` / ``redacted_thinking`` / ``text`` / ``tool_use`` blocks. Thinking
blocks are sent back unchanged, but only with an Anthropic signature: reasoning from another
provider (or unsigned local reasoning) is dropped, since the API rejects it. ``Message.cache``
becomes ``cache_control`` on the message's last block.

Responses (and streamed events, via `StreamDecoder`) come back as assistant `Message`s whose
reasoning parts carry ``provider="anthropic"``. Usage is returned raw: normalising it into
`Usage` is the SDK's job (``parley.usage``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from parley.protocol.envelope import (
    CacheMark,
    Conversation,
    Message,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
)
from parley.protocol.errors import ProtocolError
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


def _result_block(result: ToolResult) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id(result.call_id), "content": result.content}
    if result.is_error:
        block["is_error"] = True
    return block


def _assistant_blocks(message: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ReasoningPart):
            if part.provider not in (None, PROVIDER):
                continue  # another provider's signature or payload means nothing here
            if part.redacted is not None:
                blocks.append({"type": "redacted_thinking", "data": part.redacted})
            elif part.signature is not None:
                blocks.append({"type": "thinking", "thinking": part.text, "signature": part.signature})
        elif isinstance(part, TextPart):
            if part.text:
                blocks.append(_text_block(part.text))
        elif isinstance(part, ToolCall):
            blocks.append({"type": "tool_use", "id": tool_id(part.id), "name": part.name,
                           "input": part.parsed_arguments()})
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

    for message in messages:
        role = message.role
        if role in (Role.SYSTEM, Role.DEVELOPER):
            if message.text:
                system.append(_text_block(message.text))
                _mark(system, message.cache)
            continue
        if role is Role.ASSISTANT:
            if pending:
                names = sorted(pending.values())
                raise ProtocolError(f"tool calls {names} have no result before the next assistant turn")
            blocks = _assistant_blocks(message)
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
        content.extend(_text_block(p.text) for p in message.parts if isinstance(p, TextPart) and p.text)
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
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed {kind} block in an Anthropic response: {exc}") from None
    return None


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


# -- requests back to envelopes (for proxies, logs and round-trip checks) -------------------------
def _cache_of(blocks: Sequence[Mapping[str, Any]]) -> CacheMark | None:
    control = blocks[-1].get("cache_control") if blocks else None
    if isinstance(control, Mapping):
        return CacheMark(ttl="1h" if control.get("ttl") == "1h" else "5m")
    return None


def _as_blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, Mapping) for b in content):
        raise ProtocolError(f"{where}: content must be a string or a list of blocks")
    return content


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping) and b.get("type") == "text")
    return "" if content is None else str(content)


def decode_request(body: Mapping[str, Any]) -> tuple[Conversation, list[ToolSpec]]:
    """A Messages API request body as a conversation and tools (unknown roles and orphans are errors)."""
    from parley.protocol.errors import InvalidArgumentsError, OrphanToolResultError, UnknownRoleError

    messages: list[Message] = []
    system = body.get("system")
    if system:
        blocks = _as_blocks(system, "system")
        text = "".join(str(b.get("text", "")) for b in blocks)
        messages.append(Message(role=Role.SYSTEM, parts=[TextPart(text=text)], cache=_cache_of(blocks)))
    names: dict[str, str] = {}
    for index, entry in enumerate(body.get("messages") or []):
        where = f"messages[{index}]"
        role = entry.get("role") if isinstance(entry, Mapping) else None
        if role not in ("user", "assistant"):
            raise UnknownRoleError(f"{where}: unknown role {role!r} (the Messages API has user and assistant)")
        blocks = _as_blocks(entry.get("content"), where)
        if role == "assistant":
            parts: list[Part] = []
            for block in blocks:
                if block.get("type") == "tool_use" and not isinstance(block.get("input"), Mapping):
                    raise InvalidArgumentsError(f"{where}: tool_use input must be a JSON object")
                part = decode_block(block)
                if part is None:
                    raise ProtocolError(f"{where}: unsupported block type {block.get('type')!r}")
                if isinstance(part, ToolCall):
                    names[part.id] = part.name
                parts.append(part)
            messages.append(Message(role=Role.ASSISTANT, parts=parts, cache=_cache_of(blocks)))
            continue
        texts: list[Part] = []
        for block in blocks:
            kind = block.get("type")
            if kind == "tool_result":
                use_id = str(block.get("tool_use_id"))
                if use_id not in names:
                    raise OrphanToolResultError(f"{where}: tool_result for unknown tool_use id {use_id!r}")
                result = ToolResult(call_id=use_id, name=names[use_id], content=_result_text(block.get("content")),
                                    is_error=bool(block.get("is_error", False)))
                messages.append(Message(role=Role.TOOL, parts=[result], name=result.name))
            elif kind == "text":
                texts.append(TextPart(text=str(block.get("text", ""))))
            else:
                raise ProtocolError(f"{where}: unsupported block type {kind!r}")
        if texts:
            messages.append(Message(role=Role.USER, parts=texts, cache=_cache_of(blocks)))
        elif messages and messages[-1].role is Role.TOOL:
            messages[-1] = messages[-1].model_copy(update={"cache": _cache_of(blocks)})
    tools = [ToolSpec(name=t["name"], description=t.get("description", ""),
                      parameters=t.get("input_schema") or {"type": "object", "properties": {}},
                      strict=bool(t.get("strict", False)))
             for t in body.get("tools") or [] if isinstance(t, Mapping) and "name" in t]
    return Conversation(messages=messages), tools
