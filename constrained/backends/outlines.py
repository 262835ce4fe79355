"""outlines-core backend: a regex DFA crossed with the vocabulary into a token transition index.

JSON Schemas become a regex (`build_regex_from_schema`), then an `Index` (DFA state x token ->
next state, precomputed for the whole vocabulary), walked by a `Guide` per request. Masks are then
a table lookup, but building the index is slow for large schemas (seconds) and can need huge
memory, so it runs in a memory-capped worker process (see `build_index_isolated`); the regex route
cannot express several keywords at all (`UNENFORCED`). No EBNF grammars: `grammar()` raises
`UnsupportedSpecError`. Whitespace: compact means the empty whitespace pattern; flexible allows at
most `max_whitespace` characters. Note: outlines-core always forbids extra object keys, whatever
`additionalProperties` says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley.constrained.backends.base import JsonOptions, choice_regex, tool_calls_regex
from parley.constrained.backends.index_worker import build_index_isolated
from parley.constrained.errors import (
    BackendUnavailableError,
    CompileLimitError,
    InvalidRegexError,
    UnsupportedSpecError,
)
from parley.constrained.schema import dispatch
from parley.constrained.schema.patterns import (
    WIDER_FORMAT,
    format_pattern_gaps,
    formats_as_patterns,
    pattern_mentions_escape,
)
from parley.constrained.schema.walk import KeywordUse, scan_keywords
from parley.constrained.specs import ToolCalls

if TYPE_CHECKING:
    import torch

    from parley.constrained.tokenizer_info import TokenizerInfo

UNENFORCED = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "contains",
    "minContains", "maxContains", "multipleOf", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minProperties", "maxProperties",
    "patternProperties", "uniqueItems",
}  # fmt: skip
# Found by checking the formats exactly (tests/constrained/test_format_grammars.py): outlines-core's own rules
# reject valid date-times ("1963-06-19T08:30:06.283185Z"), times ("08:30:06.5+01:00"), URIs ("mailto:a@b.c",
# "a:") and emails ("BW@m.a.nikE") and pass invalid ones; only its uuid rule is used. Formats with a parley
# regex free of `"` and `\` (which it would match unescaped) are compiled as that regex, the rest validated.
SUPPORTED_FORMATS = {"uuid"}
OWN_PATTERN_FORMATS = {"date-time", "time", "duration", "ipv4", "ipv6", "uri", "uri-reference", "hostname"}
# Unenforced uses of these are removed from the schema before outlines-core sees it.
STRIPPED = {"pattern", "format"}
KEPT = {WIDER_FORMAT}  # wider: kept in the grammar and validated
LENGTHS = {"minLength", "maxLength"}  # outlines-core reads these before a pattern, and drops the pattern


def _oc() -> Any:
    try:
        import outlines_core
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BackendUnavailableError("the outlines backend needs `pip install outlines-core`") from exc
    return outlines_core


def unenforced(schema: Any, root: str, options: JsonOptions | None = None) -> list[KeywordUse]:
    """Keyword uses of `schema` (paths from `root`) that outlines-core would not enforce.

    The keyword list plus what its one-handler-per-object reading drops (see
    `parley.constrained.schema.dispatch`); `allOf` with several branches is concatenated, not intersected.
    """
    strict = True if options is None else options.strict
    out = []
    for use in scan_keywords(schema, root):
        value = use.schema.get(use.keyword)
        if use.keyword in UNENFORCED:
            out.append(use)
        elif use.keyword == "format" and value in OWN_PATTERN_FORMATS and not LENGTHS & use.schema.keys():
            out += format_pattern_gaps(use)
        elif use.keyword == "format" and value not in SUPPORTED_FORMATS:
            out.append(use)
        elif use.keyword == "format" and ({"minLength", "maxLength", "pattern"} & use.schema.keys()):
            out.append(use)  # outlines-core reads lengths first, then pattern, then format
        elif use.keyword == "pattern" and ("minLength" in use.schema or "maxLength" in use.schema):
            out.append(use)  # outlines-core keeps the length bounds and drops the pattern
        elif use.keyword == "pattern" and isinstance(value, str) and pattern_mentions_escape(value):
            out.append(use)  # stripped: outlines-core matches it against the unescaped characters
        elif use.keyword == "allOf" and isinstance(value, list) and len(value) > 1:
            out.append(use)
    out += dispatch.dropped_siblings(schema, root, dispatch.OUTLINES)
    out += dispatch.overlapping_one_of(schema, root, strict)
    out += dispatch.unattached_required(schema, root, dispatch.OUTLINES, strict)
    return dispatch.first_per_use(out)


def _vocabulary(tok: TokenizerInfo) -> Any:
    def build(t: TokenizerInfo) -> Any:
        oc = _oc()
        eos = t.stop_token_ids[0] if t.stop_token_ids else 0
        table: dict[bytes, list[int]] = {}
        for tid, raw in t.token_bytes.items():
            if tid in t.special_token_ids or tid in t.stop_token_ids or not raw:
                continue
            table.setdefault(raw, []).append(tid)
        return oc.Vocabulary(eos, table)

    return tok.backend_state("outlines", build)


class OutlinesMatcher:
    def __init__(self, index: Any, tok: TokenizerInfo) -> None:
        self._index = index
        self._tok = tok
        self._guide = _oc().Guide(index, max_rollback=1_000_000)
        self._stopped = False

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> bool:
        row = bitmask[index] if bitmask.dim() == 2 else bitmask
        if self._stopped:
            row.zero_()
            for stop in self._tok.stop_token_ids:
                row[stop // 32] |= _bit(stop % 32)
            return True
        row.zero_()
        self._guide.write_mask_into(row.data_ptr(), row.numel(), row.element_size())
        return True

    def accept_token(self, token_id: int) -> bool:
        if self._stopped:
            return False
        if token_id in self._tok.stop_token_ids:
            if self.is_completed():
                self._stopped = True
                return True
            return False
        if not self._guide.accepts_tokens([token_id]):
            return False
        self._guide.advance(token_id=token_id, return_tokens=False)
        return True

    def accept_text(self, text: str) -> bool:
        ids = self._tok.tokenizer.encode(text, add_special_tokens=False)
        return all(self.accept_token(int(t)) for t in ids)

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        if self._stopped:
            self._stopped = False
            n -= 1
        if n:
            self._guide.rollback_state(n)

    def is_completed(self) -> bool:
        return bool(self._index.is_final_state(self._guide.get_state()))

    def is_terminated(self) -> bool:
        return self._stopped

    def reset(self) -> None:
        self._guide.reset()
        self._stopped = False

    def forced_tokens(self) -> list[int]:
        if self._stopped:
            return []
        allowed = self._guide.get_tokens()
        return [int(allowed[0])] if len(allowed) == 1 and allowed[0] not in self._tok.stop_token_ids else []


def _bit(position: int) -> int:
    return (1 << position) - (1 << 32) if position == 31 else 1 << position


@dataclass
class OutlinesCompiled:
    index: Any
    tok: Any
    backend: str = "outlines"

    def new_matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self.index, self.tok)


class OutlinesBackend:
    """Compiles specs with outlines-core for one tokenizer."""

    name = "outlines"

    def __init__(self, tokenizer: TokenizerInfo, *, timeout_s: float | None = None) -> None:
        self._tok = tokenizer
        self._vocab = _vocabulary(tokenizer)
        self.timeout_s = timeout_s

    def unenforced(self, schema: Any, root: str, options: JsonOptions) -> list[KeywordUse]:
        return unenforced(schema, root, options)

    def _schema_regex(self, schema: Any, options: JsonOptions) -> str:
        from outlines_core.json_schema import build_regex_from_schema

        whitespace = "" if options.compact else f"[ \\t\\n\\r]{{0,{options.max_whitespace}}}"
        schema = formats_as_patterns(schema, OWN_PATTERN_FORMATS)
        try:
            return str(build_regex_from_schema(json.dumps(schema), whitespace))
        except Exception as exc:
            raise UnsupportedSpecError(f"outlines-core cannot convert this schema: {_first_line(exc)}") from None

    def _index(self, pattern: str) -> OutlinesCompiled:
        _check_dfa_budget(pattern)
        try:
            return OutlinesCompiled(build_index_isolated(pattern, self._vocab, self.timeout_s), self._tok)
        except (CompileLimitError, UnsupportedSpecError):
            raise
        except Exception as exc:
            message = _first_line(exc)
            if "regex" in message.lower() or "parse" in message.lower():
                raise InvalidRegexError(f"outlines-core rejects regex: {message}") from None
            raise UnsupportedSpecError(f"outlines-core failed to build an index: {message}") from None

    def json_schema(self, schema: Any, options: JsonOptions) -> OutlinesCompiled:
        return self._index(self._schema_regex(schema, options))

    def regex(self, pattern: str) -> OutlinesCompiled:
        return self._index(pattern)

    def grammar(self, ebnf: str, root: str) -> OutlinesCompiled:
        raise UnsupportedSpecError("the outlines backend has no context-free grammars; use backend='xgrammar'")

    def choice(self, options: tuple[str, ...]) -> OutlinesCompiled:
        return self._index(choice_regex(options))

    def tool_calls(self, spec: ToolCalls, calls: Any, answer: Any, options: JsonOptions) -> OutlinesCompiled:
        pattern = tool_calls_regex(spec, self._schema_regex(calls, options))
        if answer is not None:
            pattern = f"(?:{pattern})|(?:{self._schema_regex(answer, options)})"
        return self._index(pattern)


# Bounded repetitions are unrolled into DFA states: `{0,32767}` on a JSON string character class
# builds an index of tens of GB. Refuse up front instead: a typed error, decided by the pattern alone.
MAX_REPEAT = 1_000
MAX_REPEAT_TOTAL = 4_000
MAX_REGEX_CHARS = 100_000
_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def _check_dfa_budget(pattern: str) -> None:
    if len(pattern) > MAX_REGEX_CHARS:
        raise UnsupportedSpecError(f"regex of {len(pattern)} chars is too large for an outlines-core index")
    bounds = [int(hi or lo) for lo, hi in _REPEAT.findall(pattern)]
    if any(b > MAX_REPEAT for b in bounds) or sum(bounds) > MAX_REPEAT_TOTAL:
        raise UnsupportedSpecError(
            f"bounded repetitions up to {max(bounds)} (total {sum(bounds)}) would blow up the outlines-core index"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
