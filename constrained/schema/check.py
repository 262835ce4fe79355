"""Refuse what is not a usable JSON Schema before any backend sees it, with a typed error.

Wrong type, an unknown `$schema` dialect, metaschema violations, invalid regexes and `$ref`s that do
not resolve inside the document (remote refs are never fetched) are the request's fault: they are
reported here, naming the path, rather than as a backend's compile failure.
"""

from __future__ import annotations

from typing import Any

from parley.constrained.errors import (
    InvalidRegexError,
    InvalidSchemaError,
    UnresolvableRefError,
    UnsupportedDraftError,
)
from parley.constrained.pattern_match import check_pattern
from parley.constrained.schema.walk import iter_subschemas, scan_keywords

_DRAFTS = {
    "http://json-schema.org/draft-04/schema",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "https://json-schema.org/draft/2020-12/schema",
}


def check_schema(schema: Any) -> None:
    """Raise a typed `InvalidSchemaError` unless `schema` is a usable JSON Schema."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidSchemaError(f"a JSON Schema must be an object or a boolean, not {type(schema).__name__}")
    import jsonschema

    dialect = schema.get("$schema")
    if dialect is not None:
        if not isinstance(dialect, str) or dialect.rstrip("#") not in _DRAFTS:
            raise UnsupportedDraftError(
                f"unsupported $schema {dialect!r}; supported: Draft 4, 6, 7, 2019-09 and 2020-12"
            )
    for use in scan_keywords(schema):
        if use.keyword == "pattern" and isinstance(use.schema.get("pattern"), str):
            _check_regex(use.schema["pattern"], use.path)
        if use.keyword == "patternProperties" and isinstance(use.schema.get("patternProperties"), dict):
            for pattern in use.schema["patternProperties"]:
                _check_regex(pattern, use.path)
    validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    metaschema = validator_cls(validator_cls.META_SCHEMA, format_checker=_metaschema_formats(validator_cls))
    error = jsonschema.exceptions.best_match(metaschema.iter_errors(schema))
    if error is not None:
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise InvalidSchemaError(f"not a valid JSON Schema at {where}: {error.message}")
    _check_refs(schema)


def _metaschema_formats(validator_cls: Any) -> Any:
    """The dialect's metaschema format checks, `regex` read as ECMA-262 (JSON Schema's reading) instead of
    Python's `re`, which refuses `(?<year>...)` and `\\p{L}`."""
    import jsonschema

    from parley.constrained.formats import is_regex

    checker = jsonschema.FormatChecker(validator_cls.FORMAT_CHECKER.checkers)
    checker.checks("regex")(is_regex)
    return checker


def _check_regex(pattern: str, path: str) -> None:
    """ECMA-262's syntax, as the validator reads it (`pattern_match`): Python's `re` refused `(?<year>...)` and
    `\\p{L}` and took `(?i)`, which the validator cannot read."""
    try:
        check_pattern(pattern)
    except InvalidRegexError as exc:
        raise InvalidRegexError(f"{exc} (at {path})") from None


def _check_refs(schema: dict[str, Any]) -> None:
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012, specification_with

    dialect = schema.get("$schema")
    specification = specification_with(dialect, default=DRAFT202012) if isinstance(dialect, str) else DRAFT202012
    resource = specification.create_resource(schema)
    raw_base = schema.get("$id", schema.get("id"))
    base = raw_base.split("#", 1)[0] if isinstance(raw_base, str) else ""  # an empty fragment is no part of the URI
    resolver = Registry().with_resource(base, resource).resolver(base_uri=base)
    nested_ids = any("$id" in sub or "id" in sub for path, sub in iter_subschemas(schema) if path != "$")
    for path, sub in iter_subschemas(schema):
        ref = sub.get("$ref")
        if not isinstance(ref, str):
            continue
        if not ref.startswith("#") and "://" in ref:
            raise UnresolvableRefError(f"remote $ref {ref!r} at {path} is not fetched; inline it or use $defs")
        try:
            resolver.lookup(ref)
        except Unresolvable:
            if nested_ids and not ref.startswith("#/"):
                continue  # relative to a nested $id: resolvable only with base tracking; validation checks it
            raise UnresolvableRefError(f"$ref {ref!r} at {path} does not resolve inside the schema") from None
        except Exception as exc:  # malformed pointers and the like
            raise UnresolvableRefError(f"$ref {ref!r} at {path} cannot be resolved: {exc}") from None
