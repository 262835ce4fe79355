"""SchemaTool: a tool given by a JSON Schema and a handler, under the usual policy; strict detection."""

from __future__ import annotations

from typing import Any

import pytest

from parley.protocol import ToolCall
from parley.tools import SchemaTool, ToolArgumentError, ToolDefinitionError, ToolExecutor, strict_compatible

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "minLength": 1}, "force": {"type": "boolean"}},
    "required": ["path"],
}


async def _delete(arguments: dict[str, Any], context: Any) -> str:
    return f"deleted {arguments['path']} (call {context.call_id if context else '-'})"


def test_validation_uses_the_schema_and_strict_json() -> None:
    tool = SchemaTool("delete", _delete, parameters=SCHEMA, description="Delete a file.")
    assert tool.validate_arguments('{"path": "a.txt"}') == {"path": "a.txt"}
    with pytest.raises(ToolArgumentError) as missing:
        tool.validate_arguments('{"force": "yes"}')
    assert "path" in str(missing.value) and "force" in str(missing.value) and missing.value.code == "schema"
    with pytest.raises(ToolArgumentError) as duplicate:
        tool.validate_arguments('{"path": "a", "path": "b"}')
    assert duplicate.value.code == "duplicate_key"
    assert tool.spec.parameters == SCHEMA and tool.spec.description == "Delete a file." and not tool.spec.strict


def test_policy_options_apply() -> None:
    tool = SchemaTool("delete", _delete, parameters=SCHEMA, needs_approval=lambda args: args.get("force") is True)
    assert tool.needs_approval('{"path": "a", "force": true}')
    assert not tool.needs_approval('{"path": "a"}')
    assert tool.needs_approval('{"force": true}')  # invalid arguments: fail closed
    with pytest.raises(ToolDefinitionError):
        SchemaTool("delete", _delete, parameters=SCHEMA, retries=2)  # retries need idempotent
    with pytest.raises(ToolDefinitionError):
        SchemaTool("delete", _delete, parameters={"type": "array"})
    with pytest.raises(ToolDefinitionError):
        SchemaTool("delete", _delete, parameters={"type": "object", "properties": {"a": {"type": 3}}})


async def test_the_executor_runs_it_with_the_call_context() -> None:
    tool = SchemaTool("delete", _delete, parameters=SCHEMA)
    [result] = await ToolExecutor([tool]).execute([ToolCall(id="c7", name="delete", arguments='{"path": "x"}')])
    assert result.content == "deleted x (call c7)" and not result.is_error


def test_strict_compatible() -> None:
    closed = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    assert strict_compatible(closed)
    assert not strict_compatible(SCHEMA)
    nested = {**closed, "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}
    assert not strict_compatible(nested)
    assert SchemaTool("t", _delete, parameters=closed).spec.strict
