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


def _compile(spec: Any, tokenizer: Any, param: str) -> Any:
    """Compile a constrained spec to an engine hook; a schema that does not compile is a 400 on `param`."""
    try:
        from parley.constrained import ConstrainedError, compile_hook
    except ImportError:  # pragma: no cover - the constrained layer is part of the package
        raise ApiError(
            "structured output is not available: parley.constrained has no engine hook adapter",
            kind=ErrorKind.INTERNAL,
        ) from None
    try:
        return compile_hook(spec, tokenizer)
    except ConstrainedError as exc:
        raise invalid(f"{param}: the schema cannot be enforced: {exc}", param=param, code="invalid_schema") from None


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


def _schema_spec(schema: dict[str, Any], param: str) -> Any:
    _check_schema(schema, param)
    try:
        from parley.constrained import JsonSchema
    except ImportError:  # pragma: no cover
        raise ApiError("structured output is not available in this build", kind=ErrorKind.INTERNAL) from None
    return JsonSchema(schema)


def _tool_calls_spec(tools: list[Any], parallel: bool) -> Any:
    try:
        from parley.constrained import ToolCalls
    except ImportError:  # pragma: no cover
        raise ApiError("forced tool calls are not available in this build", kind=ErrorKind.INTERNAL) from None
    return ToolCalls(tools, parallel=parallel)


@dataclass(frozen=True)
class TurnHooks:
    """The engine hook for a turn (None when nothing constrains it) and its reasoning budget, if any."""

    hook: Any
    reasoning: ReasoningBudgetHook | None


def build_hooks(spec: TurnSpec, codec: PromptCodec, tokenizer: Any) -> TurnHooks:
    """The hook (or composed hooks) for this turn: grammar for the output or tool calls, reasoning budget."""
    hooks: list[Any] = []
    if spec.output_schema is not None or spec.json_object:
        param = spec.output_schema_param if spec.output_schema is not None else "response_format"
        schema = spec.output_schema if spec.output_schema is not None else {"type": "object"}
        hooks.append(_compile(_schema_spec(schema, param), tokenizer, param))
    if spec.tools and (spec.tool_choice == "required" or isinstance(spec.tool_choice, tuple)):
        tools = spec.tools
        if isinstance(spec.tool_choice, tuple):
            tools = [tool for tool in spec.tools if tool.name == spec.tool_choice[1]]
        for tool in tools:
            _check_schema(tool.parameters, f"tools[{spec.tools.index(tool)}].parameters")
        hooks.append(_compile(_tool_calls_spec(tools, spec.parallel_tool_calls), tokenizer, "tools"))
    budget = None
    if spec.thinking_budget is not None:
        from parley.reasoning import ReasoningBudgetHook

        budget = ReasoningBudgetHook(
            spec.thinking_budget,
            list(codec.think_end_ids),
            stop_token_ids=tuple(codec.stop_token_ids),
            decode=tokenizer.decode,
        )
        hooks.append(budget)
    if not hooks:
        return TurnHooks(None, None)
    if len(hooks) == 1:
        return TurnHooks(hooks[0], budget)
    from parley.local_engine.hooks import ComposedHook

    return TurnHooks(ComposedHook(hooks), budget)
