"""`parley serve`: OpenAI- and Anthropic-compatible HTTP server over the local engine.

Exports resolve lazily so `import parley.server` stays light (starlette and uvicorn load on use).
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

_EXPORTS = {
    "ApiError": "parley.server.errors",
    "BackgroundServer": "parley.server.runner",
    "EnginePort": "parley.backends.local.engine_port",
    "ServerConfig": "parley.server.config",
    "ServeError": "parley.server.errors",
    "TenantRegistry": "parley.server.tenants",
    "add_serve_command": "parley.server.cli",
    "cache_salt": "parley.server.tenants",
    "create_app": "parley.server.app",
    "serve_main": "parley.server.cli",
}

__all__ = [
    "ApiError",
    "BackgroundServer",
    "EnginePort",
    "ServeError",
    "ServerConfig",
    "TenantRegistry",
    "add_serve_command",
    "cache_salt",
    "create_app",
    "serve_main",
]


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'parley.server' has no attribute {name!r}")
    return getattr(_importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
