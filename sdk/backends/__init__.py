"""Backends: local engine, hosted providers, scripted test doubles.

The hosted backends are imported lazily (``anthropic`` is a heavy, optional dependency).
"""

import importlib
import typing

from parley.backends.base import (
    Backend,
    BackendCapabilities,
    ModelRequest,
    ModelResponse,
    NamedToolChoice,
    NativeCompaction,
    SamplingSettings,
    ToolChoice,
)
from parley.backends.fallback import FallbackBackend
from parley.backends.local import LocalBackend
from parley.backends.scripted import FunctionBackend, ScriptedBackend, ScriptedTurn

__all__ = [
    "AnthropicBackend",
    "Backend",
    "BackendCapabilities",
    "FallbackBackend",
    "FunctionBackend",
    "LocalBackend",
    "ModelRequest",
    "ModelResponse",
    "NamedToolChoice",
    "NativeCompaction",
    "OpenAIBackend",
    "SamplingSettings",
    "ScriptedBackend",
    "ScriptedTurn",
    "ToolChoice",
]

if typing.TYPE_CHECKING:
    from parley.backends.anthropic import AnthropicBackend
    from parley.backends.openai import OpenAIBackend

_LAZY = {"AnthropicBackend": "parley.backends.anthropic", "OpenAIBackend": "parley.backends.openai"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'parley.backends' has no attribute {name!r}")
