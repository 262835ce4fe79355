"""`parley.constrained`: grammar specs compiled to token-mask matchers.

`compile(spec, tokenizer)` turns a `JsonSchema`, `Regex`, `Grammar`, `Choice` or `ToolCalls` spec
into a `Matcher` that masks next-token logits (xgrammar by default, outlines-core as the other
backend); `ConstraintHook` plugs a matcher into the local engine; `validate` checks finished
outputs. Importing this package imports neither xgrammar, outlines nor torch: backends are loaded
when a spec is first compiled.
"""

from parley.constrained.compiler import CompileCache, compile, compile_cache
from parley.constrained.errors import (
    BackendUnavailableError,
    CompileLimitError,
    ConstrainedError,
    GrammarSyntaxError,
    InvalidRegexError,
    InvalidSchemaError,
    InvalidSpecError,
    UnresolvableRefError,
    UnsupportedDraftError,
    UnsupportedSpecError,
    ValidationFailed,
)
from parley.constrained.hook import (
    HARMONY_COMMENTARY,
    HARMONY_FINAL,
    THINK_END,
    TOOL_CALL_OPEN,
    ConstraintHook,
    Trigger,
    apply_bitmask,
    fill_bitmasks,
)
from parley.constrained.matcher import Matcher
from parley.constrained.specs import Choice, Grammar, JsonSchema, Regex, Spec, ToolCalls
from parley.constrained.tokenizer_info import TokenizerInfo, tokenizer_info
from parley.constrained.validate import parse_tool_calls, validate

__all__ = [
    "BackendUnavailableError",
    "Choice",
    "CompileCache",
    "CompileLimitError",
    "ConstrainedError",
    "ConstraintHook",
    "Grammar",
    "GrammarSyntaxError",
    "HARMONY_COMMENTARY",
    "HARMONY_FINAL",
    "InvalidRegexError",
    "InvalidSchemaError",
    "InvalidSpecError",
    "JsonSchema",
    "Matcher",
    "Regex",
    "Spec",
    "THINK_END",
    "TOOL_CALL_OPEN",
    "TokenizerInfo",
    "ToolCalls",
    "Trigger",
    "UnresolvableRefError",
    "UnsupportedDraftError",
    "UnsupportedSpecError",
    "ValidationFailed",
    "apply_bitmask",
    "compile",
    "compile_cache",
    "fill_bitmasks",
    "parse_tool_calls",
    "tokenizer_info",
    "validate",
]
