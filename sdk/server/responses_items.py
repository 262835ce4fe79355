"""A local turn's events as Responses output items and the documented streaming events.

`ResponseWriter` is fed the turn's items in order and keeps the `output` list the final response
carries; streaming sends the events it returns, a plain request drops them, so both see the same
items with the same ids. Each item follows the lifecycle of OpenAI's streaming reference
(developers.openai.com/api/reference/resources/responses/streaming-events):

* message: ``response.output_item.added`` (status ``in_progress``, no content),
  ``response.content_part.added`` (an empty ``output_text``), ``response.output_text.delta``...,
  ``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``;
* reasoning: the same with a ``reasoning_text`` part and ``response.reasoning_text.delta`` /
  ``.done`` (the open-weight form: the reasoning in the clear, no encrypted content);
* function call: ``response.output_item.added`` (empty ``arguments``),
  ``response.function_call_arguments.delta``..., ``.done`` (the final arguments),
  ``response.output_item.done``.

A call the parser could not complete (an `ErrorEvent` while it was open) ends ``incomplete`` and
stays out of `output`, as it stays out of the chat route's message. Every event carries the
stream's `sequence_number`; the response events around them are the route's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from parley.protocol import ErrorEvent, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from parley.server.turn import TurnEnd

__all__ = ["ResponseWriter", "new_id", "usage_json"]

ItemKind = Literal["message", "reasoning", "function_call"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_json(end: TurnEnd) -> dict[str, Any]:
    """Responses usage: `input_tokens` includes the cached ones, as OpenAI counts them."""
    return {
        "input_tokens": end.prompt_tokens,
        "input_tokens_details": {"cached_tokens": end.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": end.output_tokens,
        "output_tokens_details": {"reasoning_tokens": end.reasoning_tokens},
        "total_tokens": end.prompt_tokens + end.output_tokens,
    }


@dataclass
class _Open:
    kind: ItemKind
    id: str
    index: int
    text: str = ""
    call_id: str = ""
    name: str = ""

    def item(self, status: str) -> dict[str, Any]:
        if self.kind == "message":
            content = [] if status == "in_progress" else [_text_part(self.text)]
            return {"id": self.id, "type": "message", "role": "assistant", "status": status, "content": content}
        if self.kind == "reasoning":
            parts = [] if status == "in_progress" else [{"type": "reasoning_text", "text": self.text}]
            return {"id": self.id, "type": "reasoning", "status": status, "summary": [], "content": parts}
        arguments = "" if status == "in_progress" else self.text
        return {"id": self.id, "type": "function_call", "status": status, "call_id": self.call_id,
                "name": self.name, "arguments": arguments}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class ResponseWriter:
    """Turn items in, streaming events out; `output` holds the finished items."""

    sequence: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)
    _open: _Open | None = None
    _next_index: int = 0

    def event(self, kind: str, **payload: Any) -> dict[str, Any]:
        """One event of this stream (the next sequence number)."""
        body = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return body

    def feed(self, item: object) -> list[dict[str, Any]]:
        """The events for one turn item (text, reasoning, call pieces, a parser error); others give none."""
        if isinstance(item, TextDelta) and item.text:
            return self._delta("message", item.text)
        if isinstance(item, ReasoningDelta) and item.text:
            return self._delta("reasoning", item.text)
        if isinstance(item, ToolCallStart):
            events = self.close()
            opened = self._start("function_call", call_id=item.id, name=item.name)
            return events + [self.event("response.output_item.added", output_index=opened.index,
                                        item=opened.item("in_progress"))]
        if isinstance(item, ToolCallDelta) and self._open is not None and self._open.kind == "function_call":
            self._open.text += item.arguments_delta
            return [self.event("response.function_call_arguments.delta", item_id=self._open.id,
                               output_index=self._open.index, delta=item.arguments_delta)]
        if isinstance(item, ToolCallEnd) and self._open is not None and self._open.kind == "function_call":
            self._open.text = item.call.arguments
            return self.close()
        if isinstance(item, ErrorEvent) and self._open is not None and self._open.kind == "function_call":
            dropped, self._open = self._open, None
            return [self.event("response.output_item.done", output_index=dropped.index,
                               item=dropped.item("incomplete"))]
        return []

    def close(self) -> list[dict[str, Any]]:
        """End the open item (if any): its done events, and its place in `output`."""
        current, self._open = self._open, None
        if current is None:
            return []
        at = {"item_id": current.id, "output_index": current.index}
        events: list[dict[str, Any]] = []
        if current.kind == "function_call":
            events.append(self.event("response.function_call_arguments.done", **at, arguments=current.text))
        elif current.kind == "message":
            events.append(self.event("response.output_text.done", **at, content_index=0, text=current.text,
                                     logprobs=[]))
            events.append(self.event("response.content_part.done", **at, content_index=0,
                                     part=_text_part(current.text)))
        else:
            events.append(self.event("response.reasoning_text.done", **at, content_index=0, text=current.text))
            events.append(self.event("response.content_part.done", **at, content_index=0,
                                     part={"type": "reasoning_text", "text": current.text}))
        done = current.item("completed")
        self.output.append(done)
        events.append(self.event("response.output_item.done", output_index=current.index, item=done))
        return events

    def _start(self, kind: ItemKind, *, call_id: str = "", name: str = "") -> _Open:
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        self._open = _Open(kind, new_id(prefix), self._next_index, call_id=call_id, name=name)
        self._next_index += 1
        return self._open

    def _delta(self, kind: Literal["message", "reasoning"], text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        current = self._open
        if current is None or current.kind != kind:
            events = self.close()
            current = self._start(kind)
            empty = _text_part("") if kind == "message" else {"type": "reasoning_text", "text": ""}
            events.append(self.event("response.output_item.added", output_index=current.index,
                                     item=current.item("in_progress")))
            events.append(self.event("response.content_part.added", item_id=current.id,
                                     output_index=current.index, content_index=0, part=empty))
        current.text += text
        at = {"item_id": current.id, "output_index": current.index, "content_index": 0}
        if kind == "message":
            events.append(self.event("response.output_text.delta", **at, delta=text, logprobs=[]))
        else:
            events.append(self.event("response.reasoning_text.delta", **at, delta=text))
        return events
