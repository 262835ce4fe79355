"""JSON Schema regexes as grammar backends read them: search semantics, escapes, assertions.

JSON Schema `pattern` / `patternProperties` use *search* semantics (`"^/"` means "starts with /")
while grammar backends match the whole string, so patterns are rewritten to the equivalent full
match. What no rewrite can make a backend enforce (a pattern naming an escaped character, a
lookaround, a backreference) is detected here so the backends can leave it to validation.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from parley.constrained.schema.walk import iter_subschemas


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


def full_match_pattern(pattern: str) -> str:
    """The full-match regex equivalent to JSON Schema's search-semantics `pattern`."""
    pattern = escape_control_chars(pattern)
    alternatives = []
    for alt in _split_top_level(pattern):
        head = alt[1:] if alt.startswith("^") else ".*" + alt if alt else ".*"
        if _ends_with_anchor(head):
            head = head[:-1]
        elif not head.endswith(".*"):
            head = head + ".*"
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


# A `pattern` that names a backslash or a double quote: both backends match patterns against the raw
# characters between the JSON quotes, so the escaped forms `\\` and `\"` never match and every value
# holding one is rejected. Such patterns are left out of the grammar and validated instead. (Wildcards such as `.`
# or `[^a]` keep the same blind spot: values with `\` or `"` are unreachable, outputs stay valid.)
_ESCAPE_MENTIONS = re.compile(r'"|\\\\|\\x(?:5[cC]|22)|\\u00(?:5[cC]|22)|\\x\{(?:5[cC]|22)\}')


def pattern_mentions_escape(pattern: str) -> bool:
    """Whether a regex names `\\` or `"` (characters a JSON string carries escaped)."""
    return bool(_ESCAPE_MENTIONS.search(pattern))


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
