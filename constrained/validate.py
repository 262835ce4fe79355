"""`validate(output, spec)`: check a finished output against its spec, return the parsed value.

Masks make outputs *likely* valid; this makes it certain. It runs after constrained generation when
`Matcher.needs_validation` is set (or always, in debug mode) and on hosted backends, whose outputs
were never masked. JSON Schemas are checked with `jsonschema` as parley reads JSON Schema
(`schema_validator`), pydantic models with pydantic (the model instance is returned). Failures raise
`ValidationFailed` naming the JSON path and the failing keyword.
"""

from __future__ import annotations

import functools
import json
import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

from parley.constrained.errors import InvalidSpecError, ValidationFailed
from parley.constrained.pattern_match import pattern_fullmatch, pattern_search
from parley.constrained.specs import HERMES_CLOSE, HERMES_OPEN, Choice, Grammar, JsonSchema, Regex, Spec, ToolCalls


def _json_path(parts: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _parse_json(output: Any) -> Any:
    if isinstance(output, (bytes, bytearray)):
        output = output.decode("utf-8", errors="strict")
    if not isinstance(output, str):
        return output
    try:
        return json.loads(output)
    except json.JSONDecodeError as exc:
        raise ValidationFailed(
            f"output is not JSON: {exc.msg} at char {exc.pos}", keyword="json", text=output
        ) from None


def _exact(number: int | float) -> Fraction:
    """The number a JSON text spelled (a float's repr is its shortest round-trip spelling)."""
    return Fraction(number) if isinstance(number, int) else Fraction(Decimal(repr(number)))


def _multiple_of(validator: Any, divisor: Any, instance: Any, schema: Any) -> Any:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "number") or not validator.is_type(divisor, "number"):
        return
    if isinstance(instance, float) and not math.isfinite(instance):
        return
    if (_exact(instance) / _exact(divisor)).denominator != 1:
        yield ValidationError(f"{instance!r} is not a multiple of {divisor!r}")


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not pattern_search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, item in instance.items():
            if pattern_search(pattern, key):
                yield from validator.descend(item, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Any:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in named and not any(pattern_search(p, k) for p in patterns)]
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif extra is False and extras:
        yield ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, extras))} unexpected)")


@functools.cache
def _format_checker() -> Any:
    """Draft 2020-12's format checker, with the formats of `parley.constrained.formats` checked by parley
    (`jsonschema` checks them only with optional packages installed, or loosely), so the answer does not
    depend on what is installed."""
    import jsonschema

    from parley.constrained.formats import CHECKS

    checker = jsonschema.FormatChecker(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
    for name, check in CHECKS.items():
        checker.checks(name)(check)
    return checker


def draft_validator_class(schema: Any) -> Any:
    """The `jsonschema` validator class of `schema`'s `$schema` dialect (2020-12 when it names none): what both
    validation and preparation (`schema.prepare`, which drops what that draft does not read) go by."""
    import jsonschema

    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def schema_validator(schema: Any) -> Any:
    """A `jsonschema` validator for `schema` as parley reads JSON Schema: the dialect named by `$schema`
    (Draft 2020-12 by default), with three readings fixed whatever the dialect:

    - `format` is an assertion, checked by Draft 2020-12's checker (`uuid` included) and parley's own checks
      (`parley.constrained.formats`: `date-time`, `duration`, `uri`, `email`, `hostname`... whatever add-ons are
      installed): the backends enforce formats, and JSONSchemaBench checks them so; Draft 4's own checker
      would pass `"tokenize"` as a uuid;
    - `multipleOf` is decided exactly, on the number the text spelled: `jsonschema` divides floats, so it
      rejects 0.3 as a multiple of 0.1 and passes -43536423848412.805;
    - regexes (`pattern`, `patternProperties`, and so `additionalProperties`) are ECMA-262's, where `\\w`
      and `\\d` are ASCII (Python's `re` would match `"Á"` with `^\\w$`) and `$` is the end of the text;
      they run in time linear in the text (`parley.constrained.pattern_match`), so no output can hang this.
    """
    import jsonschema

    cls = draft_validator_class(schema)
    readings = {"multipleOf": _multiple_of, "pattern": _pattern, "patternProperties": _pattern_properties,
                "additionalProperties": _additional_properties}
    parley_cls = jsonschema.validators.extend(cls, readings)
    return parley_cls(schema, format_checker=_format_checker())


def validate_schema_value(value: Any, schema: Any, *, prefix: str = "$") -> None:
    """Raise `ValidationFailed` unless `value` satisfies the JSON Schema `schema` (`schema_validator`)."""
    import jsonschema

    validator = schema_validator(schema)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except jsonschema.exceptions.SchemaError as exc:
        raise InvalidSpecError(f"the schema is invalid: {exc.message}") from None
    except Exception as exc:  # e.g. unresolvable $ref met during validation
        raise InvalidSpecError(f"cannot validate against this schema: {exc}") from None
    if error is not None:
        path = prefix + _json_path(error.absolute_path)[1:]
        raise ValidationFailed(error.message, path=path, keyword=str(error.validator))


def _validate_json(output: Any, spec: JsonSchema) -> Any:
    model = spec.model
    if model is not None:
        from pydantic import ValidationError

        try:
            if isinstance(output, (str, bytes, bytearray)):
                return model.model_validate_json(output)
            return model.model_validate(output)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValidationFailed(first["msg"], path=_json_path(first["loc"]), keyword=first["type"]) from None
    value = _parse_json(output)
    validate_schema_value(value, spec.schema_dict())
    return value


def _validate_grammar(output: str, spec: Grammar) -> str:
    import xgrammar as xgr

    grammar = xgr.Grammar.from_ebnf(spec.ebnf, root_rule_name=spec.root)
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False).compile_grammar(grammar)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    if not (matcher.accept_string(output) and matcher.is_completed()):
        raise ValidationFailed("output is not a sentence of the grammar", keyword="grammar", text=output)
    return output


