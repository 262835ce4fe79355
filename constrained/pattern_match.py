"""Matching JSON Schema regexes in time linear in the text: a checker must never hang on its input.

Python's `re` backtracks: `^([a-z0-9])+((-)?([a-z0-9])+)*$` (a real schema's pattern) took 4 s to reject
24 characters, and each added character doubles that. A validator that runs on model output cannot
afford it, so patterns are read here as ECMA-262 reads them (`\\d`, `\\w`, `\\s`, `.`, `$` as ECMA
defines them, not as Python does) and run as a set of NFA states stepped once per character, with the
step from each (state set, character) remembered, a lazy DFA.

Lookarounds and backreferences cannot be run that way. Those patterns go to the `regex` package under
a time bound (`FALLBACK_SECONDS`); a pattern it cannot decide in time raises `ValidationUndecided`
rather than hanging or guessing.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parley.constrained.errors import InvalidRegexError, ValidationUndecided

FALLBACK_SECONDS = 2.0
"""How long the `regex` package may take over one lookaround/backreference pattern and one text."""

MAX_PROGRAM = 50_000
"""Instructions an expanded pattern may take (`(a{1,100}){1,100}` expands to 10,000 copies of `a`)."""

_MAX_CODE_POINT = 0x10FFFF
_Ranges = tuple[tuple[int, int], ...]
_DIGITS: _Ranges = ((0x30, 0x39),)
_WORD: _Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE: _Ranges = (  # ECMA-262 WhiteSpace and LineTerminator
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
    (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
)
_LINE_TERMINATORS: _Ranges = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
_CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D}
_CLASS_ESCAPES = {"d": (_DIGITS, False), "D": (_DIGITS, True), "w": (_WORD, False), "W": (_WORD, True),
                  "s": (_SPACE, False), "S": (_SPACE, True)}
_HEX = "0123456789abcdefABCDEF"


_CATEGORY_NAMES = {
    "Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll", "Titlecase_Letter": "Lt",
    "Modifier_Letter": "Lm", "Other_Letter": "Lo", "Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc",
    "Enclosing_Mark": "Me", "Number": "N", "Decimal_Number": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
    "Punctuation": "P", "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Open_Punctuation": "Ps",
    "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi", "Final_Punctuation": "Pf", "Other_Punctuation": "Po",
    "Symbol": "S", "Math_Symbol": "Sm", "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk", "Other_Symbol": "So",
    "Separator": "Z", "Space_Separator": "Zs", "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C",
    "Control": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co", "Unassigned": "Cn",
}


@functools.lru_cache(maxsize=64)
def _general_category(name: str) -> _Ranges | None:
    """The code points of a Unicode General_Category (`L`, `Lu`, `Letter`...), None for other properties."""
    import unicodedata

    short = _CATEGORY_NAMES.get(name, name)
    wanted = {"LC": ("Lu", "Ll", "Lt")}.get(short)
    if wanted is None and short not in {c for c in _CATEGORY_NAMES.values()}:
        return None
    if wanted is not None:
        return _code_points_where(lambda ch: unicodedata.category(ch) in wanted)
    return _code_points_where(lambda ch: unicodedata.category(ch).startswith(short))


def _code_points_where(holds: Callable[[str], bool]) -> _Ranges:
    """The code points whose character `holds`, as ranges (one pass over every code point: cache the result)."""
    ranges: list[tuple[int, int]] = []
    for code in range(_MAX_CODE_POINT + 1):
        if holds(chr(code)):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))
    return tuple(ranges)


class _NeedsBacktracking(Exception):
    """The pattern uses a lookaround or a backreference (or an escape only the `regex` package reads)."""


def _normalize(ranges: list[tuple[int, int]]) -> _Ranges:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _complement(ranges: _Ranges) -> _Ranges:
    out, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= _MAX_CODE_POINT:
        out.append((start, _MAX_CODE_POINT))
    return tuple(out)


@dataclass(frozen=True)
class _CharSet:
    """A set of code points as sorted, disjoint, inclusive ranges."""

    ranges: _Ranges
    starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "starts", tuple(lo for lo, _ in self.ranges))

    def __contains__(self, code: int) -> bool:
        at = bisect.bisect_right(self.starts, code) - 1
        return at >= 0 and code <= self.ranges[at][1]


# Syntax tree: ("set", _CharSet) | ("seq", [nodes]) | ("alt", [nodes]) | ("repeat", node, low, high|None)
# | ("assert", "^" | "$" | "b" | "B")
_Node = tuple[Any, ...]
_Instruction = tuple[Any, ...]


@functools.lru_cache(maxsize=8)
def _python_class(escape: str) -> _Ranges:
    """The code points Python's `re` (str patterns, no ASCII flag) matches with `\\d`, `\\w` or `\\s`."""
    import re

    compiled = re.compile("\\" + escape)
    return _code_points_where(lambda ch: compiled.match(ch) is not None)


