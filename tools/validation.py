"""`validate_arguments`: the one check every tool call passes before anything runs."""

from __future__ import annotations

from typing import Any

from parley.tools.tool import Tool


def validate_arguments(tool: Tool, arguments_json: str | bytes) -> dict[str, Any]:
    """Parse `arguments_json` strictly and validate it against `tool`'s schema.

    Returns the keyword arguments by parameter name (the context parameter excluded). Raises
    `ToolArgumentError` whose `code` says why (`too_large`, `not_json`, `duplicate_key`,
    `non_finite_number`, `too_deep`, `not_object`, `invalid_string`, `schema`) and whose message is safe
    to return to the model.
    """
    return tool.validate_arguments(arguments_json)
