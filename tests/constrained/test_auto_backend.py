"""Backend choice on "auto": ranked from the spec alone (`parley.constrained.choice`); outlines last.

The choice is a function of the spec alone. It used to prefer outlines where outlines enforced more
keywords, and to fall back past a deadline or a memory failure, so on MaskBench's
`Github_easy---o90313` it depended on whether the memory-capped outlines index worker happened to
finish on the machine: where it did, outlines was chosen and rejected the valid instance (outlines
ignores `any_order`, and the instance lists `styleName` before `name`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from parley.constrained import (
    Choice,
    CompileCache,
    CompileLimitError,
    JsonSchema,
    Regex,
    Spec,
    ToolCalls,
    UnsupportedSpecError,
    compile,
)
from parley.protocol import ToolSpec
from tests.conftest import SHARED
from tests.constrained.conftest import feed

DEV = SHARED / "data" / "jsonschemabench" / "dev"
O90313 = "Github_easy/Github_easy---o90313.json"
# The dev-split schemas on which auto preferred outlines before (it left fewer keywords unenforced).
FORMERLY_OUTLINES = [
    O90313,
    "Github_medium/Github_medium---o65012.json",
    "Snowplow/Snowplow---sp_351_Normalized.json",
    "Snowplow/Snowplow---sp_352_Normalized.json",
]
MEMORY_CAP = "outlines-core index build exceeded the worker memory cap (4096 MiB) or crashed"


def load(relative: str) -> Any:
    path = DEV / relative
    if not path.is_file():
        pytest.skip(f"MaskBench dev split not found at {DEV}")
    return json.loads(path.read_text())


def bench_spec(schema: Any) -> JsonSchema:
    """The options the MaskBench tests compile with (see test_maskbench.py)."""
    return JsonSchema(schema, strict=False, any_order=True, string_lengths="validate")


@pytest.fixture
def outlines_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every outlines index build (the real worker still runs)."""
    import parley.constrained.backends.outlines as outlines_backend

    calls: list[str] = []
    real = outlines_backend.build_index_isolated

    def spy(pattern: str, vocabulary: Any, timeout_s: float | None) -> Any:
        calls.append(pattern)
        return real(pattern, vocabulary, timeout_s)

    monkeypatch.setattr(outlines_backend, "build_index_isolated", spy)
    return calls


def broken_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The outlines worker fails as a memory-capped process does on a small machine."""
    import parley.constrained.backends.outlines as outlines_backend

    def fail(pattern: str, vocabulary: Any, timeout_s: float | None) -> Any:
        raise CompileLimitError(MEMORY_CAP)

    monkeypatch.setattr(outlines_backend, "build_index_isolated", fail)


def test_o90313_compiles_on_xgrammar_and_accepts_its_valid_instance(
    smol_tokenizer: Any, outlines_builds: list[str]
) -> None:
    case = load(O90313)
    matcher = compile(bench_spec(case["schema"]), smol_tokenizer, cache=CompileCache())
    assert matcher.backend == "xgrammar"
    assert outlines_builds == []  # outlines is not even consulted
    valid = [test["data"] for test in case["tests"] if test["valid"]]
    assert valid
    for data in valid:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        matcher.reset()
        assert feed(matcher, smol_tokenizer, text), text  # every token allowed by the mask and accepted
        matcher.reset()
        ids = smol_tokenizer.encode(text, add_special_tokens=False)
        assert all(matcher.accept_token(i) for i in ids) and matcher.is_completed()
        assert matcher.validate(text) == data
    # what xgrammar does not enforce here (the oneOf over `required`) goes to validation, not to outlines
    assert matcher.needs_validation and any("'oneOf'" in w for w in matcher.warnings), matcher.warnings


@pytest.mark.parametrize("relative", FORMERLY_OUTLINES)
def test_the_choice_is_the_same_when_the_outlines_worker_fails(
    smol_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, outlines_builds: list[str], relative: str
) -> None:
    spec = bench_spec(load(relative)["schema"])
    working = compile(spec, smol_tokenizer, cache=CompileCache())
    broken_worker(monkeypatch)
    failing = compile(spec, smol_tokenizer, cache=CompileCache())
    assert working.backend == failing.backend == "xgrammar"
    assert working.warnings == failing.warnings
    assert outlines_builds == []


TOOLS = [ToolSpec(name="add", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})]
# (spec, the backend auto picks): non-JSON specs try xgrammar first; JSON specs where llguidance and
# xgrammar leave as many keyword uses to validation go to llguidance (the tie order).
SPECS: list[tuple[Spec, str]] = [
    (Choice(["yes", "no"]), "xgrammar"),
    (Regex("[a-z]{1,8}"), "xgrammar"),
    (JsonSchema({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]}),
     "llguidance"),
    (JsonSchema({"type": "array", "items": {"type": "string", "maxLength": 4}, "uniqueItems": True}), "llguidance"),
    (JsonSchema({"type": "object", "properties": {"b": {"type": "string"}}}, strict=False), "llguidance"),
    (ToolCalls(TOOLS), "llguidance"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "expected"), SPECS, ids=lambda s: getattr(s, "kind", s))
def test_auto_never_asks_outlines_about_a_spec_another_backend_compiles(
    smol_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, outlines_builds: list[str], spec: Spec, expected: str
) -> None:
    matcher = compile(spec, smol_tokenizer, cache=CompileCache())
    assert matcher.backend == expected and matcher.choice.startswith(expected), matcher.choice
    broken_worker(monkeypatch)
    assert compile(spec, smol_tokenizer, cache=CompileCache()).backend == expected
    assert outlines_builds == []


def refusing_llguidance(monkeypatch: pytest.MonkeyPatch) -> None:
    from parley.constrained.backends.llguidance import LLGuidanceBackend

    def refuse(self: LLGuidanceBackend, schema: Any, options: Any) -> Any:
        raise UnsupportedSpecError("llguidance cannot compile this schema (test double)")

    monkeypatch.setattr(LLGuidanceBackend, "json_schema", refuse)


def test_what_llguidance_and_xgrammar_cannot_compile_goes_to_outlines_or_fails_typed(
    smol_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = JsonSchema({"type": "integer", "minimum": 0.5})  # xgrammar refuses a fractional integer bound
    with pytest.raises(UnsupportedSpecError):
        compile(spec, smol_tokenizer, backend="xgrammar", cache=CompileCache())
    assert compile(spec, smol_tokenizer, cache=CompileCache()).backend == "llguidance"
    refusing_llguidance(monkeypatch)
    assert compile(spec, smol_tokenizer, cache=CompileCache()).backend == "outlines"
    broken_worker(monkeypatch)
    with pytest.raises(CompileLimitError, match="memory cap"):
        compile(spec, smol_tokenizer, cache=CompileCache())


def test_a_deadline_is_raised_not_handed_to_the_next_backend(
    smol_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, outlines_builds: list[str]
) -> None:
    from parley.constrained.backends.llguidance import LLGuidanceBackend
    from parley.constrained.backends.xgrammar import XGrammarBackend

    def slow(self: Any, schema: Any, options: Any) -> Any:
        time.sleep(0.5)
        raise AssertionError("past the deadline: nobody reads this")

    monkeypatch.setattr(LLGuidanceBackend, "json_schema", slow)
    monkeypatch.setattr(XGrammarBackend, "json_schema", lambda *a: pytest.fail("xgrammar must not be tried"))
    with pytest.raises(CompileLimitError, match="with llguidance"):
        compile(JsonSchema({"type": "integer"}), smol_tokenizer, timeout_s=0.05, cache=CompileCache())
    assert outlines_builds == []
