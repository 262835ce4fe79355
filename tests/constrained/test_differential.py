"""Differential tests: every backend against generated instances; each disagreement found became a rule.

Instances come from hypothesis-jsonschema and the schema walker (valid; each source bounded in time) and single
mutations (invalid), deterministic (see `tests.constrained.instances`), for the schemas of `feature_schemas` (the
constructs issue 26 names) and a stride over the MaskBench dev split (read from `shared/`, never copied); generated
schemas have their own test (`test_generated_schemas`). A matcher must:

- accept every valid instance token by token (each token in the mask) and end complete;
- reject every invalid instance, unless it says it does not enforce everything
  (`needs_validation`), in which case `validate` must reject the output instead.

The disagreements these tests found, and the rule each became (tests at the bottom pin them):

| construct | backend | false rejection | rule |
|---|---|---|---|
| bounds on a `number` | xgrammar | 0.17864000541092698, 1e-05, -0.0 in [0, 1] | bounds stripped, validated |
| bounds on a `number` | llguidance | 1e-05, -0.0 in [0, 1] | bounds stripped, validated |
| min/maxLength in the grammar | xgrammar | escapes (`"\\u0010"`) | auto ranks it after llguidance |
| extra keys (additionalProperties absent or true) | outlines | any extra key | outlines ineligible |
| `date-time`, lengths, `allOf`, `anyOf` next to properties | outlines | many | outlines last resort |
| `any_order` with several properties | llguidance | reordered keys | llguidance ineligible |
| an integral float in `const`/`enum` | llguidance | `1.0` as listed | stripped, validated |
| look-around in a `patternProperties` key | llguidance | such keys, once stripped | llguidance refuses it |
| `1.0` at an integer position | every backend | for `type: integer` and a listed `1` | integer spelling (a rule) |
| `\\w` in patterns | (the tests) | Python's `re` is Unicode-aware, ECMA-262 is not | instances read as ECMA-262 |
| `\\w` in `patternProperties` keys | (the tests) | `"Á"` for `^\\w$` | every regex read as ECMA-262 |
| `format: uuid` under Draft 4/6 | (the tests) | `"tokenize"` (the draft ignores uuid) | formats asserted (2020-12) |
| `multipleOf: 0.1` | (the tests), validation | -43536423848412.805 passed, 0.3 failed | `multipleOf` decided exactly |
| `multipleOf` on a `number` | llguidance | `1e+16`, `0.30`, `4.0` | stripped, validated |
| an unanchored pattern | llguidance | `"a\\n"` for `^a` (`.*` was padded) | padded with `[\\s\\S]*` |
| escapes under a pattern | xgrammar | `"\\u0017s.com"` for `\\.[a-z]{2,3}$` | ranked after llguidance |
| escapes in a `patternProperties` key | xgrammar | `{"x-\\"":1}` for `^x-` (no extra keys) | ranked after llguidance |
| an all-escapes key | (the tests) | `{"\\u0013":true}` for `^[^-]+$` (empty once stripped) | escapes replaced |
| an untyped definition | xgrammar | `null` for `{"additionalProperties": false}` via `$ref` | typed from its `$ref`s |
| `format: email` | xgrammar | `"a@b.c"` (one-letter labels) | stripped, validated |
| `format: hostname` | xgrammar | `"fr.y.q.G5.sport"` (uppercase letters) | stripped, validated |
| a `oneOf` llguidance cannot prove disjoint | llguidance | refused: xgrammar took it | as `anyOf`, overlap validated |
| a raw DEL (U+007F) in a string | llguidance | the raw character | written `"\\u007f"` (a spelling rule) |
| an object under a `patternProperties` key | (the tests) | its keys left out of schema order | ordered by it |
| `required` names not in `properties` | llguidance | `{"a":2,"b":1}` for `required: ["b","a"]` | `required` order |
| a byte sequence the grammar forces | llguidance | `[[""]]` (`[[` masked: only `[`, `["` for `[["`) | `no_forcing` |
| a branch (`oneOf`...) next to `properties` | (the tests) | `{"b":2,"a":1}` (Github_hard o61027) | branches first |
| `required` names not in `properties` | (the tests) | `{"b":2,"a":1,"r":3}` (branch `b`) | after own names |
| `(a+b)?` in a pattern | xgrammar | none: `"-P0Y0"` passed silently (Github_trivial o41609) | validated |
| untyped `oneOf` branches | every backend | none: `{"creditcard":"x"}` passed (Github_trivial o51159) | validated |
| `date`, `date-time`, `time` | both | none: `2021-02-29`, `22:59:60Z` passed (exact format checks) | validated |
| `format: date-time`, `time` | xgrammar | `1963-06-19t08:30:06z` (lowercase `t`, `z`) | parley's regex |
| `format: email`, `hostname`, `ipv6` | llguidance | `"a b"@c.d`, `example.com.`, `::ffff:1.2.3.4` | parley's regex |
| `format: ipv6`, `uri` | xgrammar | `1:2:3:4:5:6:1.2.3.4`, `http://[2001:db8::7]/` | parley's regex |
| `format: ipv4` | xgrammar | none: an invalid address passed | parley's regex |
| `format` (all but uuid) | outlines | `08:30:06.5+01:00`, `mailto:a@b.c`, `BW@m.a.nikE` | regex or validated |
| `format: relative-json-pointer` | xgrammar | `0+1/a` (an index shift) | stripped, validated |
| `$ref` to a plain-name `id` (`#p`) | xgrammar | none: `{"maxSecurity":"x"}` passed (Github_medium o35905) | pointed |
| untyped `properties` beside `if` | xgrammar | `1` as an item (Github_medium o3385) | widened |
| untyped branches beside `required` | xgrammar | `null` as an item (Github_ultra o6365) | widened |
| a branch that is only `not` | (the tests) | `{"LastName":"","Age":0.0}` (Github_trivial o21864) | no branch order |

Key order: llguidance writes a subschema's keywords in the order written, xgrammar its `$ref`/`anyOf`/`oneOf`/
`allOf` first whatever the order; parley's preparation puts those first, and the instances follow.

CI runs `COUNT` instances per schema and every `DEV_STRIDE`-th dev file up to `DEV_MAX_BYTES`;
`PARLEY_DIFFERENTIAL=full` runs more instances on the whole split (hours on 2 cores); `PARLEY_DIFFERENTIAL=10`
the same on every 10th file; `PARLEY_DIFFERENTIAL_DEV=Github_hard` (a glob) limits the dev files to those subfolders.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from parley.constrained import CompileCache, ConstrainedError, JsonSchema, ValidationFailed, compile, validate
from parley.constrained.schema.patterns import (
    full_match_pattern,
    pattern_admits_escaped,
    pattern_has_optional_repeat_edge,
    pattern_mentions_escape,
)
from parley.constrained.schema.walk import iter_subschemas
from tests.conftest import SHARED
from tests.constrained.conftest import feed
from tests.constrained.feature_schemas import FEATURE_SCHEMAS
from tests.constrained.instances import Instance, dumps, in_schema_order, instances, validator

pytestmark = pytest.mark.model

MODE = os.environ.get("PARLEY_DIFFERENTIAL", "")
FULL = MODE == "full" or MODE.isdigit()  # "full": every dev file; a number N: every N-th, full counts otherwise
COUNT = 20 if FULL else 5
DEV = SHARED / "data" / "jsonschemabench" / "dev"
DEV_STRIDE = int(MODE) if MODE.isdigit() else 1 if FULL else 100
DEV_MAX_BYTES = 10**9 if FULL else 3_000
DEV_FOLDERS = os.environ.get("PARLEY_DIFFERENTIAL_DEV", "*")  # a glob of dev subfolders: "Github_hard", "BFCL_*"
EXACT = ("xgrammar", "llguidance", "auto")


def spec_for(schema: Any, backend: str) -> JsonSchema:
    """Each backend in its exact mode: xgrammar leaves string lengths to validation (see `choice.costly`)."""
    lengths = "validate" if backend == "xgrammar" else "grammar"
    return JsonSchema(schema, strict=False, string_lengths=lengths)


def usable(tokenizer: Any, found: list[Instance]) -> list[Instance]:
    """Instances the tokenizer can spell (SmolLM2 drops some unassigned code points: no model emits those)."""
    return [i for i in found if tokenizer.decode(tokenizer.encode(i.text, add_special_tokens=False)) == i.text]


@functools.cache
def feature_instances(name: str) -> tuple[Instance, ...]:
    return tuple(instances(FEATURE_SCHEMAS[name], COUNT))


def spelled_for(backend: str, text: str) -> str:
    """`text` in the spelling `backend`'s rules ask for (the same JSON value): llguidance takes U+007F only
    escaped (llguidance.py)."""
    return text.replace("\x7f", "\\u007f") if backend == "llguidance" else text


_ESCAPED = re.compile('[\x00-\x1f"\\\\]')


def escape_blind(schema: Any) -> bool:
    """Whether `schema` has a pattern (or a kept `patternProperties` key) under which xgrammar cannot write
    escaped characters (choice.costly)."""
    if not isinstance(schema, (dict, bool)):
        return False
    patterns = [node.get("pattern") for _, node in iter_subschemas(schema, "$")]
    patterns += [key for _, node in iter_subschemas(schema, "$") if node.get("additionalProperties") is False
                 and isinstance(node.get("patternProperties"), dict) for key in node["patternProperties"]]  # fmt: skip
    return any(isinstance(p, str) and not pattern_mentions_escape(p) and pattern_admits_escaped(
        full_match_pattern(p)) for p in patterns)


def without_escaped(text: str, plain: str = "") -> str:
    """`text` with every character JSON writes escaped replaced by `plain` (default: taken out) in its strings
    and keys."""
    def strip(value: Any) -> Any:
        if isinstance(value, str):
            return _ESCAPED.sub(plain, value)
        if isinstance(value, list):
            return [strip(v) for v in value]
        if isinstance(value, dict):
            return {strip(k): strip(v) for k, v in value.items()}
        return value

    return json.dumps(strip(json.loads(text)), separators=(",", ":"), ensure_ascii=False)


def escapes_alone_refused(matcher: Any, tokenizer: Any, text: str) -> bool:
    """Whether `text` is accepted once its escaped characters are out: taken out, or each replaced by a plain
    one (a key of `^[^-]+$` made only of escaped characters is empty once they are taken out: Github_hard
    o84134)."""
    for plain in ("", "a", "0", " "):  # " " where `\\s` took the newline (Github_medium o78739)
        matcher.reset()
        if feed(matcher, tokenizer, without_escaped(text, plain)):
            return True
    return False


def _non_ascii_keys_priced(matcher: Any, text: str) -> bool:
    """Whether `text` has a non-ASCII key where the matcher warns that xgrammar refuses some (`choice.costly`)."""
    if not any("refuses some non-ASCII extra keys" in w for w in matcher.warnings):
        return False

    def keys(value: Any) -> list[str]:
        if isinstance(value, dict):
            return list(value) + [k for v in value.values() for k in keys(v)]
        return [k for v in value for k in keys(v)] if isinstance(value, list) else []

    return any(not key.isascii() for key in keys(json.loads(text)))


def disagreements(matcher: Any, tokenizer: Any, found: list[Instance], *, blind: bool = False) -> list[str]:
    """What `matcher` gets wrong on `found`. `blind`: the schema has escape-blind patterns, so on xgrammar a
    valid value rejected only for its escaped characters is the documented price (accepted once they are out)."""
    out = []
    # or the matcher says so: a pattern outside schema keywords, reached by `$ref` (Github_hard o5983)
    blind = blind or any("never matches a backslash" in w or "never writes a backslash" in w for w in matcher.warnings)
    for inst in found:
        matcher.reset()
        text = spelled_for(matcher.backend, inst.text)
        accepted = feed(matcher, tokenizer, text)
        if inst.valid and not accepted and blind and matcher.backend == "xgrammar" and "\\" in inst.text:
            if escapes_alone_refused(matcher, tokenizer, inst.text):
                continue
        if inst.valid and not accepted and _non_ascii_keys_priced(matcher, inst.text):
            continue
        if inst.valid and not accepted:
            out.append(f"valid rejected: {inst.text[:120]}")
        elif not inst.valid and accepted:
            if not matcher.needs_validation:
                out.append(f"invalid ({inst.keyword}) accepted, no validation: {inst.text[:120]}")
                continue
            try:
                matcher.validate(inst.text)
                out.append(f"invalid ({inst.keyword}) accepted and validated: {inst.text[:120]}")
            except ValidationFailed:
                pass
    return out


@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize("name", sorted(FEATURE_SCHEMAS))
def test_feature_schemas_accept_every_valid_instance_and_never_pass_an_invalid_one_silently(
    smol_tokenizer: Any, name: str, backend: str
) -> None:
    found = usable(smol_tokenizer, list(feature_instances(name)))
    try:
        matcher = compile(
            spec_for(FEATURE_SCHEMAS[name], backend), smol_tokenizer, backend=backend, cache=CompileCache()
        )  # type: ignore[arg-type]
    except ConstrainedError as exc:
        assert backend == "llguidance" and name == "one_of_overlapping", exc  # refused, never approximated
        return
    assert not disagreements(matcher, smol_tokenizer, found), (matcher.choice, matcher.warnings)


def dev_files() -> list[Path]:
    files = sorted(DEV.glob(f"{DEV_FOLDERS}/*.json"))[::DEV_STRIDE]
    return [p for p in files if p.stat().st_size <= DEV_MAX_BYTES]


@functools.cache
def dev_case(path: Path) -> tuple[Any, tuple[Instance, ...]]:
    schema = json.loads(path.read_text())["schema"]
    return schema, tuple(instances(schema, COUNT))


@pytest.mark.parametrize("backend", EXACT)
def test_dev_split_schemas_agree_with_their_generated_instances(smol_tokenizer: Any, backend: str) -> None:
    files = dev_files()
    if not files:
        pytest.skip(f"MaskBench dev split not found at {DEV}")
    failures, checked = [], 0
    for path in files:
        schema, found = dev_case(path)
        try:
            matcher = compile(spec_for(schema, backend), smol_tokenizer, backend=backend, cache=CompileCache())  # type: ignore[arg-type]
        except ConstrainedError:
            continue  # coverage is test_maskbench's business
        usable_found = usable(smol_tokenizer, list(found))
        checked += len(usable_found)
        found_wrong = disagreements(matcher, smol_tokenizer, usable_found, blind=escape_blind(schema))
        failures += [f"{path.name} ({matcher.backend}): {d}" for d in found_wrong]
    assert checked > 20
    assert not failures, failures


# --- the disagreements found, one regression test each --------------------------------------------------------


def compiled(tokenizer: Any, schema: Any, backend: str = "auto", **options: Any) -> Any:
    return compile(JsonSchema(schema, **options), tokenizer, backend=backend, cache=CompileCache())  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_bounds_on_numbers_go_to_validation_so_every_spelling_stays_reachable(
    smol_tokenizer: Any, backend: str
) -> None:
    matcher = compiled(smol_tokenizer, {"type": "number", "minimum": 0, "maximum": 1}, backend)
    for text in ["0.17864000541092698", "1e-05", "-0.0", "0.5", "1"]:
        matcher.reset()
        assert feed(matcher, smol_tokenizer, text), text
    assert matcher.needs_validation and any(
        "'minimum'" in w and "spellings" in w or "exponents" in w for w in matcher.warnings
    )
    with pytest.raises(ValidationFailed):
        matcher.validate("1.5")


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_bounds_on_integers_stay_in_the_grammar(smol_tokenizer: Any, backend: str) -> None:
    matcher = compiled(smol_tokenizer, {"type": "integer", "minimum": -5, "maximum": 1000}, backend)
    assert not matcher.needs_validation
    assert feed(matcher, smol_tokenizer, "-5")
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, "1001")


def test_length_bounded_strings_with_escapes_go_to_llguidance(smol_tokenizer: Any) -> None:
    schema = {"type": "string", "minLength": 1, "maxLength": 5}
    escaped = json.dumps("a\x10b")
    assert not feed(compiled(smol_tokenizer, schema, "xgrammar"), smol_tokenizer, escaped)  # xgrammar's price
    auto = compiled(smol_tokenizer, schema)
    assert auto.backend == "llguidance" and not auto.needs_validation, auto.choice
    assert "xgrammar: 2 keyword use(s) left to validation" in auto.choice, auto.choice  # under auto: validated
    assert feed(auto, smol_tokenizer, escaped)
    auto.reset()
    assert not feed(auto, smol_tokenizer, '"abcdef"')


def test_outlines_rejects_extra_keys_and_is_never_chosen_where_they_are_allowed(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not feed(compiled(smol_tokenizer, schema, "outlines", strict=False), smol_tokenizer, '{"a":1,"b":2}')
    auto = compiled(smol_tokenizer, schema, strict=False)
    assert auto.backend == "llguidance" and "outlines: ineligible" in auto.choice, auto.choice


def test_outlines_takes_valid_date_times_through_parleys_regex_and_stays_a_last_resort(smol_tokenizer: Any) -> None:
    """Its own date-time rule rejected this value; parley's regex takes it (the calendar is validated)."""
    schema = {"type": "string", "format": "date-time"}
    value = json.dumps("6920-01-10T11:32:07.000194+22:41")
    assert validator(schema).is_valid(json.loads(value))
    outlines = compiled(smol_tokenizer, schema, "outlines")
    assert feed(outlines, smol_tokenizer, value) and outlines.needs_validation
    auto = compiled(smol_tokenizer, schema)
    assert auto.backend == "llguidance" and "last resort" in auto.choice and feed(auto, smol_tokenizer, value)


