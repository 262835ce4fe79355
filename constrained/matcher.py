"""`Matcher`: one request's position in a compiled spec, the object decoding loops talk to.

Wraps a backend matcher with what every backend should have but not all do: a token budget
(`max_tokens` of the spec; at the bound only stop tokens remain allowed, the matcher reports
terminated and `exhausted` is set — the output is complete only if `is_completed()` was true), a
record of warnings (keywords the backend does not enforce), the recorded backend `choice`, and the
`needs_validation` flag that says outputs must be checked with `validate` after generation because
the mask alone does not guarantee them.

Bitmask layout is xgrammar's: int32 words, bit `i % 32` of word `i // 32` set means token `i` is
allowed; width `ceil(vocab_size / 32)` where vocab_size is the model's logits width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parley.constrained.backends.base import BackendMatcher

if TYPE_CHECKING:
    import torch

    from parley.constrained.specs import Spec
    from parley.constrained.tokenizer_info import TokenizerInfo


class Matcher:
    """Token-level matcher for one spec; create with `parley.constrained.compile`."""

    def __init__(
        self,
        spec: Spec,
        backend: str,
        inner: BackendMatcher,
        tokenizer: TokenizerInfo,
        *,
        warnings: tuple[str, ...] = (),
        needs_validation: bool = False,
        choice: str = "",
    ) -> None:
        self.spec = spec
        self.backend = backend
        self.tokenizer = tokenizer
        self.warnings = warnings
        self.needs_validation = needs_validation
        self.choice = choice  # why this backend (see `parley.constrained.choice`)
        self._inner = inner
        self._accepted = 0
        self.exhausted = False

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def accepted_tokens(self) -> int:
        return self._accepted

    @property
    def inner(self) -> BackendMatcher:
        return self._inner

    def allocate_bitmask(self, batch: int = 1) -> torch.Tensor:
        """An all-allowed int32 bitmask of shape (batch, ceil(vocab_size/32)) on the CPU."""
        import torch

        return torch.full((batch, self.tokenizer.bitmask_words), -1, dtype=torch.int32)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        """Write the allowed next tokens into row `index` of `bitmask` (or into a 1-D row).

        Returns False when nothing needs masking (backends may report an all-allowed mask).
        Once terminated or exhausted, only the stop tokens are allowed.
        """
        target = bitmask.unsqueeze(0) if bitmask.dim() == 1 else bitmask
        row = 0 if bitmask.dim() == 1 else index
        if self.exhausted:
            self._only_stop_tokens(target[row])
            return True
        return self._inner.fill_bitmask(target, row)

    def _only_stop_tokens(self, row: torch.Tensor) -> None:
        row.zero_()
        for stop in self.tokenizer.stop_token_ids:
            word, bit = divmod(stop, 32)
            row[word] |= (1 << bit) - (1 << 32) if bit == 31 else 1 << bit

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no state change) when the token is not allowed."""
        if self.exhausted:
            return token_id in self.tokenizer.stop_token_ids
        if not 0 <= token_id < self.tokenizer.vocab_size:
            return False
        ok = self._inner.accept_token(int(token_id))
        if ok:
            self._accepted += 1
            limit = self.spec.max_tokens
            if limit is not None and self._accepted >= limit:
                self.exhausted = True
        return ok

    def accept_text(self, text: str) -> bool:
        """Advance by a string (used when a trigger ends inside a token); backends may tokenize it."""
        return self._inner.accept_text(text)

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (e.g. rejected speculative tokens)."""
        if n > 0:
            self._inner.rollback(n)
            self._accepted = max(0, self._accepted - n)
            self.exhausted = False

    def is_completed(self) -> bool:
        """The output so far is a complete sentence (a stop token would be accepted)."""
        return self._inner.is_completed()

    def is_terminated(self) -> bool:
        """A stop token was accepted after a complete output, or the token budget ran out."""
        return self.exhausted or self._inner.is_terminated()

    def reset(self) -> None:
        self._inner.reset()
        self._accepted = 0
        self.exhausted = False

    def forced_tokens(self) -> list[int]:
        """Jump-forward: tokens the grammar forces next (may be empty); accept them without sampling."""
        if self.exhausted or self._inner.is_terminated():
            return []
        return self._inner.forced_tokens()

    def validate(self, text: str) -> Any:
        """Validate a finished output against the spec (see `parley.constrained.validate`)."""
        from parley.constrained.validate import validate

        return validate(text, self.spec)

    def __repr__(self) -> str:
        return f"Matcher({self.spec.kind}, backend={self.backend!r}, needs_validation={self.needs_validation})"
