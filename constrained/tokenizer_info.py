"""What grammars need to know of a tokenizer: each token's bytes, the stop tokens, the mask width.

Built once per (tokenizer, vocab_size) from a Hugging Face tokenizer and shared by every backend.
`vocab_size` is the width of the model's logits (the lm_head), which is often *larger* than the
tokenizer's vocabulary (padded to a multiple of 64/128). Masks are always that wide and ids past the
tokenizer's vocabulary are never allowed — otherwise a padded id stays unmasked and can be sampled
(xgrammar#611, mlc-llm#2651).

The `fingerprint` (a hash of vocabulary, special tokens, stop tokens and width) keys the compile
cache, so two tokenizer objects with the same vocabulary share compiled grammars.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes->unicode table used by byte-level BPE vocabularies."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    visible += list(range(ord("®"), ord("ÿ") + 1))
    codes = visible[:]
    extra = 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(visible, codes, strict=True)}


def _decode_tokens(vocab: dict[str, int], byte_level: bool) -> dict[int, bytes]:
    decoded: dict[int, bytes] = {}
    if byte_level:
        table = _byte_decoder()
        for token, tid in vocab.items():
            try:
                decoded[tid] = bytes(table[ch] for ch in token)
            except KeyError:  # an added token written in plain text
                decoded[tid] = token.encode()
        return decoded
    for token, tid in vocab.items():  # SentencePiece style: ▁ is a space, <0xNN> a raw byte
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            decoded[tid] = bytes([int(token[3:5], 16)])
        else:
            decoded[tid] = token.replace("\u2581", " ").encode()
    return decoded


@dataclass
class TokenizerInfo:
    """Tokenizer facts for grammar backends (see module docstring)."""

    tokenizer: Any
    vocab_size: int
    stop_token_ids: tuple[int, ...]
    special_token_ids: frozenset[int]
    token_bytes: dict[int, bytes] = field(repr=False)
    fingerprint: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _backend_cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_huggingface(
        cls, tokenizer: Any, *, vocab_size: int | None = None, stop_token_ids: Sequence[int] | None = None
    ) -> TokenizerInfo:
        vocab: dict[str, int] = dict(tokenizer.get_vocab())
        known = max(vocab.values()) + 1 if vocab else 0
        width = max(known, len(tokenizer)) if vocab_size is None else int(vocab_size)
        if width < known:
            from parley.constrained.errors import InvalidSpecError

            raise InvalidSpecError(f"vocab_size {width} is smaller than the tokenizer's vocabulary ({known} ids)")
        if stop_token_ids is None:
            eos = tokenizer.eos_token_id
            stops: tuple[int, ...] = () if eos is None else (int(eos),)
        else:
            stops = tuple(int(t) for t in stop_token_ids)
        specials = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", ()))
        byte_level = any("Ġ" in tok or "Ċ" in tok for tok in vocab)
        token_bytes = _decode_tokens(vocab, byte_level)
        digest = hashlib.sha256()
        for tid in sorted(token_bytes):
            digest.update(tid.to_bytes(4, "little") + token_bytes[tid] + b"\x00")
        digest.update(repr((width, stops, sorted(specials))).encode())
        return cls(
            tokenizer=tokenizer,
            vocab_size=width,
            stop_token_ids=stops,
            special_token_ids=specials,
            token_bytes=token_bytes,
            fingerprint=digest.hexdigest()[:32],
        )

    @property
    def bitmask_words(self) -> int:
        """Number of int32 words in one mask row: ceil(vocab_size / 32)."""
        return (self.vocab_size + 31) // 32

    @cached_property
    def whitespace_token_ids(self) -> frozenset[int]:
        """Ids of tokens made only of whitespace (used by the runaway guard)."""
        return frozenset(
            tid
            for tid, raw in self.token_bytes.items()
            if raw and tid not in self.special_token_ids and not raw.strip(b" \t\r\n")
        )

    def backend_state(self, name: str, build: Any) -> Any:
        """Per-backend derived state (xgrammar TokenizerInfo + compiler, outlines Vocabulary), built once."""
        with self._lock:
            if name not in self._backend_cache:
                self._backend_cache[name] = build(self)
            return self._backend_cache[name]


_CACHE: dict[tuple[int, int | None, tuple[int, ...] | None], tuple[Any, TokenizerInfo]] = {}
_CACHE_LOCK = threading.Lock()


def tokenizer_info(
    tokenizer: Any, *, vocab_size: int | None = None, stop_token_ids: Sequence[int] | None = None
) -> TokenizerInfo:
    """The (cached) `TokenizerInfo` of a Hugging Face tokenizer; a `TokenizerInfo` is returned as is."""
    if isinstance(tokenizer, TokenizerInfo):
        return tokenizer
    stops = None if stop_token_ids is None else tuple(stop_token_ids)
    key = (id(tokenizer), vocab_size, stops)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    info = TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    with _CACHE_LOCK:
        if len(_CACHE) > 16:
            _CACHE.clear()
        _CACHE[key] = (tokenizer, info)
    return info
