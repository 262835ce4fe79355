"""JSON Schema patterns are matched as ECMA-262 reads them, in time linear in the text.

The validator runs on model output, so a pattern that makes a backtracking engine explode
(`^([a-z0-9])+((-)?([a-z0-9])+)*$`, from a real schema) must not hang it.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.constrained import InvalidRegexError, ValidationFailed, ValidationUndecided, pattern_match, validate
from parley.constrained.pattern_match import pattern_fullmatch, pattern_search

EXPLOSIVE = [
    r"^([a-z0-9])+((-)?([a-z0-9])+)*$",  # Github_medium o71260: 4 s for 24 characters under `re`
    r"^(a|aa)*$",
    r"^(a+)+$",
    r"^(\w+\s?)*$",
    r"^(.*a){20}$",
]


@pytest.mark.parametrize("pattern", EXPLOSIVE)
def test_patterns_that_make_backtracking_explode_are_decided_on_long_texts(pattern: str) -> None:
    assert pattern_search(pattern, "a" * 4000 + "!") is False
    assert pattern_search(pattern, "a" * 4000) is True


def test_a_schema_with_an_explosive_pattern_rejects_a_long_string_instead_of_hanging() -> None:
    schema = {"type": "string", "pattern": EXPLOSIVE[0]}
    with pytest.raises(ValidationFailed) as failure:
        validate('"' + "ab" * 2000 + '_"', schema)
    assert failure.value.keyword == "pattern"
    assert validate('"ab-cd-ef"', schema) == "ab-cd-ef"


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        (r"^\w$", "Á", False),  # \w, \d are ASCII in ECMA-262
        (r"^\d$", "٣", False),
        (r"^\s$", "\u00a0", True),  # \s is Unicode whitespace in ECMA-262
        (r"^a$", "a\n", False),  # $ is the end of the text, not "before a final newline"
        (r"^.$", "\n", False),
        (r"^.$", "\r", False),  # . stops at every line terminator
        (r"^.$", "\u2028", False),
        (r"^.$", "😀", True),
        (r"^[^]$", "\n", True),  # an empty negated class is any character
        (r"[]", "anything", False),  # an empty class matches nothing
        (r"a{", "xa{", True),  # Annex B: a brace that opens no quantifier is a literal
        (r"^x{2,3}$", "xxxx", False),
        (r"^x{2,}$", "xxxx", True),
        (r"^x{2}?$", "xx", True),  # lazy: the same strings match
        (r"\bfoo\b", "a foo.", True),
        (r"\bfoo\b", "afoo", False),
        (r"\Bfoo", "afoo", True),
        (r"^[\d-z]+$", "1-z", True),  # Annex B: a class escape cannot bound a range
        (r"^[\b]$", "\b", True),
        (r"^\cJ$", "\n", True),
        (r"^\x41\u0042\u{1F600}$", "AB😀", True),
        (r"^\x4$", "x4", True),  # an incomplete \x is the letter x
        (r"^\/\.\-$", "/.-", True),
        (r"^(?:ab|c)+(?<tail>d)?$", "abcabd", True),
        (r"^a|b$", "xxb", True),  # alternation binds loosest
        (r"^\p{Lu}\p{Ll}+$", "Éva", True),
        (r"^\P{L}$", "1", True),
        (r"^[\p{L}\d]+$", "é1", True),
    ],
)
def test_ecma_262_readings(pattern: str, text: str, matches: bool) -> None:
    assert pattern_search(pattern, text) is matches


def test_dot_all_lets_the_dot_match_line_terminators() -> None:
    assert pattern_fullmatch(r"a.b", "a\nb") is False
    assert pattern_fullmatch(r"a.b", "a\nb", dot_all=True) is True


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        (r"^(?!.*--)[a-z-]+$", "a-b", True),
        (r"^(?!.*--)[a-z-]+$", "a--b", False),
        (r"^(\w)\1$", "aa", True),
        (r"^(\w)\1$", "ab", False),
        (r"(?<=@)example$", "x@example", True),
    ],
)
def test_lookarounds_and_backreferences_are_decided_by_a_bounded_backtracking_run(
    pattern: str, text: str, matches: bool
) -> None:
    assert pattern_match._compiled(pattern, False) is None  # not linear: the bounded run decides
    assert pattern_search(pattern, text) is matches


def test_a_bounded_run_that_runs_out_of_time_refuses_the_output_with_a_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pattern_match, "FALLBACK_SECONDS", 0.05)
    text = "a" * 200 + "b"
    with pytest.raises(ValidationUndecided) as undecided:
        pattern_search(r"^(?=a)(a|aa)*$", text)
    assert isinstance(undecided.value, ValidationFailed)
    assert undecided.value.keyword == "pattern" and undecided.value.text == text


@pytest.mark.parametrize("pattern", ["a**", "(a", "a)", "[b-a]", "*a", "a{3,2}", "[a", "(?x)a", "a\\"])
def test_patterns_that_do_not_parse_raise_invalid_regex(pattern: str) -> None:
    with pytest.raises(InvalidRegexError):
        pattern_search(pattern, "a")


def test_a_pattern_too_large_to_expand_is_left_to_the_bounded_run() -> None:
    pattern = r"^(a{1,300}){1,300}$"
    assert pattern_match._compiled(pattern, False) is None
    assert pattern_search(pattern, "a" * 500) is True


# -- differential: on the syntax where ECMA-262 and Python agree (ASCII text, no `.`, `$`, `\s`), `re` is the oracle --

_ATOMS = st.sampled_from(["a", "b", "-", r"\d", r"\w", r"\W", "[ab]", "[^a]", "[a-c1]", r"\b", "^"])


def _quantified(atom: str, quantifier: str) -> str:
    return atom if atom in (r"\b", "^") else atom + quantifier


_PIECES = st.builds(_quantified, _ATOMS, st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,3}", "{2,}", "*?"]))
_PATTERNS = st.recursive(
    st.lists(_PIECES, min_size=1, max_size=4).map("".join),
    lambda inner: st.one_of(
        st.builds(lambda a, b: f"{a}|{b}", inner, inner),
        st.builds(lambda a, q: f"(?:{a}){q}", inner, st.sampled_from(["", "*", "+", "?", "{1,2}"])),
        st.builds(lambda a, b: a + b, inner, inner),
    ),
    max_leaves=6,
)


@settings(max_examples=400, deadline=None)
@given(_PATTERNS, st.text(alphabet="ab1_- ", max_size=12))
def test_search_agrees_with_python_re_where_the_two_dialects_agree(pattern: str, text: str) -> None:
    assert pattern_search(pattern, text) is (re.search(pattern, text, re.ASCII) is not None)
    assert pattern_fullmatch(pattern, text) is (re.fullmatch(pattern, text, re.ASCII) is not None)


# -- Regex specs are read as Python's `re` reads them (their backends' dialect), still in linear time --


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        (r"\w+", "héllo", True),  # Unicode \w, \d, \s
        (r"\d", "٣", True),
        (r"a.b", "a\rb", True),  # `.` stops at "\n" only (without dot_all)
        (r"a$\n", "a\n", True),  # `$` also before a final newline
        (r"\Aab\Z", "ab", True),
        (r"[]a]+", "]a]", True),  # a `]` first in a class is a literal
        (r"\U0001F600", "😀", True),
        (r"(?i)abc", "ABC", True),  # inline flags: the bounded run reads them
        (r"(?P<x>a)(?P=x)", "aa", True),
    ],
)
def test_python_readings_for_regex_specs(pattern: str, text: str, matches: bool) -> None:
    assert pattern_fullmatch(pattern, text, python=True) is matches


def test_a_regex_spec_is_validated_as_python_reads_it_and_never_hangs() -> None:
    from parley.constrained import Regex

    assert validate("héllo wörld", Regex(r"\w+ \w+")) == "héllo wörld"
    with pytest.raises(ValidationFailed):
        validate("a" * 5000 + "!", Regex(r"(a|aa)*"))


@settings(max_examples=300, deadline=None)
@given(_PATTERNS, st.text(alphabet="ab1_- é\n", max_size=12))
def test_the_python_reading_agrees_with_python_re(pattern: str, text: str) -> None:
    assert pattern_fullmatch(pattern, text, python=True) is (re.fullmatch(pattern, text) is not None)


@pytest.mark.parametrize("pattern", [r"^(?<year>\d{4})$", r"^\p{L}+$"])
def test_schemas_with_ecma_only_syntax_are_accepted_at_intake(pattern: str) -> None:
    from parley.constrained.schema.check import check_schema

    check_schema({"type": "string", "pattern": pattern})


def test_a_schema_pattern_the_validator_cannot_read_is_refused_at_intake() -> None:
    from parley.constrained.schema.check import check_schema

    with pytest.raises(InvalidRegexError, match=r"\$\.pattern|at \$"):
        check_schema({"type": "string", "pattern": "(?i)abc"})
