"""What every family's hook policy shares: the tools a turn may call, and schemas checked and compiled.

A refusal is the request's fault, so each one is a `LocalRequestError` naming the request field
(``output_schema``, ``tools[2].parameters``...), which the server turns into a 400 on its own
parameter name. Schemas are checked before anything compiles; a grammar backend that is missing is
our installation's fault and stays a `BackendUnavailableError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parley.backends.base import ModelRequest, NamedToolChoice
from parley.backends.errors import LocalRequestError
from parley.backends.local.engine_port import EnginePort
from parley.constrained import BackendUnavailableError, ConstrainedError, Matcher, compile
from parley.constrained.specs import Spec
from parley.protocol import ToolSpec


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
