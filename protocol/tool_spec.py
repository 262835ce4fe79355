"""`ToolSpec`: what a codec needs to know of a tool (name, description, JSON Schema of arguments)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ToolSpec(BaseModel):
    """A tool as offered to a model. `parameters` is a JSON Schema object (Draft 2020-12)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False
