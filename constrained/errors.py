"""Errors of `parley.constrained`.

Every problem with a spec is reported before a request runs, as a typed error that names what is
wrong, so a bad schema can never hang the engine or silently weaken a constraint:

    ConstrainedError
    ├── InvalidSpecError            the spec itself is wrong
    │   ├── InvalidSchemaError      not a JSON Schema / fails the metaschema
    │   │   ├── UnresolvableRefError   a `$ref` that points nowhere (or off-document)
    │   │   └── UnsupportedDraftError  `$schema` names a draft we do not speak
    │   ├── InvalidRegexError       a pattern that does not parse
    │   └── GrammarSyntaxError      an EBNF grammar that does not parse
    ├── UnsupportedSpecError        valid, but no (requested) backend can enforce it
    ├── CompileLimitError           too large, or compiling took longer than the bound
    ├── BackendUnavailableError     the backend's library is not installed
    └── ValidationFailed            an output does not satisfy its spec (path + keyword)
        └── ValidationUndecided     a lookaround/backreference pattern not decided in its time bound
"""

from __future__ import annotations

from parley._root import ParleyError


class ConstrainedError(ParleyError):
    """Base class of constrained-decoding errors."""


class InvalidSpecError(ConstrainedError):
    """The spec is malformed (schema, regex or grammar); nothing was compiled."""


class InvalidSchemaError(InvalidSpecError):
    """The JSON Schema is not a schema, or violates the Draft 2020-12 metaschema."""


class UnresolvableRefError(InvalidSchemaError):
    """A `$ref` cannot be resolved inside the document (remote refs are never fetched)."""


class UnsupportedDraftError(InvalidSchemaError):
    """`$schema` names a dialect other than Draft 4/6/7/2019-09/2020-12."""


class InvalidRegexError(InvalidSpecError):
    """A regular expression (a `Regex` spec or a schema `pattern`) does not parse."""


class GrammarSyntaxError(InvalidSpecError):
    """An EBNF grammar does not parse."""


class UnsupportedSpecError(ConstrainedError):
    """The spec is valid but the chosen backend (or every backend, for "auto") cannot compile it."""


class CompileLimitError(ConstrainedError):
    """The spec exceeds the size bound, or compiling it ran past the time bound."""


class BackendUnavailableError(ConstrainedError):
    """The grammar library a backend needs (xgrammar, llguidance, outlines-core) is not importable."""


class ValidationFailed(ConstrainedError):
    """An output does not satisfy its spec.

    `path` is the JSON path of the offending value ("$" for the root), `keyword` the failing schema
    keyword (or "json" / "regex" / "choice" / "grammar" / "tool_name" for non-schema checks).
    """

    def __init__(self, message: str, *, path: str = "$", keyword: str = "", text: str | None = None) -> None:
        super().__init__(f"{message} (at {path}, keyword {keyword!r})" if keyword else f"{message} (at {path})")
        self.path = path
        self.keyword = keyword
        self.text = text


class ValidationUndecided(ValidationFailed):
    """An output could not be proven to satisfy its spec within the checker's time bound.

    Only patterns with a lookaround or a backreference can get here (everything else is matched in
    linear time, `parley.constrained.pattern_match`); the output is refused, never passed unchecked,
    and `text` keeps it for the caller.
    """
