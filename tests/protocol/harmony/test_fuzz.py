"""The Harmony stream parser survives arbitrary input: 10,000 random token/text streams, no exception.

Streams mix real special-token ids, byte ids (the byte-level encoding: every id 0..255 decodes, so
invalid UTF-8 is frequent), ids outside any vocabulary, and text chunks from a list of Harmony
fragments (whole and split special-token strings, roles, headers, JSON, non-ASCII, a lone surrogate).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parley.protocol import harmony
from parley.protocol.errors import ProtocolError
from parley.protocol.events import ErrorEvent, MessageEnd

BYTES = harmony.byte_level_encoding()
SPECIAL_IDS = [200002, 200003, 200005, 200006, 200007, 200008, 200012, 199999, 200100]
FRAGMENTS = [
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>",
    "<|", "|>", "<|sta", "rt|>", "<|reserved_2000", "14|>", "assistant", "user", "tool", "system",
    "to=functions.f", " to=", "functions.get_weather", "analysis", "commentary", "final", " json", " ",
    "{\"a\": 1}", "{bad", "\n", "héllo", "😊", "\ud800", "moderator",
]  # fmt: skip

OUT_OF_VOCABULARY = [-1, 256, 1_000_000, 99_999_999]
ALPHABET: list[int | str] = [*SPECIAL_IDS, *FRAGMENTS, *range(256), *OUT_OF_VOCABULARY]
# Drawing indices into one alphabet keeps generation cheap enough for 10,000 examples in a few seconds.
streams = st.lists(st.integers(0, len(ALPHABET) - 1), max_size=24).map(lambda picks: [ALPHABET[i] for i in picks])


STREAMS_PER_EXAMPLE = 10
runs = st.tuples(streams, st.sampled_from([None, "assistant"]), st.booleans())


def feed_one(stream: list[int | str], role: str | None, strict: bool) -> None:
    parser = harmony.StreamParser(role, strict=strict, encoding=BYTES)
    events = []
    for item in stream:
        events += parser.feed(item)
        parser.current_content  # noqa: B018 - the views must never raise either
    events += parser.finish()
    ends = [e for e in events if isinstance(e, MessageEnd)]
    assert len(ends) == len(parser.messages)  # every parsed message was delivered, errors or not
    assert all(e.code for e in events if isinstance(e, ErrorEvent))


@settings(
    max_examples=1_000,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(batch=st.lists(runs, min_size=STREAMS_PER_EXAMPLE, max_size=STREAMS_PER_EXAMPLE))
def test_stream_parser_never_raises(batch: list[tuple[list[int | str], str | None, bool]]) -> None:
    """1,000 examples x 10 streams = 10,000 streams (batched: hypothesis' per-example cost dominates)."""
    for stream, role, strict in batch:
        feed_one(stream, role, strict)


@settings(max_examples=500, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(stream=streams, role=st.sampled_from([None, "assistant"]))
def test_strict_parsing_fails_only_with_typed_errors(stream: list[int | str], role: str | None) -> None:
    ids: list[int] = []
    for item in stream:
        ids += BYTES.encode(item, allowed_special="all") if isinstance(item, str) else [item]
    try:
        harmony.parse_completion(ids, role=role, encoding=BYTES)
    except ProtocolError:
        pass
    assert isinstance(harmony.parse_completion(ids, role=role, strict=False, encoding=BYTES), list)
