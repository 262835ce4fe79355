"""A fast stand-in for the engine: byte-level tokenizer, scripted replies, block and prefix-cache ledgers.

It honours the parts of the engine contract the server relies on — hooks (forced tokens), tenant
salts in prefix-cache keys, admission errors at submission, `abort` returning blocks at once — so
the HTTP layer's behaviour can be specified without loading weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from parley.local_engine.errors import AdmissionError, RequestAborted

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
BASE = 256
BLOCK = 16


class ByteTokenizer:
    """Bytes are ids 0..255; the ChatML specials follow. Duck-types what the codec and server call."""

    chat_template = None
    all_special_tokens = SPECIALS
    all_special_ids = [BASE + i for i in range(len(SPECIALS))]
    eos_token = "<|im_end|>"
    eos_token_id = BASE + 1

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            if not split_special_tokens:
                hit = next((s for s in SPECIALS if text.startswith(s, i)), None)
                if hit is not None:
                    ids.append(BASE + SPECIALS.index(hit))
                    i += len(hit)
                    continue
            ids.extend(text[i].encode("utf-8"))
            i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out = b""
        for t in ids:
            if t >= BASE:
                if not skip_special_tokens:
                    out += SPECIALS[t - BASE].encode()
            else:
                out += bytes([t])
        return out.decode("utf-8", errors="replace")

    def convert_tokens_to_ids(self, token: str) -> int:
        return BASE + SPECIALS.index(token) if token in SPECIALS else ord(token[0])

    def convert_ids_to_tokens(self, ids: Any) -> Any:
        if isinstance(ids, int):
            return SPECIALS[ids - BASE] if ids >= BASE else chr(ids)
        return [self.convert_ids_to_tokens(i) for i in ids]

    def __len__(self) -> int:
        return BASE + len(SPECIALS)


@dataclass(frozen=True)
class Delta:
    request_id: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None = None
    tpot_s: float | None = None
    logprobs: Any = None


class FakeEngine:
    """Replies with `reply` (one token per step, `step_s` apart), then `<|im_end|>`."""

    model_id = "fake-model"

    def __init__(self, reply: str = "Hello from the fake engine.", *, step_s: float = 0.0, max_model_len: int = 2048):
        self.tokenizer = ByteTokenizer()
        self.reply = reply
        self.step_s = step_s
        self.max_model_len = max_model_len
        self.refuse: AdmissionError | None = None
        self.drop_after: int | None = None
        """Raise `RequestAborted` (the engine's past-deadline drop) after this many tokens."""
        self.blocks_used = 0
        self.active: dict[str, int] = {}
        self.aborted: list[str] = []
        self.cache: set[tuple[str, tuple[int, ...]]] = set()
        self.queries = 0
        self.hits = 0
        self.last_params: Any = None
        self.last_tenant: str | None = None
        self.last_deadline: float | None = None
        self.last_prompt: list[int] = []

    def stats(self) -> dict[str, Any]:
        return {
            "blocks_used": self.blocks_used,
            "blocks_free": 1000 - self.blocks_used,
            "prefix_cache_queries": self.queries,
            "prefix_cache_hits": self.hits,
            "num_waiting": 0,
            "num_running": len(self.active),
        }

    def _cached(self, prompt: list[int], tenant: str | None) -> int:
        full = (len(prompt) - 1) // BLOCK  # the last prompt token is always computed
        hit = 0
        for n in range(1, full + 1):
            if (tenant or "", tuple(prompt[: n * BLOCK])) in self.cache:
                hit = n * BLOCK
        for n in range(1, full + 1):
            self.cache.add((tenant or "", tuple(prompt[: n * BLOCK])))
        self.queries += len(prompt)
        self.hits += hit
        return hit

    def _release(self, request_id: str) -> None:
        self.blocks_used -= self.active.pop(request_id, 0)

    async def stream(
        self,
        prompt_ids: list[int],
        params: Any,
        *,
        hooks: Any = None,
        tenant: str | None = None,
        request_id: str | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[Delta]:
        rid = request_id or "r"
        self.last_params, self.last_tenant, self.last_deadline, self.last_prompt = (
            params,
            tenant,
            deadline_s,
            prompt_ids,
        )
        if self.refuse is not None:
            raise self.refuse
        cached = self._cached(prompt_ids, tenant)
        self.active[rid] = -(-len(prompt_ids) // BLOCK)
        self.blocks_used += self.active[rid]
        script = self.tokenizer.encode(self.reply)
        produced = 0
        try:
            first = True
            while True:
                if rid in self.aborted:
                    return
                if self.drop_after is not None and produced >= self.drop_after:
                    raise RequestAborted(f"request {rid!r} dropped: past its deadline")
                forced = hooks.forced_token() if hooks is not None else None
                if forced is not None:
                    token = forced
                elif script:
                    token = script.pop(0)
                else:
                    token = self.tokenizer.eos_token_id
                if hooks is not None:
                    hooks.accept_token(token)
                produced += 1
                if self.step_s:
                    await asyncio.sleep(self.step_s)
                else:
                    await asyncio.sleep(0)
                stop = token in params.stop_token_ids or (hooks is not None and hooks.is_terminated())
                length = produced >= params.max_tokens
                finished = stop or length
                ids = () if token in params.stop_token_ids else (token,)
                yield Delta(
                    rid,
                    ids,
                    finished,
                    ("stop" if stop else "length") if finished else None,
                    len(prompt_ids),
                    cached,
                    0.001 if first else None,
                )
                first = False
                if finished:
                    return
        finally:
            self._release(rid)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._release(request_id)
