"""What a local turn needs of an engine: the narrow, typed seam `parley.local_engine.Engine` satisfies.

The SDK's `LocalBackend` and the server's routes both drive the engine through this port (one
local turn, `parley.backends.local.turn`), so a fake engine (`parley.local_engine.testing`) can
stand in for the real one in tests of either. Deltas are the engine's own `StreamDelta`s and hooks
the engine's `TokenHook`s: mypy sees the whole path from a request to the tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

from parley.local_engine.config import SamplingParams
from parley.local_engine.hooks import TokenHook
from parley.local_engine.outputs import StreamDelta
from parley.local_engine.tokenizer import Tokenizer


@runtime_checkable
class EnginePort(Protocol):
    """The engine as a local turn uses it."""

    @property
    def tokenizer(self) -> Tokenizer:
        """A Hugging Face tokenizer, or a stand-in such as `ByteTokenizer` (families and grammar compilers read it)."""
        ...

    @property
    def model_id(self) -> str:
        """The weights' identity (prefix-cache key); not necessarily a name to show."""
        ...

    @property
    def mode(self) -> str:
        """How the weights run (``float32+q4+head8+ngram``): what `parley serve` shows as the model's root."""
        ...

    @property
    def vocab_size(self) -> int:
        """Rows of the logits: grammar bitmasks are this wide."""
        ...

    @property
    def max_model_len(self) -> int: ...

    def stream(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        hooks: TokenHook | Sequence[TokenHook] | None = None,
        tenant: str | None = None,
        request_id: str | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[StreamDelta]: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> dict[str, Any]: ...
