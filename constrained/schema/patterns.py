"""JSON Schema regexes as grammar backends read them: search semantics, escapes, assertions.

JSON Schema `pattern` / `patternProperties` use *search* semantics (`"^/"` means "starts with /")
while grammar backends match the whole string, so patterns are rewritten to the equivalent full
match. What no rewrite can make a backend enforce (a pattern naming an escaped character, a
lookaround, a backreference) is detected here so the backends can leave it to validation.
"""

from __future__ import annotations

import copy
import re
from typing import Any, NamedTuple

from parley.constrained.schema.walk import KeywordUse, iter_subschemas


def _split_top_level(pattern: str) -> list[str]:
    """Split a regex on `|` outside groups and classes."""
    parts, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":
                i += 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def _ends_with_anchor(alt: str) -> bool:
    if not alt.endswith("$"):
        return False
    backslashes = len(alt) - 1 - len(alt[:-1].rstrip("\\"))
    return backslashes % 2 == 0


def escape_control_chars(pattern: str) -> str:
    """`pattern` with raw control characters written as `\\xHH` escapes (the same regex).

    A schema's JSON may carry `"[^\\u0000]"` or a raw newline inside a class; xgrammar's regex
    parser refuses raw NUL and newline characters, escaped ones are fine everywhere.
    """
    if not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in pattern):
        return pattern
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(f"\\x{ord(nxt):02x}" if ord(nxt) < 0x20 or ord(nxt) == 0x7F else ch + nxt)
            i += 2
            continue
        out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch)
        i += 1
    return "".join(out)


ANY_TEXT = r"[\s\S]*"
"""What an unanchored end of a pattern may be followed or preceded by: any characters, newlines included
(`.*` would not match `"a\n"` for `^a`, which ECMA-262's search does: a false rejection the differential
tests found on llguidance)."""


def full_match_pattern(pattern: str) -> str:
    """The full-match regex equivalent to JSON Schema's search-semantics `pattern`."""
    pattern = escape_control_chars(pattern)
    alternatives = []
    for alt in _split_top_level(pattern):
        head = alt[1:] if alt.startswith("^") else ANY_TEXT + alt if alt else ANY_TEXT
        if _ends_with_anchor(head):
            head = head[:-1]
        elif not head.endswith(ANY_TEXT):
            head = head + ANY_TEXT
        alternatives.append(head)
    if len(alternatives) == 1:
        return alternatives[0]
    return "(?:" + ")|(?:".join(alternatives) + ")"


def rewrite_patterns(schema: Any) -> Any:
    """A copy of `schema` with `pattern` and `patternProperties` keys turned into full-match regexes."""
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    for _, sub in iter_subschemas(out):
        if isinstance(sub.get("pattern"), str):
            sub["pattern"] = full_match_pattern(sub["pattern"])
        props = sub.get("patternProperties")
        if isinstance(props, dict):
            sub["patternProperties"] = {full_match_pattern(k): v for k, v in props.items()}
    return out


# A `pattern` that names a backslash or a double quote: xgrammar matches patterns against the raw
# characters between the JSON quotes, so the escaped forms `\\` and `\"` never match and every value
# holding one is rejected. On xgrammar such patterns are left out of the grammar and validated instead.
# (llguidance matches the decoded string: no blind spot there.)
_ESCAPE_MENTIONS = re.compile(r'"|\\\\|\\x(?:5[cC]|22)|\\u00(?:5[cC]|22)|\\x\{(?:5[cC]|22)\}')


BESIDE_PATTERN = "parley's regex for this format cannot be combined with the node's own pattern"
WIDER_FORMAT = "parley's regex for this format leaves a host name's length or a date's calendar to validation"


def format_pattern_gaps(use: KeywordUse) -> list[KeywordUse]:
    """What a `format` use compiled as parley's regex (`formats_as_patterns`) leaves to validation: all of
    it beside the node's own pattern (stripped), the length bound of a wider regex (kept, then validated)."""
    from parley.constrained.formats import WIDER_THAN_CHECK

    if "pattern" in use.schema:
        return [KeywordUse(use.keyword, use.path, use.schema, BESIDE_PATTERN)]
    if use.schema.get("format") in WIDER_THAN_CHECK:
        return [KeywordUse(use.keyword, use.path, use.schema, WIDER_FORMAT)]
    return []


