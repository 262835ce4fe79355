"""`parley.sandbox`: isolated execution of model-written code."""

from parley.sandbox.errors import SandboxError

__all__ = ["SandboxError"]
