"""`parley.constrained`: grammar specs compiled to token-mask matchers."""

from parley.constrained.errors import ConstrainedError

__all__ = ["ConstrainedError"]
