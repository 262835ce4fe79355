"""Documented OpenAI Responses API shapes (openai-python's generated types), shared by the tests."""

from __future__ import annotations

from typing import Any

ENCRYPTED = "gAAAAABoIPOHxZ3pY0n1c2VjcmV0LXJlYXNvbmluZy1ibG9iLXRoYXQtaXMtb3BhcXVlLXRvLXRoZS1jbGllbnQ="
REASONING_ITEM: dict[str, Any] = {
    "type": "reasoning",
    "id": "rs_6820f383d7c08191846711c5df8233bc0ac5ba57aafcbac7",
    "summary": [{"type": "summary_text", "text": "**Checking the weather**\n\nThe user wants Paris; call the tool."}],
    "encrypted_content": ENCRYPTED,
}
CALL_ITEM: dict[str, Any] = {
    "type": "function_call",
    "id": "fc_67ca09c6bedc8190a7abfec07b1a1332096610f474011cc0",
    "call_id": "call_unLAR8MvFNptuiZK6K6HCy5k",
    "name": "get_weather",
    "arguments": "{\"location\":\"Paris, France\"}",
    "status": "completed",
}


def message_item(text: str, *, refusal: str | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "output_text", "text": text, "annotations": []}] if text else []
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {"type": "message", "id": "msg_67ccd3acc8d48190a77525dc6de64b4104becb25c0fc7d88", "status": "completed",
            "role": "assistant", "content": content}


def usage(input_tokens: int = 2006, cached: int = 1920, output: int = 300, reasoning: int = 256) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": input_tokens + output}


def response(output: list[dict[str, Any]], *, status: str = "completed", model: str = "o4-mini-2025-04-16",
             response_id: str = "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
             incomplete: str | None = None, counts: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": response_id, "object": "response", "created_at": 1741476542, "status": status, "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None, "instructions": None,
        "max_output_tokens": None, "model": model, "output": output, "parallel_tool_calls": True,
        "previous_response_id": None, "reasoning": {"effort": "medium", "summary": None}, "store": False,
        "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
        "top_p": 1.0, "truncation": "disabled", "usage": counts if counts is not None else usage(), "user": None,
        "metadata": {},
    }


def stream_events(final: dict[str, Any]) -> list[dict[str, Any]]:
    """The documented event sequence for a reasoning item, a text message and a function call."""
    rs_id, msg_id, fc_id = REASONING_ITEM["id"], "msg_1", CALL_ITEM["id"]
    created = {**final, "status": "in_progress", "output": [], "usage": None}
    n = iter(range(1000))
    return [
        {"type": "response.created", "response": created, "sequence_number": next(n)},
        {"type": "response.in_progress", "response": created, "sequence_number": next(n)},
        {"type": "response.output_item.added", "output_index": 0, "sequence_number": next(n),
         "item": {"type": "reasoning", "id": rs_id, "summary": []}},
        {"type": "response.reasoning_summary_part.added", "item_id": rs_id, "output_index": 0, "summary_index": 0,
         "part": {"type": "summary_text", "text": ""}, "sequence_number": next(n)},
        {"type": "response.reasoning_summary_text.delta", "item_id": rs_id, "output_index": 0, "summary_index": 0,
         "delta": "Need the ", "sequence_number": next(n)},
        {"type": "response.reasoning_summary_text.delta", "item_id": rs_id, "output_index": 0, "summary_index": 0,
         "delta": "weather.", "sequence_number": next(n)},
        {"type": "response.reasoning_summary_part.added", "item_id": rs_id, "output_index": 0, "summary_index": 1,
         "part": {"type": "summary_text", "text": ""}, "sequence_number": next(n)},
        {"type": "response.reasoning_summary_text.delta", "item_id": rs_id, "output_index": 0, "summary_index": 1,
         "delta": "Call it.", "sequence_number": next(n)},
        {"type": "response.output_item.done", "output_index": 0, "sequence_number": next(n),
         "item": {"type": "reasoning", "id": rs_id, "encrypted_content": ENCRYPTED,
                  "summary": [{"type": "summary_text", "text": "Need the weather."},
                              {"type": "summary_text", "text": "Call it."}]}},
        {"type": "response.output_item.added", "output_index": 1, "sequence_number": next(n),
         "item": {"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []}},
        {"type": "response.content_part.added", "item_id": msg_id, "output_index": 1, "content_index": 0,
         "part": {"type": "output_text", "text": "", "annotations": []}, "sequence_number": next(n)},
        {"type": "response.output_text.delta", "item_id": msg_id, "output_index": 1, "content_index": 0,
         "delta": "Let me ", "logprobs": [], "sequence_number": next(n)},
        {"type": "response.output_text.delta", "item_id": msg_id, "output_index": 1, "content_index": 0,
         "delta": "check.", "logprobs": [], "sequence_number": next(n)},
        {"type": "response.output_text.done", "item_id": msg_id, "output_index": 1, "content_index": 0,
         "text": "Let me check.", "logprobs": [], "sequence_number": next(n)},
        {"type": "response.output_item.done", "output_index": 1, "sequence_number": next(n),
         "item": {"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
                  "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]}},
        {"type": "response.output_item.added", "output_index": 2, "sequence_number": next(n),
         "item": {"type": "function_call", "id": fc_id, "call_id": CALL_ITEM["call_id"], "name": "get_weather",
                  "arguments": "", "status": "in_progress"}},
        {"type": "response.function_call_arguments.delta", "item_id": fc_id, "output_index": 2,
         "delta": "{\"location\":", "sequence_number": next(n)},
        {"type": "response.function_call_arguments.delta", "item_id": fc_id, "output_index": 2,
         "delta": "\"Paris, France\"}", "sequence_number": next(n)},
        {"type": "response.function_call_arguments.done", "item_id": fc_id, "output_index": 2,
         "arguments": CALL_ITEM["arguments"], "sequence_number": next(n)},
        {"type": "response.output_item.done", "output_index": 2, "item": CALL_ITEM, "sequence_number": next(n)},
        {"type": "response.completed", "response": final, "sequence_number": next(n)},
    ]


STREAMED_REASONING = {"type": "reasoning", "id": REASONING_ITEM["id"], "encrypted_content": ENCRYPTED,
                      "summary": [{"type": "summary_text", "text": "Need the weather."},
                                  {"type": "summary_text", "text": "Call it."}]}
STREAMED_FINAL = response([STREAMED_REASONING,
                           {**message_item("Let me check."), "id": "msg_1"}, CALL_ITEM])
