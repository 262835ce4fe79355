"""`RelativePath` and `CommandArgument` refuse traversal and option injection at the schema (G2-G6)."""

from __future__ import annotations

import json

import pytest

from parley.tools import CommandArgument, RelativePath, ToolArgumentError, tool


@tool
def read(path: RelativePath) -> str:
    return path


@tool
def grep(pattern: CommandArgument) -> str:
    return pattern


def _ok(t: object, **arguments: str) -> bool:
    try:
        t.validate_arguments(json.dumps(arguments))  # type: ignore[attr-defined]
    except ToolArgumentError as exc:
        assert exc.code == "schema"
        return False
    return True


@pytest.mark.parametrize(
    "path", ["a.txt", "sub/dir/file.tar.gz", ".hidden", "dir/", "name with spaces.md", "v1+2=3@x,y"]
)
def test_ordinary_relative_paths_pass(path: str) -> None:
    assert _ok(read, path=path)


@pytest.mark.parametrize(
    "path",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "sub/../../x",
        "x/..",
        "..\\..\\x",
        "%2e%2e/x",
        "．．／x",  # fullwidth look-alikes
        "a\u202eb",  # RTL override
        "a\x00b",
        "-rf",
        "a/--output=x",
        "~/x",
        "$HOME/x",
        "a//b",
        "a/./b",
        "",
        " leading",
        "x" * 2000,
    ],
)
def test_escaping_or_ambiguous_paths_are_schema_errors(path: str) -> None:
    assert not _ok(read, path=path)


def test_the_pattern_is_offered_to_the_model() -> None:
    assert "pattern" in read.parameters["properties"]["path"]


@pytest.mark.parametrize(
    "value, ok",
    [
        ("needle", True),
        ("a; rm -rf /", True),
        ("--output=/etc/passwd", False),
        ("-rf", False),
        ("", False),
        ("a\nb", False),
        ("a\x1b[2J", False),
    ],
)
def test_command_arguments_are_never_options(value: str, ok: bool) -> None:
    assert _ok(grep, pattern=value) is ok
