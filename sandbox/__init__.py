"""`parley.sandbox`: isolated execution of model-written code and commands.

    sandbox = Sandbox.detect()                    # bwrap, else Landlock+seccomp, else SandboxUnavailable
    result = await sandbox.run_python("print(1)", timeout_s=5, memory_mb=256)
    result = sandbox.run_python_sync("2 + 2")     # result.value == 4
    result = await sandbox.run(["ls", "-la"], files={"a.txt": b"hi"})

In-process Python "sandboxes" are not security boundaries; every tier here is an OS boundary in a fresh
child process per call. See `parley.sandbox.bwrap` and `parley.sandbox.landlock` for the policies.
"""

from parley.sandbox.detect import Interpreter, Tier
from parley.sandbox.errors import (
    ArtifactError,
    ResultChannelError,
    SandboxError,
    SandboxLaunchError,
    SandboxRequestError,
    SandboxUnavailable,
)
from parley.sandbox.limits import LimitName, Limits
from parley.sandbox.result import ExecResult, sanitize_text
from parley.sandbox.sandbox import Sandbox

__all__ = [
    "ArtifactError",
    "ExecResult",
    "Interpreter",
    "LimitName",
    "Limits",
    "ResultChannelError",
    "Sandbox",
    "SandboxError",
    "SandboxLaunchError",
    "SandboxRequestError",
    "SandboxUnavailable",
    "Tier",
    "sanitize_text",
]
