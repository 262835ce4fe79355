"""The host's reading of the result channel: strict JSON only, capped, bound to the run (rows F2–F8, G8–G11)."""

from __future__ import annotations

import json
import pickle

import pytest

from parley.sandbox import ResultChannelError, sanitize_text
from parley.sandbox.result import classify_limit, decode_files, parse_channel

NONCE = "n0nce"


def channel(value: object) -> bytes:
    return json.dumps({"nonce": NONCE, "ok": True, "value": value}).encode()


def test_a_well_formed_result_is_parsed() -> None:
    assert parse_channel(channel({"a": [1, 2.5, None]}), cap=1000, nonce=NONCE)["value"] == {"a": [1, 2.5, None]}


@pytest.mark.parametrize("raw, reason", [
    (pickle.dumps({"nonce": NONCE}), "UTF-8|JSON"),                      # F1: pickle is never read
    (b"x" * 2000, "cap"),                                                 # F2: byte cap before parsing
    (b'{"nonce": "n0nce", "value": [1, 2', "JSON"),                       # F3: truncated
    (b'{"nonce": "n0nce", "value": "\xff"}', "UTF-8"),                     # F3: invalid UTF-8
    (b"[" * 400 + b"]" * 400, "deep|nesting"),                            # F4 / G11
    (b'{"nonce": "n0nce", "value": NaN}', "non-finite"),                  # F5
    (b'{"nonce": "n0nce", "value": -Infinity}', "non-finite"),            # F5
    (b'{"nonce": "n0nce", "value": 1e999}', "infinity"),                  # F5
    (b'{"nonce": "n0nce", "value": ' + b"9" * 5000 + b"}", "JSON"),       # F6: int digit limit
    (b'{"nonce": "other", "value": 1}', "nonce"),                         # F7: not this run's result
    (b'{"nonce": "n0nce", "nonce": "n0nce"}', "duplicate"),               # G9: duplicate keys
    (b"{'nonce': 'n0nce'}", "JSON"),                                      # G8: single quotes
    (b'{"nonce": "n0nce"} trailing', "JSON"),                             # G8: trailing garbage
    (b'"bare string"', "object"),                                         # G8: not an object
    (b"", "no result"),
])
def test_hostile_channels_are_rejected_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(ResultChannelError, match=reason):
        parse_channel(raw, cap=10_000 if b"9" * 5000 in raw else 1000, nonce=NONCE)


def test_oversize_is_rejected_before_parsing() -> None:
    with pytest.raises(ResultChannelError, match="cap"):
        parse_channel(b"[" * 100_000, cap=1000, nonce=NONCE)


def test_lone_surrogates_are_replaced() -> None:
    raw = b'{"nonce": "n0nce", "value": "a\\ud800b", "\\udfff": 1}'
    payload = parse_channel(raw, cap=1000, nonce=NONCE)
    assert payload["value"] == "a\ufffdb" and "\ufffd" in payload


def test_channel_errors_have_a_stable_code() -> None:
    with pytest.raises(ResultChannelError) as caught:
        parse_channel(b"nope", cap=100, nonce=NONCE)
    assert caught.value.code == "bad_result" and caught.value.retryable is False


def test_f8_sanitize_escapes_ansi_redacts_credentials_and_truncates() -> None:
    text = sanitize_text("\x1b[2J" + "boom https://user:s3cret@example.invalid/x \x07 token-123 " + "A" * 10_000,
                         redact=("token-123",))
    assert "\x1b" not in text and "\x07" not in text and "s3cret" not in text and "token-123" not in text
    assert "[REDACTED]" in text and len(text) < 4200 and "truncated" in text


def test_artifact_encoding_is_checked_and_capped() -> None:
    files, errors = decode_files({"a": "aGk=", "b": "not base64!", "c": "eHh4eA=="}, cap=3)
    assert files == {"a": b"hi"} and set(errors) == {"b", "c"}


@pytest.mark.parametrize("exit_code, error, limit", [
    (128 + 24, None, "cpu"),
    (128 + 25, None, "file_size"),
    (1, {"type": "MemoryError"}, "memory"),
    (1, {"type": "OSError", "errno": 27}, "file_size"),
    (1, {"type": "OSError", "errno": 24}, "open_files"),
    (1, {"type": "RuntimeError", "message": "can't start new thread"}, "processes"),
    (1, {"type": "ValueError"}, None),
    (0, None, None),
])
def test_the_limit_behind_an_exit_is_named(exit_code: int, error: dict[str, object] | None, limit: str | None) -> None:
    assert classify_limit(exit_code, error, cpu_s=3) == limit
