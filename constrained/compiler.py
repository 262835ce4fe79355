"""`compile(spec, tokenizer)`: check a spec, pick a backend, compile under a deadline, cache it.

JSON specs — a `JsonSchema`, and a `ToolCalls`' call schema (every tool's parameters) and answer
schema alike — are first prepared by one code path (`parley.constrained.schema.prepare`): checked,
`$ref`s made robust, patterns rewritten.

Backend choice ("auto") is a function of the spec alone (`parley.constrained.choice`): backends that
would reject valid values of the spec are not tried, the rest are ranked by how few keyword uses they
leave to validation, and the ranking is recorded in `Matcher.choice`. A backend raising
`UnsupportedSpecError` hands over to the next; a deadline or memory failure (`CompileLimitError`,
e.g. outlines' memory-capped index worker) is raised, never a reason to switch backends, so which
backend compiles a spec does not depend on the machine or its load. Whatever the chosen backend does
not enforce (each backend's list: its keyword rules, what its converter never reads where it stands,
see `parley.constrained.schema.dispatch`, and what the differential tests caught it rejecting wrongly) is
never dropped silently: it is recorded in `Matcher.warnings` (and logged) and
`Matcher.needs_validation` is set, so outputs are validated after generation. An explicit backend
never falls back: its failure is raised.

Compiles run in a daemon thread joined with a timeout (`timeout_s`), and specs larger than
`max_spec_bytes` are refused up front, so a pathological schema costs at most the deadline — it
never hangs the caller (the abandoned compile may keep one core busy until it finishes; both
libraries release the GIL while compiling).

Compiled grammars are cached (LRU) by (canonical spec, tokenizer fingerprint, requested backend);
each `compile` call returns a fresh `Matcher` over the shared compiled grammar.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from parley.constrained.backends.base import CompiledGrammar, GrammarBackend, JsonOptions
from parley.constrained.choice import Ranking, costly, options_for, rank
from parley.constrained.errors import (
    CompileLimitError,
    InvalidRegexError,
    InvalidSpecError,
    UnsupportedSpecError,
)
from parley.constrained.matcher import Matcher
from parley.constrained.pattern_match import check_pattern
from parley.constrained.schema.patterns import pattern_mentions_escape
from parley.constrained.schema.prepare import JsonPart, json_parts
from parley.constrained.schema.walk import KeywordUse, strip_keywords
from parley.constrained.specs import Choice, Grammar, JsonSchema, Regex, Spec, ToolCalls
from parley.constrained.tokenizer_info import TokenizerInfo, tokenizer_info

BackendName = Literal["auto", "xgrammar", "outlines", "llguidance"]
BACKENDS = ("xgrammar", "outlines", "llguidance")
logger = logging.getLogger("parley.constrained")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_SPEC_BYTES = 2_000_000


@dataclass(frozen=True)
class CompiledSpec:
    """A cache entry: the backend's compiled grammar plus what the matcher must carry."""

    compiled: CompiledGrammar
    backend: str
    warnings: tuple[str, ...]
    needs_validation: bool
    choice: str = ""


class CompileCache:
    """A thread-safe LRU of compiled specs."""

    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str, str], CompiledSpec] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str, str]) -> CompiledSpec | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: tuple[str, str, str], entry: CompiledSpec) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)


compile_cache = CompileCache()


def _backend(name: str, tok: TokenizerInfo, timeout_s: float | None = None) -> GrammarBackend:
    if name == "xgrammar":
        from parley.constrained.backends.xgrammar import XGrammarBackend

        return XGrammarBackend(tok)
    if name == "outlines":
        from parley.constrained.backends.outlines import OutlinesBackend

        return OutlinesBackend(tok, timeout_s=timeout_s)
    if name == "llguidance":
        from parley.constrained.backends.llguidance import LLGuidanceBackend

        return LLGuidanceBackend(tok)
    raise InvalidSpecError(f"unknown backend {name!r} (expected 'auto', {', '.join(map(repr, BACKENDS))})")


