"""Per-request engine hooks for a turn: output grammar (json_schema / json_object / forced tool calls)
and the reasoning budget.

A constraint that cannot be compiled is the client's problem (400 naming the field), found before
the request reaches the engine. Grammars come from `parley.constrained`; the server only chooses the
spec: a JSON Schema for `response_format`, the tool-call format for `tool_choice` required/named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from parley.server.errors import ApiError, ErrorKind, invalid

if TYPE_CHECKING:
    import torch

    from parley.server.prompting import PromptCodec
    from parley.server.turn import TurnSpec


class ThinkingBudget:
    """Lets the model reason for at most `budget` tokens, then forces the end-of-reasoning text.

    Used for Anthropic `thinking.budget_tokens`: the prompt opens `<think>`; once `budget` tokens
    have been accepted without the model closing it, `forced_token` emits `think_end_ids` one by
    one. It never masks (`fill_bitmask` returns False), so it costs nothing per step.
    """

    def __init__(self, budget: int, think_end_ids: Sequence[int], tokenizer: Any) -> None:
        self.budget = budget
        self.end_ids = list(think_end_ids)
        self.tokenizer = tokenizer
        self.count = 0
        self.closed = False
        self._forcing = 0
        self._recent: list[int] = []

    def forced_token(self) -> int | None:
        if self.closed or self.count < self.budget or not self.end_ids:
            return None
        return self.end_ids[min(self._forcing, len(self.end_ids) - 1)]

    def fill_bitmask(self, row: torch.Tensor) -> bool:
        return False

    def accept_token(self, token_id: int) -> None:
        if self.closed:
            return
        if self.count >= self.budget:
            self._forcing += 1
            if self._forcing >= len(self.end_ids):
                self.closed = True
            return
        self.count += 1
        self._recent = (self._recent + [token_id])[-8:]
        if "</think>" in self.tokenizer.decode(self._recent):
            self.closed = True

    def is_terminated(self) -> bool:
        return False


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


def build_hooks(spec: TurnSpec, codec: PromptCodec, tokenizer: Any) -> Any:
    """The hook (or composed hooks) for this turn, or None when nothing constrains it."""
    hooks: list[Any] = []
    if spec.output_schema is not None or spec.json_object:
        param = "response_format.json_schema.schema" if spec.output_schema is not None else "response_format"
        schema = spec.output_schema if spec.output_schema is not None else {"type": "object"}
        hooks.append(_compile(_schema_spec(schema, param), tokenizer, param))
    if spec.tools and (spec.tool_choice == "required" or isinstance(spec.tool_choice, tuple)):
        tools = spec.tools
        if isinstance(spec.tool_choice, tuple):
            tools = [tool for tool in spec.tools if tool.name == spec.tool_choice[1]]
        for tool in tools:
            _check_schema(tool.parameters, f"tools[{spec.tools.index(tool)}].parameters")
        hooks.append(_compile(_tool_calls_spec(tools, spec.parallel_tool_calls), tokenizer, "tools"))
    if spec.thinking_budget is not None:
        hooks.append(ThinkingBudget(spec.thinking_budget, codec.think_end_ids, tokenizer))
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]
    from parley.local_engine.hooks import ComposedHook

    return ComposedHook(hooks)