def test_llguidance_refuses_any_order_rather_than_rejecting_reordered_keys(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    with pytest.raises(ConstrainedError, match="any_order"):
        compiled(smol_tokenizer, schema, "llguidance", any_order=True)
    auto = compiled(smol_tokenizer, schema, any_order=True)
    assert auto.backend == "xgrammar" and "llguidance: ineligible" in auto.choice
    assert feed(auto, smol_tokenizer, '{"b":2,"a":1}')


def test_integral_floats_listed_in_an_enum_go_to_validation_on_llguidance(smol_tokenizer: Any) -> None:
    schema = {"allOf": [{"enum": [{"a": 1.0}]}, {"not": {"enum": [{"a": True}]}}]}  # MaskBench Synthesized const_id30
    matcher = compiled(smol_tokenizer, schema, "llguidance")
    assert feed(matcher, smol_tokenizer, '{"a":1.0}') and any("'enum'" in w for w in matcher.warnings)
    with pytest.raises(ValidationFailed):
        matcher.validate('{"a":2}')


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
@pytest.mark.parametrize("schema", [{"type": "integer"}, {"enum": [1, 2, "a"]}, {"const": 1}])
def test_integer_positions_are_written_in_integer_spelling_on_every_backend(
    smol_tokenizer: Any, schema: Any, backend: str
) -> None:
    """JSON Schema counts 1.0 as the integer 1 and the validator accepts it; the grammars write `1` (the rule
    in `parley.constrained.choice`), enforced, not left to validation, and the same for a listed integer as for
    `type: integer`."""
    assert validator(schema).is_valid(1.0) and validator(schema).is_valid(1)
    matcher = compiled(smol_tokenizer, schema, backend)
    assert not matcher.needs_validation, matcher.warnings
    assert feed(matcher, smol_tokenizer, "1")
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, "1.0")
    matcher.reset()
    assert feed(matcher, smol_tokenizer, "3") == (schema == {"type": "integer"})  # a listed value stays enforced


