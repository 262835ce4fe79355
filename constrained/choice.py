"""Backend "auto": which backend compiles a spec, ranked by what the differential tests proved.

The ranking is a function of the spec alone (never of the machine, its load or a compile that timed
out), and it is recorded on the matcher (`Matcher.choice`), so a surprising choice can be read back.

For a JSON spec every backend is scored on the prepared documents:

1. A backend that would reject valid values and cannot be told not to is *ineligible*
   (`over_constrained`): llguidance and outlines-core generate properties in schema order (a spec
   with `any_order` and an object of several properties), outlines-core forbids extra object keys
   whatever `additionalProperties` says (tests/constrained/test_differential.py found its false
   rejections on every schema that admits extra keys). Such a backend is not tried at all.
2. outlines-core comes after every other eligible backend, whatever it enforces: the differential
   tests caught it rejecting valid values on 13 of the 26 isolated constructs (extra keys, string
   lengths with escapes, `date-time`, `allOf` read as a concatenation...), so it is a last resort.
3. Then a backend that enforces something at a price in reachable values (`costly`: xgrammar's
   strings under a pattern that admits `\\`, `"` or a control character cannot hold those escaped
   characters) comes after one that does not; the matcher's warnings name each such use. String
   lengths are no such price under auto: xgrammar is scored and compiled with them validated
   (`options_for`).
4. Among the rest, the fewest keyword uses left to validation wins (each backend's `unenforced`:
   what it cannot express, plus what the differential tests caught it rejecting wrongly — those
   uses are stripped from its grammar and checked after generation instead).
5. Ties go by `ORDER`: llguidance (no false rejection on any construct the tests isolate once its
   numeric bounds are left to validation), then xgrammar.

One rule holds on every backend and is not a ranking matter: a number the schema asks to be an integer
(`type: integer`, or an integer listed in `enum`/`const`) is written in integer spelling, `1`, never `1.0`
or `1e0`, although JSON Schema counts those as the same number (and `validate` accepts them). Every value
stays reachable, in its shortest spelling; the alternative, leaving every integer enum to validation, would
let a model write any number where the schema lists three. The differential tests' instances follow it
(hypothesis-jsonschema draws integers there), and a test pins it per backend.

Non-JSON specs keep the earlier order: EBNF grammars only compile on xgrammar, regexes and choices
try xgrammar, llguidance, then outlines-core. A backend that raises `UnsupportedSpecError` hands
over to the next in the ranking; any other failure (a deadline) is raised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from parley.constrained.backends.base import JsonOptions
from parley.constrained.schema.patterns import full_match_pattern, pattern_admits_escaped, pattern_mentions_escape
from parley.constrained.schema.prepare import JsonPart
from parley.constrained.schema.walk import KeywordUse, iter_subschemas
from parley.constrained.specs import Grammar, JsonSchema, Spec, ToolCalls

ORDER = ("llguidance", "xgrammar", "outlines")
NON_JSON_ORDER = ("xgrammar", "llguidance", "outlines")

Unenforced = Callable[[str, list[JsonPart], JsonOptions], list[KeywordUse]]


@dataclass(frozen=True)
class Ranking:
    """The backends to try, best first, and one line per backend saying why it stands where it does."""

    order: tuple[str, ...]
    reasons: tuple[tuple[str, str], ...]

    def record(self, chosen: str) -> str:
        """What `Matcher.choice` says once `chosen` compiled the spec."""
        why = dict(self.reasons)
        others = "; ".join(f"{name}: {text}" for name, text in self.reasons if name != chosen)
        return f"{chosen} ({why.get(chosen, 'requested')})" + (f"; {others}" if others else "")


def _schema_order(parts: list[JsonPart], backend: str) -> list[KeywordUse]:
    out = []
    for part in parts:
        for path, node in iter_subschemas(part.schema, part.label):
            props = node.get("properties")
            if isinstance(props, dict) and len(props) > 1:
                reason = f"{backend} generates properties in schema order; any_order would be ignored"
                out.append(KeywordUse("properties", path, node, reason))
    return out


def _extra_keys(parts: list[JsonPart], strict: bool) -> list[KeywordUse]:
    out = []
    for part in parts:
        for path, node in iter_subschemas(part.schema, part.label):
            if "properties" not in node and node.get("type") != "object":
                continue
            extra = node.get("additionalProperties", not strict)
            if extra is not False:
                reason = "outlines-core forbids extra keys whatever additionalProperties says"
                out.append(KeywordUse("additionalProperties", path, node, reason))
    return out


def over_constrained(backend: str, parts: list[JsonPart], options: JsonOptions) -> list[KeywordUse]:
    """Uses that `backend` would enforce more strictly than the schema says (valid values rejected)."""
    out: list[KeywordUse] = []
    if backend in ("llguidance", "outlines") and options.any_order:
        out += _schema_order(parts, backend)
    if backend == "outlines":
        out += _extra_keys(parts, options.strict)
    return out


def _bounded_strings(parts: list[JsonPart]) -> list[KeywordUse]:
    out = []
    for part in parts:
        for path, node in iter_subschemas(part.schema, part.label):
            if {"minLength", "maxLength"} & node.keys() and not {"pattern", "format"} & node.keys():
                reason = "xgrammar never writes an escaped character in a length-bounded string"
                out.append(KeywordUse("maxLength" if "maxLength" in node else "minLength", path, node, reason))
    return out


def _escape_blind(pattern: object) -> bool:
    return (
        isinstance(pattern, str)
        and not pattern_mentions_escape(pattern)
        and pattern_admits_escaped(full_match_pattern(pattern))
    )


def _escape_blind_patterns(parts: list[JsonPart], strict: bool) -> list[KeywordUse]:
    out = []
    for part in parts:
        for path, node in iter_subschemas(part.schema, part.label):
            if _escape_blind(node.get("pattern")):
                reason = "xgrammar never matches a backslash, a quote or a control character under a pattern"
                out.append(KeywordUse("pattern", path, node, reason))
            keys = node.get("patternProperties")
            # kept in xgrammar's grammar only where extra keys are forbidden (xgrammar._keyword_rules)
            if (
                isinstance(keys, dict)
                and node.get("additionalProperties", not strict) is False
                and any(map(_escape_blind, keys))
            ):
                reason = "xgrammar never writes a backslash, a quote or a control character in a patternProperties key"
                out.append(KeywordUse("patternProperties", path, node, reason))
    return out


def _misread_extra_keys(parts: list[JsonPart], strict: bool) -> list[KeywordUse]:
    from parley.constrained.backends.xgrammar import misreads_extra_keys

    reason = "xgrammar refuses some non-ASCII extra keys beside a declared name with a non-ASCII or escaped character"
    nodes = [(path, node) for part in parts for path, node in iter_subschemas(part.schema, part.label)]
    return [KeywordUse("additionalProperties", path, node, reason) for path, node in nodes
            if misreads_extra_keys(node, strict)]  # fmt: skip


def costly(backend: str, parts: list[JsonPart], options: JsonOptions) -> list[KeywordUse]:
    """Uses that `backend` enforces at a documented price in reachable values (a reason to rank it lower).

    xgrammar matches a string's raw JSON text, escapes and all: with `string_lengths="grammar"` it forbids
    escape sequences in length-bounded strings (`"\\u0010"` under maxLength 5 is rejected), and under a
    pattern that admits `\\`, `"` or a control character (`.`, `[^:]`, `[A-z]`, an unanchored end) it never
    produces one (`"\\u0017sa.com"` for `\\.[a-z]{2,3}$`, Github_easy o68324), nor in an object key matched
    by a `patternProperties` regex it keeps (`{"x-\\"": 1}` for `^x-`, Github_hard o74015); where extra keys are
    admitted beside a declared name with a non-ASCII character, it refuses some non-ASCII extra keys. llguidance
    counts lengths right and matches patterns on the decoded string. (A pattern that names `\\` or `"` is left to
    validation on xgrammar instead: `pattern_mentions_escape`.)
    """
    if backend != "xgrammar":
        return []
    lengths = _bounded_strings(parts) if options.lengths_in_grammar else []
    return lengths + _escape_blind_patterns(parts, options.strict) + _misread_extra_keys(parts, options.strict)


def options_for(backend: str, options: JsonOptions, requested: str) -> JsonOptions:
    """The options `backend` compiles with. Under auto, xgrammar leaves string lengths to validation: in its grammar
    a length-bounded string cannot hold an escaped character, and auto does not trade reachable values for
    bounded strings. It meets those where llguidance cannot compile the schema (generated schema seed 101:
    llguidance refused `maxProperties`, and xgrammar refused `"w\\u0012"` under `maxLength: 10`)."""
    if requested == "auto" and backend == "xgrammar" and options.lengths_in_grammar:
        return replace(options, lengths_in_grammar=False)
    return options


def rank(spec: Spec, parts: list[JsonPart], given: JsonOptions | None, unenforced: Unenforced) -> Ranking:
    """The ranking of module docstring for `spec` (`parts`: its prepared JSON documents, if any)."""
    if isinstance(spec, Grammar):
        return Ranking(("xgrammar",), (("xgrammar", "the only backend with EBNF grammars"),))
    if not isinstance(spec, (JsonSchema, ToolCalls)) or given is None:
        return Ranking(NON_JSON_ORDER, tuple((name, "fixed order for non-JSON specs") for name in NON_JSON_ORDER))
    scored: list[tuple[bool, int, int, int, str, str]] = []
    reasons: list[tuple[str, str]] = []
    for position, name in enumerate(ORDER):
        options = options_for(name, given, "auto")
        over = over_constrained(name, parts, options)
        if over:
            first = over[0]
            reasons.append((name, f"ineligible: {first.reason} ({first.keyword} at {first.path})"))
            continue
        missing = unenforced(name, parts, options)
        price = len(costly(name, parts, options))
        text = f"{len(missing)} keyword use(s) left to validation"
        text += (f", {price} use(s) enforced at a price in reachable values" if price else "") + (
            ", last resort" if name == "outlines" else ""
        )
        scored.append((name == "outlines", min(price, 1), len(missing), position, name, text))
    scored.sort()
    ranked = [(name, text) for *_, name, text in scored]
    return Ranking(tuple(name for name, _ in ranked), tuple(ranked + reasons))
