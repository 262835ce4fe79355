"""Untrusted JSON means one thing or is refused, with a code that says why."""

from __future__ import annotations

import pytest

from parley.protocol.errors import ProtocolError
from parley.protocol.strict_json import StrictJsonError, loads_strict, nesting_depth


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('{"path": "ok", "path": "../../etc/passwd"}', "duplicate_key"),
        ('{"x": NaN}', "non_finite_number"),
        ('{"x": -Infinity}', "non_finite_number"),
        ('{"x": 1e999}', "non_finite_number"),
        ("[" * 40 + "]" * 40, "too_deep"),
        ('{"a": ', "not_json"),
        (b'{"a": "\xff"}', "not_json"),
        ('{"a": "' + "x" * 9000 + '"}', "too_large"),
        ('{"n": ' + "9" * 5000 + "}", "not_json"),
    ],
)
def test_ambiguous_or_hostile_json_is_refused_with_a_code(text: str | bytes, code: str) -> None:
    with pytest.raises(StrictJsonError) as info:
        loads_strict(text, max_bytes=8192, max_depth=32)
    assert info.value.code == code
    assert isinstance(info.value, ProtocolError)
    assert "passwd" not in str(info.value)  # messages never echo values


def test_plain_json_parses_as_usual() -> None:
    assert loads_strict('{"a": [1, 2.5, "x", null, true]}', max_bytes=1024, max_depth=4) == {
        "a": [1, 2.5, "x", None, True]
    }


def test_depth_ignores_brackets_inside_strings() -> None:
    assert nesting_depth('{"a": "[[[[{{{{"}') == 1
    assert nesting_depth('{"a": "\\"[[[["}') == 1
    assert nesting_depth('[[{"a": []}]]') == 4
