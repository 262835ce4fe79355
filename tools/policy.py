"""Approval policy: whether a tool call must wait for a human before it runs.

A tool's `needs_approval` option is a bool or a predicate on the call's validated arguments. The
predicate *fails closed*: every way of not getting a clean `False` means "ask a human" — arguments
that are malformed (not JSON, NaN, not an object, duplicate keys), arguments the schema rejects, a
predicate that raises, one that returns anything but a bool, or one that is async (the decision is
synchronous here; an awaitable result is closed and treated as "approve first"). This mirrors the
OpenAI Agents SDK's rule that approval predicates fail closed on malformed or non-object arguments.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from parley.tools.errors import ToolArgumentError

if TYPE_CHECKING:
    from parley.tools.tool import Tool

ApprovalPredicate: TypeAlias = Callable[[Mapping[str, Any]], bool]
"""Called with the validated arguments (parameter name -> value); `True` means "ask a human first"."""

NeedsApproval: TypeAlias = bool | ApprovalPredicate


def check_approval_option(value: Any, *, tool: str) -> NeedsApproval:
    """Accept a bool or a callable for `needs_approval`; anything else is a definition error."""
    from parley.tools.errors import ToolDefinitionError

    if isinstance(value, bool) or callable(value):
        return value  # type: ignore[no-any-return]
    raise ToolDefinitionError(
        f"tool {tool!r}: needs_approval must be a bool or a predicate, not {type(value).__name__}"
    )


def approval_required(tool: Tool, arguments_json: str | bytes) -> bool:
    """Whether a call of `tool` with `arguments_json` must be approved first (fail closed; see module doc)."""
    option = tool.approval
    if option is False:
        return False
    if option is True:
        return True
    try:
        arguments = tool.validate_arguments(arguments_json)
    except ToolArgumentError:
        return True
    try:
        decision = option(arguments)
    except Exception:
        return True
    if inspect.isawaitable(decision):
        close = getattr(decision, "close", None)
        if callable(close):
            close()  # an un-awaited coroutine would otherwise warn
        return True
    return decision is not False
