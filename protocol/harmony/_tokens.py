"""Harmony's token layer: the `o200k_harmony` special tokens and the encodings that map text to ids.

Why a layer of our own on top of tiktoken: special tokens are where the trust boundary lives. parley
encodes every piece of a prompt separately — formatting tokens by id, content with special tokens
*disallowed* — so no string a user or a tool writes can become `<|start|>`. Keeping special-token
handling here (instead of tiktoken's) gives the same rules to both ordinary-token bases:

- `o200k` — the real vocabulary, read from a local `o200k_base.tiktoken` (never downloaded; see
  `vocabulary_path()` and `scripts/build_o200k.py`);
- `bytes` — one id per byte (0..255) with the same special ids; exact, dependency-free, and what tests
  and fuzzing use when the real vocabulary is not needed.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import os
import re
from collections.abc import Collection, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

from parley.protocol.errors import DecodeError, EncodeError, VocabularyUnavailableError

# --------------------------------------------------------------------------------------------------
# Special tokens (ids from openai/harmony `src/tiktoken_ext/public_encodings.rs`).

START = "<|start|>"
END = "<|end|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
CALL = "<|call|>"
RETURN = "<|return|>"

_NAMED_SPECIALS: dict[str, int] = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    RETURN: 200002,
    CONSTRAIN: 200003,
    CHANNEL: 200005,
    START: 200006,
    END: 200007,
    MESSAGE: 200008,
    CALL: 200012,
}
FIRST_SPECIAL_ID = 199998
LAST_SPECIAL_ID = 201088


def _build_special_tokens() -> dict[str, int]:
    named_ids = set(_NAMED_SPECIALS.values())
    table = dict(_NAMED_SPECIALS)
    for token_id in range(FIRST_SPECIAL_ID, LAST_SPECIAL_ID + 1):
        if token_id not in named_ids:
            table[f"<|reserved_{token_id}|>"] = token_id
    return table


SPECIAL_TOKENS: dict[str, int] = _build_special_tokens()
"""Every special token of `o200k_harmony` (1091 of them), text -> id."""
SPECIAL_BY_ID: dict[int, str] = {v: k for k, v in SPECIAL_TOKENS.items()}
STOP_TOKENS: frozenset[str] = frozenset({RETURN, CALL, END})
STOP_TOKENS_FOR_ASSISTANT_ACTIONS: frozenset[str] = frozenset({RETURN, CALL})

_SPECIAL_PATTERN = re.compile(r"<\|(?:[a-z]+|reserved_\d{6})\|>")
_MAX_SPECIAL_LEN = max(len(s) for s in SPECIAL_TOKENS)
_RESERVED_PREFIX = "<|reserved_"
_RESERVED_REST = re.compile(r"\d{0,6}\|?")


def split_special(text: str, allowed: Collection[str] | None = None) -> list[tuple[str, bool]]:
    """Split `text` into `(piece, is_special)`; `allowed=None` recognises every special token."""
    pieces: list[tuple[str, bool]] = []
    position = 0
    for match in _SPECIAL_PATTERN.finditer(text):
        token = match.group(0)
        if token not in SPECIAL_TOKENS or (allowed is not None and token not in allowed):
            continue
        if match.start() > position:
            pieces.append((text[position : match.start()], False))
        pieces.append((token, True))
        position = match.end()
    if position < len(text):
        pieces.append((text[position:], False))
    return pieces


def could_start_special(tail: str) -> bool:
    """True when `tail` (text at the end of a chunk) may be the beginning of a special token."""
    if not tail or len(tail) >= _MAX_SPECIAL_LEN:
        return False
    if any(token.startswith(tail) for token in _NAMED_SPECIALS):
        return True
    if len(tail) <= len(_RESERVED_PREFIX):
        return _RESERVED_PREFIX.startswith(tail)
    return tail.startswith(_RESERVED_PREFIX) and _RESERVED_REST.fullmatch(tail[len(_RESERVED_PREFIX) :]) is not None


# --------------------------------------------------------------------------------------------------
# Ordinary-token bases.


class _OrdinaryBase(Protocol):
    name: str

    def encode_ordinary(self, text: str) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes | None: ...


class _ByteBase:
    """One id per byte: exact for any text, no vocabulary file needed."""

    name = "bytes"

    def encode_ordinary(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes | None:
        return bytes((token_id,)) if 0 <= token_id < 256 else None


O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
"""The o200k_base split pattern (same as tiktoken's `o200k_base`)."""
O200K_FILE = "o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class _TiktokenBase:
    """o200k_base through tiktoken's BPE, built from a local ranks file."""

    name = "o200k"

    def __init__(self, ranks: dict[bytes, int]) -> None:
        try:
            import tiktoken
        except ImportError:  # pragma: no cover - depends on the environment
            raise VocabularyUnavailableError(
                "the o200k encoding needs the `tiktoken` package: pip install tiktoken"
            ) from None
        self._encoding: Any = tiktoken.Encoding(
            name="o200k_base_local", pat_str=O200K_PATTERN, mergeable_ranks=ranks, special_tokens={}
        )
        self._n_ordinary = len(ranks)

    def encode_ordinary(self, text: str) -> list[int]:
        return list(self._encoding.encode_ordinary(text))

    def token_bytes(self, token_id: int) -> bytes | None:
        if not 0 <= token_id < self._n_ordinary:
            return None
        try:
            return bytes(self._encoding.decode_single_token_bytes(token_id))
        except KeyError:
            return None


def cache_dir() -> Path:
    """parley's cache folder: `$PARLEY_CACHE_DIR/parley`, else `$XDG_CACHE_HOME/parley` (default `~/.cache`)."""
    base = os.environ.get("PARLEY_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "parley"


def vocabulary_candidates() -> list[Path]:
    """Where `o200k_base.tiktoken` is looked for, in order (openai/harmony's `TIKTOKEN_ENCODINGS_BASE` too)."""
    candidates = [cache_dir() / O200K_FILE]
    if os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
        candidates.append(Path(os.environ["TIKTOKEN_ENCODINGS_BASE"]) / O200K_FILE)
    return candidates


def vocabulary_path() -> Path | None:
    """The first existing candidate file, or None."""
    return next((path for path in vocabulary_candidates() if path.is_file()), None)


def parse_tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    """Parse the `.tiktoken` format: one `base64(token) rank` pair per line."""
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@lru_cache(maxsize=4)
def _load_o200k(path: str) -> _TiktokenBase:
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_SHA256:
        raise VocabularyUnavailableError(f"{path} has SHA-256 {digest}, expected {O200K_SHA256}; rebuild it")
    return _TiktokenBase(parse_tiktoken_ranks(data))


# --------------------------------------------------------------------------------------------------
# The encoding.

SpecialSpec = Literal["all"] | Collection[str]


def encodable_text(text: str) -> str:
    """Lone surrogates (not encodable as UTF-8) become U+FFFD, as tiktoken does, instead of raising."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class HarmonyEncoding:
    """`o200k_harmony`-style encoding: Harmony special tokens over an ordinary-token base."""

    def __init__(self, base: _OrdinaryBase) -> None:
        self._base = base
        self.name = f"harmony+{base.name}"
        self.special_tokens = SPECIAL_TOKENS

    # -- ids of special tokens ---------------------------------------------------------------------
    def special_id(self, token: str) -> int:
        return SPECIAL_TOKENS[token]

    def is_special_token(self, token_id: int) -> bool:
        return token_id in SPECIAL_BY_ID

    def stop_tokens(self) -> set[int]:
        return {SPECIAL_TOKENS[t] for t in STOP_TOKENS}

    # -- encoding ------------------------------------------------------------------------------------
    def encode_ordinary(self, text: str) -> list[int]:
        """Encode text with every special-token string treated as plain text (the untrusted-text path)."""
        return self._base.encode_ordinary(encodable_text(text))

    def encode(
        self, text: str, *, allowed_special: SpecialSpec = (), disallowed_special: SpecialSpec = "all"
    ) -> list[int]:
        """tiktoken-style: an allowed special string becomes its id; a disallowed one raises `EncodeError`."""
        allowed = set(SPECIAL_TOKENS) if allowed_special == "all" else set(allowed_special)
        disallowed = set(SPECIAL_TOKENS) - allowed if disallowed_special == "all" else set(disallowed_special)
        ids: list[int] = []
        for piece, special in split_special(text, allowed | disallowed):
            if not special:
                ids.extend(self._base.encode_ordinary(encodable_text(piece)))
            elif piece in allowed:
                ids.append(SPECIAL_TOKENS[piece])
            else:
                raise EncodeError(f"Encountered text corresponding to disallowed special token {piece!r}")
        return ids

    def encode_pieces(self, pieces: Iterable[tuple[str, bool]]) -> list[int]:
        """Encode `(text, is_special)` pieces: specials by id, everything else as ordinary text.

        Adjacent ordinary pieces are encoded together, so the ids are those of the whole text encoded
        with exactly these special tokens (BPE merges never depend on how the renderer cut its text).
        """
        ids: list[int] = []
        run: list[str] = []
        for piece, special in pieces:
            if not special:
                run.append(piece)
                continue
            if run:
                ids.extend(self._base.encode_ordinary(encodable_text("".join(run))))
                run = []
            ids.append(SPECIAL_TOKENS[piece])
        if run:
            ids.extend(self._base.encode_ordinary(encodable_text("".join(run))))
        return ids

    # -- decoding -------------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (a special token decodes to its text); `DecodeError` for unknown ids."""
        special = SPECIAL_BY_ID.get(token_id)
        if special is not None:
            return special.encode("ascii")
        data = self._base.token_bytes(token_id) if isinstance(token_id, int) else None
        if data is None:
            raise DecodeError(f"Invalid token for decoding: {token_id}")
        return data

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.token_bytes(token_id) for token_id in ids)

    def decode_utf8(self, ids: Sequence[int]) -> str:
        """Strict decoding: `DecodeError` on an unknown id or on invalid UTF-8."""
        data = self.decode_bytes(ids)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"Invalid utf-8 in decoded tokens: {exc}") from None

    def decode(self, ids: Sequence[int]) -> str:
        """Lossy decoding: invalid UTF-8 becomes U+FFFD (unknown ids still raise `DecodeError`)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def incremental_utf8_decoder() -> codecs.IncrementalDecoder:
    """A decoder that holds back an incomplete sequence and replaces invalid bytes by U+FFFD."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


def byte_level_encoding() -> HarmonyEncoding:
    """Harmony special tokens over one-id-per-byte ordinary tokens (no vocabulary file)."""
    return HarmonyEncoding(_ByteBase())


def load_harmony_encoding(path: str | os.PathLike[str] | None = None) -> HarmonyEncoding:
    """`o200k_harmony` from a local `o200k_base.tiktoken` (hash-checked); never downloads.

    Raises `VocabularyUnavailableError` naming the places searched and how to build the file.
    """
    resolved = Path(path) if path is not None else vocabulary_path()
    if resolved is None or not resolved.is_file():
        searched = ", ".join(str(p) for p in ([Path(path)] if path else vocabulary_candidates()))
        raise VocabularyUnavailableError(
            f"vocabulary file {O200K_FILE} not found (searched: {searched}); build it once with "
            "`python scripts/build_o200k.py` (rebuilds it from the npm package js-tiktoken) or point "
            "TIKTOKEN_ENCODINGS_BASE at a folder holding it"
        )
    return HarmonyEncoding(_load_o200k(str(resolved)))
