"""The Harmony stream parser survives arbitrary input: 10,000 random token/text streams, no exception.

Streams mix real special-token ids, byte ids (the byte-level encoding: every id 0..255 decodes, so
invalid UTF-8 is frequent), ids outside any vocabulary, and text chunks built from Harmony's own
vocabulary of fragments (so special-token strings are often split across chunks).
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from parley.protocol import harmony
from parley.protocol.events import ErrorEvent, MessageEnd

BYTES = harmony.byte_level_encoding()
SPECIAL_IDS = [200002, 200003, 200005, 200006, 200007, 200008, 200012, 199999, 200100]
FRAGMENTS = [
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>",
    "<|", "|>", "<|sta", "rt|>", "<|reserved_2000", "14|>", "assistant", "user", "tool", "system",
    "to=functions.f", " to=", "functions.get_weather", "analysis", "commentary", "final", " json", " ",
    "{\"a\": 1}", "{bad", "\n", "héllo", "😊", "\ud800", "moderator",
]  # fmt: skip

token = st.one_of(
    st.sampled_from(SPECIAL_IDS),
    st.integers(min_value=0, max_value=255),
    st.integers(min_value=-5, max_value=300_000),
)
text = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=4).map("".join) | st.text(max_size=6)
streams = st.lists(st.one_of(token, text), max_size=40)


@settings(
    max_examples=10_000,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)
@given(stream=streams, role=st.sampled_from([None, "assistant"]), strict=st.booleans())
def test_stream_parser_never_raises(stream: list[int | str], role: str | None, strict: bool) -> None:
    parser = harmony.StreamParser(role, strict=strict, encoding=BYTES)
    events = []
    for item in stream:
        events += parser.feed(item)
        parser.current_content  # noqa: B018 - the views must never raise either
    events += parser.finish()
    ends = [e for e in events if isinstance(e, MessageEnd)]
    assert len(ends) == len(parser.messages)  # every parsed message was delivered, errors or not
    assert all(e.code for e in events if isinstance(e, ErrorEvent))
