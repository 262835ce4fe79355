"""Content-addressed storage for the bytes of image and document parts.

Media parts (`ImagePart`, `DocumentPart`) carry the sha256 of their bytes. Serialised with a blob
store, a part whose bytes are larger than the store's `inline_limit` (`INLINE_LIMIT`, 256 KiB, by
default) leaves its bytes in the store and its JSON carries only the hash and the media type;
smaller bytes stay inline as base64. Loading with the store puts the bytes back (checked against
the hash: `BlobIntegrityError`); loading without it raises `MissingBlobError` naming the hash.
Without a store everything is inline: nothing is ever lost, the JSON is only larger.

`BlobStore` is a two-method protocol (`put`, `get`); `FolderBlobStore` (one file per blob, named by
its hash, written atomically, so writers in several processes are safe) and `MemoryBlobStore` are
the two stores parley ships. Pass one to ``RunState.to_json(blobs=...)``/``from_json`` or
``Conversation.to_json(blobs=...)``/``from_json``; ``RunState.save(path)`` keeps its blobs in a
folder next to the state file (``<path>.blobs/``).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from parley.protocol.errors import BlobIntegrityError, MissingBlobError

INLINE_LIMIT = 256 * 1024
"""Bytes at most this long stay inline (base64) in JSON even when a blob store is given."""

CONTEXT_KEY = "parley.blobs"
"""The key of the blob store in a pydantic (de)serialisation context."""

_HASH = re.compile(r"^[0-9a-f]{64}$")


def sha256_of(data: bytes) -> str:
    """The lowercase hex sha256 of `data` (the content address media parts carry)."""
    return hashlib.sha256(data).hexdigest()


@runtime_checkable
class BlobStore(Protocol):
    """Where large media bytes live, addressed by their sha256 (hex, lowercase)."""

    def put(self, data: bytes) -> str:
        """Store `data` (idempotent) and return its sha256."""
        ...

    def get(self, sha256: str) -> bytes:
        """The bytes stored under `sha256`; `MissingBlobError` if there are none."""
        ...


def _checked(sha256: str, data: bytes) -> bytes:
    actual = sha256_of(data)
    if actual != sha256:
        raise BlobIntegrityError(
            f"blob {sha256} does not match its hash (its bytes hash to {actual}): the store is corrupt",
            expected=sha256, actual=actual,
        )
    return data


def _missing(sha256: str, where: str) -> MissingBlobError:
    return MissingBlobError(f"blob {sha256} is not in {where}", sha256=sha256)


class MemoryBlobStore:
    """A blob store in a dict (tests, or a state that never leaves the process)."""

    def __init__(self, *, inline_limit: int = INLINE_LIMIT) -> None:
        self.inline_limit = inline_limit
        self.blobs: dict[str, bytes] = {}

    def put(self, data: bytes) -> str:
        digest = sha256_of(data)
        self.blobs.setdefault(digest, bytes(data))
        return digest

    def get(self, sha256: str) -> bytes:
        if sha256 not in self.blobs:
            raise _missing(sha256, "this MemoryBlobStore")
        return _checked(sha256, self.blobs[sha256])

    def __contains__(self, sha256: object) -> bool:
        return sha256 in self.blobs

    def __len__(self) -> int:
        return len(self.blobs)


class FolderBlobStore:
    """Blobs as files ``<root>/<first two hex digits>/<sha256>``; the folder is made on the first `put`.

    Writes go to a temporary file in the same folder, are fsynced and renamed into place, so a
    reader never sees half a blob and concurrent writers of the same bytes agree.
    """

    def __init__(self, root: str | os.PathLike[str], *, inline_limit: int = INLINE_LIMIT) -> None:
        self.root = Path(root)
        self.inline_limit = inline_limit

    def path_of(self, sha256: str) -> Path:
        if not _HASH.match(sha256):
            raise MissingBlobError(f"{sha256!r} is not a sha256 hex digest", sha256=sha256)
        return self.root / sha256[:2] / sha256

    def put(self, data: bytes) -> str:
        digest = sha256_of(data)
        target = self.path_of(digest)
        if target.exists():
            return digest
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{digest[:8]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        return digest

    def get(self, sha256: str) -> bytes:
        try:
            data = self.path_of(sha256).read_bytes()
        except FileNotFoundError:
            raise _missing(sha256, f"the blob folder {str(self.root)!r}") from None
        return _checked(sha256, data)

    def __contains__(self, sha256: object) -> bool:
        return isinstance(sha256, str) and bool(_HASH.match(sha256)) and self.path_of(sha256).exists()


def blob_context(store: BlobStore | None) -> dict[str, Any] | None:
    """The pydantic context that makes media parts use `store` (None: everything inline)."""
    return None if store is None else {CONTEXT_KEY: store}


def store_in(context: Any) -> BlobStore | None:
    """The blob store of a pydantic (de)serialisation context, if any."""
    if isinstance(context, dict):
        store = context.get(CONTEXT_KEY)
        if store is not None:
            return store  # type: ignore[no-any-return]
    return None


def inline_limit_of(store: BlobStore) -> int:
    limit = getattr(store, "inline_limit", INLINE_LIMIT)
    return limit if isinstance(limit, int) else INLINE_LIMIT
