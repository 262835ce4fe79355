"""parley's error tree, in one place.

Every error parley raises on purpose derives from `ParleyError`; each layer roots its own subtree
in its `errors` module (so the low layers import nothing of the SDK) and this module re-exports
them all::

    ParleyError                         parley._root
    ├── ConfigurationError              parley.errors (a setting the user passed is invalid)
    ├── ProtocolError                   parley.protocol.errors
    │   ├── UnknownRoleError
    │   ├── OrphanToolResultError
    │   ├── InvalidArgumentsError
    │   ├── ParseError
    │   └── DecodeError
    ├── ConstrainedError                parley.constrained.errors
    ├── SandboxError                    parley.sandbox.errors
    ├── ToolError                       parley.tools.errors
    └── EngineError                     parley.local_engine.errors
        ├── ModelNotFoundError
        ├── ModelLoadError
        ├── InvalidRequestError
        ├── AdmissionError
        └── RequestAborted

Control-flow signals (a tool asking for approval, a deferred call) are not errors and do not
derive from `ParleyError`.
"""

from __future__ import annotations

from parley._root import ParleyError
from parley.constrained.errors import ConstrainedError
from parley.local_engine.errors import (
    AdmissionError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    RequestAborted,
)
from parley.protocol.errors import (
    DecodeError,
    InvalidArgumentsError,
    OrphanToolResultError,
    ParseError,
    ProtocolError,
    UnknownRoleError,
)
from parley.sandbox.errors import SandboxError
from parley.tools.errors import ToolError


class ConfigurationError(ParleyError):
    """A setting passed to parley (Agent, Reasoning, CachePolicy, a backend) is invalid."""


__all__ = [
    "AdmissionError",
    "ConfigurationError",
    "ConstrainedError",
    "DecodeError",
    "EngineError",
    "InvalidArgumentsError",
    "InvalidRequestError",
    "ModelLoadError",
    "ModelNotFoundError",
    "OrphanToolResultError",
    "ParleyError",
    "ParseError",
    "ProtocolError",
    "RequestAborted",
    "SandboxError",
    "ToolError",
    "UnknownRoleError",
]
