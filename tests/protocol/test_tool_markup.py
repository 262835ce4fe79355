"""One structural tag for "a tool call or the typed answer", in the markup a vLLM tool parser reads.

Checked with xgrammar itself (the grammar engine vLLM compiles the tag with): the tag admits the answer
object and calls in both hermes layouts, and refuses free text, an answer of the wrong shape, a call of
an unknown tool and a call whose arguments break the tool's schema.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from parley.protocol import ToolSpec
from parley.protocol.tool_markup import TOOL_CALL_PARSERS, call_or_answer_tag

xgr = pytest.importorskip("xgrammar")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

WEATHER = ToolSpec(name="get_weather", description="Weather for a city.",
                   parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                               "additionalProperties": False})
CLOCK = ToolSpec(name="get_time")  # no parameters: an empty object
ANSWER = {"type": "object", "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
          "required": ["city", "celsius"], "additionalProperties": False}


@pytest.fixture(scope="module")
def grammar() -> Any:
    return xgr.Grammar.from_structural_tag(json.dumps(call_or_answer_tag("hermes", [WEATHER, CLOCK], ANSWER)))


@pytest.mark.parametrize("text", [
    '{"city": "Paris", "celsius": 21}',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
])
def test_the_answer_and_calls_in_the_parsers_markup_are_admitted(grammar: Any, text: str) -> None:
    assert accepts(grammar, text)


@pytest.mark.parametrize("text", [
    "It is sunny in Paris.",
    '{"city": "Paris"}',  # the answer without its required field
    '<tool_call>\n{"name": "get_news", "arguments": {}}\n</tool_call>',  # no such tool
    '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>',  # breaks its schema
    '{"city": "Paris", "celsius": 21}<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
])
def test_anything_else_is_refused(grammar: Any, text: str) -> None:
    assert not accepts(grammar, text)


def test_only_known_markups_are_written() -> None:
    assert TOOL_CALL_PARSERS == ("hermes",)
    with pytest.raises(ValueError, match="pythonic"):
        call_or_answer_tag("pythonic", [WEATHER], ANSWER)
