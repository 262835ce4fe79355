"""The engine with the embedded SmolLM2-135M-Instruct (real weights, CPU, fp32): parity with HF transformers
(greedy tokens, log-probabilities and raw prefill logits), batch invariance, prefix caching across requests and
tenants, model loading."""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from parley.local_engine import Engine, SamplingParams  # noqa: E402
from parley.local_engine.runner import ModelRunner  # noqa: E402
from parley.local_engine.scheduler import ScheduledSeq  # noqa: E402
from parley.local_engine.sequence import Sequence  # noqa: E402

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
    "What is 17 times 3?",
    "Give me a synonym for happy.",
    "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Name a planet with rings.",
    "What does HTTP stand for?",
]


def chat_ids(engine: Engine, text: str) -> list[int]:
    out = engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return [int(t) for t in ids]


def hf_batch_greedy(hf: Any, prompts: list[list[int]], n: int, pad_id: int) -> list[list[int]]:
    """HF generate() on a left-padded batch (the attention mask makes padding invisible)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=hf.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=hf.device)
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=pad_id)
    rows: list[list[int]] = out[:, width:].tolist()
    return rows


def hf_logit_gap(hf: Any, prefix: list[int], ours: int) -> tuple[int, float]:
    """HF's preferred next token after `prefix` and how far (in logits) our choice trails it."""
    with torch.inference_mode():
        logits = hf(torch.tensor([prefix], device=hf.device)).logits[0, -1].float()
    best = int(logits.argmax())
    return best, float(logits[best] - logits[ours])


def test_greedy_parity_with_hf_generate_on_12_prompts(smol_engine: Engine, smol_hf: Any) -> None:
    prompts = [chat_ids(smol_engine, q) for q in QUESTIONS]
    params = SamplingParams(max_tokens=48, min_tokens=48)
    t0 = time.perf_counter()
    ours = [o.token_ids for o in smol_engine.generate(prompts, params)]
    t1 = time.perf_counter()
    theirs = hf_batch_greedy(smol_hf, prompts, 48, pad_id=smol_engine.tokenizer.pad_token_id or 2)
    print(f"engine {t1 - t0:.1f}s, HF batched generate {time.perf_counter() - t1:.1f}s")
    report = []
    for prompt, a, b in zip(prompts, ours, theirs, strict=True):
        assert len(a) == 48
        if a == b:
            continue
        k = next(i for i in range(48) if a[i] != b[i])
        best, gap = hf_logit_gap(smol_hf, prompt + a[:k], a[k])
        report.append(f"diverged at token {k}: ours {a[k]} vs HF {b[k]} (HF argmax {best}, gap {gap:.5f})")
        assert gap < 0.02, report[-1]
    print(f"parity: {len(prompts) - len(report)}/{len(prompts)} identical; near-ties: {report}")
    assert len(report) <= 2, report


def test_prefill_logprobs_match_hf(smol_engine: Engine, smol_hf: Any) -> None:
    prompt = chat_ids(smol_engine, QUESTIONS[9])
    out = smol_engine.generate([prompt], SamplingParams(max_tokens=1, logprobs=20))[0]
    with torch.inference_mode():
        ref = torch.log_softmax(smol_hf(torch.tensor([prompt], device=smol_hf.device)).logits[0, -1].float(), -1).cpu()
    assert out.logprobs is not None
    top = out.logprobs[0].top
    assert list(top) == ref.topk(20).indices.tolist()
    worst = max(abs(v - ref[t].item()) for t, v in top.items())
    assert worst < 2e-4, worst


