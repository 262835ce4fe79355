"""llguidance backend: an Earley parser over a derivative-regex lexer, masks computed per token, no index.

Why a third backend: llguidance reads a JSON Schema keyword by keyword (no one-handler-per-object
reading, see `parley.constrained.schema.dispatch`) and *refuses* what it does not implement instead of
dropping it, so what it compiles it enforces. Compiling costs about a millisecond (no vocabulary
index), a mask tens of microseconds.

Its own limits, measured on llguidance 1.9.1 and handled here:

- Keywords it does not implement (`UNENFORCED`) and formats it does not know make the whole schema
  an error: those uses are stripped before it sees the schema, recorded and validated afterwards.
- `pattern` and `patternProperties` keys use search semantics (`"abc"` matches `"xabcx"`), whereas
  parley hands backends full-match regexes: each is anchored (`^(?:...)$`). A lookaround in a
  pattern is a compile error: stripped and validated (a wider string); in a `patternProperties`
  key the spec is refused, as stripping the key would forbid those keys.
- An integral float listed in `const`/`enum` (`1.0`) is refused as written: such a use is stripped
  and validated. `1.0` for a listed integer `1` is refused, as by xgrammar and as for `type: integer`:
  integer positions are written in integer spelling (the rule in `parley.constrained.choice`).
- Properties are generated in the schema's order: `any_order` cannot be honoured, so such a spec is
  refused (`UnsupportedSpecError`) rather than over-constrained.
- `additionalProperties` follows the specification (absent = any extra key); parley's `strict`
  spells out `additionalProperties: false` where the schema says nothing (`close_objects`) and
  the type of untyped object/array keywords (`type_untyped`).
- Where the grammar forces bytes, its masks allow only the forced bytes' own tokenization (SmolLM2: `[`
  then `["` for a forced `[["`), not the model's: `[[""]]` is `[[`, `""`, `]]`, and `[[` was masked
  (Github_easy o27352, `minItems: 1` on nested arrays). Grammars are compiled with `no_forcing`, and
  `forced_tokens` tokenizes the forced bytes itself (`compute_ff_bytes`).
- Properties listed in `required` but not in `properties` follow the properties, in `required` order
  (Github_easy o11794, o57603): a key-order rule like the one below, so `any_order` counts them too.
- A `oneOf` is compiled as `anyOf` (its `coerce_one_of` option): refused otherwise where it cannot prove the
  branches disjoint (Github_medium o2109: a string under two patterns, which only xgrammar then compiled, and
  xgrammar cannot match escaped characters there). Where branches may overlap, exclusivity is recorded and
  validated, as on xgrammar (`dispatch.overlapping_one_of`).
- `multipleOf` on a number that admits fractions rejects valid spellings (`1e+16` and `0.30` as multiples of
  0.1, `4.0` and `-0.0` of 2): such uses are stripped and validated, exactly (`validate.schema_validator`).
  On integers it is exact and stays in the grammar.
- U+007F (DEL) is accepted in strings and keys only escaped, `\\u007f`, never raw, although JSON allows
  both: the value stays reachable in that spelling (a spelling rule, like integers'; found by the
  differential tests on Github_easy o43295).

Tokens come from parley's `TokenizerInfo` (one byte string per id, padded ids empty), so padded
logits ids are never allowed and the vocabulary matches what the other backends see.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley.constrained.backends.base import JsonOptions
from parley.constrained.errors import (
    BackendUnavailableError,
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
)
from parley.constrained.schema.walk import KeywordUse, iter_subschemas, scan_keywords
from parley.constrained.schema.widen import admits_fractions
from parley.constrained.specs import HERMES_CLOSE, HERMES_OPEN, ToolCalls

if TYPE_CHECKING:
    import torch

    from parley.constrained.tokenizer_info import TokenizerInfo

UNENFORCED = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "contains",
    "minContains", "maxContains", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "uniqueItems",
}  # fmt: skip
SUPPORTED_FORMATS = {"date", "time", "date-time", "duration", "ipv4", "uuid", "uri"}
# Found by checking the formats exactly (tests/constrained/test_format_grammars.py): llguidance's own rules reject
# quoted and address-literal emails ('"joe bloggs"@example.com', 'a@[IPv6:::1]'), a host name's final dot
# ("example.com."), IPv6 addresses ending in IPv4 ("::ffff:1.2.3.4"), and in URI hosts an uppercase IPvFuture `V`
# ("a://[V1.x]/") or such an IPv6 address (Github_ultra o17591, with the walker's instances); it has no rule for the
# others:
# parley's exact regexes (`parley.constrained.formats.GRAMMAR_PATTERNS`) are compiled in their place.
OWN_PATTERN_FORMATS = {
    "email", "idn-email", "hostname", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uri-template",
    "json-pointer", "relative-json-pointer",
}  # fmt: skip
LENGTHS = {"minLength", "maxLength"}
BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
# Found by tests/constrained/test_differential.py: with a bound on a `number`, llguidance admits no
# exponent and no -0.0 (1e-05 and -0.0 in [0, 1] are rejected); integer bounds are exact.
FRACTION_BOUNDS = "its bounded-number grammar rejects exponents and -0.0"
FRACTION_MULTIPLE = "its multipleOf grammar rejects valid spellings of fractions (1e+16, 0.30, 4.0, -0.0)"
# Found on MaskBench (Synthesized draft2019_09_valid_const_id30): `{"a":1.0}` is refused for
# `enum: [{"a": 1.0}]`, an integral float listed as written (xgrammar refuses it as well).
INTEGRAL_FLOAT = "an integral float listed here (1.0) is refused as written"
# Every unenforced use is stripped: llguidance refuses the whole schema otherwise.
STRIPPED = UNENFORCED | LENGTHS | BOUNDS | {"format", "pattern", "patternProperties", "enum", "const", "multipleOf"}
LOOKAROUND = "look-arounds and backreferences are not supported"
# Found by checking the formats exactly (parley.constrained.formats): llguidance's date rules take February 29
# in any year ("2021-02-29") and a leap second at any hour ("22:59:60Z"). Wider, never narrower: kept, validated.
LOOSE_DATES = "its date rules admit February 29 in any year and leap seconds at any hour"
DATE_FORMATS = {"date", "date-time", "time"}
KEPT = {LOOSE_DATES, WIDER_FORMAT}


def _llg() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BackendUnavailableError("the llguidance backend needs `pip install llguidance`") from exc
    return llguidance


def _out_of_int64(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not -(2**63) <= value < 2**63


def _integral_float(value: Any) -> bool:
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, list):
        return any(map(_integral_float, value))
    return isinstance(value, dict) and any(map(_integral_float, value.values()))


def _has_lookaround(pattern: str) -> bool:
    return pattern_has_lookahead(pattern) or pattern_has_lookbehind_or_backreference(pattern)


def unenforced(schema: Any, root: str, options: JsonOptions) -> list[KeywordUse]:
    """Keyword uses of `schema` (paths from `root`) that llguidance would not enforce (all are stripped)."""
    out = []
    for use in scan_keywords(schema, root):
        value = use.schema.get(use.keyword)
        if use.keyword in UNENFORCED:
            out.append(use)
        elif use.keyword in LENGTHS and not options.lengths_in_grammar:
            out.append(use)
        elif use.keyword == "format" and value in OWN_PATTERN_FORMATS:
            out += format_pattern_gaps(use)
        elif use.keyword == "format" and value not in SUPPORTED_FORMATS:
            out.append(use)
        elif use.keyword == "format" and value in DATE_FORMATS:
            out.append(KeywordUse(use.keyword, use.path, use.schema, LOOSE_DATES))
        elif use.keyword in BOUNDS and admits_fractions(use.schema) and not {"enum", "const"} & use.schema.keys():
            out.append(KeywordUse(use.keyword, use.path, use.schema, FRACTION_BOUNDS))  # an enum's spellings are fixed
        elif use.keyword == "multipleOf" and admits_fractions(use.schema):
            out.append(KeywordUse(use.keyword, use.path, use.schema, FRACTION_MULTIPLE))
        elif use.keyword in BOUNDS and _out_of_int64(value):
            out.append(KeywordUse(use.keyword, use.path, use.schema, "past the 64-bit integer range"))
        elif use.keyword in ("enum", "const") and _integral_float(value):
            out.append(KeywordUse(use.keyword, use.path, use.schema, INTEGRAL_FLOAT))
        elif use.keyword == "pattern" and isinstance(value, str) and _has_lookaround(value):
            out.append(KeywordUse(use.keyword, use.path, use.schema, LOOKAROUND))
    return out + dispatch.overlapping_one_of(schema, root, options.strict)


def _anchor(pattern: str) -> str:
    return f"^(?:{pattern})$"


def anchor_patterns(schema: Any) -> Any:
    """A copy of `schema` whose (full-match) patterns are anchored, as llguidance searches."""
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    for _, node in iter_subschemas(out):
        if isinstance(node.get("pattern"), str):
            node["pattern"] = _anchor(node["pattern"])
        props = node.get("patternProperties")
        if isinstance(props, dict):
            node["patternProperties"] = {_anchor(k): v for k, v in props.items()}
    return out


def close_objects(schema: Any) -> Any:
    """A copy where objects that say nothing about extra keys forbid them (parley's `strict`).

    Branches of `allOf` are left open: closing each would forbid the keys the other branches add.
    """
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    open_branches: set[int] = set()
    for _, node in iter_subschemas(out):
        branches = node.get("allOf")
        open_branches |= {id(b) for b in branches} if isinstance(branches, list) else set()
    for _, node in iter_subschemas(out):
        if id(node) in open_branches or not {"properties", "patternProperties"} & node.keys():
            continue
        if not {"additionalProperties", "unevaluatedProperties"} & node.keys():
            node["additionalProperties"] = False
    return out


_TYPE_SOURCES = {"type", "$ref", "const", "enum", "anyOf", "oneOf", "allOf", "not", "if"}
_INFERRED = {"properties": "object", "additionalProperties": "object", "items": "array", "prefixItems": "array"}


def type_untyped(schema: Any) -> Any:
    """A copy where untyped object/array keywords name their type, as xgrammar reads them in strict mode.

    `{"properties": {...}}` admits any non-object by the specification; parley's `strict` means it
    is an object (the reading xgrammar and OpenAI's strict mode share), so every backend agrees.
    """
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    for _, node in iter_subschemas(out):
        if _TYPE_SOURCES & node.keys():
            continue
        inferred = {kind for key, kind in _INFERRED.items() if key in node}
        if len(inferred) == 1:
            node["type"] = inferred.pop()
    return out


def _lookaround_keys(schema: Any) -> bool:
    return any(
        isinstance(node.get("patternProperties"), dict) and any(map(_has_lookaround, node["patternProperties"]))
        for _, node in iter_subschemas(schema)
    )


def _named_keys(node: dict[str, Any]) -> set[Any]:
    """The keys llguidance writes at fixed positions: `properties`, then `required` names not among them."""
    props, required = node.get("properties"), node.get("required")
    return set(props if isinstance(props, dict) else ()) | set(required if isinstance(required, list) else ())


def _many_properties(schema: Any) -> bool:
    return any(len(_named_keys(node)) > 1 for _, node in iter_subschemas(schema))


def _tokenizer(tok: TokenizerInfo) -> Any:
    def build(t: TokenizerInfo) -> Any:
        llg = _llg()

        class Vocabulary:  # the duck type `llguidance.TokenizerWrapper` reads
            eos_token_id = t.stop_token_ids[0] if t.stop_token_ids else 0
            bos_token_id = None
            tokens = [t.token_bytes.get(i, b"") for i in range(t.vocab_size)]
            special_token_ids = sorted(t.special_token_ids)

            def __call__(self, text: str) -> list[int]:
                return list(t.tokenizer.encode(text, add_special_tokens=False))

        stops = list(t.stop_token_ids) or [0]
        return llg.LLTokenizer(llg.TokenizerWrapper(Vocabulary()), n_vocab=t.vocab_size, eos_token=stops)

    return tok.backend_state("llguidance", build)


class LLGuidanceMatcher:
    """One request's llguidance matcher.

    llguidance stops by itself once nothing but a stop token can follow (after the closing `}`), and
    then refuses the stop token; parley's contract accepts it after a complete output, so such a
    stop token is accepted here without reaching llguidance (`_virtual_stop`, undone by rollback).
    """

    def __init__(self, tokenizer: Any, grammar: str, tok: TokenizerInfo) -> None:
        self._matcher = _llg().LLMatcher(tokenizer, grammar, log_level=0)
        self._tok = tok
        self._ended = False
        self._virtual_stop = False

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> bool:
        row = bitmask[index] if bitmask.dim() == 2 else bitmask
        if self._ended or self._matcher.is_stopped():
            row.zero_()
            for stop in self._tok.stop_token_ids:
                row[stop // 32] |= (1 << (stop % 32)) - (1 << 32) if stop % 32 == 31 else 1 << (stop % 32)
            return True
        self._matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        return True

    def accept_token(self, token_id: int) -> bool:
        if self._ended:
            return False
        if token_id in self._tok.stop_token_ids and self._matcher.is_accepting() and self._matcher.is_stopped():
            self._ended = self._virtual_stop = True
            return True
        # consume_token on a disallowed token would put the matcher in a permanent error state
        if self._matcher.is_stopped() or self._matcher.validate_tokens([token_id]) != 1:
            return False
        ok = bool(self._matcher.consume_token(token_id))
        self._ended = ok and token_id in self._tok.stop_token_ids
        return ok

    def accept_text(self, text: str) -> bool:
        ids = self._tok.tokenizer.encode(text, add_special_tokens=False)
        return all(self.accept_token(int(t)) for t in ids)

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        if self._ended:
            self._ended = False
            if self._virtual_stop:
                self._virtual_stop = False
                n -= 1
        if n:
            self._matcher.rollback(n)

    def is_completed(self) -> bool:
        return bool(self._matcher.is_accepting())

    def is_terminated(self) -> bool:
        return self._ended or bool(self._matcher.is_stopped())

    def reset(self) -> None:
        self._matcher.reset()
        self._ended = self._virtual_stop = False

    def forced_tokens(self) -> list[int]:
        """The forced bytes in the model's tokenization, less the last token (a longer one may start there)."""
        if self.is_terminated():
            return []
        try:
            text = self._matcher.compute_ff_bytes().decode()
        except UnicodeDecodeError:
            return []
        ids = [int(t) for t in self._tok.tokenizer.encode(text, add_special_tokens=False)][:-1]
        return ids[: self._matcher.validate_tokens(ids)] if ids else []


@dataclass
class LLGuidanceCompiled:
    tokenizer: Any
    grammar: str
    tok: Any
    backend: str = "llguidance"

    def new_matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self.tokenizer, self.grammar, self.tok)


class LLGuidanceBackend:
    """Compiles specs with llguidance for one tokenizer."""

    name = "llguidance"

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        self._tok = tokenizer
        self._llg_tok = _tokenizer(tokenizer)

    def unenforced(self, schema: Any, root: str, options: JsonOptions) -> list[KeywordUse]:
        return unenforced(schema, root, options)

    def _schema_text(self, schema: Any, options: JsonOptions) -> str:
        """The schema as llguidance reads it, whitespace options in its `x-guidance` key."""
        if options.any_order and _many_properties(schema):
            raise UnsupportedSpecError("llguidance generates properties in schema order; any_order is not supported")
        if _lookaround_keys(schema):
            # stripping the key pattern would forbid those keys (next to additionalProperties: false)
            raise UnsupportedSpecError("llguidance cannot compile a patternProperties key with a look-around")
        if isinstance(schema, bool):
            schema = {} if schema else {"not": {}}
        schema = close_objects(type_untyped(schema)) if options.strict else schema
        schema = anchor_patterns(formats_as_patterns(schema, OWN_PATTERN_FORMATS))
        if options.compact:
            guidance: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
        else:
            guidance = {"whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{options.max_whitespace}}}"}
        guidance["coerce_one_of"] = True  # oneOf as anyOf; overlapping ones are validated (`unenforced`)
        try:
            return json.dumps({**schema, "x-guidance": guidance}, allow_nan=False)
        except ValueError as exc:  # NaN/Infinity, or an integer too large for llguidance's number type
            raise UnsupportedSpecError(f"llguidance cannot read this schema: {exc}") from None

    def _compile(self, grammar: str, what: str) -> LLGuidanceCompiled:
        llg = _llg()
        matcher = llg.LLMatcher(self._llg_tok, grammar, log_level=0)
        if matcher.is_error():
            message = _first_line(matcher.get_error())
            if what == "regex" and "regex" in message.lower():
                raise InvalidRegexError(f"llguidance rejects regex: {message}")
            raise UnsupportedSpecError(f"llguidance cannot compile this {what}: {message}")
        return LLGuidanceCompiled(self._llg_tok, grammar, self._tok)

    def _lark(self, body: str, what: str) -> LLGuidanceCompiled:
        # no_forcing: forced bytes otherwise mask every token but their own tokenization's (module docstring)
        return self._compile(_llg().LLMatcher.grammar_from_lark('%llguidance {"no_forcing": true}\n' + body), what)

    def json_schema(self, schema: Any, options: JsonOptions) -> LLGuidanceCompiled:
        return self._lark(f"start: %json {self._schema_text(schema, options)}\n", "schema")

    def regex(self, pattern: str) -> LLGuidanceCompiled:
        return self._compile(_llg().LLMatcher.grammar_from_regex(pattern), "regex")

    def grammar(self, ebnf: str, root: str) -> LLGuidanceCompiled:
        raise UnsupportedSpecError(
            "the llguidance backend does not read parley's EBNF grammars; use backend='xgrammar'"
        )

    def choice(self, options: tuple[str, ...]) -> LLGuidanceCompiled:
        return self._lark("start: " + " | ".join(_literal(o) for o in options) + "\n", "choice")

    def tool_calls(self, spec: ToolCalls, calls: Any, answer: Any, options: JsonOptions) -> LLGuidanceCompiled:
        lines = [f"call: %json {self._schema_text(calls, options)}"]
        if spec.format == "json":
            one = "call"
            many = f'"[" call ("," call){{0,{spec.max_calls - 1}}} "]"'
        else:
            one = f"{_literal(HERMES_OPEN)} call {_literal(HERMES_CLOSE)}"
            many = f'one ("\\n" one){{0,{spec.max_calls - 1}}}'
            lines.append(f"one: {one}")
            one = "one"
        start = many if spec.allow_multiple else one
        if answer is not None:
            lines.append(f"answer: %json {self._schema_text(answer, options)}")
            start = f"({start}) | answer"
        return self._lark("\n".join([f"start: {start}", *lines]) + "\n", "tool-call grammar")


def _literal(text: str) -> str:
    """A Lark string literal (JSON escaping is a subset Lark reads); empty text is an empty sequence."""
    return json.dumps(text, ensure_ascii=False) if text else '""'


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else "unknown error"