def test_look_around_key_patterns_are_refused_by_llguidance_not_stripped(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "patternProperties": {"^(?!_)\\w+$": {"type": "string"}}, "additionalProperties": False}
    with pytest.raises(ConstrainedError, match="look-around"):
        compiled(smol_tokenizer, schema, "llguidance")
    auto = compiled(smol_tokenizer, schema)
    assert auto.backend == "xgrammar" and feed(auto, smol_tokenizer, '{"hello":"x"}')


def test_word_classes_are_ascii_as_in_ecma_262(smol_tokenizer: Any) -> None:
    schema = {"type": "string", "pattern": "^\\w+$"}
    assert not validator(schema).is_valid("Ńr") and validator(schema).is_valid("ab_1")
    for backend in ("xgrammar", "llguidance"):
        assert not feed(compiled(smol_tokenizer, schema, backend), smol_tokenizer, '"Ńr"')


def test_parleys_validator_asserts_formats_decides_multiples_exactly_and_reads_regexes_as_ecma() -> None:
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "string", "format": "uuid"}
    assert not validator(draft4).is_valid("tokenize")  # Github_easy o73993: Draft 4's checker ignores uuid
    assert validator(draft4).is_valid("02f66974-e07a-5017-9a6b-94ad5200b488")
    tenth = {"type": "number", "multipleOf": 0.1}
    assert validator(tenth).is_valid(0.3) and validator(tenth).is_valid(1e16)
    assert not validator(tenth).is_valid(-43536423848412.805)  # Github_medium o43991
    keys = {"type": "object", "patternProperties": {"^\\w$": {"type": "object"}}, "additionalProperties": False}
    assert not validator(keys).is_valid({"Á": {}}) and validator(keys).is_valid({"a": {}})  # Github_medium o90425
    validate('{"x":0.3}', {"type": "object", "properties": {"x": tenth}})  # what the model wrote, accepted


