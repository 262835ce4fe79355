"""What a constrained output may look like: JSON Schema, regex, EBNF grammar, choice, tool calls.

Specs are frozen, hashable values. `canonical()` gives the text that keys the compile cache, so two
equal specs share one compiled grammar. Options shared by every spec:

- `max_tokens`: an upper bound on the constrained output's length in tokens. The matcher counts
  accepted tokens and, at the bound, terminates (`Matcher.exhausted` is then true and the output is
  reported invalid by validation). This bounds every request even when the grammar admits
  unbounded strings.

JSON-producing specs (`JsonSchema`, `ToolCalls`) also take:

- `whitespace`: "compact" (default) allows no whitespace between JSON tokens, which is what makes
  the well-known "whitespace until max_tokens" runaway impossible; "flexible" allows at most
  `max_whitespace` whitespace characters at each position.
- `strict`: when true (default), objects whose schema does not mention `additionalProperties` get
  no extra keys (what OpenAI's strict mode, xgrammar and llama.cpp do). When false the grammar
  follows the JSON Schema specification and admits any extra key. An explicit
  `additionalProperties` in the schema always wins.
- `any_order`: allow properties in any order (default: the schema's order, which is faster).
- `string_lengths`: "grammar" (default) keeps `minLength`/`maxLength` in the mask, so strings
  stay bounded while generating; "validate" leaves them to validation after generation, so every
  valid string is reachable (MaskBench-style acceptance) but generation is unbounded. xgrammar,
  asked for by name, cannot write an escape sequence in a length-bounded string (the matcher's
  warnings say so); `auto` never pays that price: where it falls back to xgrammar, lengths are
  validated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from parley.protocol import chat_template as chat_markers
from parley.protocol.tool_spec import ToolSpec

if TYPE_CHECKING:
    from pydantic import BaseModel

Whitespace = Literal["compact", "flexible"]
StringLengths = Literal["grammar", "validate"]
ToolCallFormat = Literal["hermes", "json"]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False)


@dataclass(frozen=True)
class JsonSchema:
    """Output is one JSON value valid against a JSON Schema (a dict, a JSON string or a pydantic model class)."""

    schema: Any
    whitespace: Whitespace = "compact"
    max_whitespace: int = 4
    strict: bool = True
    any_order: bool = False
    string_lengths: StringLengths = "grammar"
    max_tokens: int | None = None
    kind: Literal["json_schema"] = field(default="json_schema", init=False)

    def __post_init__(self) -> None:
        if isinstance(self.schema, str):
            try:
                object.__setattr__(self, "schema", json.loads(self.schema))
            except json.JSONDecodeError as exc:
                from parley.constrained.errors import InvalidSchemaError

                raise InvalidSchemaError(f"schema string is not JSON: {exc}") from exc

    @property
    def model(self) -> type[BaseModel] | None:
        """The pydantic model class when the spec was built from one (used by `validate`)."""
        return self.schema if isinstance(self.schema, type) else None

    def schema_dict(self) -> Any:
        """The JSON Schema as a dict (a pydantic model's `model_json_schema()`)."""
        model = self.model
        if model is not None:
            return model.model_json_schema()
        return self.schema

    def canonical(self) -> str:
        options: list[Any] = [self.whitespace, self.max_whitespace, self.strict, self.any_order]
        options += [self.string_lengths, self.max_tokens]
        return f"json_schema:{_compact(options)}:{_compact(self.schema_dict())}"


@dataclass(frozen=True)
class Regex:
    """Output matches `pattern` in full (Python/ECMAScript-style syntax without lookarounds or backreferences)."""

    pattern: str
    max_tokens: int | None = None
    kind: Literal["regex"] = field(default="regex", init=False)

    def canonical(self) -> str:
        return f"regex:{self.max_tokens}:{self.pattern}"


@dataclass(frozen=True)
class Grammar:
    """Output is a sentence of an EBNF grammar in xgrammar's dialect (GBNF-like, W3C-EBNF based).

    The dialect, in short::

        root ::= greeting " " name          # rules: `name ::= expression`; `root` is the start
        greeting ::= "hello" | "hi"          # alternatives with |, string literals with "..." (JSON escapes)
        name ::= [A-Z] [a-z]*                # character classes [...] / [^...], \\u escapes allowed
        list ::= item ("," item)*            # grouping ( ), repetition * + ?, bounded {m,n}
        item ::= "x"{1,3} | (list)           # recursion is allowed
        # comments start with #

    `root` names the start rule (default "root"). Only the xgrammar backend compiles grammars.
    """

    ebnf: str
    root: str = "root"
    max_tokens: int | None = None
    kind: Literal["grammar"] = field(default="grammar", init=False)

    def canonical(self) -> str:
        return f"grammar:{self.root}:{self.max_tokens}:{self.ebnf}"


@dataclass(frozen=True)
class Choice:
    """Output is exactly one of `options` (strings, matched literally)."""

    options: tuple[str, ...]
    max_tokens: int | None = None
    kind: Literal["choice"] = field(default="choice", init=False)

    def __init__(self, options: Sequence[str], max_tokens: int | None = None) -> None:
        opts = tuple(options)
        if not opts or not all(isinstance(o, str) for o in opts):
            from parley.constrained.errors import InvalidSpecError

            raise InvalidSpecError("Choice needs a non-empty sequence of strings")
        object.__setattr__(self, "options", opts)
        object.__setattr__(self, "max_tokens", max_tokens)
        object.__setattr__(self, "kind", "choice")

    def canonical(self) -> str:
        return f"choice:{self.max_tokens}:{_compact(list(self.options))}"


HERMES_OPEN = chat_markers.TOOL_CALL_OPEN
HERMES_CLOSE = chat_markers.TOOL_CALL_CLOSE


@dataclass(frozen=True)
class ToolCalls:
    """Output is one tool call (or, with `allow_multiple`, up to `max_calls`) to one of `tools`.

    A call is the JSON object `{"name": <tool name>, "arguments": <object valid for that tool>}`.
    `format="hermes"` wraps each call as `<tool_call>{...}</tool_call>` (the ChatML / Hermes
    convention `parley.protocol`'s chat template renders); several calls are separated by a newline.
    `format="json"` emits the bare object (several calls: a JSON array of them).

    `answer_schema`: the model may instead answer directly with a JSON value valid for this schema
    (an agent with tools on "auto" *and* a structured output type: each turn is either a call or
    the final answer, and both are grammar-constrained).
    """

    tools: tuple[ToolSpec, ...]
    allow_multiple: bool = False
    max_calls: int = 4
    format: ToolCallFormat = "hermes"
    whitespace: Whitespace = "compact"
    max_whitespace: int = 4
    strict: bool = True
    string_lengths: StringLengths = "grammar"
    max_tokens: int | None = None
    answer_schema: dict[str, Any] | None = None
    kind: Literal["tool_calls"] = field(default="tool_calls", init=False)

    def __init__(
        self,
        tools: Sequence[ToolSpec],
        allow_multiple: bool = False,
        format: ToolCallFormat = "hermes",  # noqa: A002 - the natural name
        *,
        max_calls: int = 4,
        whitespace: Whitespace = "compact",
        max_whitespace: int = 4,
        strict: bool = True,
        max_tokens: int | None = None,
        answer_schema: dict[str, Any] | None = None,
    ) -> None:
        from parley.constrained.errors import InvalidSpecError

        specs = tuple(tools)
        if not specs:
            raise InvalidSpecError("ToolCalls needs at least one tool")
        names = [t.name for t in specs]
        if len(set(names)) != len(names):
            raise InvalidSpecError(f"ToolCalls has duplicate tool names: {names}")
        if format not in ("hermes", "json"):
            raise InvalidSpecError(f"unknown tool-call format {format!r} (expected 'hermes' or 'json')")
        if max_calls < 1:
            raise InvalidSpecError("max_calls must be >= 1")
        for key, value in (
            ("tools", specs),
            ("allow_multiple", allow_multiple),
            ("max_calls", max_calls if allow_multiple else 1),
            ("format", format),
            ("whitespace", whitespace),
            ("max_whitespace", max_whitespace),
            ("strict", strict),
            ("string_lengths", "grammar"),
            ("max_tokens", max_tokens),
            ("answer_schema", answer_schema),
            ("kind", "tool_calls"),
        ):
            object.__setattr__(self, key, value)

    def call_schema(self) -> dict[str, Any]:
        """JSON Schema of one call: an `anyOf` over the tools, each pinning `name` with `const`.

        Each tool's parameters sit at `properties.arguments` (under `anyOf[i]` for several tools);
        their local `$ref`s are rebased there, so the call schema is one self-contained document.
        """
        from parley.constrained.schema.refs import rebase_refs

        single = len(self.tools) == 1
        variants = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool.name},
                    "arguments": rebase_refs(tool.parameters, self.arguments_pointer(i if not single else None)),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for i, tool in enumerate(self.tools)
        ]
        return variants[0] if single else {"anyOf": variants}

    @staticmethod
    def arguments_pointer(index: int | None) -> list[str]:
        """Where tool `index`'s parameters sit in `call_schema()` (None: the only tool)."""
        head = [] if index is None else ["anyOf", str(index)]
        return [*head, "properties", "arguments"]

    def output_schema(self) -> dict[str, Any]:
        """JSON Schema of the whole output for `format="json"` (one call, or an array of calls)."""
        from parley.constrained.schema.refs import rebase_refs

        call = self.call_schema()
        if not self.allow_multiple:
            return call
        return {"type": "array", "items": rebase_refs(call, ["items"]), "minItems": 1, "maxItems": self.max_calls}

    def schema_for(self, name: str) -> dict[str, Any] | None:
        for tool in self.tools:
            if tool.name == name:
                return tool.parameters
        return None

    def canonical(self) -> str:
        options: list[Any] = [self.allow_multiple, self.max_calls, self.format, self.whitespace, self.max_whitespace]
        options += [self.strict, self.max_tokens]
        answer = "" if self.answer_schema is None else ":answer:" + _compact(self.answer_schema)
        return f"tool_calls:{_compact(options)}:{_compact(self.call_schema())}{answer}"


Spec = JsonSchema | Regex | Grammar | Choice | ToolCalls
