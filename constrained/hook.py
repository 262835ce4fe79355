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

Applying the masks to logits is the engine's job (its sampler), not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from parley.constrained.matcher import Matcher
from parley.protocol import chat_template as chat_markers

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

THINK_END = Trigger(chat_markers.THINK_END)
TOOL_CALL_OPEN = Trigger(chat_markers.TOOL_CALL_OPEN, include=True)
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