def test_llguidance_takes_del_only_escaped_and_the_value_stays_reachable(smol_tokenizer: Any) -> None:
    for schema in ({"type": "string"}, {"type": "object"}):
        matcher = compiled(smol_tokenizer, schema, "llguidance", strict=False)
        raw, escaped = ('"a\x7f"', '"a\\u007f"') if schema["type"] == "string" else ('{"\x7f":1}', '{"\\u007f":1}')
        assert not feed(matcher, smol_tokenizer, raw)  # llguidance's lexer (Github_easy o43295)
        matcher.reset()
        assert feed(matcher, smol_tokenizer, escaped) and json.loads(escaped) == json.loads(raw)


def test_llguidance_leaves_multiples_of_fractions_to_exact_validation(smol_tokenizer: Any) -> None:
    matcher = compiled(smol_tokenizer, {"type": "number", "multipleOf": 0.1}, "llguidance")
    assert matcher.needs_validation and any("multipleOf" in w for w in matcher.warnings)
    for text in ("1e+16", "0.30", "-0.0", "0.3"):
        matcher.reset()
        assert feed(matcher, smol_tokenizer, text), text
        matcher.validate(text)
    with pytest.raises(ValidationFailed):
        matcher.validate("0.35")
    integers = compiled(smol_tokenizer, {"type": "integer", "multipleOf": 3}, "llguidance")
    assert not integers.needs_validation and not feed(integers, smol_tokenizer, "4")


def test_an_unanchored_pattern_end_admits_newlines(smol_tokenizer: Any) -> None:
    assert full_match_pattern("^a") == "a[\\s\\S]*" and full_match_pattern("a$") == "[\\s\\S]*a"
    matcher = compiled(smol_tokenizer, {"type": "string", "pattern": "^a"}, "llguidance")
    assert feed(matcher, smol_tokenizer, '"a\\nb"')  # ECMA-262's search matches "a\nb" for ^a


