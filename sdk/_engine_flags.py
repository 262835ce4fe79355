"""The engine flags every command that loads a model shares: `--quantization`, `--speculation`, `--compile`,
`--threads` (on `parley serve`, `chat`, `demo` and `bench`).

One definition, so the four commands cannot drift, and so that their defaults are the engine's own
(`quantization="auto"`, `speculation="auto"`: `parley.local_engine.auto_mode`): a user who passes no flag
gets the measured fast mode, and a flag only ever narrows it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parley.local_engine import EngineConfig

QUANTIZATION_CHOICES = ("auto", "none", "q4", "q8", "int8")
SPECULATION_CHOICES = ("auto", "none", "ngram")


def add_engine_flags(parser: argparse.ArgumentParser, *, threads: bool = True) -> None:
    """Register the shared flags on `parser` (`threads=False` where the command has its own `--threads`)."""
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--quantization", choices=QUANTIZATION_CHOICES, default="auto",
        help="how weights run (default auto: on CPU a 4-bit GGUF runs q4, other models q8, both with an 8-bit "
        "LM head; none = the dtype unquantised)",
    )
    group.add_argument(
        "--speculation", choices=SPECULATION_CHOICES, default="auto",
        help="speculative decoding (default auto = ngram prompt lookup: same tokens, pauses itself when drafts "
        "miss; none = off)",
    )
    group.add_argument("--compile", action="store_true",
                       help="torch.compile the decode step (minutes on first use; fp32/int8 only)")
    if threads:
        group.add_argument("--threads", type=int, default=None, help="CPU threads (default: every usable core)")


def engine_config(args: argparse.Namespace, **fields: object) -> EngineConfig:
    """The `EngineConfig` the parsed flags ask for (plus `fields`, e.g. the server's `max_waiting`)."""
    from parley.local_engine import EngineConfig

    return EngineConfig(
        quantization=args.quantization, speculation=args.speculation, compile=args.compile,
        num_threads=args.threads, **fields,  # type: ignore[arg-type]
    )
