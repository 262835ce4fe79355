"""How a self-hosted server's tool parser expects calls to be written, as one constraint with the answer.

A vLLM server parses tool calls out of the generated text with the parser it was started with
(``--tool-call-parser``). An agent turn that may call a tool *or* give its typed answer needs both
shapes admitted by one constraint: an answer schema alone (``structured_outputs.json``) makes every
call impossible, and tools alone leave the answer unconstrained. xgrammar's structural tags, which
vLLM takes as ``structured_outputs.structural_tag``, can say "this JSON object, or one or more calls
in the parser's markup" exactly, so the server's own parser still finds the calls.

Only markups whose shape is known here are offered; for any other parser the backend keeps the safe
rule (the schema only on a turn with tools off). The shapes are vLLM's (``tool_parsers/``, 0.32):
``hermes`` writes ``<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>`` and its parser
also reads the call without the newlines.
"""

from __future__ import annotations

from typing import Any

from parley.protocol.tool_spec import ToolSpec

TOOL_CALL_PARSERS = ("hermes",)
"""Values of ``--tool-call-parser`` whose call markup `call_or_answer_tag` can write."""

_HERMES_LAYOUTS = (("<tool_call>\n", "\n</tool_call>"), ("<tool_call>", "</tool_call>"))


def call_or_answer_tag(parser: str, tools: list[ToolSpec], answer_schema: dict[str, Any]) -> dict[str, Any]:
    """An xgrammar structural tag admitting either the answer (one JSON value of `answer_schema`) or
    one or more calls of `tools`, each with arguments valid for its schema, in `parser`'s markup."""
    if parser not in TOOL_CALL_PARSERS:
        raise ValueError(f"no known call markup for tool parser {parser!r} (known: {', '.join(TOOL_CALL_PARSERS)})")
    calls = [
        {
            "type": "tag",
            "begin": f'{opening}{{"name": "{tool.name}", "arguments": ',
            "content": {"type": "json_schema", "json_schema": _arguments_schema(tool)},
            "end": f"}}{closing}",
        }
        for tool in tools
        for opening, closing in _HERMES_LAYOUTS
    ]
    return {
        "type": "structural_tag",
        "format": {
            "type": "or",
            "elements": [
                {"type": "json_schema", "json_schema": dict(answer_schema)},
                {"type": "tags_with_separator", "tags": calls, "separator": "\n", "at_least_one": True},
            ],
        },
    }


def _arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    schema = dict(tool.parameters)
    schema.setdefault("type", "object")
    return schema
