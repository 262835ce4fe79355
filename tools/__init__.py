"""`parley.tools`: typed tools, argument validation, policies and the executor.

`@tool` turns a typed function into a `Tool` (schema from type hints, descriptions from the
docstring); `validate_arguments` checks a model's argument JSON strictly; `ToolExecutor` runs calls
with timeouts, bounded retries for idempotent tools, at-most-once by call id, and parallelism;
`call_key` is the identity the run loop's repeat rule uses (`parley.tools.repeat`); `SchemaTool` is a
tool given by a JSON Schema and a handler, and `Toolset` a group of tools known only once opened
(an MCP server's).
"""

from parley.tools.arguments import parse_arguments
from parley.tools.context import ToolContext
from parley.tools.docstrings import Docstring, parse_docstring
from parley.tools.errors import (
    RetryableToolError,
    ToolArgumentError,
    ToolDefinitionError,
    ToolError,
)
from parley.tools.executor import ToolExecutor
from parley.tools.policy import ApprovalPredicate, approval_required
from parley.tools.python_tool import python_tool
from parley.tools.repeat import RepeatMode, call_key, canonical_arguments
from parley.tools.schema_tool import SchemaTool, strict_compatible
from parley.tools.tool import Tool, tool
from parley.tools.toolset import Toolset
from parley.tools.types import CommandArgument, RelativePath
from parley.tools.validation import validate_arguments

__all__ = [
    "ApprovalPredicate",
    "CommandArgument",
    "Docstring",
    "RelativePath",
    "RepeatMode",
    "RetryableToolError",
    "SchemaTool",
    "Tool",
    "ToolArgumentError",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolExecutor",
    "Toolset",
    "approval_required",
    "call_key",
    "canonical_arguments",
    "parse_arguments",
    "parse_docstring",
    "python_tool",
    "strict_compatible",
    "tool",
    "validate_arguments",
]
