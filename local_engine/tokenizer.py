"""`Tokenizer`: what parley calls on a tokenizer, written down once so mypy can check every caller.

The engine owns the tokenizer (stop strings are matched on decoded text) and everything above it
(the prompt families, the server, the grammar compilers) reads it from the engine, so its type is
defined here, in the lowest layer that holds one. A Hugging Face tokenizer satisfies it, and so does
`parley.local_engine.testing.ByteTokenizer`. What only some families need (a chat template, a
vocabulary table) is read where it is needed and named there.
"""

from __future__ import annotations

from typing import Protocol


class Tokenizer(Protocol):
    """Text to ids and back, as every local turn needs it."""

    def encode(self, text: str, *, add_special_tokens: bool = ..., split_special_tokens: bool = ...) -> list[int]:
        """Ids for `text`; with `split_special_tokens`, special-token strings in it stay plain text."""
        ...

    def decode(self, ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...

    def __len__(self) -> int:
        """The vocabulary size, special tokens included."""
        ...
