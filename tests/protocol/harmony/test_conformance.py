"""Every case of the Harmony conformance set (`shared/conformance/harmony/cases.json`, 66 cases).

Each case runs twice:
- text level: rendering compared as text; parsing fed as text (special-token strings recognised), and
  the few literal ordinary ids the cases use are decoded with the byte table the data's README
  publishes. Two `encode` cases need the real BPE and are token-level only.
- token level: with `o200k_harmony` built from the local `o200k_base.tiktoken` (see
  `scripts/build_o200k.py`); skipped, naming the file, only when that file is absent.

Strings are compared exactly (no Unicode normalisation); expected files lose trailing whitespace.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from parley.protocol import harmony
from parley.protocol.errors import ProtocolError
from parley.protocol.events import ErrorEvent
from parley.protocol.harmony._tokens import HarmonyEncoding
from parley.protocol.tool_spec import ToolSpec
from tests.conftest import SHARED

DATA = SHARED / "conformance" / "harmony"
CASES: list[dict[str, Any]] = json.loads((DATA / "cases.json").read_text(encoding="utf-8"))["cases"]
TOKEN_ONLY = {"test_encode_allowed_special[plain]", "test_encode_allowed_special[as_ordinary_text]"}

# The README's table of literal ordinary ids ("Ordinary token ids that appear literally, with their bytes").
README_BYTES = {
    9552: b" \xf0\x9f",
    132990: b"Chicken",
    24912: b"hello",
    2375: b" world",
    27: b"<",
    91: b"|",
    5236: b"start",
    29: b">",
}


class _ReadmeTable:
    """Decode-only ordinary tokens: the ids the README lists, plus the text the cases spell out."""

    name = "readme-table"

    def encode_ordinary(self, text: str) -> list[int]:
        raise NotImplementedError("the README table has no BPE; text-level runs feed text instead")

    def token_bytes(self, token_id: int) -> bytes | None:
        return README_BYTES.get(token_id)


def expected_text(name: str) -> str:
    return (DATA / "expected" / name).read_text(encoding="utf-8").rstrip()


# -- building inputs -----------------------------------------------------------------------------------


def _tool(tool: dict[str, Any]) -> ToolSpec:
    if tool["parameters"] is None:  # no parameters at all: an empty schema (not an object without properties)
        return ToolSpec(name=tool["name"], description=tool["description"], parameters={})
    return ToolSpec(name=tool["name"], description=tool["description"], parameters=tool["parameters"])


def _namespaces(raw: list[dict[str, Any]] | None) -> tuple[harmony.ToolNamespace, ...]:
    return tuple(
        harmony.ToolNamespace(ns["name"], ns["description"], tuple(_tool(t) for t in ns["tools"])) for ns in raw or []
    )


def _content(part: dict[str, Any]) -> harmony.SystemContent | harmony.DeveloperContent | str:
    if part["type"] == "text":
        return str(part["text"])
    if part["type"] == "developer":
        return harmony.DeveloperContent(instructions=part["instructions"], tools=_namespaces(part["tools"]))
    channels = part["channel_config"]
    return harmony.SystemContent(
        model_identity=part["model_identity"],
        reasoning_effort=part["reasoning_effort"],
        current_date=part["conversation_start_date"],
        knowledge_cutoff=part["knowledge_cutoff"],
        valid_channels=tuple(channels["valid_channels"]) if channels else None,
        channel_required=bool(channels["channel_required"]) if channels else False,
        tools=_namespaces(part["tools"]),
    )


def to_message(raw: dict[str, Any]) -> harmony.HarmonyMessage:
    (part,) = raw["content"]
    return harmony.HarmonyMessage(
        role=raw["role"],
        content=_content(part),
        name=raw["name"],
        recipient=raw["recipient"],
        channel=raw["channel"],
        content_type=raw["content_type"],
    )


def as_raw(message: harmony.HarmonyMessage) -> dict[str, Any]:
    return {
        "role": message.role,
        "name": message.name,
        "recipient": message.recipient,
        "channel": message.channel,
        "content_type": message.content_type,
        "content": [{"type": "text", "text": message.text}],
    }


def segments(case_input: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Input segments as ("text", str) or ("tokens", [ids])."""
    out: list[tuple[str, Any]] = []
    for segment in case_input:
        if "text" in segment:
            out.append(("text", segment["text"]))
        elif "text_file" in segment:
            out.append(("text", expected_text(segment["text_file"])))
        else:
            out.append(("tokens", segment["tokens"]))
    return out