_HERMES_CALL = re.compile(re.escape(HERMES_OPEN) + r"(.*?)" + re.escape(HERMES_CLOSE), re.DOTALL)


def parse_tool_calls(output: str, spec: ToolCalls) -> list[Any]:
    """The call objects of a tool-call output (no argument validation)."""
    if spec.format == "json":
        value = _parse_json(output)
        return value if isinstance(value, list) and spec.allow_multiple else [value]
    calls: list[Any] = []
    cursor = 0
    for match in _HERMES_CALL.finditer(output):
        if output[cursor : match.start()].strip():
            raise ValidationFailed("text outside <tool_call> tags", path=f"$[{len(calls)}]", keyword="format")
        calls.append(_parse_json(match.group(1)))
        cursor = match.end()
    if output[cursor:].strip() or not calls:
        raise ValidationFailed("output is not <tool_call>{...}</tool_call>", path=f"$[{len(calls)}]", keyword="format")
    return calls


def _is_answer(output: Any, spec: ToolCalls) -> bool:
    """Whether an output of a `ToolCalls` spec with an `answer_schema` is the direct answer, not calls."""
    if spec.answer_schema is None:
        return False
    if spec.format == "hermes":
        return not (isinstance(output, str) and output.lstrip().startswith(HERMES_OPEN))
    value = _parse_json(output)
    call = value[0] if spec.allow_multiple and isinstance(value, list) and value else value
    return not (isinstance(call, dict) and set(call) == {"name", "arguments"})


def _validate_tool_calls(output: Any, spec: ToolCalls) -> Any:
    if _is_answer(output, spec):
        value = _parse_json(output)
        validate_schema_value(value, spec.answer_schema, prefix="answer:$")
        return value
    calls = parse_tool_calls(output, spec) if isinstance(output, str) else list(output)
    if len(calls) > (spec.max_calls if spec.allow_multiple else 1):
        raise ValidationFailed(f"{len(calls)} tool calls, at most {spec.max_calls if spec.allow_multiple else 1}",
                               keyword="maxItems")  # fmt: skip
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
            raise ValidationFailed('a call is {"name": ..., "arguments": {...}}', path=f"$[{i}]", keyword="required")
        schema = spec.schema_for(call["name"]) if isinstance(call["name"], str) else None
        if schema is None:
            names = [t.name for t in spec.tools]
            raise ValidationFailed(f"unknown tool {call['name']!r}; tools: {names}", path=f"$[{i}].name",
                                   keyword="tool_name")  # fmt: skip
        validate_schema_value(call["arguments"], schema, prefix=f"$[{i}].arguments")
    return calls


def validate(output: Any, spec: Spec | dict[str, Any] | type) -> Any:
    """Validate `output` (text, or an already parsed value for JSON specs) and return the parsed value.

    `spec` may also be a bare JSON Schema dict or a pydantic model class. JSON specs return the
    parsed value (a model instance for pydantic), `ToolCalls` the list of call dicts (or, with an
    `answer_schema`, the parsed answer when the output is not a call), text specs the text.
    Raises `ValidationFailed` (path + keyword) on mismatch.
    """
    if isinstance(spec, (dict, type)):
        spec = JsonSchema(spec)
    if isinstance(spec, JsonSchema):
        return _validate_json(output, spec)
    if isinstance(spec, ToolCalls):
        return _validate_tool_calls(output, spec)
    if not isinstance(output, str):
        raise ValidationFailed(f"expected text, got {type(output).__name__}", keyword="type")
    if isinstance(spec, Regex):
        if not pattern_fullmatch(spec.pattern, output, dot_all=True, python=True):
            raise ValidationFailed(f"output does not match {spec.pattern!r}", keyword="regex", text=output)
        return output
    if isinstance(spec, Choice):
        if output not in spec.options:
            raise ValidationFailed(f"output {output!r} is not one of {list(spec.options)}", keyword="choice")
        return output
    if isinstance(spec, Grammar):
        return _validate_grammar(output, spec)
    raise InvalidSpecError(f"not a constrained-decoding spec: {type(spec).__name__}")