def engine_logits_every_position(engine: Engine, prompt: list[int], chunks: list[int]) -> Any:
    """fp32 logits at every prompt position from our runner and model, fed in `chunks` (sizes; 1 = a decode step).

    A private pool with a scrambled block table, so later chunks read earlier keys/values back through the paged
    cache exactly as chunked prefill and decode do in the engine. The engine's own step loop is idle meanwhile.
    """
    assert sum(chunks) == len(prompt)
    runner = ModelRunner(engine.model, num_blocks=8, block_size=16)
    seq = Sequence("logits", prompt, SamplingParams())
    seq.block_table = [5, 2, 7, 0, 3][: -(-len(prompt) // 16)]
    rows = []
    with torch.inference_mode():
        for n in chunks:
            input_ids, positions, batch, _ = runner.prepare([ScheduledSeq.of(seq, n)])
            rows.append(engine.model.compute_logits(engine.model.forward(input_ids, positions, runner.kv_cache, batch)))
            seq.num_computed_tokens += n
    return torch.cat(rows).cpu()


def test_prefill_logits_match_hf_at_every_position(smol_engine: Engine, smol_hf: Any) -> None:
    prompt = chat_ids(smol_engine, QUESTIONS[9] + " Explain it briefly.")
    assert len(prompt) > 32
    one_pass = engine_logits_every_position(smol_engine, prompt, [len(prompt)])
    rest = len(prompt) - 19 - 3
    chunked = engine_logits_every_position(smol_engine, prompt, [19, rest, 1, 1, 1])  # chunk, chunk, 3 decodes
    with torch.inference_mode():
        ref = smol_hf(torch.tensor([prompt], device=smol_hf.device)).logits[0].float().cpu()
    assert one_pass.shape == chunked.shape == ref.shape == (len(prompt), smol_engine.vocab_size)
    figures = {}
    for name, ours in (("one pass", one_pass), ("chunked+decode", chunked)):
        diff = ours - ref
        centred = diff - diff.mean(-1, keepdim=True)  # a constant shift per row changes no probability
        figures[name] = (float(diff[-1].abs().max()), float(diff.abs().max()), float(centred.abs().max()))
    report = "; ".join(f"{k}: last row {a:.2e}, all rows {b:.2e}, all rows centred {c:.2e}"
                       for k, (a, b, c) in figures.items())
    print(f"max |logit ours - HF| over {len(prompt)} positions (logits up to {float(ref.abs().max()):.1f}): {report}")
    for raw_last, raw_all, centred_all in figures.values():
        assert raw_last < 5e-4 and raw_all < 5e-4 and centred_all < 5e-4, report


def test_sixteen_concurrent_requests_equal_their_solo_runs(smol_engine: Engine) -> None:
    prompts = [chat_ids(smol_engine, " ".join((QUESTIONS * 2)[i : i + 1 + i % 5])) for i in range(16)]
    assert len({len(p) for p in prompts}) >= 12
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    together = smol_engine.generate(prompts, params)
    solo = [smol_engine.generate([p], params, tenant="solo")[0] for p in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in solo]


def test_shared_512_token_prefix_is_served_from_cache_per_tenant(smol_engine: Engine) -> None:
    tok = smol_engine.tokenizer
    doc = " ".join(f"Clause {i}: the tenant shall keep the premises clean and tidy." for i in range(60))
    prefix = tok.encode(doc)[:512]
    suffix_a = tok.encode(" Question: what does clause 3 say? Answer briefly, in one short sentence please.")[:32]
    suffix_b = tok.encode(" Question: what does clause 7 say? Give a short answer in plain words, thank you.")[:32]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    smol_engine.generate([prefix + suffix_a], params, tenant="acme")
    warm = smol_engine.generate([prefix + suffix_b], params, tenant="acme")[0]
    cold = smol_engine.generate([prefix + suffix_b], params, tenant="globex")[0]  # different salt: nothing shared
    assert warm.cached_tokens >= 496
    assert cold.cached_tokens == 0
    assert warm.token_ids == cold.token_ids
    stats = smol_engine.stats()
    assert stats["prefix_cache_hits"] >= 496 and stats["prefix_cache_queries"] >= 3 * 544


def test_cached_load_is_fast_and_tokenizer_is_complete(smol_engine: Engine) -> None:
    t0 = time.perf_counter()
    again = Engine.from_pretrained(None, device=smol_engine.device, dtype="bfloat16")
    try:
        assert time.perf_counter() - t0 < 20  # generous for a loaded 2-core CI machine; ~1-2 s when idle
        assert again.model_id != smol_engine.model_id  # dtype is part of the identity
        assert again.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids
    finally:
        again.close()
    tok = smol_engine.tokenizer
    assert tok.eos_token_id in smol_engine.eos_token_ids
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert smol_engine.max_model_len == 8192 and smol_engine.vocab_size == 49152
