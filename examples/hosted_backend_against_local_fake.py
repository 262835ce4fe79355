"""`OpenAIBackend` against a stand-in server on 127.0.0.1, and the normalised `Usage` it reports.

    python examples/hosted_backend_against_local_fake.py

No internet and no API key: the script starts a tiny HTTP server on 127.0.0.1 (any free port) that
replays two Chat Completions responses in the documented shape: a tool call, then the final answer.
Point `base_url` at api.openai.com (and set OPENAI_API_KEY) and nothing else changes.

The point is the usage ledger. OpenAI's `prompt_tokens` *includes* the cached tokens
(`prompt_tokens_details.cached_tokens`); Anthropic's `input_tokens` excludes them. parley's `Usage`
always holds the uncached remainder in `input_tokens`, so `input + cache_read + cache_write` is the
whole prompt for every provider and nothing is counted twice; usages add up across requests and
the cost comes from the price table (cached input is billed at the cheaper rate).
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from parley import Agent, tool
from parley.backends import OpenAIBackend

# Two replies as the Chat Completions API documents them (trimmed of a few irrelevant fields).
REPLIES: list[dict[str, Any]] = [
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1764460800,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [{
                    "id": "call_weather_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
                }],
            },
            "finish_reason": "tool_calls",
        }],
        "usage": {
            "prompt_tokens": 1310, "completion_tokens": 18, "total_tokens": 1328,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
    },
    {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 1764460801,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "It is 4 C and raining in Oslo.", "refusal": None},
            "finish_reason": "stop",
        }],
        # The second request repeats the first one's prefix, so OpenAI served 1280 tokens from its cache.
        "usage": {
            "prompt_tokens": 1342, "completion_tokens": 12, "total_tokens": 1354,
            "prompt_tokens_details": {"cached_tokens": 1280, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
    },
]


class FakeOpenAI(BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions with the next reply in `REPLIES`; records what it was sent."""

    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeOpenAI.received.append(body)
        index = len(FakeOpenAI.received) - 1
        ok = self.path == "/v1/chat/completions" and not body.get("stream") and index < len(REPLIES)
        payload = json.dumps(REPLIES[index] if ok else {"error": {"message": f"unexpected {self.path}"}}).encode()
        self.send_response(200 if ok else 400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # keep the example's output clean
        pass


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city name.
    """
    return f"{city}: 4 C, rain"


async def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)  # port 0: any free port, loopback only
    threading.Thread(target=server.serve_forever, daemon=True).start()
    backend = OpenAIBackend(
        "gpt-4o-mini",  # a model in parley's price table, so the run has a cost
        base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
        api_key="sk-local-fake",
        max_retries=0,
    )
    try:
        agent = Agent(backend, instructions="Answer weather questions with the tool.", tools=[get_weather])
        result = await agent.run("Weather in Oslo?")
    finally:
        await backend.aclose()
        server.shutdown()
        server.server_close()

    # What went over the wire: the conversation in OpenAI's own roles, the tool as a function.
    for number, body in enumerate(FakeOpenAI.received, 1):
        roles = ",".join(message["role"] for message in body["messages"])
        tools = ",".join(t["function"]["name"] for t in body.get("tools", []))
        print(f"request {number}: model={body['model']} roles={roles} tools={tools}")

    usage = result.usage  # the sum over both requests, normalised
    print(f"answer: {result.output}")
    print(f"requests={usage.requests} input_tokens={usage.input_tokens} cache_read_tokens={usage.cache_read_tokens} "
          f"cache_write_tokens={usage.cache_write_tokens} output_tokens={usage.output_tokens}")
    print(f"prompt_tokens={usage.prompt_tokens} (provider reported {sum(r['prompt_tokens'] for r in usage.raw)})")
    print(f"cost_usd={usage.cost}")


if __name__ == "__main__":
    asyncio.run(main())
