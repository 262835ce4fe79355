"""Backends: local engine, hosted providers, scripted test doubles."""

from parley.backends.base import (
    Backend,
    BackendCapabilities,
    ModelRequest,
    ModelResponse,
    NamedToolChoice,
    SamplingSettings,
    ToolChoice,
)
from parley.backends.local import LocalBackend
from parley.backends.scripted import FunctionBackend, ScriptedBackend, ScriptedTurn

__all__ = [
    "Backend",
    "BackendCapabilities",
    "FunctionBackend",
    "LocalBackend",
    "ModelRequest",
    "ModelResponse",
    "NamedToolChoice",
    "SamplingSettings",
    "ScriptedBackend",
    "ScriptedTurn",
    "ToolChoice",
]