class _Parser:
    """ECMA-262 pattern syntax with Annex B's leniencies (a `{` that opens no quantifier is a literal); with
    `python`, the readings of Python's `re` where they differ (Unicode `\\d` `\\w` `\\s`, `.` stops at `\\n` only,
    `$` also before a final newline, `\\A` `\\Z`, a `]` first in a class is a literal)."""

    def __init__(self, pattern: str, dot_all: bool, python: bool = False) -> None:
        self.pattern, self.at, self.dot_all, self.python = pattern, 0, dot_all, python

    def error(self, message: str) -> InvalidRegexError:
        return InvalidRegexError(f"invalid regex {self.pattern!r} at position {self.at}: {message}")

    def peek(self, ahead: int = 0) -> str:
        at = self.at + ahead
        return self.pattern[at] if at < len(self.pattern) else ""

    def parse(self) -> _Node:
        node = self.alternation()
        if self.at < len(self.pattern):
            raise self.error("unbalanced ')'")
        return node

    def alternation(self) -> _Node:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self) -> _Node:
        items: list[_Node] = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom()
            items.append(self.quantified(atom))
        return ("seq", items)

    def quantified(self, atom: _Node) -> _Node:
        bounds = self.quantifier()
        if bounds is None:
            return atom
        if atom[0] == "assert":
            raise self.error("nothing to repeat")
        if self.peek() == "?":  # lazy: the same strings match
            self.at += 1
        if self.quantifier(probe=True) is not None:
            raise self.error("multiple repeat")
        return ("repeat", atom, bounds[0], bounds[1])

    def quantifier(self, probe: bool = False) -> tuple[int, int | None] | None:
        ch, start = self.peek(), self.at
        if ch in ("*", "+", "?"):
            if not probe:
                self.at += 1
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        if ch != "{":
            return None
        close = self.pattern.find("}", start)
        body = self.pattern[start + 1 : close] if close > 0 else ""
        low, comma, high = body.partition(",")
        if not low.isdigit() or not (high.isdigit() or high == "") or (not comma and high):
            return None  # Annex B: a literal "{"
        bounds = (int(low), int(high) if high else (None if comma else int(low)))
        if bounds[1] is not None and bounds[1] < bounds[0]:
            raise self.error("numbers out of order in {} quantifier")
        if not probe:
            self.at = close + 1
        return bounds

    def atom(self) -> _Node:
        ch = self.peek()
        if ch in ("*", "+", "?") or (ch == "{" and self.quantifier(probe=True) is not None):
            raise self.error("nothing to repeat")
        self.at += 1
        if ch == "^":
            return ("assert", "^")
        if ch == "$":
            return ("assert", "$py" if self.python else "$")
        if ch == ".":
            stops = ((0x0A, 0x0A),) if self.python else _LINE_TERMINATORS
            return ("set", _CharSet(((0, _MAX_CODE_POINT),) if self.dot_all else _complement(stops)))
        if ch == "(":
            return self.group()
        if ch == "[":
            return ("set", self.char_class())
        if ch == "\\":
            return self.escape()
        code = ord(ch)
        return ("set", _CharSet(((code, code),)))

    def group(self) -> _Node:
        if self.peek() == "?":
            kind = self.pattern[self.at : self.at + 3]
            if kind.startswith(("?=", "?!", "?<=", "?<!")):
                raise _NeedsBacktracking
            if kind.startswith("?:"):
                self.at += 2
            elif kind.startswith(("?<", "?P<")):
                close = self.pattern.find(">", self.at)
                if close < 0:
                    raise self.error("unterminated group name")
                self.at = close + 1
            elif self.python:
                raise _NeedsBacktracking  # inline flags, atomic groups, comments: the `regex` package reads them
            else:
                raise self.error("unknown group extension")
        node = self.alternation()
        if self.peek() != ")":
            raise self.error("missing ')'")
        self.at += 1
        return node

    def escape(self) -> _Node:
        ch = self.peek()
        if ch == "":
            raise self.error("pattern ends with '\\'")
        if ch in ("b", "B"):
            self.at += 1
            return ("assert", ch)
        if self.python and ch in ("A", "Z"):
            self.at += 1
            return ("assert", "^" if ch == "A" else "$")
        octal = ch == "0" and self.peek(1).isdigit()
        if ch in "123456789" or ch == "k" or (self.python and (ch == "N" or octal)):
            raise _NeedsBacktracking  # backreferences; Python's named characters and octal escapes
        return ("set", self.class_escape())

    def class_escape(self, in_class: bool = False) -> _CharSet:
        """The set an escape after `\\` stands for (`self.at` is on the character after the backslash)."""
        ch = self.peek()
        self.at += 1
        if ch in _CLASS_ESCAPES:
            ranges, negated = _CLASS_ESCAPES[ch]
            ranges = _python_class(ch.lower()) if self.python else ranges
            return _CharSet(_complement(ranges) if negated else ranges)
        if ch in ("p", "P") and self.peek() == "{" and "}" in self.pattern[self.at :]:
            close = self.pattern.index("}", self.at)
            name = self.pattern[self.at + 1 : close]
            category = _general_category(name.removeprefix("gc=").removeprefix("General_Category="))
            if category is None:
                raise _NeedsBacktracking  # a script or binary property: the `regex` package reads those
            self.at = close + 1
            return _CharSet(_complement(category) if ch == "P" else category)
        code = self.escaped_code(ch, in_class)
        return _CharSet(((code, code),))

    def escaped_code(self, ch: str, in_class: bool) -> int:
        if ch in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[ch]
        if in_class and ch == "b":
            return 0x08
        if ch == "0" and not self.peek().isdigit():
            return 0
        if ch == "c" and self.peek().isascii() and self.peek().isalpha():
            self.at += 1
            return ord(self.pattern[self.at - 1]) % 32
        hex_pair = self.pattern[self.at : self.at + 2]
        if ch == "x" and len(hex_pair) == 2 and all(c in _HEX for c in hex_pair):
            self.at += 2
            return int(self.pattern[self.at - 2 : self.at], 16)
        if self.python and ch == "U" and all(c in _HEX for c in self.pattern[self.at : self.at + 8]):
            self.at += 8
            return int(self.pattern[self.at - 8 : self.at], 16)
        if ch == "u":
            digits = self.pattern[self.at : self.at + 4]
            if len(digits) == 4 and all(c in _HEX for c in digits):
                self.at += 4
                return int(digits, 16)
            close = self.pattern.find("}", self.at)
            braced = self.pattern[self.at + 1 : close] if self.peek() == "{" and close > 0 else ""
            if braced and all(c in _HEX for c in braced) and int(braced, 16) <= _MAX_CODE_POINT:
                self.at = close + 1
                return int(braced, 16)
        return ord(ch)  # an identity escape: `\\.`, `\\/`, `\\-`...

    def char_class(self) -> _CharSet:
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        ranges: list[tuple[int, int]] = []
        if self.python and self.peek() == "]":  # Python: `[]a]` is the class of `]` and `a`
            self.at += 1
            ranges.append((0x5D, 0x5D))
        while self.peek() != "]":
            if self.peek() == "":
                raise self.error("unterminated character set")
            low = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.at += 1
                high = self.class_atom()
                if len(low.ranges) == 1 == len(high.ranges) and low.ranges[0][0] == low.ranges[0][1] \
                        and high.ranges[0][0] == high.ranges[0][1]:
                    lo, hi = low.ranges[0][0], high.ranges[0][0]
                    if lo > hi:
                        raise self.error("bad character range")
                    ranges.append((lo, hi))
                    continue
                ranges.extend((*low.ranges, (0x2D, 0x2D), *high.ranges))  # Annex B: `[\\d-z]` is \\d, "-", z
                continue
            ranges.extend(low.ranges)
        self.at += 1
        merged = _normalize(ranges)
        return _CharSet(_complement(merged) if negated else merged)

    def class_atom(self) -> _CharSet:
        ch = self.peek()
        self.at += 1
        if ch == "\\":
            if self.peek() == "":
                raise self.error("pattern ends with '\\'")
            return self.class_escape(in_class=True)
        return _CharSet(((ord(ch), ord(ch)),))


