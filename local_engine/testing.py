"""A fake engine for tests of code that drives the engine (like httpx's `MockTransport`).

`FakeEngine` replies with scripted text, token by token, and plays the engine's side of every
contract a caller relies on, so an agent, a server or a tool loop can be specified in
milliseconds without weights:

* **hooks** are driven as the sampler drives them: a forced token replaces the scripted one, the
  bitmask is filled and a scripted token it forbids is recorded in `rejected` (the real engine
  would never have sampled it), every token is accepted, `is_terminated()` ends the request;
* **stop ids** (`SamplingParams.stop_token_ids`) end a request with reason ``stop`` and are not
  emitted; after its script a request ends with the first stop id; `max_tokens` gives ``length``;
* **prefix cache**: full 16-token blocks are remembered per tenant salt, and a later prompt with
  the same blocks reports them as `cached_tokens` (the last prompt token is always computed);
* **admission and drops**: set `refuse` to an `AdmissionError` (`QueueFullError`, `DeadlineUnreachableError`)
  to refuse at submission, and
  `drop_after` to raise `RequestAborted` (the engine's past-deadline drop) after N tokens;
* **abort** returns a request's blocks at once (`stats()["blocks_used"]`).

`ByteTokenizer` (bytes are ids 0..255, then the ChatML specials) is the default tokenizer; pass a
real one (`tokenizer=`) to test rendering and grammars against a real vocabulary.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from parley.local_engine.config import SamplingParams
from parley.local_engine.errors import AdmissionError, EngineError, RequestAborted
from parley.local_engine.hooks import ComposedHook, TokenHook
from parley.local_engine.outputs import FinishReason, StreamDelta
from parley.local_engine.tokenizer import Tokenizer

__all__ = ["ByteTokenizer", "FakeEngine", "Submission"]

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
BYTE_IDS = 256
BLOCK = 16

Replies = str | Sequence[str] | Callable[[list[int]], str]


class ByteTokenizer:
    """Bytes are ids 0..255; the ChatML specials follow. Duck-types what codecs and the server call."""

    chat_template = None
    all_special_tokens = list(SPECIALS)
    all_special_ids = [BYTE_IDS + i for i in range(len(SPECIALS))]
    eos_token = "<|im_end|>"
    eos_token_id = BYTE_IDS + 1

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            if not split_special_tokens:
                hit = next((s for s in SPECIALS if text.startswith(s, i)), None)
                if hit is not None:
                    ids.append(BYTE_IDS + SPECIALS.index(hit))
                    i += len(hit)
                    continue
            ids.extend(text[i].encode("utf-8"))
            i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out = b""
        for t in ids:
            if t >= BYTE_IDS:
                if not skip_special_tokens:
                    out += SPECIALS[t - BYTE_IDS].encode()
            else:
                out += bytes([t])
        return out.decode("utf-8", errors="replace")

    def convert_tokens_to_ids(self, token: str) -> int:
        return BYTE_IDS + SPECIALS.index(token) if token in SPECIALS else ord(token[0])

    def convert_ids_to_tokens(self, ids: Any) -> Any:
        if isinstance(ids, int):
            return SPECIALS[ids - BYTE_IDS] if ids >= BYTE_IDS else chr(ids)
        return [self.convert_ids_to_tokens(i) for i in ids]

    def __len__(self) -> int:
        return BYTE_IDS + len(SPECIALS)


@dataclass(frozen=True)
class Submission:
    """What one request sent the engine."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    hook: TokenHook | None
    tenant: str | None
    deadline_s: float | None


