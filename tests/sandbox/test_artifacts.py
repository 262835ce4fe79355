"""Reading files back out of a work dir: only regular files beneath it, never through a symlink.

These run on the host side (`parley.sandbox.sandbox.read_artifact`), where a sandbox's leftovers are
hostile input: rows B4–B6 and G3–G6 of the battery.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from parley.sandbox import ArtifactError
from parley.sandbox.sandbox import collect_artifacts, read_artifact

SECRET = b"host-secret-bytes"


@pytest.fixture()
def workdir(tmp_path: os.PathLike[str]) -> Iterator[tuple[str, int, str]]:
    root = os.path.join(tmp_path, "work")
    os.mkdir(root)
    outside = os.path.join(tmp_path, "secret.txt")
    with open(outside, "wb") as handle:
        handle.write(SECRET)
    with open(os.path.join(root, "ok.txt"), "wb") as handle:
        handle.write(b"fine")
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    yield root, fd, outside
    os.close(fd)


def test_a_regular_file_is_read(workdir: tuple[str, int, str]) -> None:
    _, fd, _ = workdir
    assert read_artifact(fd, "ok.txt", 100) == b"fine"


@pytest.mark.parametrize("target", ["/etc/shadow", "{outside}", "../secret.txt", "/proc/self/root/etc/passwd"])
def test_b4_symlinks_are_refused(workdir: tuple[str, int, str], target: str) -> None:
    root, fd, outside = workdir
    os.symlink(target.format(outside=outside), os.path.join(root, "out.txt"))
    with pytest.raises(ArtifactError, match="symlink"):
        read_artifact(fd, "out.txt", 1 << 20)


def test_b4_a_symlinked_directory_is_refused(workdir: tuple[str, int, str]) -> None:
    root, fd, outside = workdir
    os.symlink(os.path.dirname(outside), os.path.join(root, "sub"))
    with pytest.raises(ArtifactError):
        read_artifact(fd, "sub/secret.txt", 1 << 20)


def test_b5_rename_race_never_returns_host_bytes(workdir: tuple[str, int, str]) -> None:
    """A sandbox flips out.txt between a regular file and a symlink to a host file while we collect."""
    root, fd, outside = workdir
    path = os.path.join(root, "out.txt")
    stop = threading.Event()

    def flip() -> None:
        regular, link = os.path.join(root, ".regular"), os.path.join(root, ".link")
        while not stop.is_set():
            with open(regular, "wb") as handle:
                handle.write(b"sandbox-bytes")
            os.replace(regular, path)
            os.symlink(outside, link)
            os.replace(link, path)

    flipper = threading.Thread(target=flip)
    flipper.start()
    outcomes = {"read": 0, "refused": 0}
    try:
        for _ in range(1000):
            try:
                data = read_artifact(fd, "out.txt", 1 << 20)
            except ArtifactError:
                outcomes["refused"] += 1
            else:
                assert data == b"sandbox-bytes", "host bytes came back through a swapped symlink"
                outcomes["read"] += 1
    finally:
        stop.set()
        flipper.join()
    assert outcomes["refused"] > 0  # the race was real


def test_b6_a_fifo_is_refused_quickly(workdir: tuple[str, int, str]) -> None:
    root, fd, _ = workdir
    os.mkfifo(os.path.join(root, "out.txt"))
    started = time.monotonic()
    with pytest.raises(ArtifactError, match="regular"):
        read_artifact(fd, "out.txt", 1 << 20)
    assert time.monotonic() - started < 0.1


def test_oversized_artifacts_are_refused(workdir: tuple[str, int, str]) -> None:
    root, fd, _ = workdir
    with open(os.path.join(root, "big.bin"), "wb") as handle:
        handle.write(b"x" * 1000)
    with pytest.raises(ArtifactError, match="cap"):
        read_artifact(fd, "big.bin", 999)


@pytest.mark.parametrize("name", [
    "../../etc/passwd", "/etc/passwd", "sub/../../x", "..\\..\\x", "%2e%2e/x/../../y", "a\x00b",
    "\uff0e\uff0e\uff0fx", "a\u202etxt.exe", "", ".", "-rf", "a//b",
])
def test_g3_to_g6_hostile_names_are_refused(workdir: tuple[str, int, str], name: str) -> None:
    _, fd, _ = workdir
    with pytest.raises(ArtifactError):
        read_artifact(fd, name, 100)


def test_collect_reports_each_refusal_and_keeps_the_good_files(workdir: tuple[str, int, str]) -> None:
    root, _, outside = workdir
    os.symlink(outside, os.path.join(root, "link.txt"))
    files, errors = collect_artifacts(root, ["ok.txt", "link.txt", "missing.txt"], 1 << 20)
    assert files == {"ok.txt": b"fine"}
    assert set(errors) == {"link.txt", "missing.txt"} and "not found" in errors["missing.txt"]