# Program: a list of instructions ("set", _CharSet) | ("split", a, b) | ("jump", a) | ("assert", kind) | ("match",)
class _Compiler:
    def __init__(self) -> None:
        self.program: list[_Instruction] = []

    def emit(self, instruction: _Instruction) -> int:
        if len(self.program) >= MAX_PROGRAM:
            raise _NeedsBacktracking  # too large to expand: the bounded `regex` run decides it
        self.program.append(instruction)
        return len(self.program) - 1

    def node(self, node: _Node) -> None:
        kind = node[0]
        if kind in ("set", "assert"):
            self.emit(node)
        elif kind == "seq":
            for item in node[1]:
                self.node(item)
        elif kind == "alt":
            jumps = []
            for branch in node[1][:-1]:
                split = self.emit(("split", 0, 0))
                self.node(branch)
                jumps.append(self.emit(("jump", 0)))
                self.program[split] = ("split", split + 1, len(self.program))
            self.node(node[1][-1])
            for jump in jumps:
                self.program[jump] = ("jump", len(self.program))
        else:
            self.repeat(node[1], node[2], node[3])

    def repeat(self, body: _Node, low: int, high: int | None) -> None:
        for _ in range(low):
            self.node(body)
        if high is None:
            split = self.emit(("split", 0, 0))
            self.node(body)
            self.emit(("jump", split))
            self.program[split] = ("split", split + 1, len(self.program))
            return
        splits = []
        for _ in range(high - low):
            splits.append(self.emit(("split", 0, 0)))
            self.node(body)
        for split in splits:
            self.program[split] = ("split", split + 1, len(self.program))