def _unenforced(name: str, parts: list[JsonPart], options: JsonOptions) -> list[KeywordUse]:
    """What backend `name` would not enforce in the prepared documents, plus what preparing relaxed."""
    if name == "xgrammar":
        from parley.constrained.backends.xgrammar import unenforced
    elif name == "llguidance":
        from parley.constrained.backends.llguidance import unenforced
    else:
        from parley.constrained.backends.outlines import unenforced
    out: list[KeywordUse] = []
    for part in parts:
        out += [*part.relaxed, *unenforced(part.schema, part.label, options)]
    return out


def _with_deadline(work: Callable[[], CompiledGrammar], timeout_s: float | None, what: str) -> CompiledGrammar:
    if timeout_s is None:
        return work()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="parley-compile", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CompileLimitError(f"compiling {what} took longer than {timeout_s:g} s (timeout_s)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _json_options(spec: JsonSchema | ToolCalls) -> JsonOptions:
    any_order = spec.any_order if isinstance(spec, JsonSchema) else False
    lengths = spec.string_lengths == "grammar"
    return JsonOptions(spec.whitespace == "compact", spec.max_whitespace, spec.strict, any_order, lengths)


def _compile_uncached(
    spec: Spec, tok: TokenizerInfo, requested: str, timeout_s: float | None, max_spec_bytes: int | None
) -> CompiledSpec:
    canonical = spec.canonical()
    if max_spec_bytes is not None and len(canonical.encode()) > max_spec_bytes:
        raise CompileLimitError(
            f"{spec.kind} spec is {len(canonical.encode())} bytes, over the bound of {max_spec_bytes} (max_spec_bytes)"
        )
    parts: list[JsonPart] = []
    if isinstance(spec, (JsonSchema, ToolCalls)):
        parts = json_parts(spec)
    elif isinstance(spec, Regex):
        try:
            re.compile(spec.pattern)
        except re.error as exc:
            raise InvalidRegexError(f"invalid regex {spec.pattern!r}: {exc}") from None
        check_pattern(spec.pattern, python=True)  # what the validator will read
    elif isinstance(spec, Grammar) and not spec.ebnf.strip():
        from parley.constrained.errors import GrammarSyntaxError

        raise GrammarSyntaxError("empty grammar")

    options = _json_options(spec) if isinstance(spec, (JsonSchema, ToolCalls)) else None
    if requested == "auto":
        ranking = rank(spec, parts, options, _unenforced)
    else:
        ranking = Ranking((requested,), ((requested, "requested"),))
    errors: list[UnsupportedSpecError] = []
    for name in ranking.order:
        backend = _backend(name, tok, timeout_s)
        chosen_options = options_for(name, options, requested) if options is not None else None
        missing = _unenforced(name, parts, chosen_options) if parts and chosen_options is not None else []
        strip = _strip_set(name, missing)
        work = _builder(backend, spec, [strip_keywords(p.schema, strip, p.label) for p in parts])
        try:
            compiled = _with_deadline(work, timeout_s, f"a {spec.kind} spec with {name}")
        except UnsupportedSpecError as exc:
            # the spec is beyond this backend, whatever the machine: the next one may express it
            errors.append(exc)
            logger.info("backend %s could not compile %s: %s", name, spec.kind, exc)
            continue
        # A CompileLimitError (deadline, size, the outlines worker's memory cap) is not a reason to
        # switch: it depends on the machine and its load, and the backend choice must not.
        warnings = tuple(_warning(name, use, parts) for use in missing)
        prices = costly(name, parts, chosen_options) if parts and chosen_options is not None else []
        notes = tuple(_price_note(name, use, parts) for use in prices)
        if warnings:
            logger.info("compiled %s with %s; %d keyword(s) not enforced: %s", spec.kind, name, len(warnings),
                        ", ".join(f"{u.keyword}@{u.path}" for u in missing[:8]))  # fmt: skip
        choice = ranking.record(name)
        logger.debug("backend choice for %s: %s", spec.kind, choice)
        return CompiledSpec(compiled, name, warnings + notes, bool(warnings), choice)
    if len(errors) == 1:
        raise errors[0]
    detail = "; ".join(f"{type(e).__name__}: {e}" for e in errors)
    raise UnsupportedSpecError(f"no backend can compile the spec: {detail}")


def _where(use: KeywordUse, parts: list[JsonPart]) -> str:
    """`use`'s path as the user wrote it (a tool's own name for a tool-call part)."""
    part = next((p for p in parts if use.path == p.label or use.path.startswith(p.label + ".")), None)
    return part.describe(use.path) if part is not None else use.path


def _price_note(name: str, use: KeywordUse, parts: list[JsonPart]) -> str:
    """A warning for a use enforced at a price in reachable values (`choice.costly`): never a silent one."""
    where = _where(use, parts)
    return f"{name} enforces {use.keyword!r} at {where} at a price: {use.reason}; such values are unreachable"


def _warning(name: str, use: KeywordUse, parts: list[JsonPart]) -> str:
    why = f" ({use.reason})" if use.reason else ""
    where = _where(use, parts)
    return f"{name} does not enforce {use.keyword!r} at {where}{why}; outputs are validated after generation"


def _builder(backend: GrammarBackend, spec: Spec, schemas: list[Any]) -> Callable[[], CompiledGrammar]:
    """The compile call for `spec` on `backend` (JSON specs: their prepared, stripped documents)."""

    def build() -> CompiledGrammar:
        if isinstance(spec, JsonSchema):
            return backend.json_schema(schemas[0], _json_options(spec))
        if isinstance(spec, ToolCalls):
            answer = schemas[1] if len(schemas) > 1 else None
            return backend.tool_calls(spec, schemas[0], answer, _json_options(spec))
        if isinstance(spec, Regex):
            return backend.regex(spec.pattern)
        if isinstance(spec, Grammar):
            return backend.grammar(spec.ebnf, spec.root)
        return backend.choice(spec.options)

    return build


def _strip_set(name: str, missing: list[KeywordUse]) -> set[tuple[str, str]]:
    """The unenforced uses to remove before `name` sees the schema (it would mis-enforce them)."""
    by_reason: set[str | None] = set()
    if name == "xgrammar":
        from parley.constrained.backends.xgrammar import KEPT, STRIPPED, STRIPPED_REASONS

        missing = [u for u in missing if u.reason not in KEPT]  # a widened pattern is still worth keeping
        by_reason = set(STRIPPED_REASONS)
    elif name == "llguidance":
        from parley.constrained.backends.llguidance import KEPT, STRIPPED

        missing = [u for u in missing if u.reason not in KEPT]
    else:
        from parley.constrained.backends.outlines import KEPT, STRIPPED

        # a pattern next to length bounds is dropped by outlines-core itself; strip only the escaping ones
        missing = [u for u in missing if u.keyword != "pattern" or pattern_mentions_escape(u.schema["pattern"])]
        missing = [u for u in missing if u.reason not in KEPT]
    return {(use.keyword, use.path) for use in missing if use.keyword in STRIPPED or use.reason in by_reason}


def compile(  # noqa: A001 - the public name the design fixes
    spec: Spec,
    tokenizer: Any,
    *,
    backend: BackendName = "auto",
    vocab_size: int | None = None,
    stop_token_ids: Sequence[int] | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    max_spec_bytes: int | None = DEFAULT_MAX_SPEC_BYTES,
    cache: CompileCache | None = None,
) -> Matcher:
    """Compile `spec` for `tokenizer` (a Hugging Face tokenizer or a `TokenizerInfo`) into a fresh `Matcher`.

    `vocab_size` is the model's logits width (pass `model.config.vocab_size`; defaults to the
    tokenizer's size). Raises `InvalidSpecError` subclasses for malformed specs,
    `UnsupportedSpecError` when no backend can compile it, `CompileLimitError` past the bounds.
    """
    if backend != "auto" and backend not in BACKENDS:
        raise InvalidSpecError(f"unknown backend {backend!r} (expected 'auto', {', '.join(map(repr, BACKENDS))})")
    if not isinstance(spec, (JsonSchema, Regex, Grammar, Choice, ToolCalls)):
        raise InvalidSpecError(f"not a constrained-decoding spec: {type(spec).__name__}")
    tok = tokenizer_info(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    store = compile_cache if cache is None else cache
    key = (spec.canonical(), tok.fingerprint, backend)
    entry = store.get(key)
    if entry is None:
        entry = _compile_uncached(spec, tok, backend, timeout_s, max_spec_bytes)
        store.put(key, entry)
    return Matcher(
        spec,
        entry.backend,
        entry.compiled.new_matcher(),
        tok,
        warnings=entry.warnings,
        needs_validation=entry.needs_validation,
        choice=entry.choice,
    )
