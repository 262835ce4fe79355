"""Errors of `parley.mcp` (importable without the `mcp` package).

    ToolError
    └── MCPToolsetError         an MCP toolset cannot be used as configured
        └── MCPConnectionError  the server could not be started or reached, or it stopped (mid-call too)
"""

from __future__ import annotations

from parley.tools.errors import ToolError


class MCPToolsetError(ToolError):
    """An MCP toolset cannot be used as configured (bad options, a tool that cannot be offered)."""


class MCPConnectionError(MCPToolsetError):
    """The MCP server could not be started or reached, or it went away (also in the middle of a call).

    `server` names the toolset; `stderr` holds the last lines a stdio server wrote to its stderr
    (kept off the message, which a model may read). Raised from a tool call it becomes the call's error
    result, unless the toolset says ``on_server_error="raise"`` (`abort_run`): then the run stops with it.
    """

    def __init__(self, message: str, *, server: str = "", stderr: str = "", abort_run: bool = False) -> None:
        super().__init__(message)
        self.server = server
        self.stderr = stderr
        self.abort_run = abort_run
