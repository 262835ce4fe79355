"""`PromptFamily`: the contract a model family's prompt format fulfils for the one local turn.

`LocalTurn` knows no family: everything that differs between ChatML-style chat templates and
gpt-oss's Harmony goes through this seam, so adding a family is one new file and the turn (which
both `LocalBackend` and `parley serve` run) stays the same. A family answers four questions:

* how a conversation is **rendered** into prompt ids, ending in an open assistant turn;
* which ids **stop** an assistant turn;
* how the output is **parsed** back into protocol events (`OutputParser`), and how a call is spelt
  as plain text when tools are off;
* which **hooks** constrain a turn (`build_hooks`: the grammar, from where it starts, the reasoning
  budget) and where a text grammar on the answer may start (`answer_triggers`).

The families: `parley.backends.local.chat_template` and `parley.backends.local.harmony`;
`parley.backends.local.codec.codec_for` picks one for a tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from parley.constrained import ConstraintHook
from parley.constrained.hook import Trigger
from parley.local_engine.hooks import TokenHook
from parley.protocol import Conversation, Event, ToolCall, ToolSpec
from parley.reasoning import Reasoning, ReasoningBudgetHook

if TYPE_CHECKING:
    from parley.backends.base import ModelRequest
    from parley.backends.local.engine_port import EnginePort

ReasoningArg = Reasoning | bool | None
"""What `render` takes: the request's `Reasoning` (None: not asked for); a bool means `Reasoning()` / None."""


def as_reasoning(reasoning: ReasoningArg) -> Reasoning | None:
    if isinstance(reasoning, bool):
        return Reasoning() if reasoning else None
    return reasoning


@dataclass(frozen=True)
class TurnHooks:
    """The engine hook for a turn (None when nothing constrains it), and its parts for diagnostics."""

    hook: TokenHook | None
    reasoning: ReasoningBudgetHook | None
    constraint: ConstraintHook | None


class OutputParser(Protocol):
    """A fresh incremental parser per completion: token ids in, protocol events out (never raises)."""

    def feed_tokens(self, token_ids: Iterable[int]) -> list[Event]: ...

    def finish(self, finish_reason: str | None = "stop") -> list[Event]: ...


class PromptFamily(Protocol):
    """One model family's prompt format, as a local turn uses it (see the module docstring)."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn."""
        ...

    def render(self, conversation: Conversation, tools: Sequence[ToolSpec], *, reasoning: ReasoningArg) -> list[int]:
        """Prompt ids ending in an open assistant turn (for ChatML, inside an open reasoning block when reasoning)."""
        ...

    def parser(self, *, reasoning: bool, call_ids: Callable[[int], str]) -> OutputParser: ...

    def call_as_text(self, call: ToolCall) -> str:
        """A call the model wrote while tools were off, as the text it wrote."""
        ...

    def build_hooks(self, request: ModelRequest, engine: EnginePort, *, constrain_auto_tools: bool = True) -> TurnHooks:
        """The engine hooks of a turn: constraint, triggers, reasoning budget (each family states its policy)."""
        ...

    def answer_triggers(self, *, reasoning: bool) -> tuple[Trigger, ...] | None:
        """Where a grammar on the answer text starts (empty: from the first token).

        None: the family's answer sits inside structure a text grammar cannot see (Harmony's channel
        headers), so a regex, choice or grammar constraint is refused for it.
        """
        ...
