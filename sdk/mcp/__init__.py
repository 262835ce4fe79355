"""`parley.mcp`: Model Context Protocol toolsets and a server for parley tools (the `mcp` extra).

* `MCPServerStdio` / `MCPServerHTTP`: an MCP server's tools given to an `Agent` beside plain tools,
  under the same policy (approval, deferred, timeouts, retries for idempotent tools, at-most-once
  per call id across pause and resume); see `parley.mcp.toolset`.
* `build_server(tools)`, `serve_stdio(tools)`, `serve_http(tools, ...)` and ``parley mcp serve``:
  parley tools offered to any MCP client; see `parley.mcp.server`.

Importing this package needs nothing beyond parley; connecting or serving needs
``pip install 'parley[mcp]'`` (else `ConfigurationError` says so).
"""

from parley.mcp.errors import MCPConnectionError, MCPToolsetError
from parley.mcp.server import build_server, serve_http, serve_stdio
from parley.mcp.toolset import CALL_ID_META_KEY, MCPServerHTTP, MCPServerStdio, MCPToolset

__all__ = [
    "CALL_ID_META_KEY",
    "MCPConnectionError",
    "MCPServerHTTP",
    "MCPServerStdio",
    "MCPToolset",
    "MCPToolsetError",
    "build_server",
    "serve_http",
    "serve_stdio",
]
