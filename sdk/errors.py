"""parley's error tree, in one place.

Every error parley raises on purpose derives from `ParleyError`; each layer roots its own subtree
in its `errors` module (so the low layers import nothing of the SDK) and this module re-exports
them all (the hosted-backend and server errors lazily, so `import parley` stays light).
`tests/test_error_tree.py` fails when a `ParleyError` subclass is missing from this drawing::

    ParleyError                         parley._root
    ├── ConfigurationError              parley.errors: a setting the user passed is invalid
    │   ├── ReasoningSettingError       parley.backends.errors: the chosen model rejects a reasoning setting
    │   └── LocalRequestError           parley.backends.errors: a request the local engine cannot run (field, code)
    ├── AgentError                      parley.errors: the run loop could not finish as asked
    │   ├── MaxTurnsExceeded            carries the resumable state
    │   ├── UsageLimitExceeded          requests, tokens, tool calls or cost over a UsageLimits cap
    │   ├── OutputValidationError       structured output still invalid after the repair tries
    │   ├── GuardrailTripped            a guardrail stopped the run (guardrail, kind, output)
    │   ├── HookError                   a RunHooks method raised (hook names it; the cause is chained)
    │   ├── HistoryProcessorError       a history processor broke call/result adjacency or the open batch (names it)
    │   ├── CompactionError             compaction could not summarise (the summariser gave no text)
    │   └── CallInProgressError         another resume holds the ledger claim on a call (run_id, call_id)
    ├── RunStateError                   parley.errors: a RunState cannot be loaded or resolved
    │   ├── RunStateVersionError        unknown or newer schema_version
    │   ├── UnknownCallError            approve/reject/provide_result on a call that is not pending
    │   ├── RunStateMismatchError       resumed by an agent other than its own (differences names them)
    │   └── ApprovalArgumentsError      edited arguments fail the tool's schema
    ├── ScriptError                     parley.errors: a ScriptedBackend/FunctionBackend test double
    │   ├── ScriptExhaustedError        the model was called more times than scripted
    │   └── ScriptMismatchError         a request did not match the turn's expectation
    ├── ModelAPIError                   parley.backends.errors (status_code, request_id, retryable)
    │   ├── BadRequestError             400/404/413/422, never retried
    │   ├── AuthenticationError         401/403
    │   ├── RateLimitError              429, honours retry-after
    │   ├── OverloadedError             529/503
    │   ├── ServerError                 other 5xx
    │   ├── APIConnectionError          no HTTP answer
    │   ├── StreamError                 the stream broke after it started
    │   │   ├── StreamInterruptedError
    │   │   └── MalformedStreamError
    │   └── AllBackendsFailed           every backend of a FallbackBackend failed (errors: each one's)
    ├── SessionStoreError               parley.sessions.errors: a store failed (store, operation, retryable, state)
    │   ├── SessionBusyError            locked by another writer past the timeout (retryable)
    │   ├── SessionCorruptError         an empty, foreign or damaged database file
    │   ├── SessionReadOnlyError        a write on a read-only file, connection or server
    │   └── SessionUnavailableError     cannot be opened or reached (retryable)
    ├── ServeError                      parley.server.errors
    │   └── ApiError                    an HTTP error in the endpoint's documented shape
    ├── ProtocolError                   parley.protocol.errors
    │   ├── UnknownRoleError
    │   ├── OrphanToolResultError
    │   ├── InvalidArgumentsError
    │   ├── ParseError
    │   ├── DecodeError
    │   ├── EncodeError                 special-token text where special tokens are disallowed
    │   ├── UnencodableTextError        text the tokenizer cannot encode (lone surrogate...); names where
    │   ├── CodecConfigError            (also ValueError) a codec lacks a tokenizer, template or style
    │   ├── VocabularyUnavailableError  a local vocabulary file is missing (never downloaded)
    │   ├── UnsupportedPartError        a part the codec or model cannot carry (an image, text-only model); names it
    │   ├── MissingBlobError            media bytes stored by hash are not at hand (no blob store given); names the hash
    │   ├── BlobIntegrityError          media bytes do not match their recorded sha256
    │   └── StrictJsonError             untrusted JSON refused (duplicate keys, NaN, too deep...)
    ├── ConstrainedError                parley.constrained.errors
    │   ├── InvalidSpecError
    │   │   ├── InvalidSchemaError
    │   │   │   ├── UnresolvableRefError
    │   │   │   └── UnsupportedDraftError
    │   │   ├── InvalidRegexError
    │   │   └── GrammarSyntaxError
    │   ├── UnsupportedSpecError
    │   ├── CompileLimitError
    │   ├── BackendUnavailableError
    │   └── ValidationFailed            names the path and keyword
    │       └── ValidationUndecided     a lookaround pattern not decided in time
    ├── SandboxError                    parley.sandbox.errors (code, retryable)
    │   ├── SandboxUnavailable          "unavailable"
    │   ├── SandboxRequestError         "invalid_request"
    │   ├── SandboxLaunchError          "launch_failed", retryable
    │   └── ResultChannelError          "bad_result"
    │       └── ArtifactError           "artifact_refused"
    ├── ToolError                       parley.tools.errors
    │   ├── ToolDefinitionError
    │   ├── ToolArgumentError           (code says why)
    │   ├── RetryableToolError
    │   └── MCPToolsetError             parley.mcp.errors: an MCP toolset cannot be used as configured
    │       └── MCPConnectionError      the server could not be started or reached, or stopped (mid-call too)
    └── EngineError                     parley.local_engine.errors
        ├── ModelNotFoundError
        ├── ModelLoadError              unreadable files, unsupported architecture or config field
        ├── EngineConfigError           (also ValueError) a bad EngineConfig field, device or dtype
        ├── InvalidRequestError
        ├── AdmissionError              (retry_after_s) refused at arrival
        │   ├── QueueFullError          the waiting queue is full (the server's 429)
        │   └── DeadlineUnreachableError the deadline cannot be met or has passed (the server's 503)
        └── RequestAborted

Control-flow signals (a tool asking for approval, a deferred call) are not errors and do not
derive from `ParleyError`.
"""

