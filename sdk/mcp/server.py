"""parley tools as an MCP server, over stdio or Streamable HTTP (``parley mcp serve`` uses this).

    from parley.mcp import serve_stdio
    serve_stdio([get_weather, refund], name="shop")        # or serve_http(..., port=8000)

Every non-deferred tool is listed with its own JSON Schema and description; a ``tools/call`` goes
through `parley.tools.ToolExecutor`, so validation, timeouts, retries of idempotent tools and result
rendering are the same as inside an agent. Following the MCP spec (2025-11-25), arguments that fail
the schema and tools that fail come back as tool results with ``isError: true`` (the model can read
and fix them); an unknown tool name is a JSON-RPC error (``-32602``). Images and documents a tool
returns become ``image`` / embedded-resource blocks.

A call that needs approval (``needs_approval``) is refused with an ``isError`` result: this server
has no human to ask. Pass ``trust_client=True`` when the MCP client runs its own approval step.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from parley.errors import ConfigurationError
from parley.protocol import ToolCall, ToolResult
from parley.protocol.envelope import DocumentPart, ImagePart
from parley.tools import Tool, ToolExecutor, Toolset
from parley.tools import tool as make_tool


def _tools(tools: Sequence[Any]) -> list[Tool]:
    out: list[Tool] = []
    for item in tools:
        if isinstance(item, Toolset):
            raise ConfigurationError(f"{item!r} is a toolset; parley's MCP server serves plain tools")
        out.append(item if isinstance(item, Tool) else make_tool(item))
    return out


def _content(result: ToolResult) -> list[Any]:
    from mcp_types import BlobResourceContents, EmbeddedResource, ImageContent, TextContent

    blocks: list[Any] = [TextContent(text=result.content)] if result.content or not result.attachments else []
    for part in result.attachments:
        if isinstance(part, ImagePart) and part.data is not None:
            blocks.append(ImageContent(data=part.base64(), mime_type=part.media_type or "image/png"))
        elif isinstance(part, DocumentPart) and part.data is not None:
            uri = f"parley://attachment/{part.sha256}"
            blocks.append(
                EmbeddedResource(resource=BlobResourceContents(uri=uri, mime_type=part.media_type, blob=part.base64()))
            )
        else:  # a URL part: name it
            blocks.append(TextContent(text=f"[{part.kind}: {part.url}]"))
    return blocks


def build_server(
    tools: Sequence[Any],
    *,
    name: str = "parley",
    instructions: str | None = None,
    trust_client: bool = False,
    default_timeout_s: float | None = 60.0,
) -> Any:
    """A low-level `mcp.server.lowlevel.Server` offering `tools` (see the module docstring)."""
    try:
        import mcp_types as types
        from mcp.server.lowlevel import Server
        from mcp.shared.exceptions import MCPError
    except ImportError:
        raise ConfigurationError("serving tools over MCP needs the `mcp` package: pip install 'parley[mcp]'") from None

    offered = [t for t in _tools(tools) if not t.deferred]
    executor = ToolExecutor(offered, default_timeout_s=default_timeout_s)
    listing = [types.Tool(name=t.name, description=t.description or None, input_schema=t.parameters) for t in offered]
    counter = itertools.count(1)

    async def on_list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=listing)

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        tool = executor.get(params.name)
        if tool is None:
            known = ", ".join(t.name for t in offered) or "none"
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {params.name!r} (tools: {known})")
        arguments = json.dumps(params.arguments or {}, ensure_ascii=False)
        if not trust_client and tool.needs_approval(arguments):
            text = f"tool {tool.name!r} needs a human's approval for these arguments; this MCP server does not run it"
            return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
        call = ToolCall(id=f"mcp-{next(counter)}", name=tool.name, arguments=arguments)
        [result] = await executor.execute([call])
        return types.CallToolResult(content=_content(result), is_error=result.is_error)

    return Server(name, instructions=instructions, on_list_tools=on_list_tools, on_call_tool=on_call_tool)


async def serve_stdio_async(tools: Sequence[Any], **options: Any) -> None:
    """Serve `tools` over this process's stdin/stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    server = build_server(tools, **options)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_stdio(tools: Sequence[Any], **options: Any) -> None:
    """Blocking `serve_stdio_async` (options: `build_server`'s)."""
    import anyio

    anyio.run(lambda: serve_stdio_async(tools, **options))


def http_app(tools: Sequence[Any], *, path: str = "/mcp", host: str = "127.0.0.1", **options: Any) -> Any:
    """The Streamable HTTP ASGI app (Starlette) serving `tools` at `path`."""
    server = build_server(tools, **options)
    return server.streamable_http_app(streamable_http_path=path, host=host)


def serve_http(
    tools: Sequence[Any],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    path: str = "/mcp",
    log_level: str = "warning",
    **options: Any,
) -> None:
    """Serve `tools` over Streamable HTTP at ``http://HOST:PORT/PATH`` until interrupted."""
    import uvicorn

    app = http_app(tools, path=path, host=host, **options)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
