"""A GGUF file's tensor table (names, shapes, block types) read straight from its header.

`quantization="auto"` has to know a file's block formats before anything is loaded, on every start of
`parley serve` or `LocalBackend()`. gguf-py's `GGUFReader` builds numpy views of every metadata value and
tensor: 3.6 s for the embedded 98 MB SmolLM2 file on this project's 2-core machines, most of it the
tokenizer's 49,152-entry string arrays. Reading the header by hand only skips those values (a length, a
seek) and takes milliseconds. Only the table is read; `GGUFReader` stays the reader of the data itself.

Layout (GGUF v2/v3, little-endian): magic ``GGUF``, uint32 version, uint64 tensor count, uint64 metadata
count; each metadata entry is a string key, a uint32 value type and the value (arrays: uint32 element type,
uint64 count, the elements); then each tensor: string name, uint32 dimension count, uint64 dimensions,
uint32 GGML type, uint64 data offset. A string is a uint64 byte length and the bytes.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.local_engine.errors import ModelLoadError

_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_STRING, _ARRAY = 8, 9
_MAX_ENTRIES = 1 << 24  # far above any real file; a larger count is a damaged header, not a model


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF's order: the row length first (gguf-py's `shape`)
    type_name: str  # GGML's name for the block format: "Q4_1", "Q8_0", "Q4_K", "F32", ...
    offset: int = 0  # where the tensor's bytes start, from the start of the file


class _Cursor:
    def __init__(self, data: mmap.mmap, path: Path) -> None:
        self.data, self.at, self.path = data, 0, path

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise ModelLoadError(f"{self.path}: the GGUF header ends early (cut or not a GGUF file)")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return int(value)

    def skip(self, size: int) -> None:
        if size < 0 or self.at + size > len(self.data):
            raise ModelLoadError(f"{self.path}: the GGUF header ends early (cut or not a GGUF file)")
        self.at += size

    def string(self) -> str:
        size = self.take("<Q")
        start = self.at
        self.skip(size)
        return bytes(self.data[start : self.at]).decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> None:
        if kind in _FIXED:
            self.skip(_FIXED[kind])
        elif kind == _STRING:
            self.skip(self.take("<Q"))
        elif kind == _ARRAY:
            inner, count = self.take("<I"), self.take("<Q")
            if count > _MAX_ENTRIES * 64:
                raise ModelLoadError(f"{self.path}: a GGUF metadata array claims {count} entries")
            if inner in _FIXED:
                self.skip(_FIXED[inner] * count)
            else:
                for _ in range(count):
                    self.skip_value(inner)
        else:
            raise ModelLoadError(f"{self.path}: unknown GGUF metadata value type {kind}")


def _type_name(type_id: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(type_id).name
    except (ImportError, ValueError):
        return f"type{type_id}"


def read_tensor_table(path: Path) -> list[TensorInfo]:
    """Every tensor's name, shape and block type, from the header alone (`ModelLoadError` if it is damaged)."""
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cur = _Cursor(data, path)
            if bytes(data[:4]) != b"GGUF":
                raise ModelLoadError(f"{path} is not a GGUF file (no GGUF magic)")
            cur.skip(4)
            version = cur.take("<I")
            if version not in (2, 3):
                raise ModelLoadError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            tensors, entries = cur.take("<Q"), cur.take("<Q")
            if tensors > _MAX_ENTRIES or entries > _MAX_ENTRIES:
                raise ModelLoadError(f"{path}: the GGUF header claims {tensors} tensors and {entries} entries")
            alignment = 32  # GGUF's default; `general.alignment` overrides it
            for _ in range(entries):
                key = cur.string()
                kind = cur.take("<I")
                if key == "general.alignment" and kind == 4:
                    alignment = max(cur.take("<I"), 1)
                else:
                    cur.skip_value(kind)
            infos = []
            for _ in range(tensors):
                name = cur.string()
                dims = cur.take("<I")
                if dims > 8:
                    raise ModelLoadError(f"{path}: tensor {name!r} claims {dims} dimensions")
                shape = tuple(cur.take("<Q") for _ in range(dims))
                infos.append((name, shape, cur.take("<I"), cur.take("<Q")))
            start = -(-cur.at // alignment) * alignment
            return [TensorInfo(name, shape, _type_name(kind), start + off) for name, shape, kind, off in infos]
    except (OSError, ValueError) as exc:  # unreadable, or empty (mmap of a 0-byte file)
        raise ModelLoadError(f"cannot read the GGUF header of {path}: {exc}") from exc


def layer_block_types(path: Path) -> Counter[str]:
    """How many 2-D layer weight matrices (``blk.N.*.weight``) the file stores in each block type."""
    return Counter(
        t.type_name for t in read_tensor_table(path)
        if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) >= 2
    )


def output_block_type(path: Path) -> str | None:
    """The LM head's block type: ``output.weight``, else the tied ``token_embd.weight`` (None if neither)."""
    table = {t.name: t.type_name for t in read_tensor_table(path)}
    return table.get("output.weight") or table.get("token_embd.weight")


def tensor_arrays(path: Path) -> list[tuple[TensorInfo, Any]]:
    """Every tensor with a read-only numpy view of its bytes, shaped as gguf-py's `GGUFReader` shapes `.data`
    (rows first; a block-quantised row as its bytes), memory-mapped: nothing is read until used."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    table = read_tensor_table(path)
    file = np.memmap(path, dtype=np.uint8, mode="r")
    floats = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
    out: list[tuple[TensorInfo, Any]] = []
    for info in table:
        dims = [int(d) for d in reversed(info.shape)] or [1]
        if info.type_name in floats:
            dtype = np.dtype(floats[info.type_name])
            count = int(np.prod(dims))
            raw = file[info.offset : info.offset + count * dtype.itemsize]
            shape = dims
        else:
            try:
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType[info.type_name]]
            except KeyError as exc:
                raise ModelLoadError(f"{path}: tensor {info.name!r} has an unknown type {info.type_name}") from exc
            if dims[-1] % block:
                raise ModelLoadError(f"{path}: tensor {info.name!r} rows are not whole {info.type_name} blocks")
            dtype = np.dtype(np.uint8)
            shape = [*dims[:-1], dims[-1] // block * size]
            raw = file[info.offset : info.offset + int(np.prod(shape))]
        if raw.size * raw.itemsize != int(np.prod(shape)) * dtype.itemsize:
            raise ModelLoadError(f"{path}: tensor {info.name!r} runs past the end of the file (cut?)")
        out.append((info, raw.view(dtype).reshape(shape)))
    return out
