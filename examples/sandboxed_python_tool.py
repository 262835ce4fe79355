"""Model-written Python, run in a real OS sandbox through the ready-made `python` tool.

    python examples/sandboxed_python_tool.py

`python_tool()` is a tool like any other, except that its body never `exec`s anything in this
process: each call starts a fresh interpreter inside `parley.sandbox` (bubblewrap, or Landlock +
seccomp where user namespaces are off) with no network, no host files and CPU/memory/wall limits.
The model reads back plain text: the exit status, the final expression's value, stdout, stderr.

The "model" is a `FunctionBackend`, so the example needs no weights: it writes one snippet that
computes something and also tries to read this very script from the host disk, then reports what
the sandbox said. Without a working sandbox (`Sandbox.detect()` raises `SandboxUnavailable`) the
tool answers with an error instead of falling back to running the code unsandboxed.
"""

from __future__ import annotations

import asyncio
import json

from parley import Agent, ToolCall
from parley.backends import FunctionBackend, ModelRequest, ScriptedTurn
from parley.tools import python_tool

HOST_FILE = __file__  # exists on the host; the sandbox must not be able to read it

CODE = f"""
import math

try:
    open({HOST_FILE!r}).read()
    print("host file: readable")
except OSError as exc:
    print("host file: blocked", type(exc).__name__)

math.factorial(20)  # the final expression's value comes back as "result:"
"""


def model(request: ModelRequest) -> ScriptedTurn | str:
    """A stand-in model: write code for the `python` tool, then answer from its output."""
    results = [r for m in request.conversation for r in m.tool_results]
    if not results:
        code_call = ToolCall(id="py1", name="python", arguments=json.dumps({"code": CODE}))
        return ScriptedTurn(text="Let me compute that.", tool_calls=[code_call])
    return f"The sandbox said:\n{results[-1].content}"


async def main() -> None:
    agent = Agent(
        FunctionBackend(model),
        instructions="Use the python tool for arithmetic.",
        # timeout_s and memory_mb are enforced by the sandbox (the process group is killed).
        tools=[python_tool(timeout_s=10, memory_mb=256)],
    )
    result = await agent.run("What is 20 factorial?")
    print(result.output)
    print(f"model requests: {result.usage.requests}")


if __name__ == "__main__":
    asyncio.run(main())
