"""Arguments a model produced are parsed strictly and validated before anything runs.

The attack rows are the tool-argument-injection battery (G1-G11) of reference/sandbox.md: hostile
text stays plain data, ambiguous JSON is refused, and every refusal is a typed `ToolArgumentError`
with a short message safe to show the model.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from parley.protocol import ToolCall
from parley.protocol.strict_json import nesting_depth
from parley.tools import ToolArgumentError, ToolExecutor, parse_arguments, tool, validate_arguments


@tool
def read_file(path: str, limit: int = 100, ratio: float = 1.0, flags: list[str] | None = None) -> str:
    """Read a file (test double: echoes its arguments)."""
    return f"{path}|{limit}|{ratio}|{flags}"


def _code(arguments: str | bytes, **limits: Any) -> str:
    with pytest.raises(ToolArgumentError) as info:
        parse_arguments(arguments, **limits)
    return info.value.code


SHELL_METACHARACTERS = [
    "a.txt; touch /tmp/parley-pwned #",
    "$(id)",
    "`id`",
    "a | cat /etc/passwd",
    "a && rm -rf /",
    "a\nrm -rf /",
    "~/x",
    "$HOME/x",
    "${IFS}cat${IFS}/etc/passwd",
    "'; DROP TABLE users; --",
]


@pytest.mark.parametrize("text", SHELL_METACHARACTERS)
def test_shell_metacharacters_arrive_as_the_literal_string(text: str, tmp_path: Path) -> None:
    arguments = ToolCall(id="c", name="read_file", arguments={"path": text}).arguments
    assert validate_arguments(read_file, arguments)["path"] == text
    [result] = asyncio.run(ToolExecutor([read_file]).execute([ToolCall(id="c", name="read_file", arguments=arguments)]))
    assert not result.is_error and result.content.startswith(text + "|")
    assert not Path("/tmp/parley-pwned").exists()


@pytest.mark.parametrize("text", ["../../etc/passwd", "/etc/passwd", "sub/../../x", "..\\..\\x", "%2e%2e/x", "．．／x"])
def test_traversal_strings_are_data_not_paths(text: str) -> None:
    # The generic layer neither resolves nor rejects paths: a path-taking tool validates its own root.
    assert validate_arguments(read_file, ToolCall(id="c", name="read_file", arguments={"path": text}).arguments) == {
        "path": text,
        "limit": 100,
        "ratio": 1.0,
        "flags": None,
    }


def test_duplicate_keys_are_refused_not_last_wins() -> None:
    assert _code('{"path": "ok.txt", "path": "../../etc/passwd"}') == "duplicate_key"
    assert _code('{"a": {"k": 1, "k": 2}}') == "duplicate_key"  # nested objects too


@pytest.mark.parametrize(
    "text", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e999}', '{"x": [-1e400]}']
)
def test_non_finite_numbers_are_refused(text: str) -> None:
    assert _code(text) == "non_finite_number"


@pytest.mark.parametrize(
    "text",
    ["{'path': 'x'}", '{"path": "x"} trailing', '{"path": "x"', '{"path": }', "not json", '{"path": "x",}', "\x00"],
)
def test_malformed_json_is_refused(text: str) -> None:
    assert _code(text) == "not_json"


@pytest.mark.parametrize("text", ['"a bare string"', "[1, 2]", "42", "null", "true"])
def test_top_level_must_be_an_object(text: str) -> None:
    assert _code(text) == "not_object"


def test_oversized_payload_is_refused_before_parsing() -> None:
    big = '{"path": "' + "A" * (50 * 1024 * 1024) + '"}'
    assert _code(big) == "too_large"
    assert _code(big.encode()) == "too_large"
    million = "[" + ",".join(["0"] * 1_000_000) + "]"
    assert _code('{"flags": ' + million + "}") == "too_large"
    # The limit counts UTF-8 bytes, not characters.
    assert _code('{"p": "' + "é" * 600 + '"}', max_bytes=1000) == "too_large"


def test_deep_nesting_is_refused_without_recursion() -> None:
    assert _code("[" * 100_000 + "]" * 100_000) == "too_deep"
    assert _code('{"a":' * 33 + "1" + "}" * 33) == "too_deep"
    assert parse_arguments('{"a":' * 31 + "1" + "}" * 31)  # within the default bound of 32
    # Brackets inside strings do not count.
    assert nesting_depth('{"a": "[[[[[[[[[[{{{{{{{{{"}') == 1
    assert nesting_depth('{"a": "\\"[[[["}') == 1


def test_other_hostile_values() -> None:
    assert _code('{"x": ' + "9" * 5000 + "}") == "not_json"  # beyond CPython's int-digit limit
    assert _code('{"x": "\\ud800"}') == "invalid_string"  # lone surrogate
    assert _code(b'{"x": "\xff"}') == "not_json"  # invalid UTF-8
    assert parse_arguments('{"x": "a\\u0000b"}') == {"x": "a\x00b"}  # NUL is data; path tools must refuse it


def test_empty_arguments_mean_no_arguments() -> None:
    assert parse_arguments("") == {}
    assert parse_arguments("  \n") == {}


@pytest.mark.parametrize(
    "arguments, field",
    [
        ('{"path": "x", "limit": "5"}', "limit"),  # no "5" for an int
        ('{"path": "x", "limit": 5.0}', "limit"),  # no float for an int
        ('{"path": "x", "limit": true}', "limit"),  # no bool for an int
        ('{"path": "x", "ratio": true}', "ratio"),  # no bool for a number
        ('{"path": "x", "ratio": "1.5"}', "ratio"),  # no string for a number
        ('{"path": 5}', "path"),  # no number for a string
        ('{"path": "x", "flags": "a"}', "flags"),  # no string for a list
        ('{"path": "x", "flags": [1]}', "flags.0"),
    ],
)
def test_type_coercions_are_refused(arguments: str, field: str) -> None:
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments(read_file, arguments)
    assert info.value.code == "schema"
    assert f"{field}:" in str(info.value)


def test_missing_and_extra_fields_are_schema_errors() -> None:
    with pytest.raises(ToolArgumentError, match="path: Field required"):
        validate_arguments(read_file, "{}")
    with pytest.raises(ToolArgumentError, match="shell: Extra inputs are not permitted"):
        validate_arguments(read_file, '{"path": "x", "shell": true}')


def test_int_is_accepted_for_a_float() -> None:
    assert validate_arguments(read_file, '{"path": "x", "ratio": 2}')["ratio"] == 2.0


def test_error_messages_do_not_echo_the_input() -> None:
    secret = "hunter2-canary-" + "x" * 40
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments(read_file, '{"path": "x", "limit": "' + secret + '"}')
    assert secret not in str(info.value)
    assert len(str(info.value)) < 300
