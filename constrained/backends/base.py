"""The seam between parley's specs and a grammar library.

A backend has three factory methods — `json_schema`, `regex`, `grammar` — each returning a
`CompiledGrammar` from which per-request `BackendMatcher`s are made (outlines' shape). Two composite
specs have default lowerings on top of those: `choice` (an escaped regex alternation) and
`tool_calls` (a regex composition); a backend may override them with something better.

`unenforced(schema, root, options)` is the backend's honest list of the keyword uses it would compile
but not enforce (paths start at `root`); the compiler turns those into recorded warnings plus
post-hoc validation (they never change which backend is chosen). `tool_calls` gets the prepared call-object schema and
answer schema (see `parley.constrained.schema.prepare`), never the raw tool parameters.
Backends raise `UnsupportedSpecError` for a spec they cannot compile and the `InvalidSpecError`
family for malformed input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from parley.constrained.schema.walk import KeywordUse
from parley.constrained.specs import HERMES_CLOSE, HERMES_OPEN, ToolCalls

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class JsonOptions:
    """Backend-neutral JSON generation options (see `parley.constrained.specs`)."""

    compact: bool = True
    max_whitespace: int = 4
    strict: bool = True
    any_order: bool = False
    lengths_in_grammar: bool = True


class BackendMatcher(Protocol):
    """One request's position in a compiled grammar."""

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> bool: ...

    def accept_token(self, token_id: int) -> bool: ...

    def accept_text(self, text: str) -> bool: ...

    def rollback(self, n: int) -> None: ...

    def is_completed(self) -> bool: ...

    def is_terminated(self) -> bool: ...

    def reset(self) -> None: ...

    def forced_tokens(self) -> list[int]: ...


class CompiledGrammar(Protocol):
    backend: str

    def new_matcher(self) -> BackendMatcher: ...


class GrammarBackend(Protocol):
    name: str

    def json_schema(self, schema: Any, options: JsonOptions) -> CompiledGrammar: ...

    def regex(self, pattern: str) -> CompiledGrammar: ...

    def grammar(self, ebnf: str, root: str) -> CompiledGrammar: ...

    def choice(self, options: tuple[str, ...]) -> CompiledGrammar: ...

    def tool_calls(self, spec: ToolCalls, calls: Any, answer: Any, options: JsonOptions) -> CompiledGrammar: ...

    def unenforced(self, schema: Any, root: str, options: JsonOptions) -> list[KeywordUse]: ...


_REGEX_META = set("\\.^$|?*+()[]{}")


def escape_regex(text: str) -> str:
    """Escape regex metacharacters only (some engines reject Python's `re.escape` of spaces etc.)."""
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)


def choice_regex(options: tuple[str, ...]) -> str:
    return "|".join(f"(?:{escape_regex(o)})" if o else "" for o in options)


def tool_calls_regex(spec: ToolCalls, call_regex: str) -> str:
    """Regex of a tool-call output given the regex of one call object."""
    if spec.format == "json":
        if not spec.allow_multiple:
            return call_regex
        more = f"(?:,(?:{call_regex})){{0,{spec.max_calls - 1}}}"
        return f"\\[(?:{call_regex}){more}\\]"
    one = f"{escape_regex(HERMES_OPEN)}(?:{call_regex}){escape_regex(HERMES_CLOSE)}"
    if not spec.allow_multiple:
        return one
    return f"{one}(?:\n{one}){{0,{spec.max_calls - 1}}}"
