"""parley: agents over local and hosted language models.

`from parley import Agent, tool` is the front door; the layers live in `parley.protocol`,
`parley.constrained`, `parley.sandbox`, `parley.tools`, `parley.local_engine`.
"""

from parley._root import ParleyError
from parley.agent import Agent
from parley.caching import CachePolicy
from parley.protocol import Conversation, Message, Role, ToolCall, ToolResult, ToolSpec, Usage
from parley.reasoning import Reasoning
from parley.result import RunResult
from parley.run_state import Interruption, RepeatedCall, RunState
from parley.sessions import MemorySession, Session, SQLAlchemySession, SQLiteSession
from parley.tools import Tool, ToolContext, tool
from parley.usage_limits import UsageLimits

__all__ = [
    "Agent",
    "CachePolicy",
    "Conversation",
    "Interruption",
    "MemorySession",
    "Message",
    "ParleyError",
    "Reasoning",
    "RepeatedCall",
    "Role",
    "RunResult",
    "RunState",
    "SQLAlchemySession",
    "SQLiteSession",
    "Session",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "UsageLimits",
    "tool",
]
