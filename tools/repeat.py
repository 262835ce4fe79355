"""The repeat rule: what happens when a model calls a tool again with the same arguments.

Small models loop: having called ``send_report(to=..., text=...)`` and read "sent", they call it
again, identically, turn after turn. A run therefore remembers every call it settled (ran, or
answered by a person's rejection or an outside result) under a key made of the tool name and the
*canonical* arguments — the parsed JSON re-serialised with sorted keys, so ``{"a":1,"b":2}`` and
``{ "b": 2, "a": 1 }`` are the same call. A later call with the same key is handled by the tool's
``on_repeat`` option:

* ``"reuse"`` — not run again and not sent for approval again: the model gets the recorded result,
  marked as a repeat (the default for tools with side effects, i.e. not ``idempotent``);
* ``"allow"`` — run it again like any call (the default for ``idempotent=True`` tools: running
  twice is harmless and the answer may change, e.g. polling a job's status);
* ``"error"`` — not run: the model gets an error result saying the call was already made.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal, TypeAlias

from parley.tools.errors import ToolDefinitionError

RepeatMode: TypeAlias = Literal["reuse", "allow", "error"]
REPEAT_MODES: tuple[str, ...] = ("reuse", "allow", "error")


def check_repeat_option(value: Any, *, idempotent: bool, tool: str) -> RepeatMode:
    """Resolve `on_repeat` (None picks the default from `idempotent`); anything else is a definition error."""
    if value is None:
        return "allow" if idempotent else "reuse"
    if isinstance(value, str) and value in REPEAT_MODES:
        return value  # type: ignore[return-value]
    raise ToolDefinitionError(f"tool {tool!r}: on_repeat must be one of {', '.join(REPEAT_MODES)}, not {value!r}")


def canonical_arguments(arguments: str) -> str:
    """The argument JSON re-serialised with sorted keys and no spaces; text that is not JSON is kept as is."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):  # pragma: no cover - what json.loads built, json.dumps writes
        return arguments


@functools.lru_cache(maxsize=512)  # a call's key is needed when it is planned and again when it is recorded
def call_key(tool_name: str, arguments: str) -> str:
    """The identity of a call for the repeat rule: tool name plus canonical arguments."""
    return f"{tool_name}\n{canonical_arguments(arguments)}"
