"""xgrammar backend (default): Earley-parser matchers with precomputed/dynamic token-mask caches.

One `GrammarCompiler` per tokenizer (xgrammar's own cache disabled: parley caches compiled grammars
by spec). Dynamic compilation is on: token-mask cache entries are built on first use instead of
all up front, which turns multi-second compiles of large schemas into milliseconds.

What xgrammar compiles but does not enforce (its converter only logs a warning) is listed in
`UNENFORCED`; string length bounds are a choice (see `unenforced`); keywords its converter never
reads where they stand are found by `parley.constrained.schema.dispatch`. The compiler strips/records
those and validates outputs afterwards.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from parley.constrained.backends.base import JsonOptions
from parley.constrained.backends.xgrammar_forms import root_recursion_as_definition, tuples_as_prefix_items
from parley.constrained.errors import (
    BackendUnavailableError,
    GrammarSyntaxError,
    InvalidRegexError,
    UnsupportedSpecError,
)
from parley.constrained.schema import dispatch
from parley.constrained.schema.patterns import (
    WIDER_FORMAT,
    format_pattern_gaps,
    formats_as_patterns,
    pattern_has_lookahead,
    pattern_has_lookbehind_or_backreference,
    pattern_has_optional_repeat_edge,
    pattern_mentions_escape,
)
from parley.constrained.schema.refs import rebase_refs
from parley.constrained.schema.walk import KeywordUse, scan_keywords
from parley.constrained.schema.widen import admits_fractions, widen_untyped
from parley.constrained.specs import HERMES_CLOSE, HERMES_OPEN, ToolCalls

if TYPE_CHECKING:
    import torch

    from parley.constrained.tokenizer_info import TokenizerInfo

UNENFORCED = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "contains",
    "minContains", "maxContains", "multipleOf", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
}  # fmt: skip
LENGTHS = {"minLength", "maxLength"}
# Its own rules are not used for "uri-reference" (absolute references rejected: "https://example.com/x"),
# "hostname" (lowercase letters only: "G5.sport" rejected, Github_hard o27023) and "email" (two characters in
# every domain label after the first dot: "a@b.c" rejected, Github_medium o71405). Emails are validated (parley's
# regex admits `"` and `\` in a quoted local part, which xgrammar cannot write under a pattern: `choice.costly`).
SUPPORTED_FORMATS = {"date", "time", "date-time", "duration", "uuid", "uri-template", "json-pointer"}
# Found by checking the formats exactly (tests/constrained/test_format_grammars.py): xgrammar's own rules reject
# IPv6 addresses ending in IPv4 ("1:2:3:4:5:6:1.2.3.4") and URIs with an IP-literal host ("http://[2001:db8::7]/");
# they accept an invalid IPv4 or IPv6 address; parley's exact regexes (`parley.constrained.formats`) are compiled
# in their place, and for the formats it has no rule for whose regexes admit no escaped character.
OWN_PATTERN_FORMATS = {"ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "hostname", "date-time", "time"}
# Its relative-json-pointer rule rejects index shifts ("0+1/a"), and parley's regex would be escape-blind here.
RELATIVE_POINTER = "its rule rejects index shifts (0+1/a)"
BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
# xgrammar refuses integer bounds outside the signed 64-bit range ("precision loss at 64-bit boundary").
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Found by tests/constrained/test_differential.py: with a bound on a `number`, xgrammar's range grammar
# rejects exponents, more than ~6 fractional digits and -0.0 (0.17864000541092698 in [0, 1]).
FRACTION_BOUNDS = "its bounded-number grammar rejects valid spellings (exponents, long fractions, -0.0)"
# Why a lookahead is reported but kept: xgrammar reads it as always true, which only widens the pattern.
LOOKAHEAD = "lookaheads are read as always true"
# Found by the differential tests (Github_trivial o41609): in an optional group that starts or ends with a
# repeated atom, xgrammar's string regex also admits that atom alone ("-P0Y0" for `^-?P([0-9]+Y)?...$`).
WIDENED = "its string regex admits more than an optional group with a repeated atom at an end, e.g. (a+b)?"
# Found by checking the formats exactly (parley.constrained.formats): xgrammar's date rules take any day up to 31
# ("1990-02-31", "2021-02-29") and a leap second at any hour ("22:59:60Z"); its date-time and time rules also
# want an uppercase `T`/`Z` ("1963-06-19t08:30:06z" is RFC 3339 too), so parley's regex replaces those two.
LOOSE_DATES = "its date rules admit impossible days (2021-02-29, 1990-02-31) and leap seconds at any hour"
DATE_FORMATS = {"date", "date-time", "time"}
# Found by the generated-schema differential tests (seed 32: `{"🏻_id": ""}` refused where `_id$` takes a string and
# `additionalProperties` a number): once `patternProperties` is stripped, a key under a pattern would be held to a
# schema-valued `additionalProperties`.
PATTERN_KEYS = "beside a stripped patternProperties it would hold keys under a pattern to its own schema"
# Found by the generated-schema differential tests (seed 15: `{"ünï": {"enum": [0, false]}}` took `{"ünï":"x"}`):
# where extra keys are admitted, its extra-key rule fails to exclude declared names holding a non-ASCII or escaped
# character, so such a name can be written as an extra key with any value (a silently dropped constraint).
EXTRA_KEY_NAMES = "its extra-key rule admits declared names with non-ASCII or escaped characters as extra keys"
# Found by the generated-schema differential tests (seed 242): xgrammar refuses the whole schema ("range contains no
# multipleOf value") for an integer whose bounds hold no multiple, where the value may be absent (an optional
# property, an empty array): such a multipleOf is stripped and validated.
NO_MULTIPLE = "its range holds no multiple, which xgrammar refuses for the whole schema"
KEPT = {LOOKAHEAD, WIDENED, LOOSE_DATES, WIDER_FORMAT, EXTRA_KEY_NAMES}  # wider: kept in the grammar and validated
# Stripped from the schema before xgrammar sees it (it would enforce them incorrectly or reject them); and any use
# for a reason in STRIPPED_REASONS.
STRIPPED_REASONS = {NO_MULTIPLE}
STRIPPED = {"minLength", "maxLength", "format", "patternProperties", "pattern", "additionalProperties"} | BOUNDS


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BackendUnavailableError("the xgrammar backend needs `pip install xgrammar`") from exc
    return xgrammar


def _out_of_int64(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX


def _finite(value: Any) -> float | None:
    """`value` as a float if it is a finite JSON number, else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _integer_bound(node: dict[str, Any], low: bool) -> int | None:
    """The least (`low`) or greatest integer inside `node`'s bound on that side, if it has one."""
    inclusive, exclusive = ("minimum", "exclusiveMinimum") if low else ("maximum", "exclusiveMaximum")
    value, strict = _finite(node.get(inclusive)), node.get(exclusive)
    bounds: list[int] = []
    if value is not None:
        bounds.append(math.ceil(value) if low else math.floor(value))
        if strict is True and bounds[-1] == value:  # Draft 4's boolean form: the bound itself is out
            bounds[-1] += 1 if low else -1
    fence = _finite(strict)
    if fence is not None:
        bounds.append(math.floor(fence) + 1 if low else math.ceil(fence) - 1)
    if not bounds:
        return None
    return max(bounds) if low else min(bounds)


