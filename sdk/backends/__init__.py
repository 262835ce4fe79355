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

__all__ = [
    "Backend",
    "BackendCapabilities",
    "ModelRequest",
    "ModelResponse",
    "NamedToolChoice",
    "SamplingSettings",
    "ToolChoice",
]
