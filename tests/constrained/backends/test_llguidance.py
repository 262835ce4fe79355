"""The llguidance backend behind the `Matcher` seam: the same contract as xgrammar and outlines-core.

A disallowed token is refused without breaking the matcher (llguidance itself would enter a
permanent error state), padded vocabulary ids are never allowed, patterns keep JSON Schema's search
semantics although parley hands over full-match regexes, and `strict` closes objects as the other
backends do.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from parley.constrained import (
    Choice,
    CompileCache,
    Grammar,
    InvalidRegexError,
    JsonSchema,
    Regex,
    Spec,
    ToolCalls,
    UnsupportedSpecError,
    compile,
)
from parley.protocol import ToolSpec
from tests.constrained.conftest import feed, token_allowed

pytestmark = pytest.mark.model


def llg(tokenizer: Any, spec: Spec, **kwargs: Any) -> Any:
    return compile(spec, tokenizer, backend="llguidance", cache=CompileCache(), **kwargs)


def admits(tokenizer: Any, matcher: Any, text: str) -> bool:
    matcher.reset()
    return feed(matcher, tokenizer, text)


def test_padded_vocabulary_ids_are_never_allowed(smol_tokenizer: Any) -> None:
    width = len(smol_tokenizer) + 100
    matcher = llg(smol_tokenizer, Regex("[a-z]+"), vocab_size=width)
    mask = matcher.allocate_bitmask()
    assert mask.shape[-1] == (width + 31) // 32
    matcher.fill_next_token_bitmask(mask)
    assert not any(token_allowed(mask, i) for i in range(len(smol_tokenizer), width))
    assert not matcher.accept_token(width - 1)


def test_a_refused_token_leaves_the_matcher_usable_and_rollback_undoes_tokens(smol_tokenizer: Any) -> None:
    matcher = llg(smol_tokenizer, JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}}}))
    (letter,) = smol_tokenizer.encode("x", add_special_tokens=False)
    assert not matcher.accept_token(letter)
    assert feed(matcher, smol_tokenizer, '{"a":1', complete=False) and not matcher.is_completed()
    ids = smol_tokenizer.encode("}", add_special_tokens=False)
    assert all(matcher.accept_token(i) for i in ids) and matcher.is_completed()
    matcher.rollback(len(ids))
    assert not matcher.is_completed()
    assert all(matcher.accept_token(i) for i in ids)
    eos = smol_tokenizer.eos_token_id
    assert matcher.accept_token(eos) and matcher.is_terminated()
    mask = matcher.allocate_bitmask()
    matcher.fill_next_token_bitmask(mask)
    assert [i for i in range(len(smol_tokenizer)) if token_allowed(mask, i)] == [eos]


def test_forced_tokens_spell_what_the_grammar_fixes(smol_tokenizer: Any) -> None:
    matcher = llg(smol_tokenizer, JsonSchema({"const": {"status": "ok"}}))
    forced = matcher.forced_tokens()
    assert forced and smol_tokenizer.decode(forced) == '{"status":"ok"}'[: len(smol_tokenizer.decode(forced))]


def test_patterns_keep_search_semantics(smol_tokenizer: Any) -> None:
    starts = llg(smol_tokenizer, JsonSchema({"type": "string", "pattern": "^ab"}))
    assert admits(smol_tokenizer, starts, '"abx"') and not admits(smol_tokenizer, starts, '"xab"')
    exact = llg(smol_tokenizer, JsonSchema({"type": "string", "pattern": "^ab$"}))
    assert admits(smol_tokenizer, exact, '"ab"') and not admits(smol_tokenizer, exact, '"xabx"')
    keys = {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False}
    matcher = llg(smol_tokenizer, JsonSchema(keys))
    assert admits(smol_tokenizer, matcher, '{"x_a":1}') and not admits(smol_tokenizer, matcher, '{"ax_":1}')


def test_strict_closes_objects_and_types_untyped_keywords(smol_tokenizer: Any) -> None:
    schema = {"properties": {"a": {"type": "integer"}}}
    strict = llg(smol_tokenizer, JsonSchema(schema))
    assert admits(smol_tokenizer, strict, '{"a":1}') and not admits(smol_tokenizer, strict, '{"a":1,"b":2}')
    assert not admits(smol_tokenizer, strict, '"text"')
    loose = llg(smol_tokenizer, JsonSchema(schema, strict=False))
    assert admits(smol_tokenizer, loose, '{"a":1,"b":2}') and admits(smol_tokenizer, loose, '"text"')
    merged = {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "string"}}}]}
    assert admits(smol_tokenizer, llg(smol_tokenizer, JsonSchema(merged)), '{"a":1,"b":"x"}')


def test_whitespace_is_compact_or_bounded(smol_tokenizer: Any) -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    assert not admits(smol_tokenizer, llg(smol_tokenizer, JsonSchema(schema)), "[1, 2]")
    flexible = llg(smol_tokenizer, JsonSchema(schema, whitespace="flexible", max_whitespace=2))
    assert admits(smol_tokenizer, flexible, "[1, 2]") and not admits(smol_tokenizer, flexible, "[1,   2]")


def test_unimplemented_keywords_are_stripped_named_and_validated(smol_tokenizer: Any) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "contains": {"const": 3}}
    matcher = llg(smol_tokenizer, JsonSchema(schema))
    assert admits(smol_tokenizer, matcher, "[1,1]") and matcher.needs_validation
    assert {"uniqueItems", "contains"} <= {w.split("'")[1] for w in matcher.warnings}
    unknown = llg(smol_tokenizer, JsonSchema({"type": "string", "format": "regex"}))
    assert unknown.needs_validation and admits(smol_tokenizer, unknown, '"[a-z]+"')
    # a format llguidance has no rule for, and parley has a regex for, is enforced by that regex
    template = llg(smol_tokenizer, JsonSchema({"type": "string", "format": "uri-template"}))
    assert not template.needs_validation and admits(smol_tokenizer, template, '"/a/{b}"')
    assert not admits(smol_tokenizer, template, '"/a/{b"')


def test_regexes_choices_and_tool_calls(smol_tokenizer: Any) -> None:
    regex = llg(smol_tokenizer, Regex(r"\d{4}-\d{2}"))
    assert admits(smol_tokenizer, regex, "1989-11") and not admits(smol_tokenizer, regex, "1989-1")
    with pytest.raises(InvalidRegexError):
        llg(smol_tokenizer, Regex("(a"))
    choice = llg(smol_tokenizer, Choice(["yes", "no", ""]))
    assert (
        admits(smol_tokenizer, choice, "no")
        and admits(smol_tokenizer, choice, "")
        and not admits(smol_tokenizer, choice, "n")
    )
    with pytest.raises(UnsupportedSpecError):
        llg(smol_tokenizer, Grammar('root ::= "a"'))
    tools = [ToolSpec(name="add", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})]
    answer = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    calls = llg(smol_tokenizer, ToolCalls(tools, allow_multiple=True, answer_schema=answer))
    one = "<tool_call>" + json.dumps({"name": "add", "arguments": {"a": 1}}, separators=(",", ":")) + "</tool_call>"
    assert admits(smol_tokenizer, calls, one) and admits(smol_tokenizer, calls, one + "\n" + one)
    assert admits(smol_tokenizer, calls, '{"city":"Oslo"}') and not admits(smol_tokenizer, calls, '{"town":"Oslo"}')
    assert not admits(smol_tokenizer, calls, one.replace("add", "sub"))
    listed = llg(smol_tokenizer, ToolCalls(tools, allow_multiple=True, format="json"))
    call = json.dumps({"name": "add", "arguments": {"a": 1}}, separators=(",", ":"))
    assert admits(smol_tokenizer, listed, f"[{call},{call}]") and not admits(smol_tokenizer, listed, "[]")
