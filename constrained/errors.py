"""Errors of `parley.constrained`."""

from __future__ import annotations

from parley._root import ParleyError


class ConstrainedError(ParleyError):
    """Base class of constrained-decoding errors."""