_Context = tuple[bool, bool, bool, bool, bool]  # at the start, at the end, before a final "\n", word before, after


class LinearPattern:
    """A pattern compiled for linear-time matching; `search` and `fullmatch` answer yes or no.

    `python` reads it as Python's `re` does (Regex specs), not as ECMA-262 (JSON Schema's `pattern`)."""

    def __init__(self, pattern: str, *, dot_all: bool = False, python: bool = False) -> None:
        compiler = _Compiler()
        compiler.node(_Parser(pattern, dot_all, python).parse())
        compiler.emit(("match",))
        self.program = compiler.program
        self.pattern = pattern
        self._word = _CharSet(_python_class("w") if python else _WORD)
        self._closures: dict[tuple[frozenset[int], _Context], frozenset[int]] = {}
        self._steps: dict[tuple[frozenset[int], str], frozenset[int]] = {}

    def _is_word(self, text: str, at: int) -> bool:
        return 0 <= at < len(text) and ord(text[at]) in self._word

    def _closure(self, seeds: frozenset[int], context: _Context) -> frozenset[int]:
        key = (seeds, context)
        found = self._closures.get(key)
        if found is not None:
            return found
        at_start, at_end, before_final_newline, word_before, word_after = context
        holds = {"^": at_start, "$": at_end, "$py": at_end or before_final_newline,
                 "b": word_before != word_after, "B": word_before == word_after}
        seen: set[int] = set()
        stack = list(seeds)
        while stack:
            pc = stack.pop()
            if pc in seen:
                continue
            seen.add(pc)
            op = self.program[pc]
            if op[0] == "jump":
                stack.append(op[1])
            elif op[0] == "split":
                stack.extend((op[1], op[2]))
            elif op[0] == "assert" and holds[op[1]]:
                stack.append(pc + 1)
        result = frozenset(pc for pc in seen if self.program[pc][0] in ("set", "match"))
        if len(self._closures) > 4096:
            self._closures.clear()
        self._closures[key] = result
        return result

    def _step(self, states: frozenset[int], ch: str) -> frozenset[int]:
        key = (states, ch)
        found = self._steps.get(key)
        if found is not None:
            return found
        code = ord(ch)
        result = frozenset(pc + 1 for pc in states if self.program[pc][0] == "set" and code in self.program[pc][1])
        if len(self._steps) > 16384:
            self._steps.clear()
        self._steps[key] = result
        return result

    def _run(self, text: str, anywhere: bool) -> bool:
        match_pc = len(self.program) - 1
        states: frozenset[int] = frozenset()
        start = frozenset((0,))
        for at in range(len(text) + 1):
            seeds = states | start if anywhere or at == 0 else states
            final_newline = at == len(text) - 1 and text[at] == "\n"
            context = (at == 0, at == len(text), final_newline, self._is_word(text, at - 1), self._is_word(text, at))
            states = self._closure(seeds, context)
            if match_pc in states and (anywhere or at == len(text)):
                return True
            if at == len(text) or (not states and not anywhere):
                return False
            states = self._step(states, text[at])
        return False

    def search(self, text: str) -> bool:
        """Whether the pattern matches somewhere in `text` (JSON Schema's reading of `pattern`)."""
        return self._run(text, anywhere=True)

    def fullmatch(self, text: str) -> bool:
        """Whether the pattern matches the whole of `text`."""
        return self._run(text, anywhere=False)


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str, dot_all: bool, python: bool = False) -> LinearPattern | None:
    try:
        return LinearPattern(pattern, dot_all=dot_all, python=python)
    except _NeedsBacktracking:
        return None


