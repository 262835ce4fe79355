"""Errors of `parley.tools`."""

from __future__ import annotations

from parley._root import ParleyError


class ToolError(ParleyError):
    """Base class of tool errors."""
