"""Quality figures of a loaded model, computed with the engine's own forward pass: perplexity on a text.

Used to measure what a quantised mode costs (`benchmarks/engine_vs_llamacpp.py`, `parley bench`): the same
token ids, teacher-forced through the paged forward in chunks (a private KV pool, so the engine's own cache
is untouched; call it while the engine's step loop is idle, it shares the model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from typing import Any

import torch

from parley.local_engine.config import SamplingParams
from parley.local_engine.runner import ModelRunner
from parley.local_engine.scheduler import ScheduledSeq
from parley.local_engine.sequence import Sequence


@torch.inference_mode()
def token_logprobs(model: Any, token_ids: Seq[int], *, chunk: int = 256, block_size: int = 16) -> torch.Tensor:
    """log p(token_ids[i] | token_ids[:i]) for i = 1..n-1 (fp32, [n - 1]), prefilled `chunk` tokens at a time."""
    ids = [int(t) for t in token_ids]
    if len(ids) < 2:
        raise ValueError("perplexity needs at least 2 tokens")
    blocks = -(-len(ids) // block_size)
    runner = ModelRunner(model, num_blocks=blocks, block_size=block_size)
    seq = Sequence("perplexity", ids, SamplingParams())
    seq.block_table = list(range(blocks))
    out: list[torch.Tensor] = []
    while seq.num_computed_tokens < len(ids) - 1:
        n = min(chunk, len(ids) - 1 - seq.num_computed_tokens)
        start = seq.num_computed_tokens
        input_ids, positions, batch, _ = runner.prepare([ScheduledSeq(seq, n, start, False)])
        logits = model.compute_logits(model.forward(input_ids, positions, runner.kv_cache, batch)).float()
        targets = torch.tensor(ids[start + 1 : start + n + 1], device=logits.device)
        out.append(torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0].cpu())
        seq.num_computed_tokens += n
    return torch.cat(out)


@torch.inference_mode()
def prefill_logits(model: Any, token_ids: Seq[int], *, block_size: int = 16) -> torch.Tensor:
    """fp32 logits `[n, vocab]` at every position of `token_ids`, in one prefill (a private KV pool)."""
    ids = [int(t) for t in token_ids]
    blocks = -(-len(ids) // block_size)
    runner = ModelRunner(model, num_blocks=blocks, block_size=block_size)
    seq = Sequence("logits", ids, SamplingParams())
    seq.block_table = list(range(blocks))
    input_ids, positions, batch, _ = runner.prepare([ScheduledSeq(seq, len(ids), 0, True)])
    return model.compute_logits(model.forward(input_ids, positions, runner.kv_cache, batch)).float()


def perplexity(model: Any, token_ids: Seq[int], *, chunk: int = 256) -> float:
    """exp(mean negative log-likelihood) of `token_ids` under `model` (every token after the first)."""
    lp = token_logprobs(model, token_ids, chunk=chunk)
    return math.exp(-float(lp.double().mean()))
