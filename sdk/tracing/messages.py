"""parley messages as the GenAI conventions' message JSON (``gen_ai.input.messages`` and friends).

The conventions fix the shape of captured content, so any backend for GenAI telemetry can read it
without knowing parley (open-telemetry/semantic-conventions-genai, docs/gen-ai/gen-ai-spans.md at
002c8a6, and the schemas beside it: gen-ai-input-messages.json, gen-ai-output-messages.json,
gen-ai-system-instructions.json):

* a message is ``{"role": ..., "parts": [...]}``; an output message adds ``finish_reason``
  (``stop``, ``length``, ``content_filter``, ``tool_call``, ``error``, or the provider's own);
* a part has a ``type``: ``text`` (``content``), ``reasoning`` (``content``), ``tool_call`` (``id``,
  ``name``, ``arguments``: the decoded JSON where it decodes), ``tool_call_response`` (``id``,
  ``response``), and any other type with its own fields (a "generic part": parley's media parts
  carry their ``mime_type``, ``modality`` and ``sha256``, never their bytes);
* system instructions are a list of parts, without a role.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from parley.protocol import Message
from parley.protocol.envelope import CompactionPart, ReasoningPart, TextPart, ToolCall, ToolResult

_FINISH = {"tool_calls": "tool_call", "tool_use": "tool_call", "max_tokens": "length", "end_turn": "stop"}
"""parley's (and providers') finish reasons in the conventions' words, where they differ."""


def part_json(part: Any) -> dict[str, Any]:
    """One part in the conventions' shape."""
    if isinstance(part, TextPart):  # (a compaction summary is text too)
        return {"type": "text", "content": part.text}
    if isinstance(part, ReasoningPart):
        out: dict[str, Any] = {"type": "reasoning", "content": part.text}
        if part.redacted:
            out["redacted"] = True
        return out
    if isinstance(part, ToolCall):
        try:
            arguments: Any = json.loads(part.arguments)
        except ValueError:
            arguments = part.arguments  # as the model wrote it
        return {"type": "tool_call", "id": part.id, "name": part.name, "arguments": arguments}
    if isinstance(part, ToolResult):
        out = {"type": "tool_call_response", "id": part.call_id, "response": part.content}
        if part.is_error:
            out["is_error"] = True
        if part.attachments:
            out["attachments"] = [part_json(media) for media in part.attachments]
        return out
    if isinstance(part, CompactionPart):
        return {"type": "compaction", "provider": part.provider, "content": part.text}
    kind = str(getattr(part, "kind", type(part).__name__))
    generic: dict[str, Any] = {"type": kind, "modality": kind if kind in ("image", "video", "audio") else None}
    for field in ("mime_type", "media_type", "sha256", "url", "title"):
        value = getattr(part, field, None)
        if value is not None:
            generic["mime_type" if field == "media_type" else field] = value
    return {key: value for key, value in generic.items() if value is not None}


def message_json(message: Message) -> dict[str, Any]:
    return {"role": message.role.value, "parts": [part_json(part) for part in message.parts]}


def input_messages(messages: Iterable[Message]) -> str:
    """``gen_ai.input.messages``: the messages sent, in order (system messages included: in parley
    they are part of the conversation sent)."""
    return _dumps([message_json(m) for m in messages])


def output_messages(messages: Iterable[Message], finish_reason: str) -> str:
    """``gen_ai.output.messages``: the model's answer as one output message (one choice), its parts in
    the order the model produced them."""
    parts = [part_json(part) for m in messages for part in m.parts]
    return _dumps([{"role": "assistant", "parts": parts, "finish_reason": finish(finish_reason)}])


def system_instructions(text: str) -> str:
    """``gen_ai.system_instructions``: the agent's instructions as one text part."""
    return _dumps([{"type": "text", "content": text}])


def finish(reason: str) -> str:
    return _FINISH.get(reason, reason)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
