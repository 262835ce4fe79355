"""A `Matcher` as a local-engine token hook, with triggers and a whitespace runaway guard.

The engine's hook protocol (`parley.local_engine.hooks.TokenHook`, duck-typed here because this
layer may not import the engine) asks each step for a forced token and a bitmask, then reports the
chosen token. `ConstraintHook` answers from a `Matcher`:

- **Triggers.** With `triggers`, decoding is free until one of them appears in the output (e.g.
  `</think>` ending the reasoning, a Harmony `final` / `commentary` header, or `<tool_call>`); from
  then on the constraint applies. `include=True` feeds the trigger text itself to the matcher (a
  hermes tool-call spec begins with `<tool_call>`); the rest of the token that completed the
  trigger is fed either way. `force_trigger_after=N` makes the hook emit the first trigger's
  tokens itself after N free tokens, so a model that never stops thinking still ends up
  producing valid output.
- **Runaway guard.** After `max_whitespace_run` consecutive whitespace-only tokens, whitespace-only
  tokens are masked out for the rest of the output (whenever something else is allowed), so a
  free-form string (or flexible JSON whitespace) cannot make the engine spin to max_tokens on
  spaces and newlines: the model must move on, and its next-best choice usually closes the value.
- **Jump-forward** (`jump_forward=True`): tokens the grammar forces are emitted without sampling.

`fill_bitmasks` fills one step's masks for many requests at once (xgrammar's batch matcher runs
them in parallel threads); `apply_bitmask` masks fp32 logits in place.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley.constrained.matcher import Matcher

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Trigger:
    """Text that starts the constraint. `regex=True` treats `text` as a regular expression."""

    text: str
    include: bool = False
    regex: bool = False

    def find(self, decoded: str) -> tuple[int, int] | None:
        if self.regex:
            match = re.search(self.text, decoded)
            return None if match is None else (match.start(), match.end())
        at = decoded.find(self.text)
        return None if at < 0 else (at, at + len(self.text))


_TRIGGER_WINDOW = 512  # bytes of recent free text searched for triggers

THINK_END = Trigger("</think>")
TOOL_CALL_OPEN = Trigger("<tool_call>", include=True)
HARMONY_FINAL = Trigger("<|channel|>final<|message|>")
HARMONY_COMMENTARY = Trigger(r"<\|channel\|>commentary[^\n]*?<\|message\|>", regex=True)


class ConstraintHook:
    """Adapts a `Matcher` to the engine's TokenHook protocol (see module docstring)."""

    def __init__(
        self,
        matcher: Matcher,
        *,
        triggers: Sequence[Trigger] = (),
        force_trigger_after: int | None = None,
        max_whitespace_run: int | None = 16,
        jump_forward: bool = False,
    ) -> None:
        self.matcher = matcher
        self.triggers = tuple(triggers)
        self.force_trigger_after = force_trigger_after
        self.max_whitespace_run = max_whitespace_run
        self.jump_forward = jump_forward
        self.active = not self.triggers
        self.violations = 0  # tokens the engine emitted that the constraint did not allow
        self._free: bytearray = bytearray()
        self._free_tokens = 0
        self._pending_forced: list[int] = []
        self._whitespace_run = 0
        self.guard_tripped = False
        self._constrained_ids: list[int] = []
        self._ws_mask: torch.Tensor | None = None

    # ---- TokenHook protocol -------------------------------------------------------------------
    def forced_token(self) -> int | None:
        if not self.active:
            if self.force_trigger_after is not None and self._free_tokens >= self.force_trigger_after:
                if not self._pending_forced:
                    text = self.triggers[0].text
                    tok = self.matcher.tokenizer.tokenizer
                    self._pending_forced = [int(t) for t in tok.encode(text, add_special_tokens=False)]
                return self._pending_forced.pop(0) if self._pending_forced else None
            return None
        if self.jump_forward and not self.matcher.is_terminated():
            forced = self.matcher.forced_tokens()
            if forced:
                return forced[0]
        return None

    def fill_bitmask(self, row: torch.Tensor) -> bool:
        if not self.active:
            return False
        wrote = self.matcher.fill_next_token_bitmask(row)
        if self._guard_tripped():
            self._clear_whitespace(row)
            return True
        return wrote

    def accept_token(self, token_id: int) -> None:
        if not self.active:
            self._free_tokens += 1
            self._free += self.matcher.tokenizer.token_bytes.get(token_id, b"")
            self._check_triggers()
            return
        self._constrained_ids.append(token_id)
        if not self.matcher.accept_token(token_id):
            self.violations += 1
        if token_id in self.matcher.tokenizer.whitespace_token_ids:
            self._whitespace_run += 1
            if self.max_whitespace_run is not None and self._whitespace_run >= self.max_whitespace_run:
                self.guard_tripped = True
        else:
            self._whitespace_run = 0

    def is_terminated(self) -> bool:
        return self.active and self.matcher.is_terminated()

    # ---- helpers --------------------------------------------------------------------------------
    @property
    def constrained_token_ids(self) -> list[int]:
        """Tokens produced while the constraint was active (the constrained output)."""
        return list(self._constrained_ids)

    def _check_triggers(self) -> None:
        # Only the tail can hold a trigger completed by the latest token (keeps this O(1) per token).
        decoded = self._free[-_TRIGGER_WINDOW:].decode("utf-8", errors="replace")
        for trigger in self.triggers:
            span = trigger.find(decoded)
            if span is None:
                continue
            start, end = span
            self.active = True
            self._pending_forced = []
            rest = decoded[start:] if trigger.include else decoded[end:]
            if rest and not self.matcher.accept_text(rest):
                self.violations += 1
            return

    def _guard_tripped(self) -> bool:
        return self.guard_tripped

    def _clear_whitespace(self, row: torch.Tensor) -> None:
        import torch

        if self._ws_mask is None:
            info = self.matcher.tokenizer
            mask = torch.zeros(info.bitmask_words * 32, dtype=torch.bool)
            mask[list(info.whitespace_token_ids)] = True
            self._ws_mask = _pack(mask)
        remaining = row & ~self._ws_mask
        if bool(remaining.any()):
            row.copy_(remaining)