def _no_multiple_in_range(node: dict[str, Any]) -> bool:
    """Whether an integer `node` has both bounds and an integral `multipleOf` none of whose multiples lies between."""
    step = node.get("multipleOf")
    if "integer" not in dispatch.declared_types(node):
        return False
    if not isinstance(step, (int, float)) or isinstance(step, bool) or step <= 0 or not float(step).is_integer():
        return False
    low, high = _integer_bound(node, low=True), _integer_bound(node, low=False)
    if low is None or high is None or low > high:
        return False
    return -(-low // int(step)) > high // int(step)


def _not_plain_ascii(name: str) -> bool:
    """Whether `name` holds a character outside printable ASCII or one JSON writes escaped."""
    return any(not " " <= c <= "~" or c in '"\\' for c in name)


def misreads_extra_keys(node: dict[str, Any], strict: bool) -> bool:
    """Whether xgrammar's extra-key rule goes wrong on `node`: extra keys admitted beside a declared name with a
    non-ASCII or escaped character. It then admits that name as an extra key with any value (validated:
    `EXTRA_KEY_NAMES`) and refuses some other non-ASCII keys (`{"Ã_id": ...}` beside `ünï`, seed 363: a price in
    reachable values, `choice.costly`)."""
    names = node.get("properties")
    return (
        isinstance(names, dict)
        and node.get("additionalProperties", not strict) is not False
        and any(map(_not_plain_ascii, names))
    )


def unenforced(schema: Any, root: str, options: JsonOptions) -> list[KeywordUse]:
    """Keyword uses of `schema` (paths from `root`) that xgrammar would not enforce.

    Analysed on the schema xgrammar is given (widened when not strict). Besides the keyword list,
    everything xgrammar's one-handler-per-object reading drops (see `parley.constrained.schema.dispatch`).
    String length bounds: xgrammar enforces them but then forbids escape sequences in the bounded
    string, and it drops them next to `pattern`/`format`. With `lengths_in_grammar` they stay in
    the grammar (bounded strings cannot contain escapes — outputs stay valid, some valid values
    become unreachable) except next to pattern/format; otherwise they are all stripped and checked
    by validation (every valid value reachable, lengths unbounded while generating).
    """
    seen = widen_untyped(schema) if not options.strict else schema
    out = _keyword_rules(scan_keywords(seen, root), options.lengths_in_grammar, options.strict)
    out += dispatch.dropped_siblings(seen, root, dispatch.XGRAMMAR)
    out += dispatch.overlapping_one_of(seen, root, options.strict)
    out += dispatch.untyped_keywords(seen, root, dispatch.XGRAMMAR)
    out += dispatch.unattached_required(seen, root, dispatch.XGRAMMAR, options.strict)
    return dispatch.first_per_use(out)


def _keyword_rules(uses: list[KeywordUse], lengths_in_grammar: bool, strict: bool) -> list[KeywordUse]:
    out = []
    for use in uses:
        value = use.schema.get(use.keyword)
        if use.keyword == "multipleOf" and _no_multiple_in_range(use.schema):
            out.append(replace(use, reason=NO_MULTIPLE))
        elif use.keyword in UNENFORCED:
            out.append(use)
        elif use.keyword in LENGTHS and (not lengths_in_grammar or "pattern" in use.schema or "format" in use.schema):
            out.append(use)
        elif use.keyword == "uniqueItems" and value is True:
            out.append(use)
        elif use.keyword == "format" and value in OWN_PATTERN_FORMATS:
            out += format_pattern_gaps(use)
        elif use.keyword == "format" and value == "relative-json-pointer":
            out.append(replace(use, reason=RELATIVE_POINTER))
        elif use.keyword == "format" and value not in SUPPORTED_FORMATS:
            out.append(use)
        elif use.keyword == "format" and value in DATE_FORMATS:
            out.append(replace(use, reason=LOOSE_DATES))
        elif use.keyword == "allOf" and isinstance(value, list) and len(value) > 1:
            out.append(use)
        elif use.keyword == "patternProperties" and use.schema.get("additionalProperties", not strict) is not False:
            # xgrammar then admits only pattern keys (also when additionalProperties is absent and the
            # spec is not strict): stripped, extra keys follow additionalProperties; where that is a schema, a key
            # under a pattern would be held to it, so it is stripped too (loosened to any value)
            out.append(use)
            extra = use.schema.get("additionalProperties")
            if isinstance(extra, dict) and extra:
                out.append(KeywordUse("additionalProperties", use.path, use.schema, PATTERN_KEYS))
        elif use.keyword == "pattern" and isinstance(value, str) and pattern_mentions_escape(value):
            out.append(use)
        elif use.keyword == "pattern" and isinstance(value, str) and pattern_has_lookbehind_or_backreference(value):
            out.append(replace(use, reason="lookbehinds and backreferences are not supported"))
        elif use.keyword == "pattern" and isinstance(value, str) and pattern_has_lookahead(value):
            out.append(replace(use, reason=LOOKAHEAD))
        elif use.keyword == "patternProperties" and isinstance(value, dict) and any(map(pattern_has_lookahead, value)):
            out.append(replace(use, reason=LOOKAHEAD))
        elif use.keyword == "pattern" and isinstance(value, str) and pattern_has_optional_repeat_edge(value):
            out.append(replace(use, reason=WIDENED))
        elif (
            use.keyword == "patternProperties"
            and isinstance(value, dict)
            and any(map(pattern_has_optional_repeat_edge, value))
        ):
            out.append(replace(use, reason=WIDENED))
        elif use.keyword == "properties" and misreads_extra_keys(use.schema, strict):
            out.append(replace(use, reason=EXTRA_KEY_NAMES))
        elif use.keyword in BOUNDS and _out_of_int64(value):
            out.append(use)
        elif use.keyword in BOUNDS and admits_fractions(use.schema):
            out.append(replace(use, reason=FRACTION_BOUNDS))
    return out


@dataclass
class _State:
    info: Any
    compiler: Any


def _state(tok: TokenizerInfo) -> _State:
    def build(t: TokenizerInfo) -> _State:
        xgr = _xgr()
        info = xgr.TokenizerInfo.from_huggingface(
            t.tokenizer, vocab_size=t.vocab_size, stop_token_ids=list(t.stop_token_ids)
        )
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False, enable_dynamic_compilation=True)
        return _State(info, compiler)

    return tok.backend_state("xgrammar", build)  # type: ignore[no-any-return]


