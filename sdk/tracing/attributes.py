"""The attribute names parley's spans use, and the usage arithmetic (no OpenTelemetry needed here).

GenAI semantic conventions (``gen_ai.*``): the names as opentelemetry-semantic-conventions 0.66b2
defines them (``opentelemetry.semconv._incubating.attributes.gen_ai_attributes``, where each is marked
moved to the GenAI conventions repository), the rules as that repository states them
(open-telemetry/semantic-conventions-genai, docs/gen-ai/gen-ai-spans.md at commit 002c8a6):

======================================  ===================================================
``gen_ai.operation.name``               ``invoke_agent`` / ``chat`` / ``execute_tool``
``gen_ai.provider.name``                ``anthropic``, ``openai``, ``parley.local``, ...
``gen_ai.request.model``                the backend's model (a fallback's: its first backend's)
``gen_ai.response.model``               the model that answered (the server's name where it reports
                                        one; the model part of parley's backend id otherwise)
``gen_ai.request.*``                    ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``,
                                        ``stop_sequences``; ``stream`` = true only when streaming
``gen_ai.response.finish_reasons``      ``["stop"]``, ``["tool_calls"]``, ...
``gen_ai.response.time_to_first_chunk`` seconds to the first streamed chunk (streaming runs)
``gen_ai.usage.input_tokens``           the whole prompt: uncached + cache read + cache write
``gen_ai.usage.cache_read.input_tokens``       prompt tokens read from a cache
``gen_ai.usage.cache_creation.input_tokens``   prompt tokens written to a cache
``gen_ai.usage.output_tokens``          output tokens (reasoning included)
``gen_ai.usage.reasoning.output_tokens``  of which reasoning
``gen_ai.agent.name``                   the agent's name (``gen_ai.agent.description``: its description)
``gen_ai.conversation.id``              the session's id when the run has one (the same for every run
                                        of the session), else the run's (`RunState.trace_id`, the
                                        same across resumes)
``gen_ai.output.type``                  ``text`` or ``json``
``gen_ai.tool.name`` / ``.call.id`` / ``.description`` / ``.type``  the tool call (type ``function``)
``gen_ai.tool.call.arguments`` / ``.result``   only with content capture
``gen_ai.input.messages`` / ``gen_ai.output.messages`` / ``gen_ai.system_instructions``  only with
                                        content capture: JSON in the conventions' message schema
                                        (`parley.tracing.messages`)
``error.type``                          the exception class, or ``tool_error`` for an error result
======================================  ===================================================

On the ``invoke_agent`` span the usage of its requests is summed under ``gen_ai.aggregated_usage.*``
(the names PydanticAI uses), not ``gen_ai.usage.*``, so summing ``gen_ai.usage.*`` over all spans
never counts a token twice. parley's own attributes are under ``parley.*`` (below).
"""

from __future__ import annotations

from typing import Any

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
AGENT_NAME = "gen_ai.agent.name"
AGENT_DESCRIPTION = "gen_ai.agent.description"
REQUEST_STREAM = "gen_ai.request.stream"
CONVERSATION_ID = "gen_ai.conversation.id"
OUTPUT_TYPE = "gen_ai.output.type"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"

USAGE = "gen_ai.usage"
AGGREGATED_USAGE = "gen_ai.aggregated_usage"
INPUT_TOKENS = "input_tokens"
OUTPUT_TOKENS = "output_tokens"
CACHE_READ = "cache_read.input_tokens"
CACHE_CREATION = "cache_creation.input_tokens"
REASONING = "reasoning.output_tokens"

# parley's own
UNCACHED_INPUT = "parley.usage.uncached_input_tokens"
COST = "parley.usage.cost"
REQUESTS = "parley.usage.requests"
RUN_STATUS = "parley.run.status"
RUN_RESUMED = "parley.run.resumed"
RUN_TURNS = "parley.run.turns"
RUN_PENDING = "parley.run.pending"
TOOL_APPROVAL = "parley.tool.approval"
"""``not_required``, ``approved``, ``approved_edited``, ``rejected`` or ``provided``."""
TOOL_SOURCE = "parley.tool.source"
"""``local``, ``mcp:<server name>``, or ``agent`` (an agent as a tool: its run nests in the span)."""
FALLBACK_ATTEMPT = "parley.fallback.attempt"
"""On the chat span of a `FallbackBackend` attempt that failed: which attempt (1: the first backend)."""
REQUEST_PURPOSE = "parley.request.purpose"
"""On a chat span the run made for itself: ``compaction`` (the summariser's request)."""
LOCAL_PROMPT_TOKENS = "parley.local.prompt_tokens"
LOCAL_CACHED_TOKENS = "parley.local.cached_tokens"


def usage_attributes(usage: Any, *, prefix: str = USAGE) -> dict[str, int | float]:
    """A `Usage` as convention attributes: ``input_tokens`` is the whole prompt (uncached + cache read
    + cache write); cache reads and writes also stand alone; reasoning and cost where known."""
    reported = usage.cache_read_tokens
    read, write = int(reported or 0), int(usage.cache_write_tokens)
    uncached = int(usage.input_tokens)
    attributes: dict[str, int | float] = {
        f"{prefix}.{INPUT_TOKENS}": uncached + read + write,
        f"{prefix}.{OUTPUT_TOKENS}": int(usage.output_tokens),
        f"{prefix}.{CACHE_CREATION}": write,
    }
    if reported is not None:  # unknown is left out, never sent as 0 reads
        attributes[f"{prefix}.{CACHE_READ}"] = read
    if usage.reasoning_tokens:
        attributes[f"{prefix}.{REASONING}"] = int(usage.reasoning_tokens)
    if prefix == USAGE:
        attributes[UNCACHED_INPUT] = uncached
    if usage.cost is not None:
        attributes[COST if prefix == USAGE else f"{prefix}.cost"] = float(usage.cost)
    return attributes


def provider_and_model(backend_name: str) -> tuple[str, str]:
    """``anthropic:claude-x`` -> (``anthropic``, ``claude-x``); ``local:m`` -> (``parley.local``, ``m``);
    a name without a colon -> (``parley``, the name)."""
    provider, sep, model = backend_name.partition(":")
    if not sep:
        return "parley", backend_name
    return ("parley.local" if provider == "local" else provider), model
