"""`codec_for`: which prompt family a model's tokenizer belongs to, decided in one place.

The backend, the server and the benchmarks all ask here, so a model is never rendered in one
family by one caller and in another by the next. The rule:

* **Harmony** (gpt-oss): an `o200k_harmony` tokenizer (Harmony's specials at their ids), or
  ``model_type="gpt_oss"`` -> `parley.backends.local.harmony.HarmonyPrompts`;
* otherwise the tokenizer's chat template -> `parley.backends.local.chat_template.ChatTemplatePrompts`.
"""

from __future__ import annotations

from parley.backends.local.chat_template import ChatTemplatePrompts
from parley.backends.local.family import PromptFamily
from parley.local_engine.tokenizer import Tokenizer
from parley.protocol.chat_template import ChatTemplateCodec

HARMONY_MODEL_TYPES = frozenset({"gpt_oss"})


def codec_for(tokenizer: Tokenizer, *, model_type: str | None = None) -> PromptFamily:
    """The family this tokenizer (and, when known, the model's `model_type`) belongs to."""
    from parley.backends.local.harmony_tokenizer import is_harmony_tokenizer

    if model_type in HARMONY_MODEL_TYPES or is_harmony_tokenizer(tokenizer):
        from parley.backends.local.harmony import HarmonyPrompts

        return HarmonyPrompts(tokenizer)
    return ChatTemplatePrompts(ChatTemplateCodec.for_tokenizer(tokenizer))
