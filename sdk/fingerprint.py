"""A saved state is bound to the agent that saved it: its fingerprint, and the check on resume.

A `RunState` carries approvals: "run ``delete_account`` with these arguments" was decided for one
agent's tool. Resumed by another agent (another name, a tool of the same name that does something
else, another schema), the approval would be applied to something nobody approved. So every state
records `AgentFingerprint` (the agent's name, each tool's name with a hash of its argument schema,
the output schema's hash, and a digest of each child agent: agents used as tools and agents handed
off to), and a resume compares it with the resuming agent's before anything runs:

* the same: the run goes on;
* different: `parley.errors.RunStateMismatchError`, listing each difference in words;
* ``Agent.run(..., allow_agent_change=True)``, a deliberate upgrade: differences are accepted, but
  every call still open in the state (pending, approved, started) must find its tool with the same
  argument schema, or the same error names those calls. ``allow_agent_change`` may also be a
  migration hook, ``hook(state, differences) -> RunState | None``, that returns the state to resume
  (e.g. with a renamed tool's calls renamed, and their schema in `RunState.fingerprint` updated);
  the open-call check then applies to what it returned.

States written before fingerprints (schema 1.0 and 1.1) are checked by names only: the saved
`RunState.agent_name` must match the agent's name when both are set, and every open call's tool
must exist; they get a fingerprint from the first resume on. Tools of toolsets (MCP servers) are
recorded as listed when the run started or resumed, but a server may change its list between a
pause and a resume: only the open calls are held to them (the tool still there, same schema).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from parley.errors import RunStateMismatchError

if TYPE_CHECKING:
    from parley.agent import Agent
    from parley.run_state import RunState

MigrationHook = Callable[["RunState", list[str]], "RunState | None"]
AllowAgentChange = bool | MigrationHook


class AgentFingerprint(BaseModel):
    """What a state records of its agent (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    agent: str | None = None
    tools: dict[str, str] = Field(default_factory=dict)
    """Tool name -> hash of its argument schema (`schema_hash`)."""
    output: str | None = None
    """Hash of the output schema (None: plain text answers)."""
    children: dict[str, str] = Field(default_factory=dict)
    """Agent-tool or handoff tool name -> digest of that agent's own fingerprint."""
    toolset_tools: dict[str, str] = Field(default_factory=dict)
    """Tools of the agent's toolsets (MCP servers) as listed then, name -> schema hash. Their lists may
    change between a pause and a resume (``tools/list_changed``), so only open calls are held to them."""


def schema_hash(schema: Any) -> str:
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint_of(agent: Agent[Any, Any], tools: Mapping[str, Any] | None = None) -> AgentFingerprint:
    """The fingerprint of `agent`, with `tools` as its tool map (default: its plain tools)."""
    return _fingerprint(agent, tools, set())


def _fingerprint(agent: Agent[Any, Any], tools: Mapping[str, Any] | None, seen: set[int]) -> AgentFingerprint:
    from parley.agent_tool import AgentTool
    from parley.handoffs import HandoffTool

    seen = seen | {id(agent)}
    local = {t.name for t in agent.tools}
    table = {n: t for n, t in tools.items() if n in local} if tools is not None else {t.name: t for t in agent.tools}
    listed = {n: t for n, t in tools.items() if n not in local} if tools is not None else {}
    children: dict[str, str] = {}
    for name, tool in table.items():
        child = tool.agent if isinstance(tool, AgentTool) else None
        if isinstance(tool, HandoffTool):
            child = tool.handoff.agent
        if child is not None:
            children[name] = "cycle" if id(child) in seen else _digest(_fingerprint(child, None, seen))
    schema = agent.output_spec.schema
    return AgentFingerprint(
        agent=agent.name,
        tools={name: schema_hash(getattr(tool, "parameters", None)) for name, tool in sorted(table.items())},
        output=None if schema is None else schema_hash(schema),
        children=children,
        toolset_tools={name: schema_hash(getattr(tool, "parameters", None)) for name, tool in sorted(listed.items())},
    )


def _digest(fingerprint: AgentFingerprint) -> str:
    return schema_hash(fingerprint.model_dump(mode="json"))


def differences(saved: AgentFingerprint, current: AgentFingerprint) -> list[str]:
    """Each way the resuming agent differs from the one that saved the state, in words."""
    out: list[str] = []
    if saved.agent != current.agent:
        out.append(f"agent name {saved.agent!r} (saved) is {current.agent!r} now")
    for name in sorted(set(saved.tools) | set(current.tools)):
        before, after = saved.tools.get(name), current.tools.get(name)
        if after is None:
            out.append(f"tool {name!r} is missing")
        elif before is None:
            out.append(f"tool {name!r} is new")
        elif before != after:
            out.append(f"tool {name!r} has another argument schema")
    if saved.output != current.output:
        out.append("the output schema differs")
    for name in sorted(set(saved.children) & set(current.children)):
        if saved.children[name] != current.children[name]:
            out.append(f"child agent behind {name!r} differs")
    return out


def open_calls(state: RunState) -> list[Any]:
    """The calls of the open batch that have no result yet (pending, decided, started, in a child)."""
    return [c for c in state.batch if c.id not in state.records]


def check_resume(
    state: RunState, agent: Agent[Any, Any], tools: Mapping[str, Any], allow: AllowAgentChange = False
) -> RunState:
    """Refuse `state` unless it was saved by `agent` (or the change is allowed and safe); returns the
    state to resume (a migration hook's, if one is given), with the current fingerprint recorded."""
    current = fingerprint_of(agent, tools)
    saved = state.fingerprint
    if saved is None:
        _check_legacy(state, agent, tools)
    else:
        found = differences(saved, current)
        if found and allow is False:
            raise RunStateMismatchError(
                f"this run state was saved by another agent: {'; '.join(found)}. Resume it with the agent that "
                "saved it, or pass allow_agent_change=True for a deliberate upgrade",
                differences=found,
            )
        if found and callable(allow):
            migrated = allow(state, found)
            state = migrated if migrated is not None else state
        # (without differences this still holds the open calls of toolset tools to their schemas)
        _check_open_calls(state, _tools_for_open_calls(state, tools, agent), state.fingerprint or saved)
    state.fingerprint = current
    if state.agent_name is None:
        state.agent_name = agent.name
    return state


def _tools_for_open_calls(state: RunState, tools: Mapping[str, Any], agent: Agent[Any, Any]) -> Mapping[str, Any]:
    """After a handoff, the open batch is the handed-to agent's: look its tools up there."""
    if state.current_agent is None or state.current_agent == agent.name:
        return tools
    from parley.handoffs import find_agent

    other = find_agent(agent, state.current_agent)
    return tools if other is None else {t.name: t for t in other.tools}


def _check_legacy(state: RunState, agent: Agent[Any, Any], tools: Mapping[str, Any]) -> None:
    found: list[str] = []
    if state.agent_name is not None and agent.name is not None and state.agent_name != agent.name:
        found.append(f"agent name {state.agent_name!r} (saved) is {agent.name!r} now")
    table = _tools_for_open_calls(state, tools, agent)
    missing = sorted({c.name for c in open_calls(state) if c.name not in table})
    found += [f"tool {name!r} of an open call is missing" for name in missing]
    if found:
        raise RunStateMismatchError(
            f"this run state (saved without a fingerprint) does not fit this agent: {'; '.join(found)}",
            differences=found,
        )


def _check_open_calls(state: RunState, tools: Mapping[str, Any], saved: AgentFingerprint) -> None:
    pending = {i.call_id: i for i in state.pending}
    found: list[str] = []
    for call in open_calls(state):
        tool = tools.get(call.name)
        if tool is None:
            found.append(f"open call {call.id!r} needs tool {call.name!r}, which is missing")
            continue
        item = pending.get(call.id)
        known = saved.tools.get(call.name) or saved.toolset_tools.get(call.name)
        expected = schema_hash(item.parameters) if item is not None and item.parameters else known
        # (None: the tool of an agent handed to, whose schemas its digest in `children` covers)
        if expected is not None and expected != schema_hash(getattr(tool, "parameters", None)):
            found.append(f"open call {call.id!r} needs tool {call.name!r} with the argument schema it was made for")
    if found:
        raise RunStateMismatchError(
            f"the state's open calls do not fit this agent's tools: {'; '.join(found)}", differences=found
        )
