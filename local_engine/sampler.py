"""Token selection: penalties, hooks (forced tokens, bitmasks), greedy, temperature / top-k / min-p / top-p, logprobs.

Every sampling request owns a `torch.Generator` seeded from its own seed (hashed, so nearby seeds give
unrelated streams) and draws exactly one number per sampled token from it. Nothing is keyed on the
step or the batch position, so a request's tokens do not depend on what it is batched with, and two
requests never share a stream (unlike `seed + step`). Masks are applied to fp32 logits; a batch
without penalties, hooks, sampling or logprobs takes the argmax fast path.

Penalties are computed from the sequence's own tokens at the moment of sampling, so a speculative
round that samples row j after accepting rows 0..j-1 sees exactly the tokens plain decoding would.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from collections.abc import Sequence as Seq
from functools import lru_cache

import torch

from parley.local_engine.outputs import TokenLogprob
from parley.local_engine.sequence import Sequence


def derive_seed(seed: int | None) -> int:
    """A 63-bit generator seed from the user's seed (or fresh randomness when None)."""
    if seed is None:
        return secrets.randbits(63)
    digest = hashlib.blake2b(b"parley-sampling-seed:" + str(int(seed)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed))
    return gen


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, ceil(V/32)] int32 (bit i%32 of word i//32 = token i allowed) -> [n, V] bool."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


@lru_cache(maxsize=8)
def _byte_to_penalties(device: torch.device) -> torch.Tensor:
    """[256, 8] float32: entry [b, j] is 0.0 when bit j of byte b is set (token allowed), else -inf."""
    bits = (torch.arange(256, dtype=torch.int32).unsqueeze(1) >> torch.arange(8, dtype=torch.int32)) & 1
    return torch.where(bits.bool(), 0.0, float("-inf")).to(device)


def bitmask_penalties(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, ceil(V/32)] int32 bitmask -> [n, V] float32 of 0.0 (allowed) / -inf (blocked), to add to logits.

    Why not `masked_fill` with `unpack_bitmask`: on CPU a boolean masked fill over 4 x 49k logits takes
    ~0.7 ms, a step's worth of overhead; a table lookup per mask byte plus one add takes ~0.1 ms. Adding 0.0
    leaves a logit unchanged and adding -inf blocks it, so the result equals the masked fill.
    """
    if sys.byteorder != "little":  # byte order of the words decides which tokens a byte holds
        allowed = unpack_bitmask(bitmask, vocab_size)
        return torch.zeros(allowed.shape, device=bitmask.device).masked_fill_(~allowed, float("-inf"))
    n = bitmask.shape[0]
    table = _byte_to_penalties(bitmask.device)
    per_byte = bitmask.contiguous().view(torch.uint8).view(-1).long()
    return table.index_select(0, per_byte).view(n, -1)[:, :vocab_size]


def rows_allowing_nothing(bitmask: torch.Tensor, vocab_size: int) -> list[bool]:
    """For each row of the bitmask, whether it blocks every token id below `vocab_size`."""
    full, rest = divmod(vocab_size, 32)
    any_allowed = (bitmask[:, :full] != 0).any(dim=-1)
    if rest:
        any_allowed |= (bitmask[:, full] & ((1 << rest) - 1)) != 0
    return (~any_allowed).tolist()


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.mask_words = (vocab_size + 31) // 32
        self.eos_token_ids = eos_token_ids

    def _apply_penalties(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> None:
        """Repetition (prompt and output, HF/vLLM's CTRL rule), frequency and presence (output) penalties."""
        for i, seq in enumerate(seqs):
            p = seq.params
            if not p.penalized:
                continue
            row = logits[i]
            vocab = row.shape[-1]
            if p.repetition_penalty != 1.0:
                seen = torch.tensor(seq.token_ids, dtype=torch.long, device=row.device).unique()
                seen = seen[(seen >= 0) & (seen < vocab)]
                values = row.index_select(0, seen)
                scaled = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
                row.index_copy_(0, seen, scaled)
            if (p.frequency_penalty or p.presence_penalty) and seq.num_output_tokens:
                out = torch.tensor(seq.output_token_ids, dtype=torch.long, device=row.device)
                counts = torch.bincount(out[(out >= 0) & (out < vocab)], minlength=vocab).to(row.dtype)
                row.sub_(counts * p.frequency_penalty + (counts > 0).to(row.dtype) * p.presence_penalty)

    def _suppress_early_stops(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> None:
        """Below `min_tokens`, end-of-sequence and stop ids cannot be chosen (as HF's `min_new_tokens`)."""
        for i, seq in enumerate(seqs):
            p = seq.params
            if p.min_tokens and seq.num_output_tokens < p.min_tokens:
                banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
                if banned:
                    logits[i, sorted(banned)] = float("-inf")

    def _apply_hooks(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> dict[int, int]:
        """Ask hooks for forced tokens and masks; mask `logits` in place. Returns row -> forced token.

        A hook that raises, forces an out-of-range token or allows no token at all fails only its own
        request: the row gets `seq.error` set and token -1, and the engine ends that request with an error.
        """
        forced: dict[int, int] = {}
        mask_rows: list[int] = []
        rows_with_hooks = [i for i, s in enumerate(seqs) if s.hook is not None]
        if not rows_with_hooks:
            return forced
        bitmask = torch.full((len(rows_with_hooks), self.mask_words), -1, dtype=torch.int32)
        used: list[int] = []
        for j, i in enumerate(rows_with_hooks):
            seq = seqs[i]
            try:
                token = seq.hook.forced_token()
                if token is not None:
                    if not 0 <= int(token) < logits.shape[-1]:
                        raise ValueError(f"forced token {token} is out of range")
                    forced[i] = int(token)
                    continue
                if seq.hook.fill_bitmask(bitmask[j]):
                    mask_rows.append(i)
                    used.append(j)
            except Exception as exc:  # noqa: BLE001 - a broken hook fails its request, not the batch
                seq.error = f"token hook failed: {type(exc).__name__}: {exc}"
        if mask_rows:
            words = bitmask[used]
            penalties = bitmask_penalties(words.to(logits.device), logits.shape[-1])
            if len(mask_rows) == logits.shape[0]:
                logits.add_(penalties)
            else:
                logits.index_add_(0, torch.tensor(mask_rows, device=logits.device), penalties)
            for i, blocked in zip(mask_rows, rows_allowing_nothing(words, logits.shape[-1]), strict=True):
                if blocked:
                    seqs[i].error = "token hook allowed no token at all"
        return forced

    def _sample_row(self, row: torch.Tensor, seq: Sequence) -> int:
        p = seq.params
        row = row / p.temperature
        if p.top_k and p.top_k < row.shape[-1]:
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if p.min_p > 0.0:
            probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)  # the most likely token always stays
            probs = probs / probs.sum()  # top_p below measures the mass that is left
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_probs, dim=-1)
            drop = (cum - sorted_probs) >= p.top_p  # keep the smallest prefix reaching top_p (always >= 1 token)
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        if seq.generator is None:
            seq.generator = make_generator(p.seed, row.device)
        return int(torch.multinomial(probs, 1, generator=seq.generator).item())

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> tuple[list[int], list[TokenLogprob | None]]:
        """Choose one token per row of fp32 `logits` ([len(seqs), vocab]); tell hooks nothing yet."""
        self._apply_penalties(logits, seqs)
        self._suppress_early_stops(logits, seqs)
        forced = self._apply_hooks(logits, seqs)
        n = len(seqs)
        need_logprobs = any(s.params.logprobs is not None for s in seqs)
        failed = any(s.error is not None for s in seqs)
        if not forced and not failed and all(s.params.greedy for s in seqs):
            tokens = logits.argmax(dim=-1).tolist()
        else:
            greedy_tokens = logits.argmax(dim=-1).tolist()
            tokens = []
            for i, seq in enumerate(seqs):
                if seq.error is not None:
                    tokens.append(-1)
                elif i in forced:
                    tokens.append(forced[i])
                elif seq.params.greedy:
                    tokens.append(greedy_tokens[i])
                else:
                    tokens.append(self._sample_row(logits[i], seq))
        lps: list[TokenLogprob | None] = [None] * n
        if need_logprobs:
            logp = torch.log_softmax(logits, dim=-1)
            for i, seq in enumerate(seqs):
                k = seq.params.logprobs
                if k is None or tokens[i] < 0:
                    continue
                top: dict[int, float] = {}
                if k > 0:
                    vals, idx = torch.topk(logp[i], k)
                    top = dict(zip(idx.tolist(), vals.tolist(), strict=True))
                lps[i] = TokenLogprob(tokens[i], float(logp[i, tokens[i]]), top)
        return tokens, lps
