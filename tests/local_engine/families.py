"""Tiny random-weight models of every family parley serves, built from transformers' own config classes (no
files, no network), and the comparisons the family tests make against HF transformers."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch
import transformers

from parley.local_engine import Engine, EngineConfig, SamplingParams
from parley.local_engine.models.decoder import DecoderModel
from parley.local_engine.models.registry import build_model
from parley.local_engine.runner import ModelRunner
from parley.local_engine.scheduler import ScheduledSeq
from parley.local_engine.sequence import Sequence
from tests.local_engine.conftest import ByteTokenizer

VOCAB = 512
BASE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1,
    eos_token_id=2, pad_token_id=0,
)
WINDOW = 8  # sliding window of the windowed tiny models: far shorter than the sequences the tests run


@dataclass(frozen=True)
class Family:
    name: str
    config: type[Any]
    model: type[Any]
    overrides: dict[str, Any]


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
             "truncate": False, "original_max_position_embeddings": 64}

FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("llama3", transformers.LlamaConfig, transformers.LlamaForCausalLM,
           dict(rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True)),
    Family("llama-biases", transformers.LlamaConfig, transformers.LlamaForCausalLM,
           dict(attention_bias=True, mlp_bias=True)),
    Family("mistral", transformers.MistralConfig, transformers.MistralForCausalLM, dict(sliding_window=WINDOW)),
    Family("qwen2-tied", transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    Family("qwen2.5-untied", transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
           dict(tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    Family("qwen2-window", transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
           dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    Family("qwen3", transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(tie_word_embeddings=True)),
    Family("qwen3-moe", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
           dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                mlp_only_layers=[1])),
    Family("qwen3-moe-window", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
           dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, use_sliding_window=True,
                sliding_window=WINDOW, decoder_sparse_step=2)),
    Family("qwen3-moe-unnormalised", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
           dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=False)),
    Family("gpt-oss", transformers.GptOssConfig, transformers.GptOssForCausalLM,
           dict(num_local_experts=8, num_experts_per_tok=2, sliding_window=WINDOW, rope_parameters=YARN_ROPE,
                num_hidden_layers=4, swiglu_limit=2.0)),  # a low limit, so the clamps bite
]}


def hf_model(family: str, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random HF model of `family`, weights sharpened so greedy choices are rarely near-ties."""
    f = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = f.config(**{**BASE, **f.overrides, **overrides})
    model = f.model(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("bias", "sinks")):
                p.normal_(0.0, 0.5)  # initialised to zero (gpt-oss's expert biases too): make them matter
            elif p.dim() >= 2:
                p.mul_(8.0)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def our_model(hf: Any, dtype: torch.dtype = torch.float32) -> DecoderModel:
    return build_model(hf.config.to_dict(), hf.state_dict(), torch.device("cpu"), dtype)


def engine_of(net: DecoderModel, **config: Any) -> Engine:
    cfg = EngineConfig(**{"num_kv_blocks": 256, "block_size": 4, "max_num_batched_tokens": 16, **config})
    return Engine.from_model(net, ByteTokenizer(), model_id="tiny", eos_token_ids=frozenset({2}), config=cfg)


def prompts_of(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in lengths]


def hf_greedy(hf: Any, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=0)
    return [int(t) for t in out[0, len(prompt) :]]


def greedy(n: int) -> SamplingParams:
    """n greedy tokens, the end-of-sequence token masked until then (HF's `min_new_tokens`)."""
    return SamplingParams(max_tokens=n, min_tokens=n)


def logits_every_position(net: DecoderModel, prompt: list[int], chunks: list[int]) -> torch.Tensor:
    """fp32 logits at every prompt position from our runner and model, fed in `chunks` (sizes; 1 = a decode
    step), through a private paged pool with a scrambled block table (later chunks read earlier K/V back)."""
    assert sum(chunks) == len(prompt)
    bs = 4
    runner = ModelRunner(net, num_blocks=64, block_size=bs)
    seq = Sequence("logits", prompt, SamplingParams())
    seq.block_table = list(range(63, 63 - 2 * (-(-len(prompt) // bs)), -2))  # 63, 61, ...: not in order
    rows = []
    with torch.inference_mode():
        for n in chunks:
            ids, pos, batch, _ = runner.prepare([ScheduledSeq.of(seq, n)])
            rows.append(net.compute_logits(net.forward(ids, pos, runner.kv_cache, batch)))
            seq.num_computed_tokens += n
    return torch.cat(rows)


def hf_logits(hf: Any, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([prompt])).logits[0].float()


def parity(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |ours - HF|, that divided by max |HF|) over every position and vocabulary entry."""
    diff = float((ours - ref).abs().max())
    return diff, diff / float(ref.abs().max())
