"""parley's error tree, in one place.

Every error parley raises on purpose derives from `ParleyError`; each layer roots its own subtree
in its `errors` module (so the low layers import nothing of the SDK) and this module re-exports
them all::

    ParleyError                         parley._root
    ├── ConfigurationError              parley.errors (a setting the user passed is invalid)
    ├── AgentError                      parley.errors (the run loop could not finish as asked)
    │   ├── MaxTurnsExceeded            (carries the resumable state)
    │   ├── UsageLimitExceeded          (requests, tokens, tool calls or cost over a UsageLimits cap)
    │   └── OutputValidationError       (structured output still invalid after the repair tries)
    ├── RunStateError                   parley.errors (a RunState cannot be loaded or resolved)
    │   ├── RunStateVersionError        (unknown or newer schema_version)
    │   ├── UnknownCallError            (approve/reject/provide_result on a call that is not pending)
    │   └── ApprovalArgumentsError      (edited arguments fail the tool's schema)
    ├── ScriptError                     parley.errors (a ScriptedBackend/FunctionBackend test double)
    │   ├── ScriptExhaustedError        (the model was called more times than scripted)
    │   └── ScriptMismatchError         (a request did not match the turn's expectation)
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

import typing

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


class AgentError(ParleyError):
    """The agent run could not finish as asked."""


class MaxTurnsExceeded(AgentError):
    """The run needed more model turns than `max_turns`; `state` resumes it (with a higher limit)."""

    def __init__(self, message: str, *, state: typing.Any = None) -> None:
        super().__init__(message)
        self.state = state


class UsageLimitExceeded(AgentError):
    """A `UsageLimits` cap was hit: `limit` names it, `value` is what the run reached, `usage` the ledger."""

    def __init__(self, message: str, *, limit: str, value: typing.Any, usage: typing.Any = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.usage = usage


class OutputValidationError(AgentError):
    """The final answer never matched the output type; `last_attempt` is the model's last text."""

    def __init__(self, message: str, *, last_attempt: str, errors: str, attempts: int) -> None:
        super().__init__(message)
        self.last_attempt = last_attempt
        self.errors = errors
        self.attempts = attempts


class RunStateError(ParleyError):
    """A RunState cannot be loaded, resumed or resolved as asked."""


class RunStateVersionError(RunStateError):
    """The RunState JSON has a schema_version this parley cannot read (unknown or newer)."""


class UnknownCallError(RunStateError):
    """approve/reject/provide_result named a call id that is not pending in this state."""


class ApprovalArgumentsError(RunStateError):
    """Arguments edited at approval time do not satisfy the tool's JSON Schema."""


class ScriptError(ParleyError):
    """A scripted test backend was used in a way its script does not allow."""


class ScriptExhaustedError(ScriptError):
    """The backend was asked for more turns than the script holds."""


class ScriptMismatchError(ScriptError):
    """A request did not match what the scripted turn expected."""


__all__ = [
    "AdmissionError",
    "AgentError",
    "ApprovalArgumentsError",
    "ConfigurationError",
    "ConstrainedError",
    "DecodeError",
    "EngineError",
    "InvalidArgumentsError",
    "InvalidRequestError",
    "MaxTurnsExceeded",
    "ModelLoadError",
    "ModelNotFoundError",
    "OrphanToolResultError",
    "OutputValidationError",
    "ParleyError",
    "ParseError",
    "ProtocolError",
    "RequestAborted",
    "RunStateError",
    "RunStateVersionError",
    "SandboxError",
    "ScriptError",
    "ScriptExhaustedError",
    "ScriptMismatchError",
    "ToolError",
    "UnknownCallError",
    "UnknownRoleError",
    "UsageLimitExceeded",
]
