"""The `o200k_harmony` tokenizer as a Hugging Face tokenizer, built locally (never downloaded).

gpt-oss checkpoints ship their own `tokenizer.json`; a tiny random gpt-oss built in a test, or a
model file without one, needs the same tokenizer from somewhere else. `o200k_harmony_tokenizer()`
builds it from the `o200k_base.tiktoken` ranks parley already rebuilds
(`python scripts/build_o200k.py`, see `parley.protocol.harmony.vocabulary_path()`): transformers'
`TikTokenConverter` turns the ranks into a byte-level BPE with the o200k split pattern, and the
Harmony special tokens are added at their ids (`parley.protocol.harmony.SPECIAL_TOKENS`; ordinary
ids 0..199997, specials 199998..201087, so `len(tokenizer) == 201088`, gpt-oss's `vocab_size`).
The converted `tokenizer.json` is cached in the parley cache folder, keyed by the vocabulary's
SHA-256, so the ~10 s conversion happens once per machine.

What the engine and grammars read of it: `encode` / `decode` (special tokens in text are parsed as
specials, as in any HF tokenizer: pass untrusted text with `split_special_tokens=True`),
`get_vocab()`, `all_special_ids` (every Harmony special), `eos_token_id` (`<|return|>`), `len()`.

`<|reserved_201088|>` (which `parley.protocol.harmony` decodes, as openai/harmony does) has no id
here: it lies past gpt-oss's logits, so no model can produce it.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol, TypeGuard

from parley.local_engine.tokenizer import Tokenizer
from parley.protocol import harmony
from parley.protocol.errors import VocabularyUnavailableError
from parley.protocol.harmony._tokens import (
    O200K_FILE,
    O200K_PATTERN,
    O200K_SHA256,
    cache_dir,
    parse_tiktoken_ranks,
)

__all__ = [
    "HARMONY_VOCAB_SIZE", "HarmonyTokenizer", "is_harmony_tokenizer", "o200k_harmony_tokenizer", "tokenizer_cache_path"
]

HARMONY_VOCAB_SIZE = 201088
"""gpt-oss's logits width: ordinary ids and Harmony specials below it."""
_BUILD_VERSION = 1
_NAMED = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}
_MARKERS = ("<|channel|>", "<|start|>", "<|message|>")
_LOCK = threading.Lock()
_LOADED: dict[str, HarmonyTokenizer] = {}


class HarmonyTokenizer(Tokenizer, Protocol):
    """A `Tokenizer` with Harmony's specials at their ids and a readable vocabulary (what `HarmonyPrompts` reads)."""

    def convert_tokens_to_ids(self, token: str) -> int: ...

    def get_vocab(self) -> dict[str, int]:
        """Token string -> id (byte-level BPE strings for ordinary tokens)."""
        ...


def tokenizer_cache_path() -> Path:
    """Where the converted `tokenizer.json` is cached (the name carries the vocabulary's hash)."""
    return cache_dir() / f"o200k_harmony-{O200K_SHA256[:16]}-v{_BUILD_VERSION}.tokenizer.json"


def _specials() -> list[tuple[int, str]]:
    return sorted((i, s) for s, i in harmony.SPECIAL_TOKENS.items() if i < HARMONY_VOCAB_SIZE)


def _build_backend(vocabulary: Path) -> Any:
    """The `tokenizers.Tokenizer` converted from the ranks file, specials added at their ids."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    data = vocabulary.read_bytes()
    ranks = parse_tiktoken_ranks(data)
    converter_class: Any = TikTokenConverter  # untyped upstream
    converter = converter_class(vocab_file=str(vocabulary), pattern=O200K_PATTERN)
    converter.load_tiktoken_bpe = lambda _path: ranks  # our parser: tiktoken is not needed
    backend = converter.converted()
    specials = _specials()
    if backend.get_vocab_size() != specials[0][0]:
        raise VocabularyUnavailableError(
            f"{vocabulary}: {backend.get_vocab_size()} ordinary tokens, expected {specials[0][0]}; rebuild it "
            "with `python scripts/build_o200k.py`"
        )
    backend.add_special_tokens([AddedToken(text, normalized=False, special=True) for _, text in specials])
    wrong = [(text, i) for i, text in specials if backend.token_to_id(text) != i]
    if wrong:  # pragma: no cover - would mean the ids are not contiguous
        raise VocabularyUnavailableError(f"o200k_harmony special tokens landed at the wrong ids: {wrong[:3]}")
    return backend


def _vocabulary() -> Path:
    path = harmony.vocabulary_path()
    if path is None:
        searched = ", ".join(str(p) for p in harmony.vocabulary_candidates())
        raise VocabularyUnavailableError(
            f"the o200k_harmony tokenizer is built from the vocabulary file {O200K_FILE}, which is missing "
            f"(searched: {searched}); build it once with `python scripts/build_o200k.py` (or `make env`), "
            "or point TIKTOKEN_ENCODINGS_BASE at a folder holding it"
        )
    harmony.load_harmony_encoding(path)  # hash-checked: a wrong file is refused, naming the expected hash
    return path


def _backend() -> Any:
    from tokenizers import Tokenizer

    cached = tokenizer_cache_path()
    if cached.is_file():
        try:
            return Tokenizer.from_file(str(cached))
        except Exception:  # a truncated or foreign file: rebuild it below
            pass
    backend = _build_backend(_vocabulary())
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=cached.name, dir=cached.parent)
        os.close(fd)
        backend.save(tmp)
        os.replace(tmp, cached)  # atomic: a concurrent reader sees the old file or the whole new one
    except OSError:
        pass  # a read-only cache only costs the conversion next time
    return backend


def o200k_harmony_tokenizer() -> HarmonyTokenizer:
    """The `o200k_harmony` `PreTrainedTokenizerFast` (one per process; see the module docstring).

    Raises `VocabularyUnavailableError` naming the missing vocabulary file and the command that builds it.
    """
    with _LOCK:
        tokenizer = _LOADED.get("o200k_harmony")
        if tokenizer is None:
            from transformers import PreTrainedTokenizerFast

            fast: Any = PreTrainedTokenizerFast  # untyped upstream
            named = set(_NAMED.values())
            extra = [text for _, text in _specials() if text not in named]
            tokenizer = fast(tokenizer_object=_backend(), extra_special_tokens=extra, **_NAMED)
            tokenizer.name_or_path = "o200k_harmony"
            _LOADED["o200k_harmony"] = tokenizer
        return tokenizer


def is_harmony_tokenizer(tokenizer: object) -> TypeGuard[HarmonyTokenizer]:
    """True for an `o200k_harmony` tokenizer (ours, a gpt-oss checkpoint's): Harmony's specials at their ids."""
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is None:
        return False
    try:
        return all(convert(text) == harmony.SPECIAL_TOKENS[text] for text in _MARKERS)
    except Exception:
        return False
