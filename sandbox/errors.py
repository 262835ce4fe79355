"""Errors of `parley.sandbox`.

Every error carries a stable machine-readable `code` (callers and the tool executor branch on it,
never on message text) and `retryable` (whether trying the same call again may succeed)::

    SandboxError                 code                  retryable
    ├── SandboxUnavailable       "unavailable"         no   no tier meets the policy (or the named tier fails its probe)
    ├── SandboxRequestError      "invalid_request"     no   bad code/argv/files/limits passed by the caller
    ├── SandboxLaunchError       "launch_failed"       yes  the launcher could not start (fork/pipe/tmp exhaustion)
    └── ResultChannelError       "bad_result"          no   the sandbox's result channel broke the framing rules
        └── ArtifactError        "artifact_refused"    no   a file could not be read back safely (symlink, fifo, size)

A run that hits a limit is *not* an error: it returns an `ExecResult` whose `limit` names the limit.
"""

from __future__ import annotations

from parley._root import ParleyError


class SandboxError(ParleyError):
    """Base class of sandbox errors; `code` is stable, `retryable` says whether a retry may help."""

    code: str = "sandbox_error"
    retryable: bool = False

    def __init__(self, message: str, *, code: str | None = None, retryable: bool | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable


class SandboxUnavailable(SandboxError):
    """No isolation tier meets the policy on this machine; `reasons` maps each tier to why it failed."""

    code = "unavailable"

    def __init__(self, message: str, *, reasons: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.reasons: dict[str, str] = dict(reasons or {})


class SandboxRequestError(SandboxError):
    """The caller's request is invalid (empty argv, bad file name, limits out of range)."""

    code = "invalid_request"


class SandboxLaunchError(SandboxError):
    """The sandbox could not be started; usually transient resource exhaustion on the host."""

    code = "launch_failed"
    retryable = True


class ResultChannelError(SandboxError):
    """Data from the sandbox's result channel was rejected (oversized, not strict JSON, wrong nonce)."""

    code = "bad_result"


class ArtifactError(ResultChannelError):
    """A file could not be read out of the work dir safely (symlink, not a regular file, escape, too large)."""

    code = "artifact_refused"