def _pack(flags: torch.Tensor) -> torch.Tensor:
    """Pack a bool vector (length a multiple of 32) into int32 words, bit i%32 of word i//32."""
    import torch

    weights = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int64)
    words = (flags.view(-1, 32).to(torch.int64) * weights).sum(dim=1)
    return words.to(torch.int32)


_BATCH: list[Any] = []


def _batch_matcher() -> Any:
    """One shared xgrammar `BatchGrammarMatcher` (it owns a thread pool; creating one per step is wasteful)."""
    if not _BATCH:
        import xgrammar as xgr

        _BATCH.append(xgr.BatchGrammarMatcher())
    return _BATCH[0]


def fill_bitmasks(hooks: Sequence[ConstraintHook | None], bitmask: torch.Tensor) -> list[bool]:
    """Fill row i of `bitmask` for hooks[i] (None = unconstrained); returns which rows constrain.

    Active xgrammar matchers without pending guard/trigger logic are filled together by xgrammar's
    `BatchGrammarMatcher` (parallel threads); the rest one by one.
    """
    bitmask.fill_(-1)
    used = [False] * len(hooks)
    batch_rows: list[int] = []
    batch_matchers: list[Any] = []
    for i, hook in enumerate(hooks):
        if hook is None or not hook.active:
            continue
        inner = hook.matcher.inner
        raw = getattr(inner, "raw", None)
        if raw is not None and not hook.matcher.exhausted and not hook._guard_tripped():
            batch_rows.append(i)
            batch_matchers.append(raw)
        else:
            used[i] = hook.fill_bitmask(bitmask[i])
    if len(batch_matchers) > 1:
        _batch_matcher().batch_fill_next_token_bitmask(batch_matchers, bitmask, indices=batch_rows)
        for i in batch_rows:
            used[i] = True
    elif batch_matchers:
        i = batch_rows[0]
        hook = hooks[i]
        assert hook is not None
        used[i] = hook.fill_bitmask(bitmask[i])
    return used


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
    """Set disallowed logits to -inf in place (fp32; other dtypes are upcast and returned as fp32).

    `logits` is (batch, vocab) or (vocab,); `bitmask` the matching int32 words. Columns beyond the
    mask's width are disallowed. Returns the (possibly upcast) logits tensor.
    """
    import torch

    if logits.dtype != torch.float32:
        logits = logits.float()
    two_d = logits if logits.dim() == 2 else logits.unsqueeze(0)
    masks = bitmask if bitmask.dim() == 2 else bitmask.unsqueeze(0)
    selected = list(range(two_d.shape[0])) if rows is None else list(rows)
    width = two_d.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=masks.device)
    for r in selected:
        allowed = ((masks[r].unsqueeze(-1) >> shifts) & 1).bool().view(-1)
        if allowed.numel() < width:
            allowed = torch.cat([allowed, allowed.new_zeros(width - allowed.numel())])
        two_d[r].masked_fill_(~allowed[:width].to(two_d.device), float("-inf"))
    return logits
