"""What the server needs of an engine: a small protocol the real `Engine` and test fakes both satisfy.

Keeping the seam this narrow lets validation, error shapes, streaming, disconnects, tenants and
metrics be tested on a fast fake engine, and the same code serve the real one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class DeltaLike(Protocol):
    """One step of a request's stream (`parley.local_engine.StreamDelta` has these fields)."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def finished(self) -> bool: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...

    @property
    def ttft_s(self) -> float | None: ...


@runtime_checkable
class EnginePort(Protocol):
    """The engine as the server uses it (`parley.local_engine.Engine` satisfies it)."""

    @property
    def tokenizer(self) -> Any: ...

    @property
    def model_id(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    def stream(
        self,
        prompt_ids: list[int],
        params: Any,
        *,
        hooks: Any = None,
        tenant: str | None = None,
        request_id: str | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[Any]: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> dict[str, Any]: ...