def formats_as_patterns(schema: Any, names: set[str]) -> Any:
    """A copy of `schema` where each `format` in `names` is replaced by parley's full-match regex for it
    (`parley.constrained.formats.GRAMMAR_PATTERNS`), so a backend whose own rule for the format rejects valid
    values enforces parley's check instead. A node with its own `pattern` keeps its `format`: one regex cannot
    say both (the backends leave such a format to validation)."""
    from parley.constrained.formats import GRAMMAR_PATTERNS

    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    for _, node in iter_subschemas(out):
        name = node.get("format")
        if name in names and name in GRAMMAR_PATTERNS and "pattern" not in node:
            del node["format"]
            node["pattern"] = GRAMMAR_PATTERNS[name]
    return out


def pattern_mentions_escape(pattern: str) -> bool:
    """Whether a regex names `\\` or `"` (characters a JSON string carries escaped)."""
    return bool(_ESCAPE_MENTIONS.search(pattern))


_ESCAPED = frozenset({0x22, 0x5C, *range(0x20)})  # what a JSON string must write escaped: ", \ and controls
_CLASS_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}


def _escape_at(pattern: str, i: int) -> tuple[int | None, bool, int]:
    """The backslash escape at `pattern[i]`: (its code point or None, whether it admits an escaped character,
    the index after it)."""
    c = pattern[i + 1] if i + 1 < len(pattern) else ""
    if c in "SWDs":  # \s holds \n \t \r; the negated classes hold `\`, `"` and controls
        return None, True, i + 2
    if c in _CLASS_ESCAPES:
        return _CLASS_ESCAPES[c], _CLASS_ESCAPES[c] in _ESCAPED, i + 2
    if c == "c":
        return None, True, i + 3
    for lead, width in (("x", 2), ("u", 4)):
        digits = pattern[i + 2 : i + 2 + width]
        if c == lead and len(digits) == width and all(d in "0123456789abcdefABCDEF" for d in digits):
            code = int(digits, 16)
            return code, code in _ESCAPED, i + 2 + width
    return (ord(c) if c else None), False, i + 2  # \d, \w, \b, an escaped literal ...


def pattern_admits_escaped(pattern: str) -> bool:
    """Whether a value matching `pattern` may hold a character JSON writes escaped (`\\`, `"`, a control
    character): an unescaped `.`, a negated class, `\\S`/`\\W`/`\\D`/`\\s`, a control escape, or a class
    range over one of them (`[A-z]` holds `\\`). xgrammar never matches those characters there (Github_easy
    o68324, Github_medium o23174), so a value holding one is unreachable."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            _, admits, i = _escape_at(pattern, i)
            if admits:
                return True
            continue
        if c == ".":
            return True
        if c != "[":
            i += 1
            continue
        i += 1
        if i < n and pattern[i] == "^":
            return True
        while i < n and pattern[i] != "]":
            if pattern[i] == "\\":
                code, admits, i = _escape_at(pattern, i)
            else:
                code, admits, i = ord(pattern[i]), False, i + 1
            if admits:
                return True
            if i + 1 < n and pattern[i] == "-" and pattern[i + 1] != "]" and code is not None:
                if pattern[i + 1] == "\\":
                    high, admits, i = _escape_at(pattern, i + 1)
                else:
                    high, admits, i = ord(pattern[i + 1]), False, i + 2
                if admits or (high is not None and any(code <= e <= high for e in _ESCAPED)):
                    return True
        i += 1
    return False


# Regex assertions xgrammar cannot express: a lookahead is read as always true (`^((?!mode).)*$`
# accepts "amodeb": a superset, so the pattern may stay in the grammar), a lookbehind or a
# backreference is a compile error. outlines-core refuses all of them. Left to validation.
_UNESCAPED = r"(?<!\\)(?:\\\\)*"
_LOOKAHEAD = re.compile(_UNESCAPED + r"\(\?[=!]")
_LOOKBEHIND_OR_BACKREF = re.compile(_UNESCAPED + r"(?:\(\?<[=!]|\\[1-9]|\\k<)")


def pattern_has_lookahead(pattern: str) -> bool:
    """Whether a regex uses a lookahead (`(?=...)`, `(?!...)`)."""
    return bool(_LOOKAHEAD.search(pattern))


def pattern_has_lookbehind_or_backreference(pattern: str) -> bool:
    """Whether a regex uses a lookbehind or a backreference."""
    return bool(_LOOKBEHIND_OR_BACKREF.search(pattern))


def _repeats(quantifier: str) -> bool:
    """Whether a quantifier repeats its atom a varying number of times (`*`, `+`, `{1,}`, `{2,3}`; not `?`, `{2}`)."""
    counts = re.fullmatch(r"\{(\d+)(,(\d*))?\}\??", quantifier)
    if counts is None:
        return quantifier[:1] in ("*", "+")
    return counts.group(2) is not None and counts.group(3) != counts.group(1)


class _Atom(NamedTuple):
    """A regex atom as `pattern_has_optional_repeat_edge` reads it."""

    starts: bool  # with an atom repeated by `+`/`*`
    ends: bool
    lone: bool  # a lone repeated atom (`a+`): harmless alone in an optional group
    nullable: bool


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class opening at `pattern[i]`."""
    i += 1
    if pattern[i : i + 1] == "^":
        i += 1
    if pattern[i : i + 1] == "]":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _quantifier(pattern: str, i: int) -> tuple[str, int]:
    """The quantifier at `pattern[i]` (`""` if none: a `{` that is no `{n}`, `{n,}`, `{n,m}` is a literal)."""
    match = re.compile(r"(?:[*+?]|\{\d+(?:,\d*)?\})\??").match(pattern, i)
    return (match.group(), match.end()) if match else ("", i)


