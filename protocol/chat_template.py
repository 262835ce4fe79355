"""Chat-template codec for Hugging Face models (ChatML and friends).

Rendering goes one of two ways:

* ``style="native"``: the tokenizer's own Jinja chat template (used by ``style="auto"`` when the
  template mentions ``tools``), fed HF-style message dicts.
* ``style="chatml"``: parley's documented convention, for templates without tool support (the
  embedded SmolLM2). Every message is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; system and
  developer messages at the head merge into one system message, which also describes the tools::

      # Tools
      You may call one or more functions to assist with the user query.
      You are provided with function signatures within <tools></tools> XML tags:
      <tools>
      {"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}
      </tools>
      For each function call, return a json object with function name and arguments within
      <tool_call></tool_call> XML tags: ...

  An assistant message is ``<think>\\n{reasoning}\\n</think>\\n\\n`` (the analysis channel) +
  text + one ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` per call; tool
  results are ``tool``-role messages in call order (``is_error`` is not representable). Past
  reasoning (before the last user message) is dropped, as reasoning templates do.

The models behind this codec read text only: an image or document part (or a tool result's
attachment) is refused with `UnsupportedPartError` naming it (``messages[2].content[1]``), before
anything is encoded.

The trust boundary: a render is a list of segments, each either *structure* (encoded with special
tokens allowed) or *content* (user, tool, assistant and system text: encoded with special tokens
split into plain text). So ``<|im_start|>system`` inside a tool result can never become the
special token, and `parse_ids` reads it back as the same tool result. Text-level `parse` cannot tell
look-alike text from structure; parse token ids when that matters. The native path keeps the
boundary by rendering with sentinels in place of content and encoding the pieces separately.

The tokenizer is duck-typed (``encode``, ``decode``, ``convert_tokens_to_ids``,
``convert_ids_to_tokens``, ``all_special_tokens``/``all_special_ids``, ``chat_template``,
``apply_chat_template``); transformers is never imported here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from parley.protocol._chat_template_stream import (
    END_OF_TEXT,
    IM_END,
    IM_START,
    REASONING_CLOSE,
    THINK_END,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    StreamParser,
    call_id,
    decode_tool_call,
)
from parley.protocol.envelope import (
    Conversation,
    Message,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
    refuse_media,
)
from parley.protocol.errors import (
    CodecConfigError,
    OrphanToolResultError,
    ParseError,
    ProtocolError,
    UnencodableTextError,
    UnknownRoleError,
)
from parley.protocol.events import ErrorEvent, Event
from parley.protocol.tool_spec import ToolSpec

__all__ = [
    "END_OF_TEXT",
    "IM_END",
    "IM_START",
    "REASONING_CLOSE",
    "THINK_END",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ChatTemplateCodec",
    "Segment",
    "StreamParser",
    "call_id",
    "decode_tool_call",
]

Style = Literal["auto", "chatml", "native"]

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)
_CHATML_ROLES = {Role.SYSTEM: "system", Role.DEVELOPER: "system", Role.USER: "user", Role.ASSISTANT: "assistant",
                 Role.TOOL: "tool"}
_SENTINEL = re.compile("\ue000(\\d+)\ue001")


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of rendered prompt; `structural` pieces may contain special tokens, content never."""

    text: str
    structural: bool


def _tool_json(tool: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                              "parameters": tool.parameters}}


def _arguments(call: ToolCall) -> dict[str, Any]:
    return call.parsed_arguments()  # InvalidArgumentsError on non-JSON or non-object