class FakeEngine:
    """Replies with scripted text (see the module docstring); an `EnginePort` like `Engine`.

    `replies`: one text for every request, a list (request n gets the n-th; running out is an
    `EngineError`), or a function of the prompt ids. `step_s` paces the tokens.
    """

    def __init__(
        self,
        replies: Replies = "Hello from the fake engine.",
        *,
        tokenizer: Tokenizer | None = None,
        vocab_size: int | None = None,
        step_s: float = 0.0,
        max_model_len: int = 2048,
        model_id: str = "fake-model",
        model_name: str = "fake-model",
        cached_tokens: int | None = None,
    ) -> None:
        self.tokenizer: Tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.vocab_size = vocab_size if vocab_size is not None else len(self.tokenizer)
        self.replies = replies
        self.step_s = step_s
        self.max_model_len = max_model_len
        self.model_id = model_id
        self.model_name = model_name
        self.mode = "fake"
        self.fixed_cached_tokens = cached_tokens
        """Report this many cached prompt tokens instead of the ledger's figure."""
        self.refuse: AdmissionError | None = None
        self.drop_after: int | None = None
        self.submissions: list[Submission] = []
        self.rejected: list[int] = []
        """Scripted tokens a hook's mask forbade (the real sampler could not have chosen them)."""
        self.aborted: list[str] = []
        self.active: dict[str, int] = {}
        self.blocks_used = 0
        self._cache: set[tuple[str, tuple[int, ...]]] = set()
        self._queries = 0
        self._hits = 0
        self._count = 0

    # -- what tests read -----------------------------------------------------------------------
    @property
    def last(self) -> Submission:
        """The latest submission."""
        if not self.submissions:
            raise AssertionError("FakeEngine: nothing was submitted")
        return self.submissions[-1]

    def stats(self) -> dict[str, Any]:
        return {
            "blocks_used": self.blocks_used,
            "blocks_free": 1000 - self.blocks_used,
            "prefix_cache_queries": self._queries,
            "prefix_cache_hits": self._hits,
            "num_waiting": 0,
            "num_running": len(self.active),
        }

    # -- the engine contract -------------------------------------------------------------------
    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._release(request_id)

    async def stream(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        hooks: TokenHook | Sequence[TokenHook] | None = None,
        tenant: str | None = None,
        request_id: str | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[StreamDelta]:
        params = params or SamplingParams()
        hook = ComposedHook(list(hooks)) if isinstance(hooks, Sequence) else hooks
        prompt = [int(t) for t in prompt_ids]
        rid = request_id or f"fake-{self._count}"
        self.submissions.append(Submission(rid, prompt, params, hook, tenant, deadline_s))
        if self.refuse is not None:
            raise self.refuse
        script = list(self.tokenizer.encode(self._reply_for(prompt), add_special_tokens=False))
        cached = self._cached(prompt, tenant)
        self.active[rid] = -(-len(prompt) // BLOCK)
        self.blocks_used += self.active[rid]
        produced = 0
        try:
            while rid not in self.aborted:
                if self.drop_after is not None and produced >= self.drop_after:
                    raise RequestAborted(f"request {rid!r} dropped: past its deadline")
                token = self._next_token(script, params, hook)
                produced += 1
                await asyncio.sleep(self.step_s)
                stop = token in params.stop_token_ids or (hook is not None and hook.is_terminated())
                finished = stop or produced >= params.max_tokens or token < 0
                ids = () if token < 0 or token in params.stop_token_ids else (token,)
                reason: FinishReason | None = ("stop" if stop or token < 0 else "length") if finished else None
                yield StreamDelta(rid, ids, finished, reason, len(prompt), cached, 0.001 if produced == 1 else None)
                if finished:
                    return
        finally:
            self._release(rid)

    # -- internals -------------------------------------------------------------------------------
    def _reply_for(self, prompt: list[int]) -> str:
        index, self._count = self._count, self._count + 1
        if isinstance(self.replies, str):
            return self.replies
        if callable(self.replies):
            return self.replies(prompt)
        if index >= len(self.replies):
            raise EngineError(f"FakeEngine: request {index + 1} has no scripted reply ({len(self.replies)} given)")
        return self.replies[index]

    def _next_token(self, script: list[int], params: SamplingParams, hook: TokenHook | None) -> int:
        """The scripted token (or, past the script, the first stop id; -1 when there is none)."""
        end = params.stop_token_ids[0] if params.stop_token_ids else -1
        token = script.pop(0) if script else end
        if hook is None:
            return token
        forced = hook.forced_token()
        if forced is not None:
            token = forced
        elif token >= 0:
            import torch

            row = torch.full(((self.vocab_size + 31) // 32,), -1, dtype=torch.int32)
            if hook.fill_bitmask(row) and not (int(row[token // 32]) >> (token % 32)) & 1:
                self.rejected.append(token)
        if token >= 0:
            hook.accept_token(token)
        return token

    def _cached(self, prompt: list[int], tenant: str | None) -> int:
        full = (len(prompt) - 1) // BLOCK  # the last prompt token is always computed
        hit = 0
        for n in range(1, full + 1):
            if (tenant or "", tuple(prompt[: n * BLOCK])) in self._cache:
                hit = n * BLOCK
        for n in range(1, full + 1):
            self._cache.add((tenant or "", tuple(prompt[: n * BLOCK])))
        self._queries += len(prompt)
        self._hits += hit
        return hit if self.fixed_cached_tokens is None else self.fixed_cached_tokens

    def _release(self, request_id: str) -> None:
        self.blocks_used -= self.active.pop(request_id, 0)
