"""The prompt-family seam: `codec_for` picks a family, and the turn reads only the `PromptFamily` contract.

No weights and no vocabulary files: the tokenizers are stand-ins shaped like the real ones where
the rule looks (Harmony's special tokens at their ids), so these run everywhere.
"""

from __future__ import annotations

import pytest

from parley.backends import ModelRequest
from parley.backends.errors import LocalRequestError
from parley.backends.local.chat_template import ChatTemplatePrompts
from parley.backends.local.codec import codec_for
from parley.backends.local.harmony import HarmonyPrompts
from parley.backends.local.turn import LocalTurn, TurnOptions
from parley.constrained import Regex, Trigger
from parley.local_engine.testing import ByteTokenizer, FakeEngine
from parley.protocol import ChatTemplateCodec, Conversation, Message
from parley.protocol import harmony as harmony_protocol


class HarmonyShapedTokenizer(ByteTokenizer):
    """Harmony's specials at their o200k_harmony ids: what `codec_for` reads to pick Harmony."""

    def convert_tokens_to_ids(self, token: str) -> int:
        return harmony_protocol.SPECIAL_TOKENS.get(token, 0)


def test_a_harmony_tokenizer_gets_harmony_and_any_other_a_chat_template() -> None:
    assert isinstance(codec_for(HarmonyShapedTokenizer()), HarmonyPrompts)
    assert isinstance(codec_for(ByteTokenizer()), ChatTemplatePrompts)


def test_the_model_type_picks_harmony_even_before_the_tokenizer_is_read() -> None:
    from parley.protocol.errors import CodecConfigError

    assert isinstance(codec_for(HarmonyShapedTokenizer(), model_type="gpt_oss"), HarmonyPrompts)
    with pytest.raises(CodecConfigError, match="o200k_harmony"):  # gpt-oss with a tokenizer that is not Harmony's
        codec_for(ByteTokenizer(), model_type="gpt_oss")


def test_families_state_where_a_text_grammar_starts() -> None:
    chat = ChatTemplatePrompts(ChatTemplateCodec.for_tokenizer(ByteTokenizer()))
    assert chat.answer_triggers(reasoning=False) == ()
    assert [t.text for t in chat.answer_triggers(reasoning=True)] == ["</think>"]
    assert HarmonyPrompts(HarmonyShapedTokenizer()).answer_triggers(reasoning=True) is None


class NoTextGrammar:
    """A family whose answer a text grammar cannot see (as Harmony's, inside channel headers)."""

    def __init__(self) -> None:
        self.inner = ChatTemplatePrompts(ChatTemplateCodec.for_tokenizer(ByteTokenizer()))
        self.stop_token_ids = self.inner.stop_token_ids
        self.render, self.parser = self.inner.render, self.inner.parser
        self.call_as_text, self.build_hooks = self.inner.call_as_text, self.inner.build_hooks

    def answer_triggers(self, *, reasoning: bool) -> tuple[Trigger, ...] | None:
        return None


def test_the_turn_refuses_a_text_constraint_for_a_family_without_answer_triggers() -> None:
    family = NoTextGrammar()
    request = ModelRequest(conversation=Conversation(messages=[Message.user("hi")]))
    with pytest.raises(LocalRequestError) as caught:
        LocalTurn(FakeEngine(), family, request, TurnOptions(constraint=Regex("a+")))
    assert (caught.value.field, caught.value.code) == ("output_constraint", "unsupported_value")
