"""`RunState`: everything needed to resume an agent run, as versioned JSON.

A run pauses when a tool call needs a human (``needs_approval``) or an outside result
(``deferred``). The state then holds the conversation so far, the open batch of tool calls, the
results already recorded for that batch (by call id), the calls still pending, the decisions taken
on them, usage so far, turn count, backend identity, tenant and trace id, and the repeat rule's
record of settled calls (so an identical call is not run or sent for approval twice, even across
processes). Resolve pending calls with `approve` / `reject` / `provide_result` (partially if you
like: unresolved calls pause the run again), serialise with `to_json`, and resume with
``agent.run(state=RunState.from_json(s))`` in this or another process.

Agents working together: a paused run of an agent used as a tool is kept in `children` under the
parent's call id (its pending calls surface on the parent with a `path`, and decisions taken on the
parent are routed to it); guardrail results are kept in `guardrails`; after a handoff,
`current_agent` names the agent answering.

Durability: the run loop records a tool's result here before the next model call, and marks a
call as *started* before executing it. Resuming never re-executes a call whose result is recorded.
Copies of a state share the execution ledger (`parley.ledger`): a call with a side effect is
claimed there before it runs and its result recorded there, so a second resume of the same (or an
older) copy uses that result; a call started but never recorded (the process died mid-call) is run
again only if its tool is idempotent, otherwise it comes back as an ``uncertain`` interruption for a
person (approve: run it again; reject: skip it). Tools receive the call id in their `ToolContext`,
to use as an idempotency key. A state is bound to its agent (`fingerprint`, `parley.fingerprint`).

Compatibility policy
--------------------
* ``schema_version`` is ``"MAJOR.MINOR"``. This release writes `SCHEMA_VERSION` and reads every
  version in `SUPPORTED_VERSIONS`; `SCHEMA_VERSION_SUMMARIES` says what each version changed.
* A MINOR bump only adds fields, each with a default, so older states load unchanged.
  A MAJOR bump changes meaning; older majors are read through an explicit migration in
  `_MIGRATIONS` or refused.
* A state whose version is unknown, newer than this release, or missing is refused with
  `RunStateVersionError` (never guessed at: a newer writer may rely on fields we would drop).
* Every released version keeps frozen fixtures in ``tests/fixtures/run_state/<version>/``, replayed
  by a test; a version leaves `SUPPORTED_VERSIONS` only with a MAJOR release and a release note.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from parley.errors import ApprovalArgumentsError, RunStateError, RunStateVersionError, UnknownCallError
from parley.fingerprint import AgentFingerprint
from parley.protocol import Message, ToolCall, ToolResult, Usage
from parley.protocol.blobs import BlobStore, FolderBlobStore, blob_context

SCHEMA_VERSION = "1.2"
SCHEMA_VERSION_SUMMARIES: dict[str, str] = {
    "1.0": "First release: messages, open batch, recorded results, started calls, pending interruptions, "
    "decisions, usage, turn and tool-call counts, backend, tenant, trace id, output.",
    "1.1": "Adds the repeat rule's record (call_log: settled calls by tool name + canonical arguments; "
    "repeats: calls answered from it), tool_rounds (rounds of tool calls since the last user message) and "
    "stalled (a round only repeated earlier calls: tools off until the next user message); optional "
    "trace_context (the W3C trace context of a traced run, so a resume continues its trace); optional "
    "children (paused runs of agents used as tools, by call id), guardrails (guardrail results), "
    "input_guarded, current_agent and handoff_to (handoffs), and Interruption.path/agent/reason; optional "
    "compaction (the summary that stands in for the oldest messages, parley.compaction).",
    "1.2": "Adds the agent's fingerprint (name, tool argument-schema hashes, output schema, child agents: "
    "parley.fingerprint), Interruption kind 'uncertain' (a call claimed in the execution ledger but never "
    "recorded: it may or may not have run) with its claim token, and Approved.retry_of (the uncertain claim a "
    "person chose to run again). States of 1.0/1.1 carry no fingerprint and are checked by names only.",
}
SUPPORTED_VERSIONS: tuple[str, ...] = tuple(SCHEMA_VERSION_SUMMARIES)


def _from_1_0(data: dict[str, Any]) -> dict[str, Any]:
    """1.0 -> 1.1: only fields with defaults were added (an empty record, no rounds counted)."""
    return {**data, "schema_version": "1.1"}


def _from_1_1(data: dict[str, Any]) -> dict[str, Any]:
    """1.1 -> 1.2: additive (no fingerprint yet: the first resume checks names only, then records one)."""
    return {**data, "schema_version": "1.2"}


_MIGRATIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"1.0": _from_1_0, "1.1": _from_1_1}
"""version -> function turning a state dict of that version into the next supported one."""

DEFAULT_REJECTION = "The user rejected this tool call."


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Interruption(_Model):
    """A tool call the run is waiting on: ``approval`` (a human decides), ``deferred`` (an outside
    result) or ``uncertain`` (it was claimed in the execution ledger by a run that stopped before
    recording its result: it may or may not have run; `RunState.approve` runs it again, `reject`
    skips it with a message for the model, `provide_result` answers it).

    A call waiting inside an agent used as a tool (`Agent.as_tool`) surfaces on the parent with a
    `path`: the parent's call id, then the child's (and so on down nested agents); its `call_id` is
    the path joined by ``/``, so it is unique in the parent and `RunState.approve(item.call_id)` works
    unchanged (the decision is routed to the child's state).
    """

    kind: Literal["approval", "deferred", "uncertain"]
    call_id: str
    tool_name: str
    arguments: str
    """The arguments as the model produced them (JSON text); after a guardrail replaced them, the new ones."""
    parameters: dict[str, Any] | None = None
    """The tool's argument schema, so edited arguments can be checked at approval time."""
    path: list[str] | None = None
    """Call ids from this run's call down to the waiting call (None: a call of this run itself)."""
    agent: str | None = None
    """The agent whose call waits (set for calls inside agent tools and after handoffs)."""
    reason: str | None = None
    """Why approval is asked when a guardrail asked for it (`ToolDecision.require_approval`), or why the
    outcome of an ``uncertain`` call is unknown."""
    claim: str | None = None
    """For ``uncertain``: the ledger claim left without a result (approving takes over that claim)."""

    def parsed_arguments(self) -> Any:
        return json.loads(self.arguments)


class Approved(_Model):
    kind: Literal["approved"] = "approved"
    arguments: str | None = None
    """Edited arguments (JSON text) to run instead of the model's, already schema-checked."""
    retry_of: str | None = None
    """The orphaned ledger claim of an ``uncertain`` call that a person chose to run again."""


class Rejected(_Model):
    kind: Literal["rejected"] = "rejected"
    message: str = DEFAULT_REJECTION


class Provided(_Model):
    kind: Literal["provided"] = "provided"
    value: Any = None
    is_error: bool = False


Decision = Annotated[Approved | Rejected | Provided, Field(discriminator="kind")]


class SettledCall(_Model):
    """A call this run settled, remembered for the repeat rule (`RunState.call_log`)."""

    call_id: str
    tool_name: str
    outcome: Literal["ran", "rejected", "provided"]
    """It ran (successfully), a person rejected it, or its result was provided from outside."""
    content: str
    is_error: bool = False


class RepeatedCall(_Model):
    """A call the repeat rule answered instead of running it (or asking for approval) again."""

    call_id: str
    tool_name: str
    arguments: str
    original_call_id: str
    """The earlier identical call whose outcome answered this one."""
    action: Literal["reused", "error"]
    """``reused``: the model got the recorded result, marked as a repeat; ``error``: an error result."""
    turn: int
    """The model turn that made the repeated call."""


class GuardrailRecord(_Model):
    """What one guardrail decided, kept in `RunState.guardrails` so a resume neither re-runs nor re-bills it."""

    kind: Literal["input", "output", "tool_input", "tool_output"]
    name: str
    verdict: Literal["allow", "trip", "reject", "replace", "approval", "stop"]
    """``allow``/``trip`` for input and output guardrails; the `ToolDecision` action for tool guardrails."""
    turn: int = 0
    """Model requests the run had made when the guardrail ran."""
    call_id: str | None = None
    """The tool call a tool guardrail looked at."""
    output: Any = None
    """The guardrail's own output (what it found), as JSON."""
    message: str | None = None
    arguments: str | None = None
    """Replacement arguments (JSON text) of a ``replace`` verdict before a call."""
    content: str | None = None
    """Replacement result text of a ``replace`` verdict after a call."""


class CompactionRecord(_Model):
    """What compaction (`parley.compaction`) replaced, kept in `RunState.compaction` so a resume sends
    the same summary instead of asking for it again.

    Indices count the conversation as the model sees it without the instructions: the session's
    history, then `RunState.messages`; ``[start, through)`` is what the summary stands in for.
    """

    summary: str
    start: int
    through: int
    digest: str
    """sha256 over the messages before `through`: a record whose messages changed is not used."""
    turn: int = 0
    """Model requests the run had made when it compacted."""
    tokens_before: int = 0
    """The request's size (tokens, counted or estimated) that passed the threshold."""
    tokens_after: int = 0
    backend: str = ""
    """The backend that wrote the summary."""
    count: int = 1
    """Compactions so far (a later one summarises the previous summary with the next turns)."""


class RunState(_Model):
    """A resumable snapshot of an agent run (see the module docstring for the compatibility policy)."""

    schema_version: str = SCHEMA_VERSION
    trace_id: str
    agent_name: str | None = None
    backend: str = ""
    tenant: str | None = None
    status: Literal["running", "paused", "complete"] = "running"
    messages: list[Message] = Field(default_factory=list)
    """The conversation without the agent's instructions (those come from the Agent on resume)."""
    batch: list[ToolCall] = Field(default_factory=list)
    """The open batch: the last assistant turn's tool calls, not yet answered in `messages`."""
    records: dict[str, ToolResult] = Field(default_factory=dict)
    """Results recorded for calls of the open batch, by call id."""
    started: list[str] = Field(default_factory=list)
    """Calls of the open batch whose execution began but whose result is not recorded yet."""
    pending: list[Interruption] = Field(default_factory=list)
    """Calls still waiting for a decision."""
    decisions: dict[str, Decision] = Field(default_factory=dict)
    queued_input: list[Message] = Field(default_factory=list)
    """User messages given while a batch was open; appended once its results are in (adjacency)."""
    turn: int = 0
    """Model requests made by this run so far."""
    tool_calls: int = 0
    output_attempts: int = 0
    usage: Usage = Field(default_factory=Usage)
    output: Any = None
    """The final output as JSON (when `status` is ``complete``)."""
    call_log: dict[str, SettledCall] = Field(default_factory=dict)
    """Calls settled since the last user message, by `parley.tools.call_key` (tool name + canonical
    arguments): what the repeat rule answers identical calls from. Cleared by a new user message."""
    repeats: list[RepeatedCall] = Field(default_factory=list)
    """Every call of this run the repeat rule answered (resumes included; never cleared)."""
    tool_rounds: int = 0
    """Model turns that made tool calls since the last user message (compared with `Agent.max_tool_rounds`)."""
    stalled: bool = False
    """A round of tool calls since the last user message only repeated earlier calls: tools stay off
    (the model is asked for its answer) until the next user message."""
    children: dict[str, RunState] = Field(default_factory=dict)
    """Runs of agents used as tools (`Agent.as_tool`) that paused, by this run's call id: resuming this
    run resumes each child where it stopped. Optional and additive within 1.1."""
    guardrails: list[GuardrailRecord] = Field(default_factory=list)
    """Every guardrail result of the run (optional, additive within 1.1)."""
    input_guarded: bool = False
    """The latest user input went through the input guardrails (a new user message clears it)."""
    current_agent: str | None = None
    """The agent answering now, after a handoff (None: the agent the run started with)."""
    handoff_to: str | None = None
    """A handoff the model asked for, applied once the open batch is resolved."""
    compaction: CompactionRecord | None = None
    """The latest compaction of the conversation (`parley.compaction`); optional and additive within 1.1."""
    fingerprint: AgentFingerprint | None = None
    """The agent this state belongs to (`parley.fingerprint`): a resume by another agent is refused.
    Added in 1.2 (older states have none and are checked by names only)."""
    trace_context: dict[str, str] | None = None
    """The W3C trace context (``traceparent``, ``tracestate``) of the run's first ``invoke_agent`` span,
    when the run is traced (`parley.tracing`): a resume, in any process, continues that trace.
    Optional and additive within 1.1 (None when the run was never traced)."""

    # -- resolving interruptions ------------------------------------------------------------------
    def _take(self, call_id: str) -> Interruption:
        for item in self.pending:
            if item.call_id == call_id:
                return item
        # a call inside an agent tool may also be named by its own id, when that is unambiguous
        inner = [i for i in self.pending if i.path and i.path[-1] == call_id]
        if len(inner) == 1:
            return inner[0]
        known = ", ".join(repr(i.call_id) for i in self.pending) or "none"
        why = "names more than one pending call: use the full call_id" if inner else "is not pending in this run state"
        raise UnknownCallError(f"call {call_id!r} {why} (pending: {known})")

    def _child(self, item: Interruption) -> tuple[RunState, str]:
        """The child state a nested item belongs to, and the item's id there (see `Interruption.path`)."""
        assert item.path is not None
        child = self.children.get(item.path[0])
        if child is None:
            raise RunStateError(
                f"call {item.call_id!r} waits inside agent call {item.path[0]!r}, whose state is missing"
            )
        return child, "/".join(item.path[1:])

    def _drop(self, item: Interruption) -> None:
        self.pending = [i for i in self.pending if i.call_id != item.call_id]

    def _resolve(self, call_id: str, decision: Approved | Rejected | Provided) -> None:
        self.pending = [i for i in self.pending if i.call_id != call_id]
        self.decisions[call_id] = decision

    def approve(self, call_id: str, *, arguments: dict[str, Any] | str | None = None) -> None:
        """Let the call run, optionally with edited `arguments` (checked against the tool's schema now)."""
        item = self._take(call_id)
        if item.path:
            child, inner = self._child(item)
            child.approve(inner, arguments=arguments)
            self._drop(item)
            return
        if item.kind == "deferred":
            raise UnknownCallError(f"call {call_id!r} ({item.tool_name}) is deferred: use provide_result, not approve")
        edited: str | None = None
        if arguments is not None:
            value = _edited_arguments(call_id, arguments)
            if item.parameters is not None:
                _check_schema(call_id, item.tool_name, value, item.parameters)
            edited = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        self._resolve(call_id, Approved(arguments=edited, retry_of=item.claim if item.kind == "uncertain" else None))

    def reject(self, call_id: str, message: str = DEFAULT_REJECTION) -> None:
        """Do not run the call; `message` reaches the model as the tool's error result."""
        item = self._take(call_id)
        if item.path:
            child, inner = self._child(item)
            child.reject(inner, message)
            self._drop(item)
            return
        self._resolve(item.call_id, Rejected(message=message))

    def provide_result(self, call_id: str, value: Any, *, is_error: bool = False) -> None:
        """Answer the call from outside (a deferred tool's result, or instead of running it)."""
        item = self._take(call_id)
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise RunStateError(f"the result for call {call_id!r} must be JSON-serialisable: {exc}") from None
        if item.path:
            child, inner = self._child(item)
            child.provide_result(inner, value, is_error=is_error)
            self._drop(item)
            return
        self._resolve(item.call_id, Provided(value=value, is_error=is_error))

    # -- serialisation ---------------------------------------------------------------------------
    def to_json(self, *, indent: int | None = None, blobs: BlobStore | None = None) -> str:
        """JSON; with `blobs`, image/document bytes over its inline limit are kept there, by hash."""
        return self.model_dump_json(indent=indent, context=blob_context(blobs))

    def save(self, path: str | os.PathLike[str], *, blobs: BlobStore | None = None) -> None:
        """Write the state to `path` atomically (temp file, fsync, rename): a crash leaves the old or the new state.

        Large media bytes go to `blobs`, by default the folder ``<path>.blobs`` next to the state
        (made only when needed); blobs are written before the state that names them.
        """
        target = Path(path)
        store = blobs if blobs is not None else default_blobs(target)
        temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(self.to_json(blobs=store))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, blobs: BlobStore | None = None) -> RunState:
        """Read a state written by `save` (its blobs from `blobs`, by default ``<path>.blobs``)."""
        target = Path(path)
        store = blobs if blobs is not None else default_blobs(target)
        return cls.from_json(target.read_text(encoding="utf-8"), blobs=store)

    @classmethod
    def from_json(cls, text: str | bytes, *, blobs: BlobStore | None = None) -> RunState:
        """Load a state, refusing unknown or newer schema versions with `RunStateVersionError`.

        Media kept in a blob store by `to_json(blobs=...)` need that store here; without it,
        `MissingBlobError` names the missing hash.
        """
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise RunStateError(f"run state is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise RunStateError("run state JSON must be an object")
        data = _migrate(data)
        try:
            return cls.model_validate(data, context=blob_context(blobs))
        except ValidationError as exc:
            raise RunStateError(f"run state (schema_version {data['schema_version']}) is malformed: {exc}") from None


def default_blobs(path: str | os.PathLike[str]) -> FolderBlobStore:
    """The blob folder `RunState.save`/`load` use for a state file: ``<path>.blobs`` beside it."""
    target = Path(path)
    return FolderBlobStore(target.with_name(target.name + ".blobs"))


def _migrate(data: dict[str, Any]) -> dict[str, Any]:
    version = data.get("schema_version")
    if not isinstance(version, str):
        raise RunStateVersionError(
            f"run state has no schema_version string (got {version!r}); this parley reads {list(SUPPORTED_VERSIONS)}"
        )
    while version in _MIGRATIONS:
        data = _MIGRATIONS[version](data)
        version = data["schema_version"]
    if version in SUPPORTED_VERSIONS:
        return data
    newer = _version_key(version) > _version_key(SCHEMA_VERSION)
    why = "was written by a newer parley; upgrade parley to resume it" if newer else "is not a known version"
    raise RunStateVersionError(
        f"run state schema_version {version!r} {why} (this parley reads {', '.join(SUPPORTED_VERSIONS)})"
    )


def _version_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        return (-1,)


def _edited_arguments(call_id: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    value: Any = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError as exc:
            raise ApprovalArgumentsError(f"edited arguments for call {call_id!r} are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApprovalArgumentsError(f"edited arguments for call {call_id!r} must be a JSON object")
    return value


def _check_schema(call_id: str, tool_name: str, value: dict[str, Any], schema: dict[str, Any]) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        detail = "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:5])
        raise ApprovalArgumentsError(
            f"edited arguments for call {call_id!r} ({tool_name}) do not fit its schema: {detail}"
        )