def _bounded(pattern: str, text: str, *, whole: bool, dot_all: bool, python: bool = False) -> bool:
    import regex

    flags = regex.V0 | (0 if python else regex.ASCII) | (regex.DOTALL if dot_all else 0)
    try:
        if whole:
            return regex.fullmatch(pattern, text, flags, timeout=FALLBACK_SECONDS) is not None
        return regex.search(pattern, text, flags, timeout=FALLBACK_SECONDS) is not None
    except TimeoutError:
        raise ValidationUndecided(
            f"pattern {pattern!r} (a lookaround or backreference) could not be decided on a text of {len(text)} "
            f"characters within {FALLBACK_SECONDS} s",
            keyword="pattern",
            text=text,
        ) from None
    except regex.error as exc:
        raise InvalidRegexError(f"invalid regex {pattern!r}: {exc}") from None


def pattern_search(pattern: str, text: str) -> bool:
    """Whether `pattern` matches somewhere in `text`, as ECMA-262 reads it, in time linear in `text`."""
    compiled = _compiled(pattern, False)
    return compiled.search(text) if compiled is not None else _bounded(pattern, text, whole=False, dot_all=False)


def pattern_fullmatch(pattern: str, text: str, *, dot_all: bool = False, python: bool = False) -> bool:
    """Whether `pattern` matches the whole of `text` (`dot_all`: `.` matches line terminators too; `python`: read
    as Python's `re` reads it)."""
    compiled = _compiled(pattern, dot_all, python)
    if compiled is not None:
        return compiled.fullmatch(text)
    return _bounded(pattern, text, whole=True, dot_all=dot_all, python=python)


def check_pattern(pattern: str, *, python: bool = False) -> None:
    """Raise `InvalidRegexError` unless `pattern` parses, so that a spec is refused before it runs rather than
    its output after (a pattern that needs backtracking is checked by the `regex` package's parser)."""
    if _compiled(pattern, False, python) is not None:
        return
    import regex

    try:
        regex.compile(pattern, regex.V0 | (0 if python else regex.ASCII))
    except regex.error as exc:
        raise InvalidRegexError(f"invalid regex {pattern!r}: {exc}") from None
