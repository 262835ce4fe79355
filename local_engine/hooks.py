"""Per-request hooks: the seam between the engine and grammars / reasoning budgets.

The engine knows nothing of grammars. For each running request that has a hook it asks, before
sampling a step's token:

1. `forced_token()` — a token the hook insists on (end of a reasoning budget, a grammar's
   jump-forward). When not None, sampling is skipped and that token is emitted.
2. `fill_bitmask(row)` — `row` is a 1-D int32 tensor of `ceil(vocab/32)` words, pre-filled with
   -1 (every token allowed). Bit `i % 32` of word `i // 32` set means token `i` is allowed.
   Return False to say "no constraint this step" (the engine then skips masking).

After a token is chosen the engine calls `accept_token(id)`; afterwards, if `is_terminated()` is
true, the request finishes with reason "stop" (e.g. the grammar is complete). Masks are applied to
fp32 logits. A request without hooks pays nothing. `ComposedHook` ANDs the masks of several
hooks; the first hook with a forced token wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class TokenHook(Protocol):
    """What the engine calls for a request that has a hook."""

    def forced_token(self) -> int | None: ...

    def fill_bitmask(self, row: torch.Tensor) -> bool: ...

    def accept_token(self, token_id: int) -> None: ...

    def is_terminated(self) -> bool: ...


class ComposedHook:
    """Several hooks acting as one: masks ANDed, first forced token wins, all told each token."""

    def __init__(self, hooks: Sequence[TokenHook]) -> None:
        self.hooks = list(hooks)

    def forced_token(self) -> int | None:
        for hook in self.hooks:
            token = hook.forced_token()
            if token is not None:
                return token
        return None

    def fill_bitmask(self, row: torch.Tensor) -> bool:
        wrote = False
        scratch = None
        for hook in self.hooks:
            if scratch is None:
                scratch = row.clone()
            scratch.fill_(-1)
            if hook.fill_bitmask(scratch):
                row.bitwise_and_(scratch)
                wrote = True
        return wrote

    def accept_token(self, token_id: int) -> None:
        for hook in self.hooks:
            hook.accept_token(token_id)

    def is_terminated(self) -> bool:
        return any(hook.is_terminated() for hook in self.hooks)
