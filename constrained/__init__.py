"""`parley.constrained`: grammar specs compiled to token-mask matchers.

`compile(spec, tokenizer)` turns a `JsonSchema`, `Regex`, `Grammar`, `Choice` or `ToolCalls` spec
into a `Matcher` that fills next-token bitmasks (backend "auto" ranks llguidance, xgrammar and
outlines-core per spec from what the differential tests proved, see `parley.constrained.choice`; the
choice depends on the spec alone and is recorded in `Matcher.choice`);
`ConstraintHook` plugs a matcher into the local engine, which applies the masks itself, starting at a
`Trigger` such as `THINK_END` or `TOOL_CALL_OPEN`; `validate` checks finished outputs. Importing this
package imports neither xgrammar, llguidance, outlines nor torch: backends are loaded when a spec is first
compiled. (The Harmony triggers `HARMONY_FINAL` / `HARMONY_COMMENTARY` live in
`parley.constrained.hook`.)
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
    ValidationUndecided,
)
from parley.constrained.hook import (
    THINK_END,
    TOOL_CALL_OPEN,
    ConstraintHook,
    Trigger,
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
    "ValidationUndecided",
    "compile",
    "compile_cache",
    "parse_tool_calls",
    "tokenizer_info",
    "validate",
]
