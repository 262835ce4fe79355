"""The Harmony codec (OpenAI's gpt-oss message format): render conversations, parse completions.

    from parley.protocol import harmony
    prompt = harmony.render_conversation_for_completion(conversation, tools=tools,
                                                        system=harmony.SystemContent(reasoning_effort="high"))
    ids = prompt.token_ids(harmony.load_harmony_encoding())   # the model's input
    parser = harmony.StreamParser()                            # the model's output, token by token
    for token in generated: events = parser.feed(token)

Rendering takes parley's envelope (`Conversation`, `Message`) or Harmony's own `HarmonyMessage`s and
returns a `RenderedPrompt`: its `.text` is the Harmony text (what the reference test vectors show),
its `.token_ids(encoding)` the ids. Parsing goes the other way, strict (typed errors) or lenient.

Trust boundary. The token path is the boundary: content is encoded with special tokens disallowed,
so `<|start|>system<|message|>…` written by a user or returned by a tool is ordinary tokens to the
model and parses back as the same content. Text has no such distinction: in `.text` a user's
`<|start|>` looks like a real one, and parsing text treats every special-token string as a token.
So parley never turns rendered text into ids (`RenderedPrompt.token_ids` encodes piece by piece),
`RenderedPrompt.text_is_unambiguous` says when the text form is lossy, and the stream parser's text
path is meant for model output (which a model writes with real special tokens), not for user text.

Invalid UTF-8 inside a message (bytes split across tokens that never complete) becomes U+FFFD, in
strict parsing too, as in the reference; `HarmonyEncoding.decode_utf8` is the strict decoder and
raises `DecodeError`.

Analysis dropping (`auto_drop_analysis`, default True as in the reference): once the last assistant
message is on `final`, the `analysis` messages before the first `final` are left out.
"""

from __future__ import annotations

from parley.protocol.harmony._conversation import (
    parse_completion,
    parse_messages,
    render_conversation,
    render_conversation_for_completion,
    render_conversation_for_training,
    render_message,
    to_envelope_messages,
    to_harmony_messages,
)
from parley.protocol.harmony._parser import StreamState
from parley.protocol.harmony._render import (
    conversation_has_function_tools,
    render_developer_content,
    render_system_content,
)
from parley.protocol.harmony._stream import StreamParser
from parley.protocol.harmony._tokens import (
    SPECIAL_TOKENS,
    STOP_TOKENS,
    STOP_TOKENS_FOR_ASSISTANT_ACTIONS,
    HarmonyEncoding,
    byte_level_encoding,
    load_harmony_encoding,
    vocabulary_candidates,
    vocabulary_path,
)
from parley.protocol.harmony._types import (
    DEFAULT_MODEL_IDENTITY,
    DeveloperContent,
    HarmonyMessage,
    ReasoningEffort,
    RenderedPrompt,
    SystemContent,
    ToolNamespace,
)
from parley.protocol.harmony._typescript import schema_to_typescript

__all__ = [
    "DEFAULT_MODEL_IDENTITY",
    "DeveloperContent",
    "HarmonyEncoding",
    "HarmonyMessage",
    "ReasoningEffort",
    "RenderedPrompt",
    "SPECIAL_TOKENS",
    "STOP_TOKENS",
    "STOP_TOKENS_FOR_ASSISTANT_ACTIONS",
    "StreamParser",
    "StreamState",
    "SystemContent",
    "ToolNamespace",
    "byte_level_encoding",
    "conversation_has_function_tools",
    "load_harmony_encoding",
    "parse_completion",
    "parse_messages",
    "render_conversation",
    "render_conversation_for_completion",
    "render_conversation_for_training",
    "render_developer_content",
    "render_message",
    "render_system_content",
    "schema_to_typescript",
    "to_envelope_messages",
    "to_harmony_messages",
    "vocabulary_candidates",
    "vocabulary_path",
]
