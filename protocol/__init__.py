"""`parley.protocol`: envelopes, streaming events and codecs. Imports nothing else of parley."""

from parley.protocol.chat_template import ChatTemplateCodec
from parley.protocol.envelope import (
    CacheMark,
    Channel,
    Conversation,
    Message,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
)
from parley.protocol.errors import (
    DecodeError,
    InvalidArgumentsError,
    OrphanToolResultError,
    ParseError,
    ProtocolError,
    UnknownRoleError,
)
from parley.protocol.events import (
    ErrorEvent,
    Event,
    MessageEnd,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    UsageEvent,
)
from parley.protocol.tool_spec import ToolSpec
from parley.protocol.usage import Usage

__all__ = [
    "CacheMark",
    "Channel",
    "ChatTemplateCodec",
    "Conversation",
    "DecodeError",
    "ErrorEvent",
    "Event",
    "InvalidArgumentsError",
    "Message",
    "MessageEnd",
    "OrphanToolResultError",
    "ParseError",
    "Part",
    "ProtocolError",
    "ReasoningDelta",
    "ReasoningPart",
    "Role",
    "TextDelta",
    "TextPart",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolResult",
    "ToolSpec",
    "UnknownRoleError",
    "Usage",
    "UsageEvent",
]
