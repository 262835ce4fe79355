"""Per-request engine hooks for a turn: output grammar (json_schema / json_object / forced tool calls)
and the reasoning budget (`parley.reasoning.ReasoningBudgetHook`: the prompt opens `<think>`, the
hook forces `</think>` after `budget_tokens`).

A constraint that cannot be compiled is the client's problem (400 naming the field), found before
the request reaches the engine. Grammars come from `parley.constrained`; the server only chooses the
spec: a JSON Schema for `response_format`, the tool-call format for `tool_choice` required/named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley.server.errors import ApiError, ErrorKind, invalid

if TYPE_CHECKING:
    from parley.reasoning import ReasoningBudgetHook
    from parley.server.prompting import PromptCodec
    from parley.server.turn import TurnSpec


def _compile(spec: Any, engine: Any, codec: PromptCodec, param: str, triggers: list[Any]) -> Any:
    """Compile a constrained spec into an engine hook; a spec that cannot be enforced is a 400 on `param`."""
    from parley.constrained import BackendUnavailableError, ConstrainedError, ConstraintHook, compile

    try:
        matcher = compile(
            spec,
            engine.tokenizer,
            vocab_size=getattr(engine, "vocab_size", None),
            stop_token_ids=list(codec.stop_token_ids),
        )
    except BackendUnavailableError as exc:  # our fault, not the client's
        raise ApiError(f"structured output is unavailable: {exc}", kind=ErrorKind.INTERNAL) from None
    except ConstrainedError as exc:
        raise invalid(f"{param}: the schema cannot be enforced: {exc}", param=param, code="invalid_schema") from None
    return ConstraintHook(matcher, triggers=triggers)


def _check_schema(schema: dict[str, Any], param: str) -> None:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise invalid(
            f"{param} is not a valid JSON Schema: {exc.message}" + (f" (at {where})" if where else ""),
            param=param,
            code="invalid_schema",
        ) from None


@dataclass(frozen=True)
class TurnHooks:
    """The engine hook for a turn (None when nothing constrains it) and its reasoning budget, if any."""

    hook: Any
    reasoning: ReasoningBudgetHook | None


def build_hooks(spec: TurnSpec, codec: PromptCodec, engine: Any, *, constrain_auto_tools: bool = True) -> TurnHooks:
    """The hook (or composed hooks) for this turn: grammar for the output or tool calls, reasoning budget."""
    from parley.constrained import TOOL_CALL_OPEN, JsonSchema, ToolCalls

    hooks: list[Any] = []
    if spec.output_schema is not None or spec.json_object:
        param = spec.output_schema_param if spec.output_schema is not None else "response_format"
        schema = spec.output_schema if spec.output_schema is not None else {"type": "object"}
        _check_schema(schema, param)
        hooks.append(_compile(JsonSchema(schema), engine, codec, param, []))
    forced = spec.tool_choice == "required" or isinstance(spec.tool_choice, tuple)
    if spec.tools and spec.tool_choice != "none" and (forced or constrain_auto_tools):
        tools = spec.tools
        if isinstance(spec.tool_choice, tuple):
            tools = [tool for tool in spec.tools if tool.name == spec.tool_choice[1]]
        for tool in tools:
            _check_schema(tool.parameters, f"tools[{spec.tools.index(tool)}].parameters")
        calls = ToolCalls(tools, allow_multiple=spec.parallel_tool_calls, format="hermes")
        # auto: the model may answer in text; once it opens <tool_call> the call must be valid
        hooks.append(_compile(calls, engine, codec, "tools", [] if forced else [TOOL_CALL_OPEN]))
    budget = None
    if spec.thinking_budget is not None:
        from parley.reasoning import ReasoningBudgetHook

        budget = ReasoningBudgetHook(
            spec.thinking_budget,
            list(codec.think_end_ids),
            stop_token_ids=tuple(codec.stop_token_ids),
            decode=engine.tokenizer.decode,
        )
        hooks.append(budget)
    if not hooks:
        return TurnHooks(None, None)
    if len(hooks) == 1:
        return TurnHooks(hooks[0], budget)
    from parley.local_engine.hooks import ComposedHook

    return TurnHooks(ComposedHook(hooks), budget)
