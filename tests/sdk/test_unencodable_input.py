"""A lone surrogate in user or tool text, through `Agent` over `LocalBackend`: a typed `ParleyError`, not a
tokenizer `TypeError`. The engine is real (tiny random weights sized to the embedded SmolLM2 tokenizer,
which is real too), so the text goes through the same codec and tokenizer as with the embedded model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from parley import Agent, tool
from parley.errors import ParleyError, UnencodableTextError

pytestmark = pytest.mark.model  # needs the embedded model's tokenizer files

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from parley.local_engine import Engine, EngineConfig, loader
    from parley.local_engine.models.llama import LlamaArch, LlamaModel

    tokenizer = loader.load_tokenizer(loader.resolve(None).folder)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    arch = LlamaArch.from_hf_config(cfg.to_dict())
    net = LlamaModel.from_hf_state_dict(arch, hf.state_dict(), torch.device("cpu"), torch.float32)
    engine = Engine.from_model(
        net, tokenizer, model_id="tiny-smollm2-vocab", eos_token_ids=frozenset({tokenizer.eos_token_id}),
        config=EngineConfig(num_kv_blocks=64, num_threads=1),
    )
    yield engine
    engine.close()


def agent(engine: Any, **kwargs: Any) -> Agent:
    from parley.backends import LocalBackend

    return Agent(LocalBackend(engine=engine), **kwargs)


async def test_a_lone_surrogate_in_the_user_input_is_a_typed_error_naming_the_message(engine: Any) -> None:
    with pytest.raises(ParleyError) as info:
        await agent(engine).run("what is \ud800 this?")
    assert isinstance(info.value, UnencodableTextError), repr(info.value)
    assert "messages[" in str(info.value) and ".content" in str(info.value)
    assert "lone surrogate U+D800" in str(info.value)


async def test_a_lone_surrogate_in_the_instructions_is_a_typed_error(engine: Any) -> None:
    with pytest.raises(UnencodableTextError, match=r"messages\[0\]\.content"):
        await agent(engine, instructions="Be \udfff brief.").run("hi")


@tool
def describe(thing: str) -> str:
    """Describe a thing: \ud800."""
    return thing


async def test_a_lone_surrogate_in_a_tool_description_names_the_tool(engine: Any) -> None:
    with pytest.raises(UnencodableTextError, match=r"tools\[0\]\.description"):
        await agent(engine, tools=[describe]).run("hi")


async def test_valid_text_still_runs(engine: Any) -> None:
    result = await agent(engine).run("plain text \U0001f600")
    assert isinstance(result.output, str)
