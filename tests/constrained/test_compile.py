"""`compile`: specs become matchers on either backend; bad input is a typed error, never a hang."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import BaseModel, Field

from parley.constrained import (
    Choice,
    CompileCache,
    CompileLimitError,
    Grammar,
    GrammarSyntaxError,
    InvalidRegexError,
    InvalidSchemaError,
    JsonSchema,
    Regex,
    ToolCalls,
    UnresolvableRefError,
    UnsupportedDraftError,
    UnsupportedSpecError,
    compile,
)
from parley.protocol import ToolSpec
from tests.constrained.conftest import feed, token_allowed


class Address(BaseModel):
    city: str
    zip: str | None = None


class Person(BaseModel):
    name: str
    age: int
    addresses: list[Address] = Field(default_factory=list, max_length=2)


TOOLS = [
    ToolSpec(name="add", parameters={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
    ToolSpec(name="echo", parameters={"type": "object", "properties": {"text": {"type": "string"}}}),
]

CASES: list[tuple[Any, str]] = [
    (JsonSchema(Person), '{"name":"Ann","age":31,"addresses":[{"city":"Oslo","zip":null}]}'),
    (Regex(r"\d{4}-\d{2}-\d{2}"), "2024-01-31"),
    (Choice(["red", "green", "blue"]), "green"),
    (ToolCalls(TOOLS), '<tool_call>{"name":"echo","arguments":{"text":"hi"}}</tool_call>'),
    (ToolCalls(TOOLS, format="json"), '{"name":"add","arguments":{"a":5}}'),
]


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_each_spec_accepts_its_example_on_each_backend(smol_tokenizer: Any, backend: str, case: int) -> None:
    spec, text = CASES[case]
    matcher = compile(spec, smol_tokenizer, backend=backend)  # type: ignore[arg-type]
    assert matcher.backend == backend
    assert feed(matcher, smol_tokenizer, text)
    assert matcher.accept_token(smol_tokenizer.eos_token_id) and matcher.is_terminated()


def test_grammar_and_multiple_tool_calls_on_xgrammar(smol_tokenizer: Any) -> None:
    grammar = compile(Grammar('root ::= "a" [0-9]+ ("," [0-9]+)*'), smol_tokenizer)
    assert grammar.backend == "xgrammar" and feed(grammar, smol_tokenizer, "a12,3")
    calls = compile(ToolCalls(TOOLS, allow_multiple=True), smol_tokenizer)
    two = (
        '<tool_call>{"name":"add","arguments":{"a":1}}</tool_call>\n'
        '<tool_call>{"name":"echo","arguments":{}}</tool_call>'
    )
    assert feed(calls, smol_tokenizer, two)


def test_wrong_output_is_rejected(smol_tokenizer: Any) -> None:
    matcher = compile(ToolCalls(TOOLS), smol_tokenizer)
    assert not feed(matcher, smol_tokenizer, '<tool_call>{"name":"mul","arguments":{}}</tool_call>')
    matcher = compile(ToolCalls(TOOLS), smol_tokenizer)
    assert not feed(matcher, smol_tokenizer, '<tool_call>{"name":"add","arguments":{"a":"one"}}</tool_call>')


def test_outlines_has_no_grammars_and_explicit_backends_do_not_fall_back(smol_tokenizer: Any) -> None:
    with pytest.raises(UnsupportedSpecError):
        compile(Grammar('root ::= "x"'), smol_tokenizer, backend="outlines")


def test_auto_falls_back_when_xgrammar_cannot_compile(smol_tokenizer: Any) -> None:
    # xgrammar refuses a fractional bound on an integer; outlines ignores bounds; llguidance enforces it.
    schema = {"type": "integer", "minimum": 0.5}
    with pytest.raises(UnsupportedSpecError):
        compile(JsonSchema(schema), smol_tokenizer, backend="xgrammar")
    outlines = compile(JsonSchema(schema), smol_tokenizer, backend="outlines")
    assert outlines.needs_validation and any("minimum" in w for w in outlines.warnings)
    matcher = compile(JsonSchema(schema), smol_tokenizer)
    assert matcher.backend == "llguidance" and not matcher.needs_validation
    assert feed(matcher, smol_tokenizer, "1") and not feed(
        compile(JsonSchema(schema), smol_tokenizer), smol_tokenizer, "0"
    )


def test_ignored_keywords_are_recorded_not_silently_dropped(smol_tokenizer: Any) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    matcher = compile(JsonSchema(schema), smol_tokenizer)
    assert matcher.backend == "llguidance"
    assert matcher.needs_validation and any("uniqueItems" in w and "$" in w for w in matcher.warnings)
    clean = compile(JsonSchema({"type": "array", "items": {"type": "integer"}}), smol_tokenizer)
    assert not clean.needs_validation and clean.warnings == ()


def test_patterns_use_json_schema_search_semantics(smol_tokenizer: Any) -> None:
    spec = JsonSchema({"type": "string", "pattern": "^/"})
    assert feed(compile(spec, smol_tokenizer), smol_tokenizer, '"/editor.xml"')
    assert not feed(compile(spec, smol_tokenizer), smol_tokenizer, '"editor.xml"')


def test_compact_whitespace_by_default_and_bounded_when_flexible(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    space = smol_tokenizer.encode(" ", add_special_tokens=False)[0]
    # xgrammar: llguidance masks the lone "{" token (only the canonical '{"' follows), see its module
    compact = compile(JsonSchema(schema), smol_tokenizer, backend="xgrammar")
    assert feed(compact, smol_tokenizer, "{", complete=False)
    mask = compact.allocate_bitmask()
    compact.fill_next_token_bitmask(mask)
    assert not token_allowed(mask, space)
    flexible = compile(JsonSchema(schema, whitespace="flexible", max_whitespace=2), smol_tokenizer, backend="xgrammar")
    assert feed(flexible, smol_tokenizer, "{", complete=False)
    assert flexible.accept_token(space) and flexible.accept_token(space)
    assert not flexible.accept_token(space)


def test_padded_vocabulary_ids_are_never_allowed(smol_tokenizer: Any) -> None:
    width = len(smol_tokenizer) + 100
    for backend in ("xgrammar", "outlines"):
        matcher = compile(Regex("[a-z]+"), smol_tokenizer, backend=backend, vocab_size=width)  # type: ignore[arg-type]
        mask = matcher.allocate_bitmask()
        assert mask.shape[-1] == (width + 31) // 32
        matcher.fill_next_token_bitmask(mask)
        assert not any(token_allowed(mask, i) for i in range(len(smol_tokenizer), width))
        assert not matcher.accept_token(width - 1)


def test_compile_cache_shares_grammars_but_not_state(smol_tokenizer: Any) -> None:
    cache = CompileCache(max_entries=2)
    first = compile(Choice(["a", "b"]), smol_tokenizer, cache=cache)
    second = compile(Choice(["a", "b"]), smol_tokenizer, cache=cache)
    assert (cache.hits, cache.misses) == (1, 1)
    assert feed(first, smol_tokenizer, "a") and not second.is_completed()
    compile(Choice(["a", "b"]), smol_tokenizer, cache=cache, backend="outlines")
    compile(Choice(["c"]), smol_tokenizer, cache=cache)
    assert len(cache) == 2  # LRU bound


def test_rollback_reset_and_token_budget(smol_tokenizer: Any) -> None:
    matcher = compile(Regex("[a-z ]+", max_tokens=3), smol_tokenizer)
    ids = smol_tokenizer.encode("hello big world", add_special_tokens=False)
    assert all(matcher.accept_token(i) for i in ids[:2])
    matcher.rollback(1)
    assert matcher.accepted_tokens == 1
    assert matcher.accept_token(ids[1]) and matcher.accept_token(ids[2])
    assert matcher.is_terminated() and matcher.exhausted  # budget reached: only stop tokens now
    mask = matcher.allocate_bitmask()
    matcher.fill_next_token_bitmask(mask)
    assert token_allowed(mask, smol_tokenizer.eos_token_id) and not token_allowed(mask, ids[0])
    matcher.reset()
    assert matcher.accepted_tokens == 0 and not matcher.is_terminated()


def test_jump_forward_offers_forced_tokens(smol_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"temperature": {"type": "number"}}, "required": ["temperature"]}
    matcher = compile(JsonSchema(schema), smol_tokenizer)
    forced = matcher.forced_tokens()
    assert smol_tokenizer.decode(forced).startswith('{"temperature')


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (JsonSchema({"type": 12}), InvalidSchemaError),
        (JsonSchema(["not", "a", "schema"]), InvalidSchemaError),
        (JsonSchema({"$ref": "#/$defs/missing"}), UnresolvableRefError),
        (JsonSchema({"$ref": "https://example.com/schema.json"}), UnresolvableRefError),
        (JsonSchema({"$schema": "http://json-schema.org/draft-01/schema#", "type": "string"}), UnsupportedDraftError),
        (JsonSchema({"type": "string", "pattern": "(unclosed"}), InvalidRegexError),
        (Regex("[a-"), InvalidRegexError),
        (Grammar('root ::= "a" | '), GrammarSyntaxError),
        (Grammar("start ::= [a-z]"), GrammarSyntaxError),
    ],
)
def test_bad_input_is_a_typed_error(smol_tokenizer: Any, spec: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        compile(spec, smol_tokenizer)


def test_size_and_time_bounds(smol_tokenizer: Any) -> None:
    big = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(2000)}}
    with pytest.raises(CompileLimitError, match="max_spec_bytes"):
        compile(JsonSchema(big), smol_tokenizer, max_spec_bytes=10_000)
    slow = {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": 30} for i in range(12)}}
    started = time.monotonic()
    with pytest.raises(CompileLimitError, match="timeout_s"):
        compile(JsonSchema(slow), smol_tokenizer, backend="outlines", timeout_s=0.05)
    assert time.monotonic() - started < 2.0


def test_string_lengths_bound_generation_or_go_to_validation(smol_tokenizer: Any) -> None:
    schema = {"type": "string", "maxLength": 3}
    bounded = compile(JsonSchema(schema), smol_tokenizer)
    assert not bounded.needs_validation and feed(bounded, smol_tokenizer, '"abc"')
    assert not feed(compile(JsonSchema(schema), smol_tokenizer), smol_tokenizer, '"abcd"')
    relaxed = compile(JsonSchema(schema, string_lengths="validate"), smol_tokenizer, backend="xgrammar")
    assert relaxed.needs_validation and any("maxLength" in w for w in relaxed.warnings)
    assert feed(relaxed, smol_tokenizer, '"a\\nbcd"')
    # the caller chose validation for lengths: auto never picks outlines to enforce them (it forbids extra keys)
    auto = compile(JsonSchema(schema, string_lengths="validate"), smol_tokenizer)
    assert auto.backend != "outlines" and auto.needs_validation


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_tool_calls_with_an_answer_schema_admit_a_call_or_a_direct_answer(smol_tokenizer: Any, backend: str) -> None:
    answer = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    spec = ToolCalls(TOOLS, answer_schema=answer)
    assert spec.canonical() != ToolCalls(TOOLS).canonical()  # distinct compile-cache entries
    call = '<tool_call>{"name":"add","arguments":{"a":1}}</tool_call>'
    assert feed(compile(spec, smol_tokenizer, backend=backend), smol_tokenizer, call)  # type: ignore[arg-type]
    assert feed(compile(spec, smol_tokenizer, backend=backend), smol_tokenizer, '{"city":"Oslo"}')  # type: ignore[arg-type]
    assert not feed(compile(spec, smol_tokenizer, backend=backend), smol_tokenizer, "Oslo")  # type: ignore[arg-type]
    assert not feed(compile(spec, smol_tokenizer, backend=backend), smol_tokenizer, '{"town":"Oslo"}')  # type: ignore[arg-type]
