"""The `on_repeat` tool option and the call key the repeat rule uses."""

from __future__ import annotations

import pytest

from parley.tools import Tool, ToolDefinitionError, call_key, canonical_arguments, python_tool, tool


def send(to: str) -> str:
    return to


def test_defaults_follow_idempotence() -> None:
    assert Tool(send).on_repeat == "reuse"  # a side effect happens once per run
    assert Tool(send, idempotent=True).on_repeat == "allow"  # harmless to rerun; the answer may change
    assert python_tool().on_repeat == "allow"  # idempotent (retried once on sandbox launch errors)


@pytest.mark.parametrize("mode", ["reuse", "allow", "error"])
def test_explicit_modes_win_over_the_default(mode: str) -> None:
    assert tool(on_repeat=mode)(send).on_repeat == mode  # type: ignore[call-overload]
    assert tool(on_repeat=mode, idempotent=True)(send).on_repeat == mode  # type: ignore[call-overload]


@pytest.mark.parametrize("bad", ["once", "", 1, True, "REUSE"])
def test_unknown_modes_are_a_definition_error(bad: object) -> None:
    with pytest.raises(ToolDefinitionError, match="on_repeat"):
        Tool(send, on_repeat=bad)  # type: ignore[arg-type]


def test_canonical_arguments() -> None:
    assert canonical_arguments('{ "b": [1, {"d": 1, "c": 2}], "a": "é" }') == '{"a":"é","b":[1,{"c":2,"d":1}]}'
    assert canonical_arguments("{broken") == "{broken"
    assert call_key("send", '{"to": "a"}') == call_key("send", '{"to":"a"}') != call_key("send", '{"to":"b"}')
