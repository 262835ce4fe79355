"""The root of parley's error tree.

It lives in its own dependency-free module so that every layer (even `protocol`, `sandbox` and
`local_engine`, which import nothing else of ours) can root its errors here. The whole tree is
drawn in `parley.errors`.
"""

from __future__ import annotations


class ParleyError(Exception):
    """Base class of every error parley raises on purpose."""