@pytest.mark.parametrize("pattern", ["\\.[a-zA-Z]{2,3}$", "^[^:]+$", "^[A-z]+$"])
def test_xgrammar_cannot_write_escapes_under_a_pattern_so_auto_takes_llguidance(
    smol_tokenizer: Any, pattern: str
) -> None:
    schema = {"type": "string", "pattern": pattern}
    value = json.dumps("\x17Z.ab" if "." in pattern else "\\Za")  # Github_easy o68324, medium o2109 / o23174
    assert validator(schema).is_valid(json.loads(value)) and pattern_admits_escaped(full_match_pattern(pattern))
    assert not feed(compiled(smol_tokenizer, schema, "xgrammar"), smol_tokenizer, value)  # its documented price
    auto = compiled(smol_tokenizer, schema)
    assert auto.backend == "llguidance" and "enforced at a price" in auto.choice, auto.choice
    assert feed(auto, smol_tokenizer, value)
    assert not pattern_admits_escaped(full_match_pattern("^[0-9]+$"))


@pytest.mark.parametrize(
    ("fmt", "value"), [("email", '"BW@m.a.nikE"'), ("hostname", '"fr.y.q.G5.sport"')]
)  # Github_medium o71405, Github_hard o27023
def test_xgrammar_never_uses_its_email_and_hostname_rules_which_reject_valid_values(
    smol_tokenizer: Any, fmt: str, value: str
) -> None:
    """Emails are validated on xgrammar; host names take parley's regex, their length validated."""
    schema = {"type": "string", "format": fmt}
    assert validator(schema).is_valid(json.loads(value))
    matcher = compiled(smol_tokenizer, schema, "xgrammar")
    assert matcher.needs_validation and feed(matcher, smol_tokenizer, value)
    with pytest.raises(ValidationFailed):
        matcher.validate('"a b"')
    auto = compiled(smol_tokenizer, schema)
    assert auto.backend == "llguidance" and feed(auto, smol_tokenizer, value)
    assert auto.needs_validation is (fmt == "hostname")  # a host name's 253-character bound


def test_llguidance_compiles_a_oneof_it_cannot_prove_disjoint_and_validates_exclusivity(smol_tokenizer: Any) -> None:
    schema = {"type": "string", "oneOf": [{"pattern": "^[^:]+$"}, {"pattern": "^[^:]+:[^:]+:[0-9]+$"}]}
    auto = compiled(smol_tokenizer, schema)  # Github_medium o2109: refused before, so xgrammar took it
    assert auto.backend == "llguidance" and auto.needs_validation and any("oneOf" in w for w in auto.warnings)
    assert feed(auto, smol_tokenizer, json.dumps("a:\x13:1"))


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
@pytest.mark.parametrize("strict", [True, False])
def test_required_names_missing_from_properties_stay_writable(smol_tokenizer: Any, backend: str, strict: bool) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["b", "a"]}
    matcher = compiled(smol_tokenizer, schema, backend, strict=strict)  # strict xgrammar rejected every value
    for text in ('{"b":1,"a":2}', '{"x":1,"b":"s","a":null}'):
        matcher.reset()
        assert feed(matcher, smol_tokenizer, text), text
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, '{"x":1}')  # still required


# The issue's failing kinds: which backend enforces each exactly (auto picks it), and what is left to validation.
EXACTLY_ON_LLGUIDANCE = [
    "enum_with_bounds", "number_enum_with_minimum", "min_max_items", "prefix_items_with_bounds", "pattern_with_lengths",
    "ref_with_additional_properties", "ref_siblings",
    "one_of_tagged", "any_of_objects", "any_of_scalars", "all_of_merge", "pattern_properties", "multiple_of",
]  # fmt: skip
LEFT_TO_VALIDATION = {"dependencies": "dependencies", "dependent_required": "dependentRequired",
                      "unique_items": "uniqueItems", "one_of_overlapping": "oneOf", "pattern_with_format": "format",
                      "format_date_time": "format"}  # fmt: skip


@pytest.mark.parametrize("name", EXACTLY_ON_LLGUIDANCE)
def test_auto_compiles_the_issue_constructs_exactly(smol_tokenizer: Any, name: str) -> None:
    matcher = compiled(smol_tokenizer, FEATURE_SCHEMAS[name], strict=False)
    assert matcher.backend == "llguidance" and not matcher.needs_validation, (matcher.choice, matcher.warnings)


@pytest.mark.parametrize("name", sorted(LEFT_TO_VALIDATION))
def test_what_no_backend_enforces_is_compiled_partly_and_named_in_a_warning(smol_tokenizer: Any, name: str) -> None:
    matcher = compiled(smol_tokenizer, FEATURE_SCHEMAS[name], strict=False)
    keyword = LEFT_TO_VALIDATION[name]
    assert matcher.needs_validation and any(f"'{keyword}'" in w for w in matcher.warnings), matcher.warnings
    assert matcher.choice.startswith(matcher.backend)


def test_llguidance_writes_required_names_missing_from_properties_in_required_order(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"m": {"type": "object", "required": ["b", "a"]}}}  # Github_easy o11794
    matcher = compiled(smol_tokenizer, schema, "llguidance", strict=False)
    assert feed(matcher, smol_tokenizer, '{"m":{"b":1,"a":2,"c":3}}')
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, '{"m":{"a":2,"b":1}}')  # the key-order rule the instances follow
    with pytest.raises(ConstrainedError):
        compiled(smol_tokenizer, schema, "llguidance", strict=False, any_order=True)


def test_llguidance_masks_do_not_force_their_own_tokenization(smol_tokenizer: Any) -> None:
    inner = {"type": "array", "items": {"type": "string"}, "minItems": 1}  # Github_easy o27352
    matcher = compiled(smol_tokenizer, {"type": "array", "items": inner, "minItems": 1}, "llguidance")
    assert feed(matcher, smol_tokenizer, '[[""]]')  # `[[`, `""`, `]]`: `[[` was masked for a forced `[["`


