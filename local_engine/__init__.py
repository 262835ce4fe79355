"""`parley.local_engine`: our own paged-KV inference engine. Takes token ids and hooks only.

Importing this package does not import torch: the torch-backed names (`Engine`, ...) are resolved on
first access through a module-level `__getattr__`.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from parley.local_engine.config import EngineConfig, SamplingParams
from parley.local_engine.errors import (
    AdmissionError,
    DeadlineUnreachableError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    QueueFullError,
    RequestAborted,
)
from parley.local_engine.hooks import ComposedHook, TokenHook
from parley.local_engine.outputs import FinishReason, GenerationOutput, StreamDelta, TokenLogprob
from parley.local_engine.tokenizer import Tokenizer

if _TYPE_CHECKING:
    from parley.local_engine.engine import Engine

_LAZY = {"Engine": "parley.local_engine.engine"}

__all__ = [
    "AdmissionError",
    "ComposedHook",
    "DeadlineUnreachableError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "FinishReason",
    "GenerationOutput",
    "InvalidRequestError",
    "ModelLoadError",
    "ModelNotFoundError",
    "QueueFullError",
    "RequestAborted",
    "SamplingParams",
    "StreamDelta",
    "TokenHook",
    "TokenLogprob",
    "Tokenizer",
]


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value
