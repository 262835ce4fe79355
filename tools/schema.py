"""From a typed function signature to a JSON Schema for its arguments, and back to call arguments.

Each tool gets a pydantic model built from its parameters (`create_model`): the type hints give the
types, defaults stay defaults, docstring texts become `description`s, and `Annotated[..., Field(...)]`
constraints are honoured. The model forbids extra keys and validates in pydantic's *strict* JSON mode,
so `"5"` is not an int and `true` is not a number. A parameter annotated with `ToolContext` is the run
context: it is injected by the executor and never appears in the schema.

Fields are stored under positional names with the parameter name as alias, so a parameter may be
called `schema`, `json` or `model_config` without clashing with pydantic's own attributes.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo

from parley.tools.context import ToolContext
from parley.tools.docstrings import Docstring
from parley.tools.errors import ToolArgumentError, ToolDefinitionError

_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_MAX_REPORTED_ERRORS = 5


@dataclass(frozen=True)
class ArgumentModel:
    """A tool's argument model and how its validated fields map back onto the function's parameters."""

    model: type[BaseModel]
    json_schema: dict[str, Any]
    field_to_param: dict[str, str]
    positional_only: frozenset[str] = frozenset()
    context_param: str | None = None
    order: tuple[str, ...] = field(default_factory=tuple)

    def validate(self, arguments: Mapping[str, Any], *, tool: str | None = None) -> dict[str, Any]:
        """Validate already-parsed JSON `arguments` strictly; return keyword arguments by parameter name."""
        try:
            instance = self.model.model_validate_json(json.dumps(arguments, allow_nan=False), strict=True)
        except ValidationError as exc:
            raise ToolArgumentError(_describe(exc), code="schema", tool=tool) from None
        return {param: getattr(instance, name) for name, param in self.field_to_param.items()}

    def bind(self, kwargs: Mapping[str, Any], context: ToolContext | None) -> tuple[list[Any], dict[str, Any]]:
        """Positional and keyword arguments for calling the function (the context injected if wanted)."""
        values = dict(kwargs)
        if self.context_param is not None:
            values[self.context_param] = context
        args = [values.pop(name) for name in self.order if name in self.positional_only]
        return args, values


def _printable(text: str) -> str:
    """Field names come from the model's JSON: keep them from carrying control characters into messages."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _describe(exc: ValidationError) -> str:
    """A short, model-facing summary of a validation error: field path and expectation, never the input."""
    parts: list[str] = []
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    for error in errors[:_MAX_REPORTED_ERRORS]:
        loc = ".".join(_printable(str(p)[:40]) for p in error["loc"]) or "arguments"
        parts.append(f"{loc}: {error['msg']}")
    if len(errors) > _MAX_REPORTED_ERRORS:
        parts.append(f"and {len(errors) - _MAX_REPORTED_ERRORS} more")
    return "invalid arguments: " + "; ".join(parts)


def clean_schema(schema: Any) -> Any:
    """Drop the auto-generated `title`s (noise in a prompt), keeping property names that are called `title`,
    and close every object that lists its `properties` (`additionalProperties: false`, unless the model
    said otherwise): pydantic drops unknown keys of nested models, so the model must not send them."""
    if isinstance(schema, list):
        return [clean_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    cleaned: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title":
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            cleaned[key] = {name: clean_schema(sub) for name, sub in value.items()}
        else:
            cleaned[key] = clean_schema(value)
    if "properties" in cleaned and cleaned.get("type") == "object":
        cleaned.setdefault("additionalProperties", False)
    return cleaned


def _is_context(annotation: Any) -> bool:
    annotation = typing.get_origin(annotation) or annotation  # ToolContext[Deps] as well as ToolContext
    return isinstance(annotation, type) and issubclass(annotation, ToolContext)


def _field(annotation: Any, default: Any, *, alias: str, description: str | None) -> tuple[Any, Any]:
    """The (type, default) pair for create_model: the alias and the docstring text ride in `Annotated`.

    A description the user gave (`Annotated[..., Field(description=...)]` or `= Field(description=...)`)
    wins over the docstring's.
    """
    own = isinstance(default, FieldInfo) and default.description is not None
    if typing.get_origin(annotation) is typing.Annotated:
        own = own or any(isinstance(m, FieldInfo) and m.description for m in typing.get_args(annotation)[1:])
    extra = Field(alias=alias) if own or not description else Field(alias=alias, description=description)
    return typing.Annotated[annotation, extra], default


def _definition_locals() -> dict[str, Any]:
    """The local names where the tool is being defined (the first frame outside `parley.tools`).

    With `from __future__ import annotations` every hint is a string; one naming a class defined in
    the same function (common in tests and notebooks) resolves only against that function's locals.
    """
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("parley.tools"):
        frame = frame.f_back  # type: ignore[assignment]
    return dict(frame.f_locals) if frame is not None else {}


def hint_target(function: Callable[..., Any]) -> Any:
    """Where the annotations live: the wrapped function of a `functools.partial`, `__call__` of an instance."""
    while isinstance(function, functools.partial):
        function = function.func
    if inspect.isfunction(function) or inspect.ismethod(function) or inspect.isbuiltin(function):
        return function
    return getattr(type(function), "__call__", function)  # noqa: B004


def build_argument_model(function: Callable[..., Any], *, name: str, docstring: Docstring) -> ArgumentModel:
    """Build the strict argument model of `function` (see the module docstring)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"tool {name!r}: cannot read the signature of {function!r}: {exc}") from None
    try:
        target = hint_target(function)
        try:
            hints = typing.get_type_hints(target, include_extras=True)
        except NameError:
            hints = typing.get_type_hints(target, localns=_definition_locals(), include_extras=True)
    except Exception as exc:  # NameError for an unresolvable forward reference, among others
        raise ToolDefinitionError(
            f"tool {name!r}: cannot resolve the type hints of {getattr(function, '__qualname__', function)!r} "
            f"({type(exc).__name__}: {exc}); define the types at module level"
        ) from None

    fields: dict[str, Any] = {}
    field_to_param: dict[str, str] = {}
    positional_only: set[str] = set()
    order: list[str] = []
    context_param: str | None = None
    for index, (param_name, param) in enumerate(signature.parameters.items()):
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {name!r}: *args/**kwargs parameter {param_name!r} cannot be described to a model"
            )
        annotation = hints.get(param_name, Any)
        order.append(param_name)
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional_only.add(param_name)
        if _is_context(annotation):
            if context_param is not None:
                raise ToolDefinitionError(f"tool {name!r}: more than one ToolContext parameter")
            context_param = param_name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        field_name = f"p{index}"
        fields[field_name] = _field(annotation, default, alias=param_name, description=docstring.params.get(param_name))
        field_to_param[field_name] = param_name

    config = ConfigDict(extra="forbid", strict=True, validate_by_alias=True, arbitrary_types_allowed=False)
    try:
        model = create_model(f"{name}_arguments", __config__=config, **fields)
        json_schema = clean_schema(model.model_json_schema(by_alias=True))
    except Exception as exc:  # pydantic's schema errors for types it cannot describe
        raise ToolDefinitionError(f"tool {name!r}: cannot build an argument schema: {exc}") from None
    json_schema.setdefault("properties", {})
    json_schema["additionalProperties"] = False
    return ArgumentModel(
        model=model,
        json_schema=json_schema,
        field_to_param=field_to_param,
        positional_only=frozenset(positional_only),
        context_param=context_param,
        order=tuple(order),
    )
