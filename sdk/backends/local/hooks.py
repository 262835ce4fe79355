"""The hook policy of a local turn: which grammar constrains it, from when, and the reasoning budget.

Composed per request, from the `ModelRequest` alone (so the SDK and the server cannot differ).
`build_hooks` asks the codec (`PromptCodec.build_hooks`): each family states its own triggers.
Harmony's policy, which reads channels and recipients from the headers, is in
`parley.backends.local.harmony_hooks`; the text-marker policy of chat-template families
(`marker_hooks`, below) is:

* **reasoning** (`request.reasoning` set): the prompt opens the reasoning block and
  `ReasoningBudgetHook` forces its end after exactly N tokens (`parley.reasoning.local_budget`);
  every grammar below then starts only after the reasoning ends (the codec's `answer_triggers`);
* **tools** offered and ``tool_choice`` not ``"none"``:
  - ``"required"`` or a named tool: the tool-call grammar from the first answer token (an output
    schema does not apply to a forced turn: the answer comes in a later turn);
  - ``"auto"`` with an output schema: one grammar, *a tool call or the typed answer*
    (`ToolCalls(answer_schema=...)`), from the first answer token. (ANDing a JSON mask with a call
    grammar instead would silently switch tools off: the JSON mask can never write the call's
    opening tag);
  - ``"auto"`` alone: free text until the model opens a call (the codec's `tool_call_triggers`),
    then the call is constrained (with ``constrain_auto_tools=False``, calls are not constrained at all);
* **no tools** (or ``"none"``) and an output schema: the answer is constrained to the schema.

Schemas are checked before anything compiles, and every refusal is a `LocalRequestError` naming
the request field (``output_schema``, ``tools[2].parameters``...), which the server turns into a
400 on its own parameter name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from parley.backends.base import ModelRequest, NamedToolChoice
from parley.backends.errors import LocalRequestError
from parley.backends.local.engine_port import EnginePort
from parley.constrained import BackendUnavailableError, ConstrainedError, ConstraintHook, Matcher, compile
from parley.constrained.hook import Trigger
from parley.constrained.specs import JsonSchema, Spec, ToolCallFormat, ToolCalls
from parley.local_engine.hooks import ComposedHook, TokenHook
from parley.protocol import ToolSpec
from parley.reasoning import ReasoningBudgetHook, local_budget

if TYPE_CHECKING:
    from parley.backends.local.codec import PromptCodec


@dataclass(frozen=True)
class TurnHooks:
    """The engine hook for a turn (None when nothing constrains it), and its parts for diagnostics."""

    hook: TokenHook | None
    reasoning: ReasoningBudgetHook | None
    constraint: ConstraintHook | None


def callable_tools(request: ModelRequest) -> list[ToolSpec]:
    """The tools this turn may call (all offered ones, or the named one); none when tools are off."""
    choice = request.tool_choice
    if choice == "none":
        return []
    if isinstance(choice, NamedToolChoice):
        named = [tool for tool in request.tools if tool.name == choice.name]
        if not named:
            offered = ", ".join(repr(tool.name) for tool in request.tools)
            raise LocalRequestError(
                f"tool_choice names {choice.name!r}, which is not offered (offered: {offered})",
                field="tool_choice",
                code="unknown_tool",
            )
        return named
    return list(request.tools)  # "auto" or "required"; none offered: nothing to call


class MarkerCodec(Protocol):
    """What the text-marker policy reads of a codec: its markers, as text, ids and triggers."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...

    @property
    def reasoning_close_ids(self) -> tuple[int, ...]:
        """The tokens a spent reasoning budget forces (they close the reasoning block)."""
        ...

    @property
    def reasoning_close_text(self) -> str:
        """Text whose appearance means the model closed its reasoning itself."""
        ...

    @property
    def tool_call_format(self) -> ToolCallFormat: ...

    def answer_triggers(self, *, reasoning: bool) -> tuple[Trigger, ...]:
        """Where an answer or a forced call grammar starts (none: from the first token)."""
        ...

    def tool_call_triggers(self) -> tuple[Trigger, ...]:
        """Tools on `auto`: the text that opens a call, from where the call grammar applies."""
        ...


def build_hooks(
    request: ModelRequest, codec: PromptCodec, engine: EnginePort, *, constrain_auto_tools: bool = True
) -> TurnHooks:
    """The hooks for `request` on `engine`, by the codec's own policy."""
    return codec.build_hooks(request, engine, constrain_auto_tools=constrain_auto_tools)


def marker_hooks(
    request: ModelRequest, codec: MarkerCodec, engine: EnginePort, *, constrain_auto_tools: bool = True
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


def _reasoning_hook(request: ModelRequest, codec: MarkerCodec, engine: EnginePort) -> ReasoningBudgetHook | None:
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
    request: ModelRequest, codec: MarkerCodec, engine: EnginePort, reasoning: bool, constrain_auto_tools: bool
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


def tool_field(request: ModelRequest, tool: ToolSpec) -> str:
    """The request field a tool's schema is refused under (``tools[2].parameters``)."""
    return f"tools[{request.tools.index(tool)}].parameters"


def compile_constraint(spec: Spec, engine: EnginePort, stop_token_ids: Sequence[int], field: str) -> Matcher:
    """`spec` compiled for `engine`; a schema the grammar backends refuse is a `LocalRequestError` on `field`."""
    try:
        return compile(spec, engine.tokenizer, vocab_size=engine.vocab_size, stop_token_ids=list(stop_token_ids))
    except BackendUnavailableError:
        raise  # our installation's fault, not the request's
    except ConstrainedError as exc:
        message = f"{field}: the schema cannot be enforced: {exc}"
        raise LocalRequestError(message, field=field, code="invalid_schema") from exc


def check_schema(schema: dict[str, Any], field: str) -> None:
    """A `LocalRequestError` on `field` unless `schema` is a valid JSON Schema."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise LocalRequestError(
            f"{field} is not a valid JSON Schema: {exc.message}" + (f" (at {where})" if where else ""),
            field=field,
            code="invalid_schema",
        ) from None
