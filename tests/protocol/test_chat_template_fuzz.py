"""Fuzzing the chat-template stream parser at text level: it never raises, and chunking never matters."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from parley.protocol import ErrorEvent, MessageEnd, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd
from parley.protocol.chat_template import StreamParser

PIECES = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "assistant\n", "user\n", "tool\n", "wizard\n", "<", "|", ">", "\n", " ", "{", "}", '"', ":", ",",
    '{"name": "f", "arguments": {"a": 1}}', '{"name": "g", "arguments": ', '"x"', "[1, 2]", "hello", "é☃",
    "<tool_", "call>", "</thi", "nk>", "<|im_", "end|>",
]

texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=25).map("".join)


def _run(text: str, cuts: list[int]) -> tuple[StreamParser, list[object]]:
    parser = StreamParser()
    events: list[object] = []
    last = 0
    for cut in sorted({min(c, len(text)) for c in cuts}) + [len(text)]:
        events += parser.feed_text(text[last:cut])
        last = cut
    events += parser.finish()
    return parser, events


@settings(max_examples=400, deadline=None)
@given(texts, st.lists(st.integers(min_value=0, max_value=200), max_size=12))
@example(  # a 66-character header whose newline came in the next chunk was read as a role, whole as bad
    text='<think><think><think><|im_start|><think><think><think>{"name": "f", "arguments": {"a": 1}}assistant\n',
    cuts=[98],
)
def test_never_raises_and_chunking_does_not_change_the_result(text: str, cuts: list[int]) -> None:
    whole, whole_events = _run(text, [])
    chunked, chunked_events = _run(text, cuts)
    assert chunked.messages == whole.messages
    codes = [e.code for e in chunked_events if isinstance(e, ErrorEvent)]
    assert codes == [e.code for e in whole_events if isinstance(e, ErrorEvent)]
    ends = [e.message for e in chunked_events if isinstance(e, MessageEnd)]
    assert ends == chunked.messages


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_deltas_add_up_to_the_messages(text: str, cuts: list[int]) -> None:
    parser, events = _run(text, cuts)
    streamed_text = "".join(e.text for e in events if isinstance(e, TextDelta))
    streamed_reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert streamed_reasoning == "".join(m.reasoning for m in parser.messages)
    # The raw text of a malformed tool call is streamed too (and reported by an error event).
    assert streamed_text == "".join(m.text for m in parser.messages)
    for end in (e for e in events if isinstance(e, ToolCallEnd)):
        deltas = "".join(e.arguments_delta for e in events if isinstance(e, ToolCallDelta) and e.index == end.index)
        assert deltas == end.call.arguments