INTEGER = {"type": "integer"}
# Github_hard o61027's `definitions.handle` wrote `oneOf` before `properties`, most schemas write it after.
BRANCH = {"properties": {"b": INTEGER}, "required": ["b"]}
OWN = {"properties": {"a": INTEGER}, "required": ["a"]}


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "oneOf": [BRANCH], **OWN},
        {"type": "object", **OWN, "oneOf": [BRANCH]},
        {"type": "object", **OWN, "anyOf": [BRANCH]},
        {"type": "object", **OWN, "allOf": [BRANCH]},
        {"type": "object", **OWN, "$ref": "#/definitions/b", "definitions": {"b": BRANCH}},
    ],
)
def test_a_branchs_names_come_before_the_nodes_own_whatever_the_keyword_order(
    smol_tokenizer: Any, schema: Any, backend: str
) -> None:
    """xgrammar writes the names of `$ref`, `anyOf`, `oneOf`, `allOf` before `properties` whatever the order,
    llguidance in the order written (`{"a":1,"b":2}` for the last four): prepared, every backend writes the
    first, and the instances follow it."""
    assert dumps(in_schema_order(schema, schema, {"a": 1, "b": 2})) == '{"b":2,"a":1}'
    matcher = compiled(smol_tokenizer, schema, backend, strict=False)
    assert feed(matcher, smol_tokenizer, '{"b":2,"a":1}'), matcher.choice
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, '{"a":1,"b":2}')


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_required_names_missing_from_properties_follow_the_branches_and_the_nodes_own(
    smol_tokenizer: Any, backend: str
) -> None:
    """Declared right after the node's own properties (`prepare._declare_required`), which follow its branches'.
    Names no `properties` can declare (the node has none) come after every other name, branches' included."""
    schema = {"type": "object", "properties": {"a": INTEGER}, "required": ["a", "r"], "anyOf": [BRANCH]}
    bare = {"type": "object", "required": ["s"], "anyOf": [{"properties": {"b": INTEGER}, "required": ["b", "r"]}]}
    for case, value, text in ((schema, {"r": 3, "a": 1, "b": 2}, '{"b":2,"a":1,"r":3}'),
                              (bare, {"s": 3, "r": 1, "b": 2}, '{"b":2,"r":1,"s":3}')):  # fmt: skip
        assert dumps(in_schema_order(case, case, value)) == text
        matcher = compiled(smol_tokenizer, case, backend, strict=False)
        assert feed(matcher, smol_tokenizer, text), (text, matcher.choice)
    matcher = compiled(smol_tokenizer, schema, backend, strict=False)
    for text in ('{"a":1,"r":3,"b":2}', '{"a":1,"b":2,"r":3}'):  # the order before: a node's own names first
        matcher.reset()
        assert not feed(matcher, smol_tokenizer, text), text


def test_a_key_made_only_of_escaped_characters_is_xgrammars_documented_price(smol_tokenizer: Any) -> None:
    """Github_hard o84134: xgrammar cannot write the escaped key; taking the escapes out leaves an empty key that
    `+` refuses, so the harness replaces them by a plain character before calling it a disagreement."""
    schema = {"type": "object", "patternProperties": {"^[^-]+$": {"type": "boolean"}}, "additionalProperties": False}
    value = '{"\\u0013":true}'
    assert validator(schema).is_valid(json.loads(value)) and escape_blind(schema)
    matcher = compiled(smol_tokenizer, schema, "xgrammar")
    assert not feed(matcher, smol_tokenizer, value)  # the price
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, without_escaped(value))  # '{"":true}': not a key of `+`
    assert escapes_alone_refused(matcher, smol_tokenizer, value)
    assert disagreements(matcher, smol_tokenizer, [Instance(value, True)], blind=True) == []


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
@pytest.mark.parametrize("keyword", ["anyOf", "oneOf"])
def test_a_branch_list_the_grammars_read_as_any_value_declares_no_names(
    smol_tokenizer: Any, keyword: str, backend: str
) -> None:
    """Github_trivial o21864: `anyOf: [{oneOf: [FirstName], [LastName]}, {not: both}]` beside `Age`. `not` is left
    to validation, so the second branch admits any value and so does the list: llguidance drops it and writes
    `LastName` as an undeclared key after `Age` (every value stays reachable in that order); the instances
    ordered it first, as a branch's name."""
    either = {"oneOf": [BRANCH, {"properties": {"c": INTEGER}, "required": ["c"]}]}
    schema = {"type": "object", **OWN, keyword: [either, {"not": {"required": ["b", "c"]}}]}
    assert dumps(in_schema_order(schema, schema, {"b": 2, "a": 1})) == '{"a":1,"b":2}'
    matcher = compiled(smol_tokenizer, schema, backend, strict=False)
    assert feed(matcher, smol_tokenizer, '{"a":1,"b":2}'), matcher.choice
    if matcher.backend == "llguidance" and keyword == "anyOf":
        matcher.reset()
        assert not feed(matcher, smol_tokenizer, '{"b":2,"a":1}')  # the order the instances used to ask for


DURATION = "^-?P([0-9]+Y)?([0-9]+M)?([0-9]+D)?(T([0-9]+H)?([0-9]+M)?([0-9]+S)?)?$"  # Github_trivial o41609