from __future__ import annotations

import importlib as _importlib
import typing

from parley._root import ParleyError
from parley.constrained.errors import (
    BackendUnavailableError,
    CompileLimitError,
    ConstrainedError,
    GrammarSyntaxError,
    InvalidRegexError,
    InvalidSchemaError,
    InvalidSpecError,
    UnresolvableRefError,
    UnsupportedDraftError,
    UnsupportedSpecError,
    ValidationFailed,
    ValidationUndecided,
)
from parley.local_engine.errors import (
    AdmissionError,
    DeadlineUnreachableError,
    EngineConfigError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    QueueFullError,
    RequestAborted,
)
from parley.protocol.errors import (
    BlobIntegrityError,
    CodecConfigError,
    DecodeError,
    EncodeError,
    InvalidArgumentsError,
    MissingBlobError,
    OrphanToolResultError,
    ParseError,
    ProtocolError,
    UnencodableTextError,
    UnknownRoleError,
    UnsupportedPartError,
    VocabularyUnavailableError,
)
from parley.protocol.strict_json import StrictJsonError
from parley.sandbox.errors import (
    ArtifactError,
    ResultChannelError,
    SandboxError,
    SandboxLaunchError,
    SandboxRequestError,
    SandboxUnavailable,
)
from parley.tools.errors import RetryableToolError, ToolArgumentError, ToolDefinitionError, ToolError

if typing.TYPE_CHECKING:
    from parley.backends.errors import (
        AllBackendsFailed,
        APIConnectionError,
        AuthenticationError,
        BadRequestError,
        LocalRequestError,
        MalformedStreamError,
        ModelAPIError,
        OverloadedError,
        RateLimitError,
        ReasoningSettingError,
        ServerError,
        StreamError,
        StreamInterruptedError,
    )
    from parley.mcp.errors import MCPConnectionError, MCPToolsetError
    from parley.server.errors import ApiError, ServeError
    from parley.sessions.errors import (
        SessionBusyError,
        SessionCorruptError,
        SessionReadOnlyError,
        SessionStoreError,
        SessionUnavailableError,
    )


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


class GuardrailTripped(AgentError):
    """A guardrail stopped the run: `guardrail` names it, `kind` says which (``input``, ``output``,
    ``tool_input``, ``tool_output``), `output` is what the guardrail returned, `call_id` the tool call
    a tool guardrail looked at, `state` the run state when it tripped (its usage included)."""

    def __init__(
        self,
        message: str,
        *,
        guardrail: str,
        kind: str,
        output: typing.Any = None,
        call_id: str | None = None,
        state: typing.Any = None,
    ) -> None:
        super().__init__(message)
        self.guardrail = guardrail
        self.kind = kind
        self.output = output
        self.call_id = call_id
        self.state = state


class HookError(AgentError):
    """A `RunHooks` method raised: `hook` names it (e.g. ``before_model_request``); the error is chained."""

    def __init__(self, message: str, *, hook: str) -> None:
        super().__init__(message)
        self.hook = hook


class HistoryProcessorError(AgentError):
    """A history processor (`Agent(history_processors=...)`) returned a history that cannot be sent:
    a tool result without its call, a call without its result, the open batch of the current turn
    cut, or not a list of messages. `processor` names it; `call_ids` are the calls concerned."""

    def __init__(self, message: str, *, processor: str, call_ids: typing.Sequence[str] = ()) -> None:
        super().__init__(message)
        self.processor = processor
        self.call_ids = list(call_ids)


class CompactionError(AgentError):
    """Compaction (`parley.compaction.Compaction`) could not summarise the older messages."""


