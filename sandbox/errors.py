"""Errors of `parley.sandbox`."""

from __future__ import annotations

from parley._root import ParleyError


class SandboxError(ParleyError):
    """Base class of sandbox errors."""
