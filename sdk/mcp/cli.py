"""`parley mcp serve`: parley tools offered to MCP clients (wired into `parley.cli` by `add_mcp_command`).

    parley mcp serve myapp.tools:TOOLS                      # stdio (an MCP client starts this command)
    parley mcp serve myapp.tools:lookup myapp.tools:refund --http --port 8765
    parley mcp serve ./tools.py:TOOLS --name shop --trust-client

Each TARGET is ``module:attribute`` or ``path/to/file.py:attribute``; the attribute is a `Tool`, a
plain function (made a tool with the defaults), a list or tuple of those, or an `Agent` (its plain
tools). Over stdio nothing but the protocol is written to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from parley.errors import ConfigurationError, ParleyError


def load_target(target: str) -> list[Any]:
    """The tools named by one ``module:attribute`` or ``file.py:attribute`` target."""
    where, sep, attribute = target.rpartition(":")
    if not sep or not where or not attribute:
        raise ConfigurationError(f"{target!r}: name the tools as MODULE:ATTRIBUTE or FILE.py:ATTRIBUTE")
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise ConfigurationError(f"{target!r}: no file {where}")
        spec = importlib.util.spec_from_file_location(f"_parley_mcp_{path.stem}", path)
        if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a loader
            raise ConfigurationError(f"{target!r}: cannot import {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ConfigurationError(f"{target!r}: cannot import {where}: {exc}") from None
    try:
        value = getattr(module, attribute)
    except AttributeError:
        raise ConfigurationError(f"{target!r}: {where} has no attribute {attribute!r}") from None
    from parley.agent import Agent

    if isinstance(value, Agent):
        return list(value.tools)
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def add_mcp_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``mcp serve`` on the `parley` CLI's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser("mcp", help="Model Context Protocol: serve parley tools")
    mcp_sub = parser.add_subparsers(dest="mcp_command", required=True)
    serve = mcp_sub.add_parser(
        "serve",
        help="offer parley tools to MCP clients over stdio or Streamable HTTP",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("targets", nargs="+", metavar="TARGET", help="MODULE:ATTRIBUTE or FILE.py:ATTRIBUTE")
    serve.add_argument("--http", action="store_true", help="serve Streamable HTTP instead of stdio")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind with --http (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--path", default="/mcp", help="the endpoint's path with --http (default /mcp)")
    serve.add_argument("--name", default="parley", help="the server name clients see")
    serve.add_argument("--timeout", type=float, default=60.0, help="default seconds per tool call")
    serve.add_argument(
        "--trust-client",
        action="store_true",
        help="run calls that need approval (the client asks its user); otherwise they are refused",
    )
    serve.set_defaults(func=serve_main)
    return serve


def serve_main(args: argparse.Namespace) -> int:
    from parley.mcp.server import serve_http, serve_stdio

    try:
        tools = [tool for target in args.targets for tool in load_target(target)]
    except ParleyError as exc:
        print(f"parley mcp serve: {exc}", file=sys.stderr)
        return 2
    options: dict[str, Any] = {
        "name": args.name,
        "trust_client": args.trust_client,
        "default_timeout_s": args.timeout,
    }
    try:
        if args.http:
            where = f"http://{args.host}:{args.port}{args.path}"
            print(f"parley mcp serve: {len(tools)} tool(s) at {where}", file=sys.stderr)
            serve_http(tools, host=args.host, port=args.port, path=args.path, **options)
        else:
            serve_stdio(tools, **options)
    except ParleyError as exc:
        print(f"parley mcp serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
