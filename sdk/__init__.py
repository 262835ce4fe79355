"""parley: agents over local and hosted language models.

`from parley import Agent, tool` is the front door; the layers live in `parley.protocol`,
`parley.constrained`, `parley.sandbox`, `parley.tools`, `parley.local_engine`.
"""

from parley._root import ParleyError
from parley.protocol import Conversation, Message, Role, ToolCall, ToolResult, Usage

__all__ = [
    "Conversation",
    "Message",
    "ParleyError",
    "Role",
    "ToolCall",
    "ToolResult",
    "Usage",
]