def pattern_has_optional_repeat_edge(pattern: str) -> bool:
    """Whether a regex has an optional group (`(...)?`) one of whose alternatives starts or ends with an atom
    repeated by `+` or `*` next to another atom: `(a+b)?`, `(\\.[0-9]+)?`, `([0-9]+Y)?`, `((a+b))?`.

    xgrammar's regex for JSON strings then also admits the repeated atom alone: `x(a+b)?` matches `"xa"`,
    `x(ab+)?` matches `"xb"`, `^-?P([0-9]+Y)?([0-9]+M)?...$` matches `"-P0Y0"` (Github_trivial o41609); its
    plain regex grammars, `(a+b){0,1}`, `(a+b)*` and a repeat inside (`(ba+b)?`) are right. A wider pattern,
    never a narrower one: kept in its grammar and validated."""
    found = False

    def edges(alt: list[_Atom]) -> tuple[bool, bool]:
        """Whether a repeated atom can come first (last) in `alt`: the first (last) one, or one after (before)
        atoms that may be absent (`a?[ab]+a`)."""
        def edge(atoms: list[_Atom], side: int) -> bool:
            for atom in atoms:
                if atom[side]:
                    return True
                if not atom.nullable:
                    return False
            return False

        return edge(alt, 0), edge(alt[::-1], 1)

    def sequence(i: int) -> tuple[list[list[_Atom]], int]:
        """The alternatives from `pattern[i]` to the closing `)`."""
        nonlocal found
        alternatives: list[list[_Atom]] = [[]]
        while i < len(pattern) and pattern[i] != ")":
            c = pattern[i]
            inner: list[list[_Atom]] | None = None
            if c == "|":
                alternatives.append([])
                i += 1
                continue
            if c in "^$":
                i += 1
                continue
            if c == "(":
                j = i + 1
                if pattern.startswith("?<", j) and pattern[j + 2 : j + 3] not in ("=", "!"):  # (?<name>
                    j = pattern.find(">", j) + 1 or len(pattern)
                elif pattern.startswith("?", j):  # (?:  (?=  (?!  (?<=  (?<!
                    j += 3 if pattern.startswith("?<", j) else 2
                inner, j = sequence(j)
                j += 1
            elif c == "[":
                j = _class_end(pattern, i)
            elif c == "\\":
                j = i + 2
                if pattern[i + 1 : i + 2] in ("p", "P", "u", "x") and pattern[j : j + 1] == "{":
                    j = pattern.find("}", j) + 1 or len(pattern)
            else:
                j = i + 1
            quantifier, i = _quantifier(pattern, j)
            repeated = _repeats(quantifier)
            optional = quantifier[:1] in ("?", "*") or quantifier.startswith("{0")
            if inner is None:
                alternatives[-1].append(_Atom(repeated, repeated, repeated, optional))
                continue
            sides = [edges(alt) for alt in inner if alt]
            edged = [any(edges(alt)) for alt in inner if alt and not (len(alt) == 1 and alt[0].lone)]  # `(a+)?`: right
            found = found or (quantifier in ("?", "??") and any(edged))
            starts = repeated or any(first for first, _ in sides)  # a quantified group starts with its body
            ends = repeated or any(last for _, last in sides)
            empty = any(all(atom.nullable for atom in alt) for alt in inner)
            alternatives[-1].append(_Atom(starts, ends, False, optional or empty))
        return alternatives, i

    i = 0
    while i < len(pattern):  # an unbalanced `)` ends a sequence early: go on after it
        _, i = sequence(i)
        i += 1
    return found
