"""`parley.local_engine`: our own paged-KV inference engine. Takes token ids and hooks only."""

from parley.local_engine.errors import (
    AdmissionError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    RequestAborted,
)
from parley.local_engine.hooks import ComposedHook, TokenHook

__all__ = [
    "AdmissionError",
    "ComposedHook",
    "EngineError",
    "InvalidRequestError",
    "ModelLoadError",
    "ModelNotFoundError",
    "RequestAborted",
    "TokenHook",
]
