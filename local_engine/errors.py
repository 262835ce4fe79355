"""Errors of `parley.local_engine`."""

from __future__ import annotations

from parley._root import ParleyError


class EngineError(ParleyError):
    """Base class of local-engine errors."""


class ModelNotFoundError(EngineError):
    """The model (or the embedded SmolLM2) could not be found locally."""


class ModelLoadError(EngineError):
    """Model files exist but could not be loaded (corrupt, unsupported architecture...)."""


class InvalidRequestError(EngineError):
    """A request's prompt or sampling parameters are invalid."""


class AdmissionError(EngineError):
    """The engine refused a request at arrival (queue full, deadline cannot be met)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFullError(AdmissionError):
    """Refused at arrival because the waiting queue is full: the same request may succeed later."""


class DeadlineUnreachableError(AdmissionError):
    """Refused at arrival because the request cannot finish within its deadline (or it already passed)."""


class RequestAborted(EngineError):
    """The request was cancelled or dropped past its deadline."""


class EngineConfigError(EngineError, ValueError):
    """An engine setting is invalid: an `EngineConfig` field, or `device`/`dtype`; the message names it.

    Also a `ValueError`, as `EngineConfig` raised before it joined the error tree.
    """
