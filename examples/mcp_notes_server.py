"""A small MCP server (the official `mcp` SDK) that parley agents use as a toolset.

    python examples/mcp_notes_server.py                          # stdio (what MCPServerStdio starts)
    python examples/mcp_notes_server.py --http --port 8765       # Streamable HTTP on 127.0.0.1:8765/mcp

It keeps notes in memory and offers four tools: ``add_note``, ``list_notes``, ``delete_note`` (a
side effect an agent should ask a human about) and ``slow`` (sleeps; for timeouts and kill tests).
With ``--count-file PATH`` every tool execution appends one line ``<tool> <arguments>`` to PATH, so a
test can count how often a call really ran, whatever the client believes. ``--image`` adds
``chart`` (returns a PNG and text), ``--fail`` adds ``broken`` (always raises: an ``isError`` result),
and ``add_tool_later`` adds a tool at run time and tells clients (``notifications/tools/list_changed``).

Needs the ``mcp`` extra: ``pip install 'parley[mcp]'``.
"""

# No `from __future__ import annotations`: the mcp SDK reads the tools' type hints at run time, and
# `Context` is imported inside build_server.
import argparse
import asyncio
import base64
import json
import sys
from typing import Any

# The smallest valid PNG (1x1, transparent), for the image tool.
PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def build_server(count_file: str | None, *, image: bool = False, fail: bool = False) -> Any:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp_types import CallToolResult, ImageContent, TextContent

    server: Any = MCPServer(name="notes")
    notes: dict[str, str] = {}

    def count(tool: str, arguments: dict[str, Any]) -> None:
        if count_file:
            with open(count_file, "a", encoding="utf-8") as handle:
                handle.write(f"{tool} {json.dumps(arguments, sort_keys=True)}\n")
                handle.flush()

    @server.tool()
    def add_note(title: str, text: str) -> str:
        """Store a note under a title."""
        count("add_note", {"title": title, "text": text})
        notes[title] = text
        return f"stored {title!r}"

    @server.tool()
    def list_notes() -> list[str]:
        """The titles of all notes."""
        count("list_notes", {})
        return sorted(notes)

    @server.tool()
    def delete_note(title: str) -> str:
        """Delete a note (cannot be undone)."""
        count("delete_note", {"title": title})
        existed = notes.pop(title, None) is not None
        return f"deleted {title!r}" if existed else f"no note {title!r}"

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleep, then answer (for timeouts and kill tests)."""
        count("slow", {"seconds": seconds})
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    async def add_tool_later(name: str, ctx: Context) -> str:
        """Add a tool called NAME at run time (clients are told the list changed)."""
        count("add_tool_later", {"name": name})

        def echo(text: str) -> str:
            return text

        server.add_tool(echo, name=name, description=f"Echo (added at run time as {name}).")
        await ctx.session.send_tool_list_changed()
        return f"added {name}"

    if image:

        @server.tool()
        def chart() -> CallToolResult:
            """A chart of the notes (an image and a caption)."""
            count("chart", {})
            picture = ImageContent(data=base64.b64encode(PNG_1X1).decode(), mime_type="image/png")
            return CallToolResult(content=[TextContent(text=f"{len(notes)} notes"), picture])

    if fail:

        @server.tool()
        def broken() -> str:
            """Always fails."""
            count("broken", {})
            raise RuntimeError("the disk is on fire")

    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count-file", default=None, help="append one line per tool execution to this file")
    parser.add_argument("--http", action="store_true", help="serve Streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--image", action="store_true", help="add the chart tool (returns an image)")
    parser.add_argument("--fail", action="store_true", help="add the broken tool (always an error result)")
    args = parser.parse_args(argv)
    server = build_server(args.count_file, image=args.image, fail=args.fail)
    if args.http:
        server.settings.log_level = "WARNING"
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
