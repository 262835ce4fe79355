"""Every backend's grammar for a `format` takes every valid value, and what it lets through is validated.

A backend's own rule for a format is used only where it was checked exact on these values; elsewhere
parley's regex for the format (`parley.constrained.formats.GRAMMAR_PATTERNS`, the very check the
validator runs) is compiled in its place, or the format is left to validation with a reason.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.constrained import CompileCache, JsonSchema, ValidationFailed, compile
from parley.constrained.formats import GRAMMAR_PATTERNS, IPV4, IPV6
from tests.constrained.conftest import feed
from tests.constrained.test_formats import INVALID, VALID

MORE_VALID = {
    "ipv4": ["0.0.0.0", "255.255.255.255", "192.168.0.1"],
    "ipv6": ["::", "::1", "::ffff:1.2.3.4", "1:2:3:4:5:6:7:8", "1::", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8",
             "fe80::1:2", "1:2:3:4:5:6:1.2.3.4", "ABCD::EF"],
    "uuid": ["2eb8aa08-aa98-11ea-b4aa-73b441d16380"],
    "date": ["2020-02-29", "1999-12-31"],
}  # fmt: skip
MORE_INVALID = {
    "ipv4": ["256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5"],
    "ipv6": ["1:2:3:4:5:6:7:8:9", "::1%eth0", "1::2::3", "12345::", ":1:2", "::ffff:01.2.3.4", "1:2:3:4:5:6:7:1.2.3.4"],
    "uuid": ["2eb8aa08-aa98-11ea-b4aa-73b441d1638", "not-a-uuid"],
    "date": ["2021-02-29", "2020-13-01", "2020-1-01"],
}  # fmt: skip
FORMATS = sorted(set(VALID) | set(MORE_VALID))


_COMPILED = CompileCache()  # one compile per format and backend; each call gets a fresh matcher


def _matcher(tokenizer: Any, fmt: str, backend: str) -> Any:
    spec = JsonSchema({"type": "string", "format": fmt})
    return compile(spec, tokenizer, backend=backend, cache=_COMPILED)  # type: ignore[arg-type]


def _text(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "outlines", "auto"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_valid_value_of_a_format_is_reachable(smol_tokenizer: Any, fmt: str, backend: str) -> None:
    rejected = [
        value
        for value in VALID.get(fmt, []) + MORE_VALID.get(fmt, [])
        if not feed(_matcher(smol_tokenizer, fmt, backend), smol_tokenizer, _text(value))
    ]
    assert not rejected, f"{backend} rejects valid {fmt} values"


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "outlines", "auto"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_invalid_value_is_masked_out_or_caught_by_validation(smol_tokenizer: Any, fmt: str, backend: str) -> None:
    for value in INVALID.get(fmt, []) + MORE_INVALID.get(fmt, []):
        matcher = _matcher(smol_tokenizer, fmt, backend)
        if feed(matcher, smol_tokenizer, _text(value)):
            assert matcher.needs_validation, f"{backend} passes the invalid {fmt} {value!r} unvalidated"
            with pytest.raises(ValidationFailed):
                matcher.validate(_text(value))


@pytest.mark.parametrize(
    ("fmt", "backend"),
    [("email", "llguidance"), ("ipv6", "llguidance"), ("ipv6", "xgrammar"), ("uri", "xgrammar"),
     ("ipv4", "xgrammar"), ("uri-reference", "llguidance"), ("relative-json-pointer", "llguidance")],
)  # fmt: skip
def test_parleys_regex_makes_a_format_exact_where_the_backends_own_rule_was_not(
    smol_tokenizer: Any, fmt: str, backend: str
) -> None:
    matcher = _matcher(smol_tokenizer, fmt, backend)
    assert not matcher.needs_validation, matcher.warnings


def test_a_format_beside_a_pattern_is_left_to_validation_with_a_reason(smol_tokenizer: Any) -> None:
    spec = JsonSchema({"type": "string", "format": "email", "pattern": "^[a-z@.]+$"})
    matcher = compile(spec, smol_tokenizer, backend="llguidance", cache=CompileCache())
    assert matcher.needs_validation and any("format" in w and "pattern" in w for w in matcher.warnings)
    assert feed(matcher, smol_tokenizer, '"a@b.c"')


def test_xgrammar_leaves_index_shifted_relative_pointers_to_validation_and_auto_takes_llguidance(
    smol_tokenizer: Any,
) -> None:
    assert _matcher(smol_tokenizer, "relative-json-pointer", "xgrammar").needs_validation
    auto = _matcher(smol_tokenizer, "relative-json-pointer", "auto")
    assert auto.backend == "llguidance" and not auto.needs_validation
    assert feed(auto, smol_tokenizer, '"0+1/a"')


def test_every_grammar_pattern_is_in_the_syntax_ecma_262_and_python_share() -> None:
    for name, pattern in GRAMMAR_PATTERNS.items():
        assert "(?=" not in pattern and "(?!" not in pattern and "(?<" not in pattern, name
        assert not re.search(r"(?<!\\)\\[dwsDWS]", pattern), name


def _ipaddress_takes(kind: type, text: str) -> bool:
    try:
        address = kind(text)
    except ValueError:
        return False
    return not getattr(address, "scope_id", None)


_PIECES = st.sampled_from(["0", "1", "ff", "FFFF", "12345", "", "1.2.3.4", "01.2.3.4", "256.1.1.1", "g", "0000"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(_PIECES, min_size=1, max_size=9), st.integers(0, 40), st.sampled_from(["", ":", "::"]))
def test_the_ipv6_regex_takes_exactly_what_ipaddress_takes(pieces: list[str], at: int, insert: str) -> None:
    text = ":".join(pieces)
    text = text[:at] + insert + text[at:]
    assert (re.fullmatch(IPV6, text) is not None) == _ipaddress_takes(ipaddress.IPv6Address, text)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(["0", "1", "01", "99", "199", "249", "250", "255", "256", "2550", ""]), min_size=1,
                max_size=5))  # fmt: skip
def test_the_ipv4_regex_takes_exactly_what_ipaddress_takes(octets: list[str]) -> None:
    text = ".".join(octets)
    assert (re.fullmatch(IPV4, text) is not None) == _ipaddress_takes(ipaddress.IPv4Address, text)
