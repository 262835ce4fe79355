"""Agent as a tool across backend kinds: a local child under a hosted parent, and the reverse.

The local side is `LocalBackend` over the shipped `FakeEngine` with the embedded model's tokenizer
(no weights: the grammar constraint still judges the scripted tokens); the hosted side is
`OpenAIBackend` against a scripted HTTP server on 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parley import Agent, RunState
from tests.sdk.teamwork_agents import counter_tool

pytestmark = pytest.mark.model  # needs the embedded model's tokenizer files


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from parley.local_engine import loader

    return loader.load_tokenizer(loader.resolve(None).folder)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35},
    }


async def test_a_local_child_under_a_hosted_parent_and_the_reverse(tmp_path: Path, tokenizer: Any) -> None:
    from parley.backends import LocalBackend, OpenAIBackend
    from parley.local_engine.testing import FakeEngine
    from tests.sdk.backends.fake_server import FakeServer, Reply

    server = await FakeServer().start()
    try:
        hosted = OpenAIBackend("gpt-4o-mini", base_url=f"{server.url}/v1", api_key="k", max_retries=0)
        # a local child under a hosted parent: the child's approval still pauses the parent
        counter = tmp_path / "sent.log"
        local_child = LocalBackend(
            engine=FakeEngine(
                [
                    '<tool_call>\n{"name": "send_email", "arguments": {"to": "ada@example.com", "body": "late"}}'
                    "\n</tool_call>",
                    "Sent.<|im_end|>",
                ],
                tokenizer=tokenizer,
                vocab_size=49152,
            )
        )
        mailer = Agent(local_child, name="mailer", tools=[counter_tool(counter, "local")])
        ask = {"id": "ask_9", "type": "function", "function": {"name": "mailer", "arguments": '{"input": "mail Ada"}'}}
        server.queue(
            Reply(body=_completion({"content": None, "tool_calls": [ask]}, "tool_calls")),
            Reply(body=_completion({"content": "Ada is told."})),
        )
        parent = Agent(hosted, tools=[mailer.as_tool()])
        paused = await parent.run("Tell Ada")
        [item] = paused.interruptions
        assert item.path is not None and item.path[0] == "ask_9" and item.tool_name == "send_email"
        paused.state.approve(item.call_id)
        done = await parent.run(state=RunState.from_json(paused.state.to_json()))
        assert done.output == "Ada is told." and lines(counter) == [f"local {item.path[1]}"]
        assert done.usage.requests == 4 and done.state.backend == hosted.name

        # a hosted child under a local parent
        server.queue(Reply(body=_completion({"content": "4 C in Oslo."})))
        forecaster = Agent(hosted, name="forecaster")
        local_parent = LocalBackend(
            engine=FakeEngine(
                [
                    '<tool_call>\n{"name": "forecaster", "arguments": {"input": "Oslo?"}}\n</tool_call>',
                    "It is 4 C.<|im_end|>",
                ],
                tokenizer=tokenizer,
                vocab_size=49152,
            )
        )
        result = await Agent(local_parent, tools=[forecaster.as_tool()]).run("Weather in Oslo?")
        assert result.output == "It is 4 C." and result.usage.requests == 3
        assert result.messages[-2].tool_results[0].content == "4 C in Oslo."
    finally:
        await server.stop()