def units(case_input: list[dict[str, Any]], encoding: HarmonyEncoding | None) -> list[int | str]:
    """Feedable units. Text level: text split at special tokens (one unit per special); token level: ids."""
    out: list[int | str] = []
    for kind, value in segments(case_input):
        if kind == "tokens":
            out.extend(value)
        elif encoding is None:
            out.extend(piece for piece, _ in harmony_split(value))
        else:
            out.extend(encoding.encode(value, allowed_special="all"))
    return out


def harmony_split(text: str) -> list[tuple[str, bool]]:
    from parley.protocol.harmony._tokens import split_special

    return split_special(text)


# -- encodings -----------------------------------------------------------------------------------------


@cache
def o200k() -> HarmonyEncoding | None:
    path = harmony.vocabulary_path()
    return harmony.load_harmony_encoding(path) if path else None


def table_encoding() -> HarmonyEncoding:
    return HarmonyEncoding(_ReadmeTable())


def need_o200k() -> HarmonyEncoding:
    encoding = o200k()
    if encoding is None:
        searched = ", ".join(str(p) for p in harmony.vocabulary_candidates())
        pytest.skip(f"vocabulary file o200k_base.tiktoken not found ({searched}); run scripts/build_o200k.py")
    return encoding


# -- running one case ----------------------------------------------------------------------------------


def run_render(case: dict[str, Any], encoding: HarmonyEncoding | None) -> None:
    kind = case["kind"]
    config = case.get("config", {})
    if kind == "render_message":
        options = case["render_options"]
        prompt = harmony.render_message(
            to_message(case["message"]), conversation_has_function_tools=options["conversation_has_function_tools"]
        )
        if case["drop_last_token"]:
            assert prompt.pieces[-1] == ("<|end|>", True)
            prompt = harmony.RenderedPrompt(prompt.pieces[:-1])
    else:
        messages = [to_message(m) for m in case["messages"]]
        drop = config["auto_drop_analysis"]
        if kind == "render_conversation_for_completion":
            prompt = harmony.render_conversation_for_completion(
                messages, next_turn_role=case["next_turn_role"], system=None, auto_drop_analysis=drop
            )
        elif kind == "render_conversation":
            prompt = harmony.render_conversation(messages, system=None, auto_drop_analysis=drop)
        else:
            prompt = harmony.render_conversation_for_training(messages, system=None, auto_drop_analysis=drop)
    expected = expected_text(case["expected_file"]) if "expected_file" in case else case["expected_text"]
    assert prompt.text == expected
    if encoding is not None and "tokens" in case["compare"]:
        assert prompt.token_ids(encoding) == encoding.encode(expected, allowed_special="all")


def run_parse(case: dict[str, Any], encoding: HarmonyEncoding | None) -> None:
    if encoding is None:
        completion: str | list[int] = "".join(value for kind, value in segments(case["input"]))
    else:
        completion = units(case["input"], encoding)  # type: ignore[assignment]
    if case["expect_error"]:
        with pytest.raises(ProtocolError):
            harmony.parse_messages(completion, role=case["role"], strict=case["strict"], encoding=encoding)
        return
    messages = harmony.parse_messages(completion, role=case["role"], strict=case["strict"], encoding=encoding)
    expected = case["expected"]
    assert [as_raw(m) for m in messages] == expected["messages"]
    if "message_count" in expected:
        assert len(messages) == expected["message_count"]


