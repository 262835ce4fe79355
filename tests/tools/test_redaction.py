"""Error text for the model is sanitised: no control characters, credentials, secrets or host paths."""

from __future__ import annotations

import pytest

from parley.tools.redaction import safe_error_text, safe_text


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\x1b[2Jcleared\x07", "cleared"),
        ("GET https://user:pa55@db.internal/x failed", "GET https://<redacted>@db.internal/x failed"),
        ("Authorization: Bearer abc.def.ghi", "Authorization: Bearer <redacted>"),
        ("api_key=sk_live_123 rejected", "api_key=<redacted> rejected"),
        ("used sk-proj-abcdefghijklmnopqrstu", "used <redacted>"),
        ("open /home/alice/.aws/credentials", "open <path>/credentials"),
        ("missing token in request", "missing token in request"),  # prose is not redacted
        ("see https://example.com/a/b/c", "see https://example.com/a/b/c"),  # URLs keep their paths
        ("relative sub/dir/file.txt", "relative sub/dir/file.txt"),
    ],
)
def test_safe_text(text: str, expected: str) -> None:
    assert safe_text(text) == expected


def test_long_text_is_capped() -> None:
    assert len(safe_text("x" * 10_000, max_chars=100)) == 100


def test_safe_error_text_names_the_type_and_survives_a_hostile_str() -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert safe_error_text(ValueError("bad")) == "ValueError: bad"
    assert safe_error_text(Weird()) == "Weird"
    assert safe_error_text(KeyError()) == "KeyError"