class XGrammarMatcher:
    def __init__(self, compiled: Any) -> None:
        self._matcher = _xgr().GrammarMatcher(compiled)

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> bool:
        return bool(self._matcher.fill_next_token_bitmask(bitmask, index))

    def accept_token(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def accept_text(self, text: str) -> bool:
        return bool(self._matcher.accept_string(text))

    def rollback(self, n: int) -> None:
        self._matcher.rollback(n)

    def is_completed(self) -> bool:
        return bool(self._matcher.is_completed())

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def reset(self) -> None:
        self._matcher.reset()

    def forced_tokens(self) -> list[int]:
        return list(self._matcher.find_jump_forward_tokens())


@dataclass
class XGrammarCompiled:
    compiled: Any
    backend: str = "xgrammar"

    def new_matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self.compiled)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class XGrammarBackend:
    """Compiles specs with xgrammar for one tokenizer."""

    name = "xgrammar"

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        self._tok = tokenizer
        self._state = _state(tokenizer)

    def unenforced(self, schema: Any, root: str, options: JsonOptions) -> list[KeywordUse]:
        return unenforced(schema, root, options)

    def _json_grammar(self, schema: Any, options: JsonOptions) -> Any:
        xgr = _xgr()
        kwargs: dict[str, Any] = {"strict_mode": options.strict, "any_order": options.any_order}
        if options.compact:
            kwargs.update(any_whitespace=False, separators=(",", ":"))
        else:
            kwargs.update(any_whitespace=True, max_whitespace_cnt=options.max_whitespace)
        if not options.strict:  # JSON Schema semantics: an untyped `{"items": ...}` also admits non-arrays
            schema = widen_untyped(schema)
        schema = tuples_as_prefix_items(formats_as_patterns(schema, OWN_PATTERN_FORMATS))
        schema = root_recursion_as_definition(schema)
        try:
            return xgr.Grammar.from_json_schema(json.dumps(schema), **kwargs)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError with converter messages
            raise UnsupportedSpecError(f"xgrammar cannot compile this schema: {_first_line(exc)}") from None

    def _compile(self, grammar: Any) -> XGrammarCompiled:
        try:
            return XGrammarCompiled(self._state.compiler.compile_grammar(grammar))
        except Exception as exc:
            raise UnsupportedSpecError(f"xgrammar failed to compile: {_first_line(exc)}") from None

    def json_schema(self, schema: Any, options: JsonOptions) -> XGrammarCompiled:
        return self._compile(self._json_grammar(schema, options))

    def regex(self, pattern: str) -> XGrammarCompiled:
        xgr = _xgr()
        try:
            grammar = xgr.Grammar.from_regex(pattern)
        except Exception as exc:
            raise InvalidRegexError(f"xgrammar rejects regex {pattern!r}: {_first_line(exc)}") from None
        return self._compile(grammar)

    def grammar(self, ebnf: str, root: str) -> XGrammarCompiled:
        xgr = _xgr()
        try:
            grammar = xgr.Grammar.from_ebnf(ebnf, root_rule_name=root)
        except Exception as exc:
            raise GrammarSyntaxError(f"EBNF grammar does not parse: {_first_line(exc)}") from None
        return self._compile(grammar)

    def choice(self, options: tuple[str, ...]) -> XGrammarCompiled:
        return self.grammar("root ::= " + " | ".join(_literal(o) for o in options), "root")

    def tool_calls(self, spec: ToolCalls, calls: Any, answer: Any, options: JsonOptions) -> XGrammarCompiled:
        xgr = _xgr()
        grammar = self._tool_calls_grammar(spec, calls, options)
        if answer is not None:
            grammar = xgr.Grammar.union(grammar, self._json_grammar(answer, options))
        return self._compile(grammar)

    def _tool_calls_grammar(self, spec: ToolCalls, calls: Any, options: JsonOptions) -> Any:
        xgr = _xgr()
        if spec.format == "json":
            if spec.allow_multiple:
                items = rebase_refs(calls, ["items"])
                calls = {"type": "array", "items": items, "minItems": 1, "maxItems": spec.max_calls}
            return self._json_grammar(calls, options)
        call = self._json_grammar(calls, options)
        one = xgr.Grammar.concat(
            xgr.Grammar.from_ebnf(f"root ::= {_literal(HERMES_OPEN)}"),
            call,
            xgr.Grammar.from_ebnf(f"root ::= {_literal(HERMES_CLOSE)}"),
        )
        if not spec.allow_multiple:
            return one
        newline = xgr.Grammar.from_ebnf(f"root ::= {_literal(chr(10))}")
        sequences = [one]
        for count in range(2, spec.max_calls + 1):
            parts = [one]
            for _ in range(count - 1):
                parts += [newline, one]
            sequences.append(xgr.Grammar.concat(*parts))
        return xgr.Grammar.union(*sequences)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:300] if text else type(exc).__name__