def run_stream(case: dict[str, Any], encoding: HarmonyEncoding | None) -> None:
    needs_table = case["needs_token_ids"] and encoding is None
    feed_encoding = table_encoding() if needs_table else encoding
    parser = harmony.StreamParser(case["role"], strict=case["strict"], encoding=feed_encoding)
    deltas: list[str] = []
    events = []
    for unit in units(case["input"], encoding):
        events += parser.feed(unit)
        if parser.last_content_delta is not None:
            deltas.append(parser.last_content_delta)
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    if case["expect_error"]:
        assert errors, "the stream parser must report the malformed input as an ErrorEvent"
        # ...and strict non-streaming parsing raises a typed error on the same input.
        if not case["needs_token_ids"] or encoding is not None:
            completion: Any = (
                units(case["input"], encoding) if encoding else "".join(v for _, v in segments(case["input"]))
            )
            with pytest.raises(ProtocolError):
                harmony.parse_messages(completion, role=case["role"], strict=True, encoding=encoding)
        return
    assert not errors, errors
    expected = case["expected"]
    if "messages" in expected:
        assert [as_raw(m) for m in parser.messages] == expected["messages"]
    if "message_count" in expected:
        assert len(parser.messages) == expected["message_count"]
    if "current_content" in expected:
        assert parser.current_content == expected["current_content"]
    if "content_deltas_joined" in expected:
        assert "".join(deltas) == expected["content_deltas_joined"]
    then = case.get("then")
    if then:
        for unit in units(then["input"], encoding):
            parser.feed(unit)
        assert parser.last_content_delta == then["expected"]["last_content_delta"]
        assert parser.current_content == then["expected"]["current_content"]


def decode_input(case: dict[str, Any], encoding: HarmonyEncoding | None, *, strict: bool) -> str:
    if encoding is not None:
        ids = units(case["input"], encoding)
        return encoding.decode_utf8(ids) if strict else encoding.decode(ids)  # type: ignore[arg-type]
    table = table_encoding()
    data = b""
    for kind, value in segments(case["input"]):
        data += table.decode_bytes(value) if kind == "tokens" else value.encode("utf-8")
    if strict:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            from parley.protocol.errors import DecodeError

            raise DecodeError(str(exc)) from None
    return data.decode("utf-8", errors="replace")


def run_tokenizer(case: dict[str, Any], encoding: HarmonyEncoding | None) -> None:
    kind = case["kind"]
    if kind == "is_special_token":
        active = encoding or table_encoding()
        assert active.is_special_token(case["token"]) is case["expected"]["is_special"]
        return
    if kind == "encode":
        active = encoding or harmony.byte_level_encoding()  # special-token handling is the same
        call = lambda: active.encode(  # noqa: E731
            case["text"], allowed_special=case["allowed_special"], disallowed_special=case["disallowed_special"]
        )
        if case["expect_error"]:
            with pytest.raises(ProtocolError):
                call()
            return
        tokens = call()
        if encoding is not None or all(t >= 199998 for t in case["expected"]["tokens"]):
            assert tokens == case["expected"]["tokens"]
        return
    strict = kind == "decode_utf8"
    if case["expect_error"]:
        with pytest.raises(ProtocolError):
            decode_input(case, encoding, strict=strict)
        return
    text = decode_input(case, encoding, strict=strict)
    assert text == case["expected"]["text"]
    if "text_contains" in case["expected"]:
        assert case["expected"]["text_contains"] in text


def run_case(case: dict[str, Any], encoding: HarmonyEncoding | None) -> None:
    kind = case["kind"]
    if kind.startswith("render"):
        run_render(case, encoding)
    elif kind == "parse_completion_tokens":
        run_parse(case, encoding)
    elif kind == "streamable_parser":
        run_stream(case, encoding)
    else:
        run_tokenizer(case, encoding)


def test_the_data_has_66_cases() -> None:
    assert len(CASES) == 66
    assert len({c["id"] for c in CASES}) == 66


@pytest.mark.parametrize("case", [c for c in CASES if c["id"] not in TOKEN_ONLY], ids=lambda c: c["id"])
def test_text_level(case: dict[str, Any]) -> None:
    run_case(case, None)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_token_level(case: dict[str, Any]) -> None:
    run_case(case, need_o200k())
