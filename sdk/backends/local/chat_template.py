"""The chat-template family: ChatML, or the model's own Jinja template, with text markers.

`ChatTemplatePrompts` renders through `parley.protocol.chat_template.ChatTemplateCodec` (the ChatML
convention, or the tokenizer's template when it renders tools, e.g. Qwen3's hermes
``<tool_call>``s, with its ``enable_thinking`` switch set from the request's reasoning). Its output
is marked up in text (``<think>…</think>``, ``<tool_call>…</tool_call>``), so its hook policy
(`marker_hooks`) starts grammars at text triggers:

* **reasoning** (`request.reasoning` set): the prompt opens the reasoning block and
  `ReasoningBudgetHook` forces its end after exactly N tokens (`parley.reasoning.local_budget`);
  every grammar below then starts only after the reasoning ends (`answer_triggers`);
* **tools** offered and ``tool_choice`` not ``"none"``:
  - ``"required"`` or a named tool: the tool-call grammar from the first answer token (an output
    schema does not apply to a forced turn: the answer comes in a later turn);
  - ``"auto"`` with an output schema: one grammar, *a tool call or the typed answer*
    (`ToolCalls(answer_schema=...)`), from the first answer token. (ANDing a JSON mask with a call
    grammar instead would silently switch tools off: the JSON mask can never write the call's
    opening tag);
  - ``"auto"`` alone: free text until the model opens a call (`tool_call_triggers`), then the
    call is constrained (with ``constrain_auto_tools=False``, calls are not constrained at all);
* **no tools** (or ``"none"``) and an output schema: the answer is constrained to the schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from parley.backends.local.constraints import callable_tools, check_schema, compile_constraint, tool_field
from parley.backends.local.family import OutputParser, ReasoningArg, TurnHooks, as_reasoning
from parley.constrained import ConstraintHook
from parley.constrained.hook import THINK_END, TOOL_CALL_OPEN, Trigger
from parley.constrained.specs import JsonSchema, ToolCallFormat, ToolCalls
from parley.local_engine.hooks import ComposedHook, TokenHook
from parley.local_engine.tokenizer import Tokenizer
from parley.protocol import Conversation, ToolCall, ToolSpec
from parley.protocol.chat_template import THINK_END as THINK_END_TEXT
from parley.protocol.chat_template import TOOL_CALL_CLOSE, ChatTemplateCodec
from parley.protocol.chat_template import TOOL_CALL_OPEN as TOOL_CALL_OPEN_TEXT
from parley.reasoning import ReasoningBudgetHook, local_budget

if TYPE_CHECKING:
    from parley.backends.base import ModelRequest
    from parley.backends.local.engine_port import EnginePort

__all__ = ["ChatTemplatePrompts", "marker_hooks"]


class ChatTemplatePrompts:
    """`PromptFamily` over `ChatTemplateCodec` (ChatML convention, or the model's native template).

    Its hooks are the text-marker policy (`marker_hooks`): the answer grammar starts after
    ``</think>`` when the turn reasons, an `auto` call grammar at ``<tool_call>``.
    """

    tool_call_format: ToolCallFormat = "hermes"
    reasoning_close_text: str = THINK_END_TEXT

    def __init__(self, codec: ChatTemplateCodec) -> None:
        self.codec = codec
        self.tokenizer: Tokenizer = codec.tokenizer
        self.stop_token_ids = tuple(codec.stop_token_ids())
        # A spent budget forces "\n</think>" only: the layout after it is the model's, so an answer
        # grammar starting right after `</think>` is never fed whitespace it does not allow.
        self.reasoning_close_ids = tuple(self.tokenizer.encode("\n" + THINK_END_TEXT, add_special_tokens=False))
        template = getattr(self.tokenizer, "chat_template", None)
        self.thinking_switch = codec.style == "native" and isinstance(template, str) and "enable_thinking" in template
        """The model's own template takes `enable_thinking` (Qwen3): it is set from the request's reasoning."""
        self._switched: dict[bool, ChatTemplateCodec] = {}

    def answer_triggers(self, *, reasoning: bool) -> tuple[Trigger, ...]:
        """Where an answer or a forced call grammar starts: after ``</think>`` when reasoning, else at once."""
        return (THINK_END,) if reasoning else ()

    def tool_call_triggers(self) -> tuple[Trigger, ...]:
        """Tools on `auto`: the text that opens a call, from where the call grammar applies."""
        return (TOOL_CALL_OPEN,)

    def render(self, conversation: Conversation, tools: Sequence[ToolSpec], *, reasoning: ReasoningArg) -> list[int]:
        opened = as_reasoning(reasoning) is not None
        return list(self.codec_for(opened).render_ids(conversation, list(tools), open_reasoning=opened))

    def codec_for(self, reasoning: bool) -> ChatTemplateCodec:
        """The codec that renders a turn with (or without) reasoning.

        A template with an ``enable_thinking`` switch (Qwen3) renders with it set: off, the template
        writes its own empty ``<think>\n\n</think>\n\n`` block and the model answers at once; on,
        the prompt ends inside an open ``<think>`` block as for every family.
        """
        if not self.thinking_switch:
            return self.codec
        codec = self._switched.get(reasoning)
        if codec is None:
            view = _TemplateKwargs(self.tokenizer, enable_thinking=reasoning)
            codec = ChatTemplateCodec(
                view, style="native", default_system=self.codec.default_system,
                drop_past_reasoning=self.codec.drop_past_reasoning,
            )
            self._switched[reasoning] = codec
        return codec

    def parser(self, *, reasoning: bool, call_ids: Callable[[int], str]) -> OutputParser:
        return self.codec.stream_parser(start_in_reasoning=reasoning, call_ids=call_ids)

    def call_as_text(self, call: ToolCall) -> str:
        body = f'{{"name": {json.dumps(call.name)}, "arguments": {call.arguments}}}'
        return f"{TOOL_CALL_OPEN_TEXT}{body}{TOOL_CALL_CLOSE}"

    def build_hooks(self, request: ModelRequest, engine: EnginePort, *, constrain_auto_tools: bool = True) -> TurnHooks:
        return marker_hooks(request, self, engine, constrain_auto_tools=constrain_auto_tools)


class _TemplateKwargs:
    """A tokenizer whose `apply_chat_template` always passes `kwargs` (a template switch such as `enable_thinking`)."""

    def __init__(self, tokenizer: Tokenizer, **kwargs: Any) -> None:
        self._tokenizer = tokenizer
        self._kwargs = kwargs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        native: Any = self._tokenizer  # only a tokenizer with its own chat template is switched
        return native.apply_chat_template(conversation, **{**self._kwargs, **kwargs})


# --------------------------------------------------------------------------------------------------
# The text-marker hook policy.


def marker_hooks(
    request: ModelRequest, codec: ChatTemplatePrompts, engine: EnginePort, *, constrain_auto_tools: bool = True
) -> TurnHooks:
    """The text-marker policy (see the module docstring)."""
    reasoning = _reasoning_hook(request, codec, engine)
    constraint = _constraint(request, codec, engine, reasoning is not None, constrain_auto_tools)
    hooks: list[TokenHook] = [h for h in (reasoning, constraint) if h is not None]
    hook: TokenHook | None = None
    if len(hooks) == 1:
        hook = hooks[0]
    elif hooks:
        hook = ComposedHook(hooks)
    return TurnHooks(hook=hook, reasoning=reasoning, constraint=constraint)


def _reasoning_hook(
    request: ModelRequest, codec: ChatTemplatePrompts, engine: EnginePort
) -> ReasoningBudgetHook | None:
    if request.reasoning is None:
        return None
    return ReasoningBudgetHook(
        local_budget(request.reasoning),
        list(codec.reasoning_close_ids),
        stop_token_ids=codec.stop_token_ids,
        decode=engine.tokenizer.decode,
        end_text=codec.reasoning_close_text,
    )


def _constraint(
    request: ModelRequest, codec: ChatTemplatePrompts, engine: EnginePort, reasoning: bool, constrain_auto_tools: bool
) -> ConstraintHook | None:
    tools = callable_tools(request)
    triggers: list[Trigger] = list(codec.answer_triggers(reasoning=reasoning))
    spec: JsonSchema | ToolCalls
    field = "output_schema"
    if tools:
        auto = request.tool_choice == "auto"
        answer = request.output_schema if auto else None
        if auto and answer is None:
            if not constrain_auto_tools:
                return None
            triggers = list(codec.tool_call_triggers())
        for tool in tools:
            check_schema(tool.parameters, tool_field(request, tool))
        if answer is not None:
            check_schema(answer, "output_schema")
        spec = ToolCalls(
            tools,
            allow_multiple=request.parallel_tool_calls is True,
            format=codec.tool_call_format,
            answer_schema=answer,
        )
        field = "tools"
    elif request.output_schema is not None:
        check_schema(request.output_schema, "output_schema")
        spec = JsonSchema(request.output_schema)
    else:
        return None
    matcher = compile_constraint(spec, engine, codec.stop_token_ids, field)
    return ConstraintHook(matcher, triggers=triggers)
