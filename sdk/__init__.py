"""parley: agents over local and hosted language models.

`from parley import Agent, tool` is the front door; the layers live in `parley.protocol`,
`parley.constrained`, `parley.sandbox`, `parley.tools`, `parley.local_engine`. Agents that work
together and runs users control: `Agent.as_tool`, `handoff` (`parley.handoffs`), guardrails
(`parley.guardrails`), `RunHooks` (`parley.hooks`), `RunContext` (`parley.context`). Long
conversations: history processors (`parley.history`) and `Compaction` (`parley.compaction`).
Exactly once across resumes and processes: the execution ledger (`parley.ledger`); a state is
bound to its agent (`parley.fingerprint`).
"""

from parley._root import ParleyError
from parley.agent import Agent
from parley.caching import CachePolicy
from parley.compaction import Compaction
from parley.context import RunContext
from parley.guardrails import (
    GuardrailResult,
    ToolDecision,
    input_guardrail,
    output_guardrail,
    tool_input_guardrail,
    tool_output_guardrail,
)
from parley.handoffs import Handoff, handoff
from parley.history import HistoryContext
from parley.hooks import RunHooks
from parley.ledger import Ledger, MemoryLedger
from parley.ledger_stores import SQLAlchemyLedger, SQLiteLedger
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
    "Compaction",
    "Conversation",
    "GuardrailResult",
    "Handoff",
    "HistoryContext",
    "Interruption",
    "Ledger",
    "MemoryLedger",
    "MemorySession",
    "Message",
    "ParleyError",
    "Reasoning",
    "RepeatedCall",
    "Role",
    "RunContext",
    "RunHooks",
    "RunResult",
    "RunState",
    "SQLAlchemyLedger",
    "SQLAlchemySession",
    "SQLiteLedger",
    "SQLiteSession",
    "Session",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDecision",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "UsageLimits",
    "handoff",
    "input_guardrail",
    "output_guardrail",
    "tool",
    "tool_input_guardrail",
    "tool_output_guardrail",
]
