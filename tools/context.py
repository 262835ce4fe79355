"""`ToolContext`: what a tool may know about the run that called it.

A tool asks for it by annotating a parameter with `ToolContext` (any name); the executor injects it
and the parameter never appears in the schema the model sees, so the model cannot forge it.
`ToolContext[Deps]` types `deps` as the agent's dependency type (``Agent(deps_type=Deps)``), so a
type checker sees ``ctx.deps.db`` for what it is; a bare `ToolContext` is ``ToolContext[Any]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic

from typing_extensions import TypeVar

DepsT = TypeVar("DepsT", default=Any)


@dataclass(frozen=True)
class ToolContext(Generic[DepsT]):
    """Run facts passed to a tool: the call being served, the tenant, and caller-provided metadata.

    `deps` is the caller's dependency object (a database handle, an HTTP client...), passed through
    untouched. `attempt` counts from 1 and grows when an idempotent tool is retried.
    """

    call_id: str = ""
    tool_name: str = ""
    tenant: str | None = None
    run_id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    deps: DepsT = None  # type: ignore[assignment]  # None when the run was given no deps
    attempt: int = 1

    def for_call(self, call_id: str, tool_name: str, *, attempt: int = 1) -> ToolContext[DepsT]:
        """A copy addressed to one call (the executor builds one per call and attempt)."""
        return replace(self, call_id=call_id, tool_name=tool_name, attempt=attempt)