@pytest.mark.parametrize(
    ("pattern", "wider"),
    [(DURATION, "-P0Y0"), (DURATION, "P3Y1424501960M82346517528"), ("^x(a+b)?$", "xa"), ("^x(ab+)?$", "xb"),
     ("^v(\\.[0-9]+)?$", "v5"), ("^x(b[ab]{1,2})?$", "xa"), ("^x(a(ab+|x))?$", "xb")],
)  # fmt: skip
def test_xgrammar_validates_patterns_its_string_regex_widens(smol_tokenizer: Any, pattern: str, wider: str) -> None:
    """xgrammar's regex for JSON strings admits the repeated atom at an end of an optional group alone; the
    pattern stays in its grammar (wider, never narrower) and is validated. auto takes llguidance, exact."""
    schema = {"type": "string", "pattern": pattern}
    assert not validator(schema).is_valid(wider) and pattern_has_optional_repeat_edge(full_match_pattern(pattern))
    matcher = compiled(smol_tokenizer, schema, "xgrammar")
    assert matcher.needs_validation and any("'pattern'" in w for w in matcher.warnings), matcher.warnings
    assert feed(matcher, smol_tokenizer, json.dumps(wider))  # the widening, kept in the grammar
    with pytest.raises(ValidationFailed):
        matcher.validate(json.dumps(wider))
    auto = compiled(smol_tokenizer, schema)
    assert auto.backend == "llguidance" and not auto.needs_validation, auto.choice
    assert not feed(auto, smol_tokenizer, json.dumps(wider))


def test_xgrammar_validates_patternproperties_keys_its_regex_widens(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "patternProperties": {"^x(a+b)?$": {"type": "integer"}}, "additionalProperties": False}
    matcher = compiled(smol_tokenizer, schema, "xgrammar")
    assert matcher.needs_validation and any("'patternProperties'" in w for w in matcher.warnings), matcher.warnings
    assert feed(matcher, smol_tokenizer, '{"xab":1}')
    with pytest.raises(ValidationFailed):
        matcher.validate('{"xa":1}')


@pytest.mark.parametrize("pattern", ["x(ab)?", "x(a+)?", "x(a+b){0,1}", "x(a+b)*", "x(ba+b)?", "x(ba{2})?", "[(a+b)?]"])
def test_optional_groups_xgrammar_reads_right_are_not_flagged(smol_tokenizer: Any, pattern: str) -> None:
    assert not pattern_has_optional_repeat_edge(pattern)
    matcher = compiled(smol_tokenizer, {"type": "string", "pattern": f"^{pattern}$"}, "xgrammar")
    assert not matcher.needs_validation, matcher.warnings
    for text in ("xa", "xb", "xab", "xaab", "xbab", "x"):
        matcher.reset()
        assert feed(matcher, smol_tokenizer, json.dumps(text)) == bool(re.fullmatch(pattern, text)), text


CARD = [
    {"additionalProperties": False, "properties": {"provider": {"enum": ["mastercard"], "type": "string"}},
     "required": ["provider"]},
    {"additionalProperties": False,
     "properties": {"provider": {"enum": ["visa"], "type": "string"}, "securitycode": {"type": "integer"}},
     "required": ["provider", "securitycode"]},
]  # fmt: skip


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_a_oneof_told_apart_only_among_objects_is_validated_where_other_types_may_match(
    smol_tokenizer: Any, backend: str
) -> None:
    """Github_trivial o51159: untyped branches that differ on a required property exclude each other as objects
    only; a string matches both, so `oneOf` refuses it, and every backend generated it unvalidated."""
    schema = {"type": "object", "properties": {"creditcard": {"oneOf": CARD}}}
    visa = '{"creditcard":{"provider":"visa","securitycode":1}}'
    for text in ('{"creditcard":"x"}', '{"creditcard":7}', '{"creditcard":2.5}'):
        assert not validator(schema).is_valid(json.loads(text))
    loose = compiled(smol_tokenizer, schema, backend, strict=False)
    assert loose.needs_validation and any("'oneOf'" in w for w in loose.warnings), loose.warnings
    assert feed(loose, smol_tokenizer, visa)
    with pytest.raises(ValidationFailed):
        loose.validate('{"creditcard":"x"}')
    strict = compiled(smol_tokenizer, schema, backend)  # parley's strict reading: the branches are objects
    assert not any("'oneOf'" in w for w in strict.warnings), strict.warnings
    assert feed(strict, smol_tokenizer, visa)
    strict.reset()
    assert not feed(strict, smol_tokenizer, '{"creditcard":"x"}')
    typed = compiled(smol_tokenizer, {"type": "object", "oneOf": CARD}, backend, strict=False)  # objects alone
    assert not any("'oneOf'" in w for w in typed.warnings), typed.warnings


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
@pytest.mark.parametrize(
    ("fmt", "impossible", "valid"),
    [("date", "2021-02-29", "2020-02-29"), ("date-time", "2021-02-29T10:00:00Z", "1998-12-31T23:59:60Z"),
     ("time", "22:59:60Z", "15:59:60-08:00")],
)  # fmt: skip
def test_date_formats_stay_in_the_grammar_and_are_validated(
    smol_tokenizer: Any, backend: str, fmt: str, impossible: str, valid: str
) -> None:
    """Both backends' date rules admit February 29 of any year and a leap second at any hour (xgrammar also
    1990-02-31): wider than RFC 3339, so the format is kept in the grammar, reported and validated (parley's
    own check, `parley.constrained.formats`: jsonschema has none here without rfc3339-validator)."""
    schema = {"type": "string", "format": fmt}
    matcher = compiled(smol_tokenizer, schema, backend)
    assert matcher.needs_validation and any("'format'" in w for w in matcher.warnings), matcher.warnings
    assert feed(matcher, smol_tokenizer, json.dumps(impossible))  # the grammar's reading
    with pytest.raises(ValidationFailed):
        matcher.validate(json.dumps(impossible))
    matcher.reset()
    assert feed(matcher, smol_tokenizer, json.dumps(valid))
    matcher.validate(json.dumps(valid))
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, '"not a date"')  # still in the grammar


def test_xgrammar_takes_times_in_either_case_through_parleys_regex(smol_tokenizer: Any) -> None:
    """Its own date-time rule wanted `T` and `Z` in uppercase (a price auto weighed); parley's regex takes both."""
    schema = {"type": "string", "format": "date-time"}
    lower = json.dumps("1963-06-19t08:30:06z")
    validate(lower, schema)
    matcher = compiled(smol_tokenizer, schema, "xgrammar")
    assert feed(matcher, smol_tokenizer, lower)
    assert matcher.needs_validation  # the calendar: 2021-02-29 is in the regex
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, json.dumps("1963-06-19 08:30:06Z"))


