"""`parley.tools`: typed tools, argument validation, policies and the executor."""

from parley.tools.errors import ToolError

__all__ = ["ToolError"]
