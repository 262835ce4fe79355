"""`ConstraintHook`, driven by a fake decoding loop (no model)."""

from __future__ import annotations

from typing import Any

import torch

from parley.constrained import (
    THINK_END,
    TOOL_CALL_OPEN,
    Choice,
    ConstraintHook,
    JsonSchema,
    ToolCalls,
    compile,
    validate,
)
from parley.local_engine.hooks import TokenHook
from parley.protocol import ToolSpec


def masked(logits: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """`logits` with every token the int32 bitmask `row` disallows set to -inf (bit i%32 of word i//32)."""
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    allowed = bits.bool().view(-1)[: logits.shape[-1]]
    return logits.masked_fill(~allowed, float("-inf"))


def decode_loop(hook: ConstraintHook, scores: torch.Tensor, max_steps: int) -> list[int]:
    """What the engine does per step: forced token, else mask fp32 logits and take the argmax."""
    vocab = hook.matcher.vocab_size
    out: list[int] = []
    for _ in range(max_steps):
        forced = hook.forced_token()
        if forced is None:
            row = torch.full((hook.matcher.tokenizer.bitmask_words,), -1, dtype=torch.int32)
            logits = scores[len(out) % scores.shape[0]].clone()
            if hook.fill_bitmask(row):
                logits = masked(logits, row)
            forced = int(torch.argmax(logits[:vocab]))
        out.append(forced)
        hook.accept_token(forced)
        if hook.is_terminated():
            break
    return out


def test_the_hook_satisfies_the_engine_protocol(smol_tokenizer: Any) -> None:
    assert isinstance(ConstraintHook(compile(Choice(["a"]), smol_tokenizer)), TokenHook)


def test_runaway_whitespace_in_a_free_string_is_cut_off(smol_tokenizer: Any) -> None:
    spec = JsonSchema({"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]})
    hook = ConstraintHook(compile(spec, smol_tokenizer), max_whitespace_run=8)
    info = hook.matcher.tokenizer
    scores = torch.zeros(1, info.vocab_size)
    scores[0, list(info.whitespace_token_ids)] = 10.0  # a model that loves whitespace
    for text, bonus in (('"', 5.0), ("}", 4.0), ('{"note":"', 3.0)):
        scores[0, smol_tokenizer.encode(text, add_special_tokens=False)[0]] = bonus
    scores[0, smol_tokenizer.eos_token_id] = 2.0
    out = decode_loop(hook, scores, max_steps=200)
    assert hook.is_terminated() and len(out) < 40 and hook.guard_tripped
    validate(smol_tokenizer.decode(out, skip_special_tokens=True), spec)
    unguarded = ConstraintHook(compile(spec, smol_tokenizer), max_whitespace_run=None)
    assert len(decode_loop(unguarded, scores, max_steps=200)) == 200  # what the guard prevents


def test_constraint_starts_after_the_reasoning_ends(smol_tokenizer: Any) -> None:
    hook = ConstraintHook(compile(Choice(["yes", "no"]), smol_tokenizer), triggers=[THINK_END])
    for token in smol_tokenizer.encode("let me think about it", add_special_tokens=False):
        assert not hook.fill_bitmask(torch.full((hook.matcher.tokenizer.bitmask_words,), -1, dtype=torch.int32))
        hook.accept_token(token)
    assert not hook.active
    for token in smol_tokenizer.encode("</think>", add_special_tokens=False):
        hook.accept_token(token)
    assert hook.active
    row = torch.full((hook.matcher.tokenizer.bitmask_words,), -1, dtype=torch.int32)
    assert hook.fill_bitmask(row)
    no = smol_tokenizer.encode("no", add_special_tokens=False)[0]
    think = smol_tokenizer.encode("think", add_special_tokens=False)[0]
    assert (int(row[no // 32]) >> (no % 32)) & 1 and not (int(row[think // 32]) >> (think % 32)) & 1


def test_a_forced_trigger_ends_endless_thinking(smol_tokenizer: Any) -> None:
    hook = ConstraintHook(compile(Choice(["yes", "no"]), smol_tokenizer), triggers=[THINK_END], force_trigger_after=5)
    scores = torch.zeros(1, hook.matcher.vocab_size)
    scores[0, smol_tokenizer.encode("hmm", add_special_tokens=False)[0]] = 9.0
    scores[0, smol_tokenizer.encode("yes", add_special_tokens=False)[0]] = 1.0
    scores[0, smol_tokenizer.eos_token_id] = 0.5
    text = smol_tokenizer.decode(decode_loop(hook, scores, max_steps=50))
    assert text.split("</think>")[1].replace("<|im_end|>", "") == "yes" and hook.is_terminated()


def test_tool_call_trigger_feeds_the_opening_tag(smol_tokenizer: Any) -> None:
    tools = [ToolSpec(name="ping", parameters={"type": "object", "properties": {}})]
    hook = ConstraintHook(compile(ToolCalls(tools), smol_tokenizer), triggers=[TOOL_CALL_OPEN])
    for token in smol_tokenizer.encode("Sure.<tool_call>", add_special_tokens=False):
        hook.accept_token(token)
    assert hook.active and hook.violations == 0
    for token in smol_tokenizer.encode('{"name":"ping","arguments":{}}</tool_call>', add_special_tokens=False):
        hook.accept_token(token)
    assert hook.violations == 0 and hook.matcher.is_completed()


def test_harmony_commentary_header_is_a_regex_trigger(smol_tokenizer: Any) -> None:
    from parley.constrained.hook import HARMONY_COMMENTARY

    hook = ConstraintHook(compile(JsonSchema({"type": "integer"}), smol_tokenizer), triggers=[HARMONY_COMMENTARY])
    header = "<|channel|>commentary to=functions.add <|constrain|>json<|message|>"
    for token in smol_tokenizer.encode("<|channel|>analysis<|message|>thinking" + header, add_special_tokens=False):
        hook.accept_token(token)
    assert hook.active and hook.violations == 0
    for token in smol_tokenizer.encode("42", add_special_tokens=False):
        hook.accept_token(token)
    assert hook.matcher.is_completed()