ANCHORED = [
    {"$schema": "http://json-schema.org/draft-04/schema#",
     "definitions": {"p": {"id": "#p", "type": "object", "properties": {"y": INTEGER, "x": INTEGER}}},
     "type": "object", "properties": {"a": {"$ref": "#p"}}},
    {"$defs": {"p": {"$anchor": "p", "type": "object", "properties": {"y": INTEGER, "x": INTEGER}}},
     "type": "object", "properties": {"a": {"$ref": "#p"}}},
]  # fmt: skip


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
@pytest.mark.parametrize("schema", ANCHORED)
def test_references_to_plain_name_anchors_are_followed(smol_tokenizer: Any, schema: Any, backend: str) -> None:
    """Github_medium o35905: `"$ref": "#minSecurityParam"` names Draft 4's `"id": "#minSecurityParam"`;
    xgrammar follows pointers only and read it as any value, unvalidated. Prepared, it points into `$defs`;
    the instances follow the anchored subschema's key order too."""
    assert dumps(in_schema_order(schema, schema, {"a": {"x": 1, "y": 2}})) == '{"a":{"y":2,"x":1}}'
    matcher = compiled(smol_tokenizer, schema, backend, strict=False)
    assert not matcher.needs_validation, matcher.warnings
    assert feed(matcher, smol_tokenizer, '{"a":{"y":2,"x":1}}')
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, '{"a":"x"}')


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_reference_parley_cannot_resolve_is_validated(smol_tokenizer: Any, backend: str) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "item.json"}},
              "$defs": {"item": {"$id": "item.json", "type": "integer"}}}  # fmt: skip
    try:
        matcher = compiled(smol_tokenizer, schema, backend, strict=False)
    except ConstrainedError:
        return  # refused, never approximated
    assert matcher.needs_validation and any("'$ref'" in w for w in matcher.warnings), matcher.warnings
    with pytest.raises(ValidationFailed):
        matcher.validate('{"a":"x"}')


def test_xgrammar_does_not_type_a_subschema_from_if_or_not(smol_tokenizer: Any) -> None:
    """Github_medium o3385: `{"properties": ..., "if": ...}` as `items` admits a number; xgrammar reads neither
    `if` nor `not`, so its `properties` alone typed it an object and `[1]` was rejected."""
    for beside in ({"if": {"properties": {"t": {"const": "a"}}}}, {"not": {"type": "string"}}):
        schema = {"type": "array", "items": {"properties": {"a": {}}, **beside}}
        assert validator(schema).is_valid([1])
        matcher = compiled(smol_tokenizer, schema, "xgrammar", strict=False)
        assert feed(matcher, smol_tokenizer, "[1]"), matcher.warnings


ARTIFACT = {"anyOf": [{"properties": {"image": INTEGER}, "additionalProperties": False}], "required": ["image"]}


@pytest.mark.parametrize(
    "schema",
    [{"type": "array", "items": ARTIFACT},
     {"type": "array", "items": {"$ref": "#/definitions/a"}, "definitions": {"a": ARTIFACT}}],
)  # fmt: skip
def test_untyped_branches_beside_type_specific_keywords_admit_every_type_on_xgrammar(
    smol_tokenizer: Any, schema: Any
) -> None:
    """Github_ultra o6365: an item `{"anyOf": [<untyped object branches>], "required": ["image"]}` admits `null`,
    numbers, arrays (`required` constrains objects only). xgrammar reads the `anyOf` alone (`required` is
    validated) and typed its branches as objects from their `properties`: every non-object item was rejected."""
    assert validator(schema).is_valid([None, 2.5, [], True, {"image": 1}])
    matcher = compiled(smol_tokenizer, schema, "xgrammar", strict=False)
    assert feed(matcher, smol_tokenizer, '[null,2.5,[],true,{"image":1}]'), matcher.warnings
    matcher.reset()
    assert not feed(matcher, smol_tokenizer, '[{"image":1,"x":2}]')  # the branch still shapes objects
    assert any("'required'" in w for w in matcher.warnings), matcher.warnings
    with pytest.raises(ValidationFailed):
        matcher.validate("[{}]")  # and `required` is validated


def test_a_vacuous_branch_list_still_shapes_the_values_it_holds() -> None:
    """JsonSchemaStore ci.json: a `.` key under `anyOf: [job_template, {"description": ...}]` holds a job written in
    job_template's order by xgrammar (which strips that `patternProperties` and writes `additionalProperties`,
    the same job); only the list's own names lose their branch order (o21864), not its values' key order."""
    template = {"type": "object", "properties": {"w": INTEGER, "s": INTEGER}}
    schema = {"type": "object", "definitions": {"t": template},
              "patternProperties": {"^[.]": {"anyOf": [{"$ref": "#/definitions/t"}, {"description": "anything"}]}},
              "additionalProperties": {"$ref": "#/definitions/t"}}  # fmt: skip
    assert dumps(in_schema_order(schema, schema, {".": {"s": 1, "w": 2}})) == '{".":{"w":2,"s":1}}'


def test_a_value_is_ordered_by_the_subschema_that_says_something_about_it() -> None:
    """JsonSchemaStore helm-testsuite.json: `properties: {"contains": true, ...}` beside `oneOf` branches that
    give `contains` an object of `path`, `content`; the `true` came first and left the value unordered."""
    inner = {"type": "object", "properties": {"path": {"type": "string"}, "content": {}}}
    schema = {"type": "object", "properties": {"contains": True}, "oneOf": [{"properties": {"contains": inner}}]}
    value = {"contains": {"content": None, "path": "a"}}
    assert dumps(in_schema_order(schema, schema, value)) == '{"contains":{"path":"a","content":null}}'
