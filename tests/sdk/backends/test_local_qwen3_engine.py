"""Qwen3 end to end on the real engine: a tiny random Qwen3, its own (Qwen3-style) template, an approval
pause, and the resume in another process, thinking on and off.

The weights are random, so every well-formed token comes from the grammars: the named tool's call on
the first turn, the typed answer (tools off) on the second. The SmolLM2 tokenizer stands in for
Qwen3's (none is on this machine), carrying the Qwen3-style template of `test_local_qwen3`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from parley import Agent, Reasoning, tool
from parley.backends import LocalBackend, NamedToolChoice, SamplingSettings, ToolChoice
from parley.protocol import Message

pytestmark = pytest.mark.model  # the embedded model's tokenizer files

ROOT = Path(__file__).resolve().parents[3]


class Sky(BaseModel):
    sunny: bool


@tool(needs_approval=True)
def sky(city: Literal["Oslo", "Bergen"]) -> str:  # bounded: random weights would write a string forever
    """Whether the sky is clear in a city.

    Args:
        city: The city.
    """
    return "clear"


def policy(messages: list[Message]) -> ToolChoice:
    return "none" if any(m.tool_results for m in messages) else NamedToolChoice("sky")


def tiny_qwen3_backend() -> LocalBackend:
    """The same engine in every process: a seeded tiny Qwen3 over the SmolLM2 vocabulary."""
    import torch
    import transformers

    from parley.local_engine import Engine, EngineConfig, loader
    from parley.local_engine.models.registry import build_model
    from tests.sdk.backends.test_local_qwen3 import QWEN3_TEMPLATE

    tokenizer = loader.load_tokenizer(loader.resolve(None).folder)
    tokenizer.chat_template = QWEN3_TEMPLATE
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, tie_word_embeddings=True,
    )
    hf = transformers.Qwen3ForCausalLM(config).eval()
    net = build_model(config.to_dict(), hf.state_dict(), torch.device("cpu"), torch.float32)
    stop = frozenset(tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    engine = Engine.from_model(net, tokenizer, model_id="tiny-qwen3", eos_token_ids=stop,
                               config=EngineConfig(num_kv_blocks=256, block_size=16))
    return LocalBackend(engine=engine, max_tokens=160)


def agent(backend: LocalBackend, thinking: bool) -> Agent[Sky]:
    # random weights under a grammar may spell a call a character a token: room for ~100 tokens
    return Agent(backend, tools=[sky], output_type=Sky, tool_choice=policy,
                 reasoning=Reasoning(budget_tokens=5) if thinking else None, sampling=SamplingSettings(max_tokens=160))


RESUME = textwrap.dedent("""
    import asyncio, json, sys
    from parley import RunState
    from tests.sdk.backends.test_local_qwen3_engine import agent, tiny_qwen3_backend

    state = RunState.load(sys.argv[1])
    state.approve(state.pending[0].call_id)
    backend = tiny_qwen3_backend()
    done = asyncio.run(agent(backend, sys.argv[2] == "on").run(state=state))
    backend.engine.close()
    calls = [c.name for m in done.messages for c in m.tool_calls]
    print(json.dumps({"output": done.output.model_dump(), "calls": calls,
                      "reasoning": [r["reasoning_tokens"] for r in done.usage.raw],
                      "finish": [r["finish_reason"] for r in done.usage.raw]}))
""")


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking off", "thinking on"])
async def test_pause_on_the_tiny_qwen3_then_resume_in_another_process(tmp_path: Path, thinking: bool) -> None:
    backend = tiny_qwen3_backend()
    try:
        paused = await agent(backend, thinking).run("Is it sunny in Oslo?")
    finally:
        backend.engine.close()  # type: ignore[attr-defined]
    assert paused.paused and [p.tool_name for p in paused.interruptions] == ["sky"]
    (call,) = [c for m in paused.messages for c in m.tool_calls]
    assert call.parsed_arguments()["city"] in ("Oslo", "Bergen")  # schema-valid from random weights
    path = tmp_path / "state.json"
    paused.state.save(path)
    done = subprocess.run([sys.executable, "-c", RESUME, str(path), "on" if thinking else "off"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(result["output"]["sunny"], bool) and result["calls"] == ["sky"]
    assert result["finish"] == ["tool_calls", "stop"]
    assert result["reasoning"] == ([5, 5] if thinking else [0, 0])  # the budget is exact on every turn