class CallInProgressError(AgentError):
    """Another resume of the same run holds the execution ledger's claim on this call and has not
    recorded its result (yet): running it here too could do its side effect twice (`parley.ledger`)."""

    def __init__(self, message: str, *, run_id: str, call_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.call_id = call_id


class RunStateError(ParleyError):
    """A RunState cannot be loaded, resumed or resolved as asked."""


class RunStateVersionError(RunStateError):
    """The RunState JSON has a schema_version this parley cannot read (unknown or newer)."""


class UnknownCallError(RunStateError):
    """approve/reject/provide_result named a call id that is not pending in this state."""


class RunStateMismatchError(RunStateError):
    """The state was saved by another agent (name, tools and their argument schemas, output schema,
    child agents differ): resuming it could run this agent's tool on an approval given for another's.
    `differences` lists each one, in words (`parley.fingerprint`)."""

    def __init__(self, message: str, *, differences: list[str]) -> None:
        super().__init__(message)
        self.differences = differences


class ApprovalArgumentsError(RunStateError):
    """Arguments edited at approval time do not satisfy the tool's JSON Schema."""


class ScriptError(ParleyError):
    """A scripted test backend was used in a way its script does not allow."""


class ScriptExhaustedError(ScriptError):
    """The backend was asked for more turns than the script holds."""


class ScriptMismatchError(ScriptError):
    """A request did not match what the scripted turn expected."""



# Defined in modules that import this one (or pull in heavy dependencies): resolved on first use.
_LAZY = {
    "APIConnectionError": "parley.backends.errors",
    "AllBackendsFailed": "parley.backends.errors",
    "ApiError": "parley.server.errors",
    "AuthenticationError": "parley.backends.errors",
    "BadRequestError": "parley.backends.errors",
    "LocalRequestError": "parley.backends.errors",
    "MCPConnectionError": "parley.mcp.errors",
    "MCPToolsetError": "parley.mcp.errors",
    "MalformedStreamError": "parley.backends.errors",
    "ModelAPIError": "parley.backends.errors",
    "OverloadedError": "parley.backends.errors",
    "RateLimitError": "parley.backends.errors",
    "ReasoningSettingError": "parley.backends.errors",
    "ServeError": "parley.server.errors",
    "ServerError": "parley.backends.errors",
    "SessionBusyError": "parley.sessions.errors",
    "SessionCorruptError": "parley.sessions.errors",
    "SessionReadOnlyError": "parley.sessions.errors",
    "SessionStoreError": "parley.sessions.errors",
    "SessionUnavailableError": "parley.sessions.errors",
    "StreamError": "parley.backends.errors",
    "StreamInterruptedError": "parley.backends.errors",
}


def __getattr__(name: str) -> typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'parley.errors' has no attribute {name!r}")
    return getattr(_importlib.import_module(module), name)


__all__ = [
    "APIConnectionError",
    "AdmissionError",
    "AgentError",
    "AllBackendsFailed",
    "ApiError",
    "ApprovalArgumentsError",
    "ArtifactError",
    "AuthenticationError",
    "BackendUnavailableError",
    "BadRequestError",
    "BlobIntegrityError",
    "CallInProgressError",
    "CodecConfigError",
    "CompactionError",
    "CompileLimitError",
    "ConfigurationError",
    "ConstrainedError",
    "DeadlineUnreachableError",
    "DecodeError",
    "EncodeError",
    "EngineConfigError",
    "EngineError",
    "GrammarSyntaxError",
    "GuardrailTripped",
    "HistoryProcessorError",
    "HookError",
    "InvalidArgumentsError",
    "InvalidRegexError",
    "InvalidRequestError",
    "InvalidSchemaError",
    "InvalidSpecError",
    "LocalRequestError",
    "MCPConnectionError",
    "MCPToolsetError",
    "MalformedStreamError",
    "MaxTurnsExceeded",
    "MissingBlobError",
    "ModelAPIError",
    "ModelLoadError",
    "ModelNotFoundError",
    "OrphanToolResultError",
    "OutputValidationError",
    "OverloadedError",
    "ParleyError",
    "ParseError",
    "ProtocolError",
    "QueueFullError",
    "RateLimitError",
    "ReasoningSettingError",
    "RequestAborted",
    "ResultChannelError",
    "RetryableToolError",
    "RunStateError",
    "RunStateMismatchError",
    "RunStateVersionError",
    "SandboxError",
    "SandboxLaunchError",
    "SandboxRequestError",
    "SandboxUnavailable",
    "ScriptError",
    "ScriptExhaustedError",
    "ScriptMismatchError",
    "ServeError",
    "ServerError",
    "SessionBusyError",
    "SessionCorruptError",
    "SessionReadOnlyError",
    "SessionStoreError",
    "SessionUnavailableError",
    "StreamError",
    "StreamInterruptedError",
    "StrictJsonError",
    "ToolArgumentError",
    "ToolDefinitionError",
    "ToolError",
    "UnencodableTextError",
    "UnknownCallError",
    "UnknownRoleError",
    "UnresolvableRefError",
    "UnsupportedDraftError",
    "UnsupportedPartError",
    "UnsupportedSpecError",
    "UsageLimitExceeded",
    "ValidationFailed",
    "ValidationUndecided",
    "VocabularyUnavailableError",
]
