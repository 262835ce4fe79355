"""parley: agents over local and hosted language models.

`from parley import Agent, tool` is the front door; the layers live in `parley.protocol`,
`parley.constrained`, `parley.sandbox`, `parley.tools`, `parley.local_engine`.
"""

from parley._root import ParleyError
from parley.caching import CachePolicy
from parley.protocol import Conversation, Message, Role, ToolCall, ToolResult, ToolSpec, Usage
from parley.reasoning import Reasoning

__all__ = [
    "CachePolicy",
    "Conversation",
    "Message",
    "ParleyError",
    "Reasoning",
    "Role",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Usage",
]
