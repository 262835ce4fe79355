"""Bad configs, models and inputs driven through the public API: every failure is a typed `ParleyError`.

No embedded model needed: model folders are built in `tmp_path` from tiny random Llama configs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from parley.errors import (
    CodecConfigError,
    EngineConfigError,
    InvalidArgumentsError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    OrphanToolResultError,
    ParleyError,
    ParseError,
    UnencodableTextError,
    UnknownRoleError,
)
from parley.protocol import Message, ToolCall
from parley.protocol.chat_template import ChatTemplateCodec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from parley.local_engine import Engine, EngineConfig, SamplingParams  # noqa: E402

TINY: dict[str, Any] = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)


def _tiny_state() -> dict[str, Any]:
    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def model_folder(tmp_path: Path, *, config: dict[str, Any] | None = None, state: dict[str, Any] | None = None,
                 drop: tuple[str, ...] = (), raw_config: str | None = None) -> Path:
    """A HF-style folder: config.json (TINY with `config` merged; None values removed) and model.safetensors."""
    from safetensors.torch import save_file

    folder = tmp_path / "tiny-llama"
    folder.mkdir(exist_ok=True)
    merged = {k: v for k, v in {**TINY, **(config or {})}.items() if v is not None}
    (folder / "config.json").write_text(raw_config if raw_config is not None else json.dumps(merged))
    weights = state if state is not None else _tiny_state()
    save_file({k: v for k, v in weights.items() if k not in drop}, str(folder / "model.safetensors"))
    return folder


def raises(kind: type[ParleyError], call: Any, *args: Any, match: str | None = None, **kwargs: Any) -> ParleyError:
    with pytest.raises(kind, match=match) as info:
        call(*args, **kwargs)
    assert isinstance(info.value, ParleyError)
    return info.value


# -- Engine.from_pretrained ------------------------------------------------------------------------
def test_a_missing_model_is_model_not_found(tmp_path: Path) -> None:
    raises(ModelNotFoundError, Engine.from_pretrained, tmp_path / "nowhere", device="cpu")
    raises(ModelNotFoundError, Engine.from_pretrained, tmp_path, device="cpu")  # a folder with nothing in it


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "architecture 'gpt2' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_scaling\.rope_type 'yarn' is not supported"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"rope_scaling\.rope_type 'dynamic'"),
        ({"rope_parameters": {"rope_type": "longrope", "factor": 2.0}}, r"rope_parameters\.rope_type 'longrope'"),
        ({"rope_scaling": {"rope_type": "linear"}}, "needs a 'factor'"),
        ({"rope_scaling": "big"}, "rope_scaling must be an object"),
        ({"hidden_size": None}, "no 'hidden_size'"),
        ({"num_attention_heads": "many"}, "cannot use"),
        ({"num_attention_heads": 0}, "cannot use|must be >= 1"),
        ({"num_key_value_heads": 3, "num_attention_heads": 2}, "not a multiple"),
        ({"vocab_size": 65}, r"'model\.embed_tokens\.weight' has shape \(64, 16\)"),
        ({"intermediate_size": 48}, r"mlp\.gate_proj\.weight' has shape"),
    ],
)
def test_an_unsupported_or_inconsistent_config_is_a_model_load_error(
    tmp_path: Path, config: dict[str, Any], match: str
) -> None:
    folder = model_folder(tmp_path, config=config)
    raises(ModelLoadError, Engine.from_pretrained, folder, device="cpu", match=match)


def test_a_missing_tensor_is_a_model_load_error_naming_it(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, drop=("model.layers.0.mlp.down_proj.weight",))
    raises(ModelLoadError, Engine.from_pretrained, folder, device="cpu", match="model.layers.0.mlp.down_proj.weight")


@pytest.mark.parametrize("raw", ["{not json", "[1, 2, 3]"])
def test_an_unreadable_config_is_a_model_load_error(tmp_path: Path, raw: str) -> None:
    folder = model_folder(tmp_path, raw_config=raw)
    raises(ModelLoadError, Engine.from_pretrained, folder, device="cpu", match="config.json")


def test_unreadable_or_absent_weights_are_a_model_load_error(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x00\x01 not a safetensors file")
    raises(ModelLoadError, Engine.from_pretrained, folder, device="cpu", match="cannot read the weights")
    (folder / "model.safetensors").unlink()
    raises(ModelLoadError, Engine.from_pretrained, folder, device="cpu", match="no weights")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"dtype": "int3"}, "unsupported dtype"), ({"device": "toaster"}, "unsupported device")],
)
def test_a_bad_device_or_dtype_is_an_engine_config_error(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    error = raises(EngineConfigError, Engine.from_pretrained, tmp_path, **kwargs, match=match)
    assert isinstance(error, ValueError)


def test_cuda_without_cuda_is_an_engine_config_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    raises(EngineConfigError, Engine.from_pretrained, tmp_path, device="cuda", match="CUDA")


# -- EngineConfig, SamplingParams ------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"block_size": "16"},
        {"block_size": True},
        {"num_kv_blocks": 0},
        {"kv_cache_bytes": -1},
        {"max_num_batched_tokens": 0},
        {"max_num_seqs": 0},
        {"max_waiting": -1},
        {"max_model_len": 0},
        {"num_threads": 0},
        {"num_threads": 1.5},
        {"enable_prefix_caching": "yes"},
    ],
)
def test_bad_engine_config_values_are_engine_config_errors_naming_the_field(kwargs: dict[str, Any]) -> None:
    (field,) = kwargs
    error = raises(EngineConfigError, EngineConfig, **kwargs, match=f"EngineConfig.{field}")
    assert isinstance(error, ValueError)  # what EngineConfig raised before: callers catching it still do


def test_good_engine_config_values_pass() -> None:
    EngineConfig(num_kv_blocks=4, max_waiting=0, max_model_len=16, num_threads=1, enable_prefix_caching=False)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_k": -1},
        {"logprobs": 21},
        {"seed": "x"},
        {"min_tokens": -1},
        {"stop": [""]},
    ],
)
def test_bad_sampling_params_are_invalid_request_errors(kwargs: dict[str, Any]) -> None:
    raises(InvalidRequestError, SamplingParams, **kwargs)


# -- the chat-template codec -----------------------------------------------------------------------
class SurrogateRefusingTokenizer:
    """Encodes UTF-8 bytes; refuses what UTF-8 cannot hold with a TypeError, as HF fast tokenizers do."""

    chat_template = None
    all_special_tokens: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> list[int]:
        try:
            return list(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, ...]") from None


def test_bad_conversations_are_protocol_errors_of_their_kind() -> None:
    codec = ChatTemplateCodec(SurrogateRefusingTokenizer())
    bad_role = Message.model_construct(role="wizard", parts=[])
    raises(UnknownRoleError, codec.render_ids, [bad_role])
    raises(OrphanToolResultError, codec.render_ids, [Message.user("hi"), Message.tool("call_9", "f", "42")])
    bad_args = Message.assistant("", tool_calls=[ToolCall(id="c", name="f", arguments="[1, 2]")])
    raises(InvalidArgumentsError, codec.render_ids, [Message.user("hi"), bad_args])
    error = raises(UnencodableTextError, codec.render_ids, [Message.user("a\ud800b")], match=r"messages\[0\]\.content")
    assert isinstance(error, UnencodableTextError) and error.where == "messages[0].content" and error.position == 1
    raises(UnencodableTextError, codec.encode, "\udfff", match="lone surrogate U\\+DFFF")
    raises(ParseError, codec.parse, "<tool_call>\nnot json\n</tool_call>")


def test_a_codec_missing_what_it_needs_is_a_codec_config_error() -> None:
    raises(CodecConfigError, ChatTemplateCodec(None).render_ids, [Message.user("hi")], match="needs a tokenizer")
    raises(CodecConfigError, ChatTemplateCodec, SurrogateRefusingTokenizer(), style="native", match="chat_template")
    error = raises(CodecConfigError, ChatTemplateCodec, None, style="jinja")  # type: ignore[arg-type]
    assert isinstance(error, ValueError)  # what the codec raised before
