"""Structured output: what the final answer must be, and how it is checked.

`output_type` may be `str`/None (free text), a pydantic model class, or a JSON Schema dict. The
schema travels in `ModelRequest.output_schema`: the local backend enforces it with constrained
decoding, hosted backends with the provider's native schema mode. Either way the agent validates
the answer here; an invalid answer gets a bounded repair loop (the validation error goes back to the
model) and then `OutputValidationError` carrying the last attempt. Reasoning parts never count as
the answer: only the text of the final assistant message is parsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from parley.errors import ConfigurationError


class OutputInvalid(Exception):
    """Internal signal: the answer did not validate; `detail` is what the model is told."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class OutputSpec:
    """The compiled form of an Agent's `output_type`."""

    kind: str
    """``text``, ``model`` (pydantic) or ``schema`` (JSON Schema dict)."""
    schema: dict[str, Any] | None = None
    model: type[BaseModel] | None = None

    @classmethod
    def from_type(cls, output_type: Any) -> OutputSpec:
        if output_type is None or output_type is str:
            return cls(kind="text")
        if isinstance(output_type, type) and issubclass(output_type, BaseModel):
            return cls(kind="model", schema=output_type.model_json_schema(), model=output_type)
        if isinstance(output_type, dict):
            import jsonschema

            try:
                jsonschema.Draft202012Validator.check_schema(output_type)
            except jsonschema.SchemaError as exc:
                raise ConfigurationError(f"output_type is not a valid JSON Schema: {exc.message}") from None
            return cls(kind="schema", schema=output_type)
        raise ConfigurationError(
            f"output_type must be str, a pydantic model class or a JSON Schema dict, not {output_type!r}"
        )

    def parse(self, text: str) -> Any:
        """The validated answer, or `OutputInvalid` with a message fit to show the model."""
        if self.kind == "text":
            return text
        body = _strip_fences(text)
        if self.model is not None:
            try:
                return self.model.model_validate_json(body)
            except ValidationError as exc:
                lines = [f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()[:5]]
                raise OutputInvalid("; ".join(lines)) from None
        try:
            value = json.loads(body)
        except ValueError as exc:
            raise OutputInvalid(f"not valid JSON: {exc}") from None
        from parley.constrained import ValidationFailed
        from parley.constrained.validate import validate_schema_value

        try:
            validate_schema_value(value, self.schema)
        except ValidationFailed as exc:
            raise OutputInvalid(str(exc)) from None
        return value

    def dump(self, value: Any) -> Any:
        """`value` as JSON data (for the RunState)."""
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        return value

    def load(self, data: Any) -> Any:
        """Inverse of `dump`: the output of a completed state, typed again."""
        if self.model is not None and data is not None:
            return self.model.model_validate(data)
        return data

    def repair_prompt(self, detail: str) -> str:
        return (
            f"Your answer did not match the required JSON schema: {detail}. "
            "Reply again with only a JSON value that matches the schema."
        )


def _strip_fences(text: str) -> str:
    """Hosted models sometimes wrap JSON in a Markdown fence even in schema mode; accept that."""
    body = text.strip()
    if body.startswith("```"):
        first_newline = body.find("\n")
        if first_newline != -1 and body.endswith("```"):
            body = body[first_newline + 1 : -3].strip()
    return body