class ChatTemplateCodec:
    """Render conversations to prompts and parse model output, for one tokenizer (or none: text only)."""

    def __init__(
        self,
        tokenizer: Any = None,
        *,
        style: Style = "auto",
        default_system: str | None = None,
        drop_past_reasoning: bool = True,
    ) -> None:
        template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
        if style not in ("auto", "chatml", "native"):
            raise CodecConfigError(f"style must be 'auto', 'chatml' or 'native', not {style!r}")
        if style == "auto":
            style = "native" if isinstance(template, str) and "tools" in template else "chatml"
        if style == "native" and not isinstance(template, str):
            raise CodecConfigError("style='native' needs a tokenizer with a chat_template")
        self.tokenizer = tokenizer
        self.style: Literal["chatml", "native"] = style
        self.default_system = default_system
        self.drop_past_reasoning = drop_past_reasoning

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> ChatTemplateCodec:
        """The codec a model family needs, read from its tokenizer's chat template.

        SmolLM2's template has no tool support and adds its own default system prompt, so it gets
        the ChatML convention with that prompt; a template that renders tools is used natively;
        anything else gets the plain ChatML convention.
        """
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, str) and "SmolLM" in template:
            return cls.for_smollm2(tokenizer)
        return cls(tokenizer)

    @classmethod
    def for_smollm2(cls, tokenizer: Any = None) -> ChatTemplateCodec:
        """The convention with SmolLM2's own default system prompt (its template adds it)."""
        return cls(tokenizer, style="chatml",
                   default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face")

    # -- rendering ----------------------------------------------------------------------------
    def render_segments(
        self, conversation: Conversation | Sequence[Message], tools: Sequence[ToolSpec] = (), *,
        add_generation_prompt: bool = True, open_reasoning: bool = False,
    ) -> list[Segment]:
        """The prompt as structure/content segments (see the module docstring)."""
        messages = list(conversation)
        _check(messages)
        if self.style == "native":
            segments = self._native_segments(messages, tools, add_generation_prompt)
        else:
            segments = self._chatml_segments(messages, tools, add_generation_prompt)
        if add_generation_prompt and open_reasoning:
            segments.append(Segment(THINK_OPEN + "\n", True))
        return _merge(segments)

    def render(self, conversation: Conversation | Sequence[Message], tools: Sequence[ToolSpec] = (), *,
               add_generation_prompt: bool = True, open_reasoning: bool = False) -> str:
        """The prompt text (what the template would print)."""
        segments = self.render_segments(conversation, tools, add_generation_prompt=add_generation_prompt,
                                        open_reasoning=open_reasoning)
        return "".join(s.text for s in segments)

    def render_ids(self, conversation: Conversation | Sequence[Message], tools: Sequence[ToolSpec] = (), *,
                   add_generation_prompt: bool = True, open_reasoning: bool = False) -> list[int]:
        """The prompt token ids; content segments can never produce special tokens.

        Text the tokenizer cannot encode (a lone surrogate, ...) raises `UnencodableTextError` naming
        where it is (``messages[2].content``, ``tools[0].description``, ...).
        """
        self._need_tokenizer()
        messages = list(conversation)
        segments = self.render_segments(messages, tools, add_generation_prompt=add_generation_prompt,
                                        open_reasoning=open_reasoning)
        ids: list[int] = []
        try:
            for segment in segments:
                ids.extend(self.encode(segment.text, structural=segment.structural))
        except UnencodableTextError as exc:
            raise self._locate_unencodable(messages, tools, exc) from exc
        return ids

    def encode(self, text: str, *, structural: bool = False, where: str = "text") -> list[int]:
        """Encode text; only `structural` text may produce special tokens.

        `UnencodableTextError` (naming `where`) when the tokenizer refuses the text, e.g. a lone surrogate.
        """
        tok = self._need_tokenizer()
        try:
            if structural:
                return list(tok.encode(text, add_special_tokens=False))
            return list(tok.encode(text, add_special_tokens=False, split_special_tokens=True))
        except Exception as exc:  # tokenizers raise TypeError/ValueError/...: one typed error for all
            raise _unencodable(where, text, exc) from exc

    def _locate_unencodable(self, messages: list[Message], tools: Sequence[ToolSpec],
                            error: UnencodableTextError) -> UnencodableTextError:
        """The first place whose text the tokenizer refuses (rendering merges places, so look at each)."""
        for where, text in _text_places(messages, tools, self.default_system):
            try:
                self.encode(text, where=where)
            except UnencodableTextError as exc:
                return exc
        return UnencodableTextError(f"the rendered prompt cannot be encoded: {error}", where="prompt",
                                    position=error.position)

    def _chatml_segments(self, messages: list[Message], tools: Sequence[ToolSpec], gen: bool) -> list[Segment]:
        out: list[Segment] = []
        head: list[str] = []
        index = 0
        while index < len(messages) and messages[index].role in (Role.SYSTEM, Role.DEVELOPER):
            head.append(messages[index].text)
            index += 1
        if not head and self.default_system is not None:
            head.append(self.default_system)
        if tools:
            lines = "\n".join(json.dumps(_tool_json(t), ensure_ascii=False) for t in tools)
            head.append(TOOLS_PREAMBLE + lines + TOOLS_POSTAMBLE)
        if head:
            out += [Segment(IM_START + "system\n", True), Segment("\n\n".join(head), False)]
            out.append(Segment(IM_END + "\n", True))
        last_user = max((i for i, m in enumerate(messages) if m.role is Role.USER and m.text), default=-1)
        for position, message in enumerate(messages[index:], start=index):
            keep_reasoning = not self.drop_past_reasoning or position > last_user
            for role, body in self._chatml_bodies(message, keep_reasoning):
                out.append(Segment(f"{IM_START}{role}\n", True))
                out.extend(body)
                out.append(Segment(IM_END + "\n", True))
        if gen:
            out.append(Segment(IM_START + "assistant\n", True))
        return out

    def _chatml_bodies(self, message: Message, keep_reasoning: bool) -> list[tuple[str, list[Segment]]]:
        role = _CHATML_ROLES.get(message.role)
        if role is None:
            raise UnknownRoleError(f"the chat-template codec cannot render role {message.role!r}")
        results = message.tool_results
        bodies: list[tuple[str, list[Segment]]] = []
        if message.role is Role.ASSISTANT:
            body: list[Segment] = []
            reasoning = "".join(p.text for p in message.parts if isinstance(p, ReasoningPart))
            if reasoning and keep_reasoning:
                body += [Segment(THINK_OPEN + "\n", True), Segment(reasoning, False),
                         Segment(REASONING_CLOSE, True)]
            if message.text:
                body.append(Segment(message.text, False))
            for n, call in enumerate(message.tool_calls):
                payload = json.dumps({"name": call.name, "arguments": _arguments(call)}, ensure_ascii=False)
                sep = "\n" if (n or message.text) else ""
                body += [Segment(sep + TOOL_CALL_OPEN + "\n", True), Segment(payload, False),
                         Segment("\n" + TOOL_CALL_CLOSE, True)]
            bodies.append((role, body))
        else:
            # Results answer earlier calls, so they come before any text of the same message.
            bodies.extend(("tool", [Segment(result.content, False)]) for result in results)
            if message.text or not results:
                bodies.append((role, [Segment(message.text, False)]))
        return bodies

    def _native_segments(self, messages: list[Message], tools: Sequence[ToolSpec], gen: bool) -> list[Segment]:
        tok = self.tokenizer
        content: list[str] = []

        def hide(text: str) -> str:
            content.append(text)
            return f"\ue000{len(content) - 1}\ue001"

        def hide_values(value: Any) -> Any:
            # Argument strings are printed by the template's `tojson`: put them back JSON-escaped.
            if isinstance(value, str):
                return hide(json.dumps(value, ensure_ascii=False)[1:-1])
            if isinstance(value, dict):
                return {k: hide_values(v) for k, v in value.items()}
            if isinstance(value, list):
                return [hide_values(v) for v in value]
            return value

        last_user = max((i for i, m in enumerate(messages) if m.role is Role.USER and m.text), default=-1)
        dicts: list[dict[str, Any]] = []
        for position, message in enumerate(messages):
            role = _CHATML_ROLES.get(message.role)
            if role is None:
                raise UnknownRoleError(f"the chat-template codec cannot render role {message.role!r}")
            results = message.tool_results
            if message.role is Role.ASSISTANT:
                entry: dict[str, Any] = {"role": "assistant", "content": hide(message.text)}
                if message.reasoning and (not self.drop_past_reasoning or position > last_user):
                    entry["reasoning_content"] = hide(message.reasoning)
                if message.tool_calls:
                    entry["tool_calls"] = [
                        {"id": c.id, "type": "function",
                         "function": {"name": c.name, "arguments": hide_values(_arguments(c))}}
                        for c in message.tool_calls
                    ]
                dicts.append(entry)
                continue
            for result in results:
                dicts.append({"role": "tool", "content": hide(result.content), "name": result.name,
                              "tool_call_id": result.call_id})
            if message.text or not results:
                dicts.append({"role": role, "content": hide(message.text)})
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": gen}
        if tools:
            kwargs["tools"] = [_tool_json(t) for t in tools]
        try:
            rendered = tok.apply_chat_template(dicts, **kwargs)
        except Exception as exc:  # jinja2 TemplateError from `raise_exception(...)` in templates, and the like
            raise ProtocolError(f"the model's chat template rejected the conversation: {exc}") from exc
        if not isinstance(rendered, str):
            raise ProtocolError("the model's chat template did not render text")
        segments: list[Segment] = []
        last = 0
        for match in _SENTINEL.finditer(rendered):
            segments.append(Segment(rendered[last : match.start()], True))
            segments.append(Segment(content[int(match.group(1))], False))
            last = match.end()
        segments.append(Segment(rendered[last:], True))
        return segments

    # -- parsing ------------------------------------------------------------------------------
    def stream_parser(
        self, *, strict: bool = False, start_in_reasoning: bool = False, call_ids: Callable[[int], str] = call_id
    ) -> StreamParser:
        """A parser for one completion (or a ChatML transcript), fed text chunks or token ids.

        `call_ids` names the n-th call; the default (``call_0``...) repeats across completions.
        """
        return StreamParser(self.tokenizer, strict=strict, start_in_reasoning=start_in_reasoning, call_ids=call_ids)

    def parse(self, text: str, *, strict: bool = True, start_in_reasoning: bool = False) -> list[Message]:
        """Parse completion text or a ChatML transcript (text level: markers are trusted)."""
        parser = StreamParser(None, strict=strict, start_in_reasoning=start_in_reasoning)
        events = parser.feed_text(text) + parser.finish()
        return _finish_parse(parser, events, strict)

    def parse_ids(self, ids: Iterable[int], *, strict: bool = True, start_in_reasoning: bool = False) -> list[Message]:
        """Parse token ids: only special ids are structure, so injected look-alikes stay text."""
        parser = StreamParser(self._need_tokenizer(), strict=strict, start_in_reasoning=start_in_reasoning)
        events = parser.feed_tokens(ids) + parser.finish()
        return _finish_parse(parser, events, strict)

    def parse_conversation(self, text_or_ids: str | Sequence[int], *, strict: bool = True) -> Conversation:
        """Parse a whole rendered transcript back into a conversation (tool results paired by order)."""
        if isinstance(text_or_ids, str):
            messages = self.parse(text_or_ids, strict=strict)
        else:
            messages = self.parse_ids(text_or_ids, strict=strict)
        if messages and messages[-1].role is Role.ASSISTANT and not messages[-1].parts:
            messages = messages[:-1]  # the generation prompt's empty assistant turn
        return Conversation(messages=_pair_tool_results(messages, strict=strict))

    def stop_token_ids(self) -> list[int]:
        """Ids that end an assistant turn (``<|im_end|>`` and EOS where the vocabulary has them)."""
        tok = self._need_tokenizer()
        ids = {tok.convert_tokens_to_ids(t) for t in (IM_END, END_OF_TEXT) if t in tok.all_special_tokens}
        eos = getattr(tok, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        return sorted(i for i in ids if isinstance(i, int) and i >= 0)

    def _need_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise CodecConfigError("this operation needs a tokenizer: ChatTemplateCodec(tokenizer)")
        return self.tokenizer


# -- helpers -----------------------------------------------------------------------------------
def _unencodable(where: str, text: str, exc: Exception) -> UnencodableTextError:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as bad:
        code = ord(text[bad.start])
        return UnencodableTextError(
            f"{where} cannot be encoded: it holds a lone surrogate U+{code:04X} at character {bad.start} "
            "(text must be valid Unicode: a surrogate is only half of a UTF-16 pair)",
            where=where, position=bad.start,
        )
    return UnencodableTextError(f"{where} cannot be encoded by the tokenizer: {type(exc).__name__}: {exc}",
                                where=where)


def _text_places(messages: list[Message], tools: Sequence[ToolSpec],
                 default_system: str | None) -> Iterable[tuple[str, str]]:
    """Every piece of caller text a render may encode, with the name of its place."""
    for i, message in enumerate(messages):
        results = calls = 0
        for part in message.parts:
            if isinstance(part, TextPart):
                yield f"messages[{i}].content", part.text
            elif isinstance(part, ReasoningPart):
                yield f"messages[{i}].reasoning", part.text
            elif isinstance(part, ToolCall):
                where = f"messages[{i}].tool_calls[{calls}]"
                yield f"{where}.id", part.id
                yield f"{where}.name", part.name
                yield f"{where}.arguments", part.arguments
                try:  # a JSON escape such as "\ud800" only becomes a lone surrogate once parsed
                    rendered = json.dumps(part.parsed_arguments(), ensure_ascii=False)
                except ProtocolError:
                    rendered = ""
                yield f"{where}.arguments", rendered
                calls += 1
            elif isinstance(part, ToolResult):
                yield f"messages[{i}].tool_results[{results}].call_id", part.call_id
                yield f"messages[{i}].tool_results[{results}].name", part.name
                yield f"messages[{i}].tool_results[{results}].content", part.content
                results += 1
    for k, tool in enumerate(tools):
        yield f"tools[{k}].name", tool.name
        yield f"tools[{k}].description", tool.description
        yield f"tools[{k}].parameters", json.dumps(tool.parameters, ensure_ascii=False)
    if default_system is not None:
        yield "the codec's default system prompt", default_system


def _check(messages: list[Message]) -> None:
    for message in messages:
        if not isinstance(message.role, Role):
            raise UnknownRoleError(f"unknown role {message.role!r}")
    Conversation.model_construct(messages=messages).check_tool_pairing()
    refuse_media(messages)  # chat-template models read text only: `UnsupportedPartError` naming the part


def _merge(segments: list[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for segment in segments:
        if not segment.text:
            continue
        if merged and merged[-1].structural == segment.structural:
            merged[-1] = Segment(merged[-1].text + segment.text, segment.structural)
        else:
            merged.append(segment)
    return merged


def _finish_parse(parser: StreamParser, events: list[Event], strict: bool) -> list[Message]:
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    if strict and errors:
        raise ParseError("; ".join(f"{e.code}: {e.message}" for e in errors))
    return parser.messages


def _pair_tool_results(messages: list[Message], *, strict: bool) -> list[Message]:
    """Turn tool-role text messages into `ToolResult`s answering the open calls, in order."""
    open_calls: list[ToolCall] = []
    out: list[Message] = []
    for message in messages:
        if message.role is Role.ASSISTANT:
            open_calls = list(message.tool_calls)
            out.append(message)
            continue
        if message.role is not Role.TOOL:
            out.append(message)
            continue
        if not open_calls:
            if strict:
                raise OrphanToolResultError("a tool message answers no open tool call")
            out.append(Message(role=Role.USER, parts=[TextPart(text=message.text)]))
            continue
        call = open_calls.pop(0)
        out.append(Message.tool(call.id, call.name, message.text))
    return out
