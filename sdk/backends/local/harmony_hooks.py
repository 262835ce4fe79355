"""The hook policy of a Harmony (gpt-oss) turn: headers, then each message's own constraint.

A Harmony turn is a few messages the model writes after the prompt's ``<|start|>assistant``::

    <|channel|>analysis<|message|>…<|end|>                                         reasoning
    <|start|>assistant<|channel|>commentary to=functions.x <|constrain|>json<|message|>{…}<|call|>
    <|start|>assistant<|channel|>final<|message|>…<|return|>                        or the answer

What a message may say depends on its header (the channel, and for a call the tool in the
recipient), so one hook, `HarmonyTurnHook`, follows the structure token by token instead of
watching for text triggers:

* **Headers** are masked to the ones this turn allows, at the byte level (any tokenization of an
  allowed header passes) and, where only one header (or one next token) remains, forced in the
  tokenizer's own tokenization (jump-forward). Allowed: one ``analysis`` message (while the
  reasoning budget lasts); a call header ``commentary to=functions.x <|constrain|>json`` per
  callable tool; ``final`` unless a call is required. So `tool_choice="required"` or a named tool
  can never end in an answer, and a named tool's header is forced once the analysis is over. (A
  ``commentary`` preamble is not among them: a constrained turn is reasoning, then a call or the
  answer.)
* **Content**: analysis is free text; a call's arguments follow *the schema of the tool named in the
  recipient* (each callable tool's JSON-schema matcher is compiled up front, so a schema the
  backends refuse is a `LocalRequestError` on ``tools[i].parameters`` before any token); the final
  answer follows `output_schema` when there is one (with tools on `auto`: a call *or* the typed
  answer). No special token but the message's own end (``<|end|>``, ``<|call|>``, ``<|return|>``)
  is ever allowed inside a message, so a JSON string cannot swallow ``<|channel|>``.
* **Reasoning budget**: tokens of analysis content are counted (the header and ``<|end|>`` are
  not); at exactly `local_budget(request.reasoning)` the hook forces ``<|end|>``, and the header
  mask then forces ``<|start|>assistant<|channel|>final<|message|>`` when only the answer is left,
  the named tool's call header under a named tool choice, or ``<|start|>assistant<|channel|>`` under
  `auto` / `required` with tools, after which the model picks ``final`` or an offered tool's call
  header (never a second analysis). Without `Reasoning`, analysis is unbounded (counted, as usage,
  up to the context length).
* With tools on `auto`, no output schema and ``constrain_auto_tools=False``, call arguments are
  not constrained (headers still are).

Every Harmony turn has this hook: even unconstrained, it keeps the output parseable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from parley.backends.base import ModelRequest
from parley.backends.local.constraints import callable_tools, check_schema, compile_constraint, tool_field
from parley.backends.local.engine_port import EnginePort
from parley.backends.local.family import TurnHooks
from parley.constrained import ConstraintHook
from parley.constrained.specs import JsonSchema
from parley.protocol import ToolSpec, harmony
from parley.protocol.harmony._envelope import recipient_for
from parley.reasoning import ReasoningBudgetHook, local_budget

if TYPE_CHECKING:
    import torch

    from parley.backends.local.harmony import HarmonyPrompts

__all__ = ["HarmonyTurnHook", "harmony_hooks"]

_ID = harmony.SPECIAL_TOKENS
START, END, MESSAGE, CHANNEL = _ID["<|start|>"], _ID["<|end|>"], _ID["<|message|>"], _ID["<|channel|>"]
CONSTRAIN, RETURN, CALL = _ID["<|constrain|>"], _ID["<|return|>"], _ID["<|call|>"]
FIRST_SPECIAL_ID = _ID["<|startoftext|>"]

Kind = Literal["analysis", "final", "call"]
Piece = tuple[str, bool]
Item = bytes | int
"""A header element: ordinary text (any tokenization of these bytes) or one special token id."""


@dataclass(frozen=True)
class HeaderChoice:
    """One header the model may write next: what it opens, its elements, and their canonical ids."""

    kind: Kind
    tool: str | None
    items: tuple[Item, ...]
    canonical: tuple[int, ...]


def header_pieces(kind: Kind, tool: str | None = None) -> list[Piece]:
    """A header after the role, as the model writes it (`<|channel|>final<|message|>`, ...)."""
    if kind != "call":
        return [("<|channel|>", True), (kind, False), ("<|message|>", True)]
    assert tool is not None
    recipient = recipient_for(tool)
    channel = "commentary" if recipient.startswith("functions.") else "analysis"
    return [
        ("<|channel|>", True),
        (f"{channel} to={recipient} ", False),
        ("<|constrain|>", True),
        ("json", False),
        ("<|message|>", True),
    ]


def _items(pieces: Sequence[Piece]) -> tuple[Item, ...]:
    return tuple(_ID[text] if special else text.encode("utf-8") for text, special in pieces)


_ROW_CACHE: dict[tuple[int, int], torch.Tensor] = {}


def _content_row(words: int, terminator: int) -> torch.Tensor:
    """Every ordinary id allowed, no special but `terminator` (a `words`-wide int32 bitmask row)."""
    key = (words, terminator)
    row = _ROW_CACHE.get(key)
    if row is None:
        import torch

        flags = torch.zeros(words * 32, dtype=torch.bool)
        flags[: min(FIRST_SPECIAL_ID, words * 32)] = True
        if terminator < words * 32:
            flags[terminator] = True
        row = _pack(flags)
        _ROW_CACHE[key] = row
    return row


def _pack(flags: torch.Tensor) -> torch.Tensor:
    import torch

    weights = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int64)
    return (flags.view(-1, 32).to(torch.int64) * weights).sum(dim=1).to(torch.int32)


def _set_only(row: torch.Tensor, ids: set[int]) -> None:
    """Clear `row`, then allow exactly `ids` (those inside the row)."""
    words: dict[int, int] = {}
    for token in ids:
        word, bit = divmod(token, 32)
        if word < row.shape[0]:
            words[word] = words.get(word, 0) | (1 << bit)
    row.zero_()
    for word, bits in words.items():
        row[word] = bits - (1 << 32) if bits >= 1 << 31 else bits  # int32 words are signed


class HarmonyTurnHook:
    """Engine hook for one Harmony turn (see the module docstring).

    `calls`: the callable tools, each with its arguments' `ConstraintHook` (None: unconstrained).
    `answer`: the final answer's `ConstraintHook` (None: free text). `budget` counts analysis tokens
    and forces ``<|end|>`` when spent; `open_with_analysis` forces the first header to ``analysis``
    (while the budget is above zero); `forced` lists every token the hook forced, in order.
    """

    def __init__(
        self,
        *,
        vocab_words: int,
        token_bytes: Mapping[int, bytes],
        ids_by_bytes: Mapping[bytes, tuple[int, ...]],
        encode_pieces: Callable[[Sequence[Piece]], list[int]],
        budget: ReasoningBudgetHook,
        calls: Mapping[str, ConstraintHook | None],
        answer: ConstraintHook | None,
        final_allowed: bool,
        open_with_analysis: bool = False,
    ) -> None:
        self.vocab_words = vocab_words
        self.token_bytes = token_bytes
        self.encode_pieces = encode_pieces
        self.budget = budget
        self.calls = dict(calls)
        self.answer = answer
        self.final_allowed = final_allowed or not self.calls
        self.open_with_analysis = open_with_analysis
        self.state: Literal["header", "content", "done", "lost"] = "header"
        self.kind: Kind | None = None
        """What the current (or last) message is."""
        self.tool: str | None = None
        """The tool the current call message addresses."""
        self.analysis_done = False
        self.violations = 0
        """Tokens the engine emitted that this hook did not allow (the real sampler never does)."""
        self.forced: list[int] = []
        self._by_bytes = ids_by_bytes
        self._choices: list[tuple[HeaderChoice, int, int]] = []  # (choice, item index, byte offset)
        self._header_ids: list[int] = []
        self._content: ConstraintHook | None = None
        self._terminator = END
        self._open_header(after_end=False)

    # ---- what the turn allows ------------------------------------------------------------------
    def header_choices(self, *, after_end: bool) -> list[HeaderChoice]:
        """The headers allowed now (after an `<|end|>`, each starts with `<|start|>assistant`)."""
        analysis = not self.analysis_done and self.budget.reasoning_tokens < self.budget.budget
        kinds: list[tuple[Kind, str | None]] = [("analysis", None)] if analysis else []
        if not (analysis and self.open_with_analysis):  # asked-for reasoning: the turn opens with it
            kinds += [("call", name) for name in self.calls]
            if self.final_allowed:
                kinds.append(("final", None))
        prefix: list[Piece] = [("<|start|>", True), ("assistant", False)] if after_end else []
        choices = []
        for kind, tool in kinds:
            pieces = prefix + header_pieces(kind, tool)
            choices.append(HeaderChoice(kind, tool, _items(pieces), tuple(self.encode_pieces(pieces))))
        return choices

    def _open_header(self, *, after_end: bool) -> None:
        self.state = "header"
        self._choices = [(choice, 0, 0) for choice in self.header_choices(after_end=after_end)]
        self._header_ids = []

    # ---- TokenHook protocol ---------------------------------------------------------------------
    def forced_token(self) -> int | None:
        token = self._forced_token()
        return token

    def _forced_token(self) -> int | None:
        if self.state == "header":
            n = len(self._header_ids)
            nexts = {c.canonical[n] if c.canonical[:n] == tuple(self._header_ids) and n < len(c.canonical) else None
                     for c, _, _ in self._choices}
            if len(nexts) == 1:
                return nexts.pop()
            return None
        if self.state == "content":
            if self.kind == "analysis":
                return self.budget.forced_token()
            if self._content is not None:
                return self._content.forced_token()
        return None

    def fill_bitmask(self, row: torch.Tensor) -> bool:
        if self.state == "header":
            _set_only(row, self._allowed_in_header())
            return True
        if self.state == "content":
            if self._content is not None:
                self._content.fill_bitmask(row)
            row.bitwise_and_(_content_row(row.shape[0], self._terminator))
            return True
        return False

    def accept_token(self, token_id: int) -> None:
        forced = self._forced_token()
        if forced is not None:
            if token_id == forced:
                self.forced.append(token_id)
            else:
                self.violations += 1
        if self.state == "header":
            self._accept_in_header(token_id)
        elif self.state == "content":
            self._accept_in_content(token_id)

    def is_terminated(self) -> bool:
        return self.state == "done"

    # ---- headers --------------------------------------------------------------------------------
    def _allowed_in_header(self) -> set[int]:
        allowed: set[int] = set()
        for choice, index, offset in self._choices:
            item = choice.items[index]
            if isinstance(item, int):
                allowed.add(item)
                continue
            rest = item[offset:]
            for end in range(1, len(rest) + 1):
                allowed.update(self._by_bytes.get(rest[:end], ()))
        return allowed

    def _accept_in_header(self, token_id: int) -> None:
        self._header_ids.append(token_id)
        data = self.token_bytes.get(token_id)
        live: list[tuple[HeaderChoice, int, int]] = []
        for choice, index, offset in self._choices:
            item = choice.items[index]
            if isinstance(item, int):
                if token_id == item:
                    live.append((choice, index + 1, 0))
            elif data and item.startswith(data, offset):
                offset += len(data)
                live.append((choice, index + 1, 0) if offset == len(item) else (choice, index, offset))
        if not live:
            self.violations += 1
            self.state = "lost"  # the model left the structure (only a script can): nothing is masked any more
            return
        self._choices = live
        done = next((choice for choice, index, _ in live if index == len(choice.items)), None)
        if done is not None:
            self._open_content(done)

    def _open_content(self, choice: HeaderChoice) -> None:
        self.state = "content"
        self.kind, self.tool = choice.kind, choice.tool
        if choice.kind == "analysis":
            self._content, self._terminator = None, END
        elif choice.kind == "final":
            self._content, self._terminator = self.answer, RETURN
        else:
            self._content, self._terminator = self.calls.get(choice.tool or ""), CALL

    # ---- content --------------------------------------------------------------------------------
    def _accept_in_content(self, token_id: int) -> None:
        if self.kind == "analysis":
            if token_id == END:
                if self.budget.phase == "forcing":
                    self.budget.accept_token(token_id)  # the forced end: phase "done"
                self.budget.phase = "done"
                self.analysis_done = True
                self._open_header(after_end=True)
                return
            if token_id >= FIRST_SPECIAL_ID:
                self.violations += 1
            self.budget.accept_token(token_id)
            return
        if self._content is not None:
            self._content.accept_token(token_id)
        if token_id == self._terminator:
            self.state = "done"
        elif token_id >= FIRST_SPECIAL_ID:
            self.violations += 1


# --------------------------------------------------------------------------------------------------
# The policy.


def harmony_hooks(
    request: ModelRequest, codec: HarmonyPrompts, engine: EnginePort, *, constrain_auto_tools: bool = True
) -> TurnHooks:
    """The `HarmonyTurnHook` for `request` (see the module docstring for the policy)."""
    tools: list[ToolSpec] = callable_tools(request)
    auto = request.tool_choice == "auto"
    answer_schema = request.output_schema if (auto or not tools) else None
    for tool in tools:
        check_schema(tool.parameters, tool_field(request, tool))
    if answer_schema is not None:
        check_schema(answer_schema, "output_schema")
    constrain_calls = not (auto and answer_schema is None and not constrain_auto_tools)
    stops = codec.stop_token_ids
    calls: dict[str, ConstraintHook | None] = {}
    for tool in tools:
        matcher = compile_constraint(JsonSchema(tool.parameters), engine, stops, tool_field(request, tool))
        calls[tool.name] = ConstraintHook(matcher) if constrain_calls else None
    answer = None
    if answer_schema is not None:
        answer = ConstraintHook(compile_constraint(JsonSchema(answer_schema), engine, stops, "output_schema"))
    limit = local_budget(request.reasoning) if request.reasoning is not None else engine.max_model_len
    budget = ReasoningBudgetHook(limit, [END], stop_token_ids=stops)
    hook = HarmonyTurnHook(
        vocab_words=(engine.vocab_size + 31) // 32,
        token_bytes=codec.token_bytes,
        ids_by_bytes=codec.ids_by_bytes,
        encode_pieces=codec.encoding.encode_pieces,
        budget=budget,
        calls=calls,
        answer=answer,
        final_allowed=not tools or auto,
        open_with_analysis=request.reasoning is not None,
    )
    return TurnHooks(hook=hook, reasoning=budget, constraint=answer)
