"""`SchemaTool`: a tool described by a JSON Schema and served by a handler, not by a typed function.

Tools that come from elsewhere (an MCP server, an OpenAPI document) already have their argument
schema; `SchemaTool` offers them to a model with every option of `Tool` — approval (bool or
predicate, failing closed), deferred, timeouts, retries for idempotent tools, the repeat rule —
and runs ``await handler(arguments, context)`` with the validated argument object.

Arguments are parsed with the same strict JSON rules as any tool (`parley.tools.arguments`) and
validated against the schema (JSON Schema 2020-12, `jsonschema`); errors name the field and the
rule, never echo long input. `strict` may be given, or left to `strict_compatible(schema)`: every
object closed (``additionalProperties: false``) with all its properties required.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from parley.tools.arguments import parse_arguments
from parley.tools.context import ToolContext
from parley.tools.errors import ToolArgumentError, ToolDefinitionError
from parley.tools.redaction import safe_text
from parley.tools.tool import Tool

SchemaHandler = Callable[[dict[str, Any], ToolContext | None], Awaitable[Any]]
"""``await handler(arguments, context)``: the validated argument object and the call's context."""

_MAX_REPORTED_ERRORS = 5


def _no_arguments() -> None:
    """Stands in for the function a `Tool` is built from (a `SchemaTool` has a schema instead)."""


def strict_compatible(schema: Any) -> bool:
    """Whether `schema` fits strict function calling: every object lists its properties, requires all of
    them and allows no others (what OpenAI's ``strict`` mode and our grammar compile exactly)."""
    if isinstance(schema, list):
        return all(strict_compatible(item) for item in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required") or ()) != set(properties):
            return False
    return all(strict_compatible(value) for key, value in schema.items() if key not in ("enum", "const", "default"))


class SchemaTool(Tool):
    """A `Tool` whose arguments are a JSON Schema and whose work is an async `handler` (see the module doc)."""

    def __init__(
        self,
        name: str,
        handler: SchemaHandler,
        *,
        parameters: Mapping[str, Any] | None = None,
        description: str = "",
        strict: bool | None = None,
        **options: Any,
    ) -> None:
        schema = dict(parameters) if parameters is not None else {"type": "object", "properties": {}}
        if schema.get("type", "object") != "object":
            raise ToolDefinitionError(f"tool {name!r}: the argument schema must describe an object")
        schema.setdefault("type", "object")
        try:
            import jsonschema

            jsonschema.Draft202012Validator.check_schema(schema)
            self._validator = jsonschema.Draft202012Validator(schema)
        except jsonschema.SchemaError as exc:
            raise ToolDefinitionError(f"tool {name!r}: invalid argument schema: {exc.message}") from None
        except RecursionError:
            raise ToolDefinitionError(f"tool {name!r}: the argument schema is nested too deeply") from None
        super().__init__(
            _no_arguments,
            name=name,
            description=description,
            strict=strict_compatible(schema) if strict is None else strict,
            **options,
        )
        self._schema = schema
        self.handler = handler
        self.is_async = True

    def __repr__(self) -> str:
        return f"SchemaTool({self.name!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler with keyword arguments (no validation), like calling a `@tool` function."""
        return self.handler(dict(kwargs), None)

    @property
    def parameters(self) -> dict[str, Any]:
        return self._schema

    def validate_arguments(self, arguments_json: str | bytes) -> dict[str, Any]:
        parsed = parse_arguments(
            arguments_json, max_bytes=self.max_argument_bytes, max_depth=self.max_argument_depth, tool=self.name
        )
        try:
            errors = sorted(self._validator.iter_errors(parsed), key=lambda e: list(e.absolute_path))
        except RecursionError:
            raise ToolArgumentError("invalid arguments: nested too deeply", code="too_deep", tool=self.name) from None
        if errors:
            parts = []
            for error in errors[:_MAX_REPORTED_ERRORS]:
                where = ".".join(safe_text(str(p), max_chars=40) for p in error.absolute_path) or "arguments"
                parts.append(f"{where}: {safe_text(error.message, max_chars=160)}")
            if len(errors) > _MAX_REPORTED_ERRORS:
                parts.append(f"and {len(errors) - _MAX_REPORTED_ERRORS} more")
            raise ToolArgumentError("invalid arguments: " + "; ".join(parts), code="schema", tool=self.name)
        return parsed

    async def invoke(self, arguments: dict[str, Any], context: ToolContext | None = None) -> Any:
        return await self.handler(arguments, context)
