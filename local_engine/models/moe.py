"""Mixture-of-experts MLP: routing and the experts a step's tokens chose, and no other.

A router GEMM gives each token a logit per expert; `MoeSpec.router` says how the top k become weights
(Qwen3-MoE: softmax over all experts, then top k, optionally renormalised; gpt-oss: top k logits, then a
softmax over those k). Then each expert that at least one token of the step chose runs once, on exactly the
tokens that chose it, and its weighted output is added into those tokens' rows. A decode batch therefore pays
for the union of its tokens' choices, never for all experts (the seed document's dense fallback).

Experts are visited in ascending id, as transformers does, so a token's sum over its experts is added in the
same order whether it runs alone or in a batch. Expert weights are prepared for `WeightGemm` at load, with the
post-attention RMSNorm weight folded into the router's and every expert's gate/up columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from parley.local_engine.models.arch import MoeSpec
from parley.local_engine.models.gemm import Gemm
from parley.local_engine.models.layers import clamped_swiglu_, swiglu_


@dataclass
class MoeWeights:
    """One MoE layer, prepared: router `[E, hidden]`, and per expert gate/up `[2I, hidden]` (gate rows first)
    and down `[hidden, I]`, each with its bias when the family has one."""

    router: torch.Tensor
    router_bias: torch.Tensor | None
    gate_up: list[torch.Tensor]
    gate_up_bias: list[torch.Tensor] | None
    down: list[torch.Tensor]
    down_bias: list[torch.Tensor] | None


class MoeMlp:
    def __init__(self, spec: MoeSpec, weights: MoeWeights, gemm: Gemm) -> None:
        self.spec = spec
        self.w = weights
        self.gemm = gemm
        self.experts_run = 0  # expert invocations (one per expert per step it was chosen in)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per token: the weights `[T, k]` (fp32) and ids `[T, k]` of its chosen experts."""
        s = self.spec
        if s.router == "topk_softmax":
            top, ids = torch.topk(logits, s.top_k, dim=-1)
            return torch.softmax(top.float(), dim=-1), ids
        probs = torch.softmax(logits.float(), dim=-1)
        top, ids = torch.topk(probs, s.top_k, dim=-1)
        if s.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top, ids

    def __call__(self, h: torch.Tensor, many: Callable[[int], None], threads: int) -> torch.Tensor:
        """The layer's MLP output `[T, hidden]` for normalised hidden states `h` (norm weight folded in)."""
        s, w, gemm = self.spec, self.w, self.gemm
        many(threads)
        logits = gemm(h, w.router, w.router_bias)
        many(1)
        weights, ids = self.route(logits)
        T, k = ids.shape
        out = torch.zeros_like(h)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, rank) slots grouped by expert, ascending
        counts = torch.bincount(flat, minlength=s.num_experts).tolist()
        token_of = order // k
        weight_of = weights.reshape(-1).index_select(0, order).to(h.dtype).unsqueeze(1)
        inter = s.intermediate_size
        start = 0
        for e, n in enumerate(counts):
            if not n:
                continue
            rows = token_of[start : start + n]
            x = h if n == T == 1 else h.index_select(0, rows)
            many(threads)
            gu = gemm(x, w.gate_up[e], None if w.gate_up_bias is None else w.gate_up_bias[e])
            many(1)
            if s.activation == "clamped_swiglu":
                act = clamped_swiglu_(gu, inter, s.swiglu_alpha, s.swiglu_limit)
            else:
                act = swiglu_(gu, inter)
            many(threads)
            y = gemm(act, w.down[e], None if w.down_bias is None else w.down_bias[e])
            many(1)
            out.index_add_(0, rows, y.mul_(weight_of[start : start + n]))
            start += n
            self.experts_run += 1
        return out
