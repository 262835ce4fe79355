"""Loading every family from disk, and failing closed.

- `Engine.from_pretrained` on folders written by HF's own `save_pretrained`: one file or sharded with an
  index, fp32/bf16/fp16 weights, each family; tokens equal HF's own model loaded from the same folder.
- Every config field that changes the computation and that parley does not implement is refused at load,
  naming the field; unknown architectures, missing, misshapen and unused tensors are `ModelLoadError`s
  naming the tensor or field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.local_engine.families import (
    LLAMA3_ROPE,
    hf_greedy,
    hf_logits,
    hf_model,
    logits_every_position,
    parity,
    prompts_of,
)
from tests.local_engine.gguf_writer import round_experts_to_mxfp4, write_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from parley.local_engine import Engine, EngineConfig, ModelLoadError, SamplingParams  # noqa: E402
from parley.local_engine.models import registry  # noqa: E402

SMALL = EngineConfig(num_kv_blocks=64, block_size=4, max_num_batched_tokens=16, quantization=None)  # HF parity: fp32


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary ("t0".."t511"), so the folder is complete."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(512)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="t1", eos_token="t2", pad_token="t0")
    fast.save_pretrained(str(folder))


def saved(hf: Any, folder: Path, *, dtype: Any = None, shard: str | None = None) -> Path:
    model = hf if dtype is None else hf.to(dtype)
    model.save_pretrained(str(folder), **({"max_shard_size": shard} if shard else {}))
    write_tokenizer(folder)
    return folder


@pytest.mark.parametrize("family", ["llama3", "mistral", "qwen2.5-untied", "qwen3", "qwen3-moe", "gpt-oss"])
def test_a_save_pretrained_folder_loads_and_matches_hf(tmp_path: Path, family: str) -> None:
    folder = saved(hf_model(family), tmp_path / family)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    engine = Engine.from_pretrained(folder, device="cpu", dtype="float32", config=SMALL)
    try:
        assert engine.model_name == family and 2 in engine.eos_token_ids
        assert engine.stats()["model_type"] == ref.config.model_type
        prompts = prompts_of([9, 30], seed=7)
        outs = engine.generate(prompts, SamplingParams(max_tokens=16, min_tokens=16))
        assert [o.token_ids for o in outs] == [hf_greedy(ref, p, 16) for p in prompts]
    finally:
        engine.close()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sharded_half_precision_weights_load_through_the_index(tmp_path: Path, dtype: str) -> None:
    folder = saved(hf_model("qwen2-tied"), tmp_path / "sharded", dtype=getattr(torch, dtype), shard="60KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2 and (folder / "model.safetensors.index.json").is_file()
    torch.save({}, folder / "unrelated.bin")  # the index decides, not a glob
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    engine = Engine.from_pretrained(folder, device="cpu", dtype="float32", config=SMALL)
    try:
        prompt = prompts_of([33], seed=8)[0]
        abs_diff, rel_diff = parity(logits_every_position(engine.model, prompt, [33]), hf_logits(ref, prompt))
        assert rel_diff <= 1e-4, (abs_diff, rel_diff)
    finally:
        engine.close()
    shards[1].unlink()
    with pytest.raises(ModelLoadError, match=shards[1].name):
        Engine.from_pretrained(folder, device="cpu", dtype="float32", config=SMALL)


def test_mistrals_consolidated_file_is_not_read_beside_hf_shards(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = saved(hf_model("mistral"), tmp_path / "mistral")
    save_file({"layers.0.attention.wq.weight": torch.zeros(4, 4)}, str(folder / "consolidated.safetensors"))
    engine = Engine.from_pretrained(folder, device="cpu", dtype="float32", config=SMALL)
    engine.close()


# -- failing closed ------------------------------------------------------------------------------------
def config_of(family: str, **changes: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = hf_model(family).config.to_dict()
    for key, value in changes.items():
        if value is _DROP:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


_DROP = object()
_ROPE = {"rope_theta": 10000.0}

REFUSED = [
    ("llama3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("qwen3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ("llama3", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("qwen2-tied", {"hidden_act": "relu"}, "hidden_act 'relu'"),
    ("llama3", {"rope_parameters": {**_ROPE, "rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
    ("qwen3", {"rope_parameters": {**_ROPE, "rope_type": "longrope", "factor": 2.0}}, "rope_type 'longrope'"),
    ("llama3", {"rope_parameters": {**_ROPE, "rope_type": "default", "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ("qwen2-tied", {"rope_parameters": {**_ROPE, "rope_type": "default", "mrope_section": [2, 3, 3]}},
     "mrope_section"),
    ("llama3", {"rope_parameters": {**_ROPE, "rope_type": "yarn", "factor": 4.0}}, "original_max_position_embeddings"),
    ("llama3", {"rope_parameters": {**_ROPE, "rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 64}}, "low_freq_factor"),
    ("llama3", {"sliding_window": 16}, "sliding_window"),
    ("llama3", {"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, "layer_types"),
    ("mistral", {"layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}, "layer_types"),
    ("qwen2-tied", {"use_sliding_window": True, "sliding_window": None,
                    "layer_types": ["sliding_attention"] * 3}, "sliding_window is null"),
    ("qwen3", {"layer_types": ["chunked_attention"] * 3}, r"layer_types\[0\] = 'chunked_attention'"),
    ("qwen3-moe", {"shared_expert_intermediate_size": 64}, "shared_expert_intermediate_size"),
    ("qwen2-tied", {"num_experts": 4}, "num_experts"),
    ("mistral", {"attention_bias": True}, "attention_bias"),
    ("qwen2-tied", {"mlp_bias": True}, "mlp_bias"),
    ("llama3", {"embedding_multiplier": 12.0}, "embedding_multiplier"),
    ("llama3", {"query_pre_attn_scalar": 64}, "query_pre_attn_scalar"),
    ("llama3", {"use_qk_norm": True}, "use_qk_norm"),
    ("llama3", {"no_rope_layers": [1, 0, 1]}, "no_rope_layers"),
    ("llama3", {"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization_config"),
    ("gpt-oss", {"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ("llama3", {"model_type": "gemma2"}, "architecture 'gemma2' is not supported"),
    ("llama3", {"model_type": _DROP, "architectures": ["MambaForCausalLM"]}, "is not supported"),
    ("qwen3", {"num_key_value_heads": 3}, "not a multiple"),
    ("qwen3-moe", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("gpt-oss", {"layer_types": ["sliding_attention", "full_attention"]}, "describes 2 layers"),
]


@pytest.mark.parametrize(("family", "changes", "match"), REFUSED, ids=[m for _, _, m in REFUSED])
def test_a_field_parley_does_not_implement_is_refused_naming_it(family: str, changes: dict[str, Any],
                                                                 match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        registry.architecture(config_of(family, **changes))


def test_refusal_happens_in_from_pretrained_before_the_weights_are_read(tmp_path: Path) -> None:
    folder = saved(hf_model("mistral"), tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "attn_logit_softcapping": 50.0}))
    (folder / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(ModelLoadError, match="attn_logit_softcapping"):
        Engine.from_pretrained(folder, device="cpu", dtype="float32", config=SMALL)


def build(family: str, edit: Any) -> Any:
    hf = hf_model(family)
    state = dict(hf.state_dict())
    edit(state)
    return registry.build_model(hf.config.to_dict(), state, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize(
    ("family", "edit", "match"),
    [
        ("qwen2-tied", lambda sd: sd.pop("model.layers.1.self_attn.k_proj.bias"),
         "'model.layers.1.self_attn.k_proj.bias' missing"),
        ("qwen3", lambda sd: sd.pop("model.layers.0.self_attn.q_norm.weight"), "q_norm.weight' missing"),
        ("gpt-oss", lambda sd: sd.pop("model.layers.2.self_attn.sinks"), "self_attn.sinks' missing"),
        ("qwen3-moe", lambda sd: sd.update({"model.layers.0.mlp.gate.weight": torch.zeros(7, 64)}),
         r"'model.layers.0.mlp.gate.weight' has shape \(7, 64\)"),
        ("qwen2.5-untied", lambda sd: sd.pop("lm_head.weight"), "'lm_head.weight' missing"),
        ("llama3", lambda sd: sd.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}),
         "does not use: 'model.layers.0.self_attn.q_proj.bias'"),
        ("mistral", lambda sd: sd.update({"model.layers.0.mlp.experts.0.up_proj.weight": torch.zeros(1)}),
         "does not use: 'model.layers.0.mlp.experts.0.up_proj.weight'"),
    ],
    ids=["missing-bias", "missing-qk-norm", "missing-sinks", "router-shape", "untied-head", "unused-bias",
         "unused-expert"],
)
def test_a_missing_misshapen_or_unused_tensor_is_named(family: str, edit: Any, match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        build(family, edit)


# -- GGUF ----------------------------------------------------------------------------------------------
# Each family transformers' GGUF reader loads, written as llama.cpp writes it (gguf_writer.py): Llama with
# default, llama3 (llama.cpp's rope_freqs tensor) and linear rope, Mistral (an arch 'llama' file), Qwen2.5,
# Qwen3 (and with YaRN rope) and Qwen3-MoE (every layer MoE: llama.cpp's qwen3moe has no dense layers); and
# gpt-oss, which parley reads itself (gguf_gpt_oss.py), with fp32 and with MXFP4 experts. A gpt-oss GGUF has
# no field for the SwiGLU limit (llama.cpp hard-codes gpt-oss's 7.0), so the twin has 7.0, and its experts'
# gate/up weights are scaled up so that the clamps at 7 bite (they change the logits).
GPT_OSS_GGUF = {"swiglu_limit": 7.0}
GGUF_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt-oss": ("gpt-oss", GPT_OSS_GGUF),
    "gpt-oss-mxfp4": ("gpt-oss", GPT_OSS_GGUF),
    "llama": ("llama3", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "llama3-rope": ("llama3", {}),
    "llama3-rope-unscaled": ("llama3", {"rope_parameters": {**LLAMA3_ROPE, "factor": 1.0}}),  # rope_freqs all 1
    "llama-linear-rope": ("llama3", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "mistral": ("mistral", {"sliding_window": None}),
    "qwen2.5": ("qwen2.5-untied", {}),
    "qwen3": ("qwen3", {}),
    "qwen3-moe": ("qwen3-moe", {"mlp_only_layers": []}),
    "qwen3-yarn": ("qwen3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 128}}),
}


@pytest.mark.parametrize("family", sorted(GGUF_FAMILIES))
def test_a_gguf_round_trip_loads_and_matches_its_hf_twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         family: str) -> None:
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))
    base, overrides = GGUF_FAMILIES[family]
    hf = hf_model(base, **overrides)
    mxfp4 = family.endswith("-mxfp4")
    if base == "gpt-oss":
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if name.endswith("experts.gate_up_proj"):
                    p.mul_(4.0)
        if mxfp4:
            round_experts_to_mxfp4(hf)
    path = tmp_path / f"tiny-{family}.F32.gguf"
    eos = write_gguf(hf, path, name=f"tiny-{family}", mxfp4=mxfp4)
    engine = Engine.from_pretrained(path, device="cpu", dtype="float32", config=SMALL)
    try:
        assert engine.model_name == f"tiny-{family}" and eos in engine.eos_token_ids
        assert engine.stats()["model_type"] == ("llama" if family == "mistral" else hf.config.model_type)
        prompt = prompts_of([29], seed=10)[0]
        abs_diff, rel_diff = parity(logits_every_position(engine.model, prompt, [13, 16]), hf_logits(hf, prompt))
        assert rel_diff <= 1e-4, (abs_diff, rel_diff)
        prompts = prompts_of([6, 27], seed=9)
        outs = engine.generate(prompts, SamplingParams(max_tokens=16, min_tokens=16))
        hf.generation_config.eos_token_id = eos  # the GGUF's end token: both sides mask the same one
        assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 16) for p in prompts]
        assert engine.tokenizer.decode(engine.tokenizer.encode("Ab")) == "Ab"
    finally:
        engine.close()
    if base == "gpt-oss":
        from parley.local_engine import loader

        cfg = loader.load_config(loader.resolve(path).folder)
        assert cfg["swiglu_limit"] == 7.0 and cfg["layer_types"] == hf.config.layer_types
        assert cfg["rope_parameters"] == hf.config.rope_parameters
        assert ("quantization_config" in cfg) == mxfp4  # MXFP4 experts stay packed in the converted folder


def test_a_cache_an_older_converter_wrote_is_converted_again_when_it_would_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Llama-3 GGUF cached before rope_freqs was read back (default rope in its config.json) is redone."""
    from parley.local_engine import loader

    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny-llama3.F32.gguf"
    write_gguf(hf_model("llama3"), path, name="tiny-llama3")
    folder = loader.resolve(path).folder
    assert json.loads((folder / "config.json").read_text())["rope_parameters"]["rope_type"] == "llama3"
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "rope_parameters": {"rope_type": "default",
                                                                               "rope_theta": 10000.0}}))
    (folder / "parley-complete.json").write_text(json.dumps({"source": str(path)}))  # no converter version
    again = loader.resolve(path).folder
    assert json.loads((again / "config.json").read_text())["rope_parameters"]["rope_type"] == "llama3"
    # A file whose conversion has not changed keeps its folder; the marker is brought up to date.
    plain = tmp_path / "tiny-llama.F32.gguf"
    write_gguf(hf_model("llama3", rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), plain,
               name="tiny-llama")
    kept = loader.resolve(plain).folder
    (kept / "parley-complete.json").write_text(json.dumps({"source": str(plain)}))
    (kept / "model.safetensors").touch()
    before = (kept / "model.safetensors").stat().st_mtime_ns
    assert loader.resolve(plain).folder == kept and (kept / "model.safetensors").stat().st_mtime_ns == before
    assert json.loads((kept / "parley-complete.json").read_text())["converter"] >= 2


def _with_key(key: str | None, drop: str | None = None) -> Any:
    def edit(path: Path, out: Path) -> None:  # rewrite `path` with one more metadata key, or one tensor less
        import gguf

        reader = gguf.GGUFReader(str(path))
        w = gguf.GGUFWriter(str(out), str(reader.fields["general.architecture"].contents()))
        for name, f in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue
            w.add_key_value(name, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
        if key:
            w.add_uint32(key, 8)
        for t in reader.tensors:
            if t.name != drop:
                w.add_tensor(t.name, np_copy(t.data), raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return edit


def np_copy(data: Any) -> Any:
    import numpy as np

    return np.array(data)


REFUSED_GGUF = [
    ("gpt-oss-gating-key", "gpt-oss", GPT_OSS_GGUF, "gpt-oss.expert_gating_func",
     "metadata key 'gpt-oss.expert_gating_func' is not supported"),
    ("gpt-oss-window-pattern", "gpt-oss", GPT_OSS_GGUF, "gpt-oss.attention.sliding_window_pattern",
     "'gpt-oss.attention.sliding_window_pattern' = 8 is not gpt-oss's"),
    ("gpt-oss-no-sinks", "gpt-oss", GPT_OSS_GGUF, "-blk.1.attn_sinks.weight",
     "tensor 'blk.1.attn_sinks.weight' is missing"),
    ("mistral-arch", "mistral", {"sliding_window": None}, "mistral", "architecture 'mistral' is not supported"),
    ("phi3-arch", "llama3", {}, "phi3", "architecture 'phi3' is not supported"),
    ("llama-biases", "llama-biases", {}, None, "tensor 'blk.0.attn_q.bias' is not read"),
    ("qwen3-moe-dense-layer", "qwen3-moe", {}, None, "left 'model.layers.1.mlp.experts.down_proj' unset"),
    ("sliding-window-key", "qwen2.5-untied", {}, "qwen2.attention.sliding_window",
     "metadata key 'qwen2.attention.sliding_window' is not supported"),
]


@pytest.mark.parametrize(("case", "family", "overrides", "arch", "match"), REFUSED_GGUF,
                         ids=[c[0] for c in REFUSED_GGUF])
def test_a_gguf_transformers_cannot_load_faithfully_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, family: str, overrides: dict[str, Any],
    arch: str | None, match: str,
) -> None:
    """An arch 'mistral' file (gguf-py has no tensor names for it), an unknown architecture, a GGUF tensor the
    reader drops, a weight it leaves unset and a metadata key it ignores; for gpt-oss (read by parley), a key
    it does not read, a sliding-window pattern that is not llama.cpp's and a missing tensor: each a
    `ModelLoadError` naming it, and nothing cached."""
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))
    hf = hf_model(family, **overrides)
    path = tmp_path / f"{case}.gguf"
    drop = arch[1:] if arch and arch.startswith("-") else None  # "-NAME": that tensor left out
    key = arch if arch and "." in arch and not drop else None
    write_gguf(hf, path, name=case, arch=None if key or drop else arch)
    if key or drop:
        edited = tmp_path / f"{case}-edited.gguf"
        _with_key(key, drop)(path, edited)
        path = edited
    with pytest.raises(ModelLoadError, match=match):
        Engine.from_pretrained(path, device="cpu", dtype="float32", config=SMALL)
    models = tmp_path / "cache" / "models"
    assert not models.exists() or not [p for p in models.iterdir() if not p.name.startswith(".")]


def test_llama3_rope_is_recovered_from_llama_cpps_factor_tensor() -> None:
    """Llama 3.2's rope scaling, baked by llama.cpp into `rope_freqs.weight`, read back as its parameters."""
    import numpy as np

    from parley.local_engine import gguf_arch

    released = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    factors = np.float32(gguf_arch._llama3_factors(500000.0, 64, 32.0, 1.0, 4.0, 8192))
    assert gguf_arch.llama3_rope(factors, 500000.0, 64, "x.gguf") == released
    assert gguf_arch.llama3_rope(np.ones(32, np.float32), 500000.0, 64, "x.gguf") is None
    with pytest.raises(ModelLoadError, match="rope_freqs"):
        gguf_arch.llama3_rope(np.float32(np.linspace(1, 7, 32)), 500000.0, 64, "x.gguf")


# Shaped like the released checkpoints' config.json files (the fields that matter; no weights needed).
RELEASED: dict[str, dict[str, Any]] = {
    "Llama-3.2-1B-Instruct": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=False, attention_dropout=0.0,
        bos_token_id=128000, eos_token_id=[128001, 128008, 128009], head_dim=64, hidden_act="silu",
        hidden_size=2048, intermediate_size=8192, max_position_embeddings=131072, mlp_bias=False,
        num_attention_heads=32, num_hidden_layers=16, num_key_value_heads=8, pretraining_tp=1, rms_norm_eps=1e-05,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        rope_theta=500000.0, tie_word_embeddings=True, torch_dtype="bfloat16", vocab_size=128256),
    "Mistral-7B-v0.1": dict(
        architectures=["MistralForCausalLM"], model_type="mistral", bos_token_id=1, eos_token_id=2,
        hidden_act="silu", hidden_size=4096, intermediate_size=14336, max_position_embeddings=32768,
        num_attention_heads=32, num_hidden_layers=32, num_key_value_heads=8, rms_norm_eps=1e-05,
        rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False, vocab_size=32000),
    "Mistral-7B-Instruct-v0.3": dict(
        architectures=["MistralForCausalLM"], model_type="mistral", hidden_act="silu", hidden_size=4096,
        intermediate_size=14336, max_position_embeddings=32768, num_attention_heads=32, num_hidden_layers=32,
        num_key_value_heads=8, rms_norm_eps=1e-05, rope_theta=1000000.0, sliding_window=None, vocab_size=32768),
    "Qwen2.5-7B-Instruct": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", attention_dropout=0.0, bos_token_id=151643,
        eos_token_id=151645, hidden_act="silu", hidden_size=3584, intermediate_size=18944,
        max_position_embeddings=32768, max_window_layers=28, num_attention_heads=28, num_hidden_layers=28,
        num_key_value_heads=4, rms_norm_eps=1e-06, rope_theta=1000000.0, sliding_window=131072,
        tie_word_embeddings=False, use_sliding_window=False, vocab_size=152064),
    "Qwen3-8B": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", attention_bias=False, head_dim=128,
        hidden_act="silu", hidden_size=4096, intermediate_size=12288, max_position_embeddings=40960,
        max_window_layers=36, num_attention_heads=32, num_hidden_layers=36, num_key_value_heads=8,
        rms_norm_eps=1e-06, rope_scaling=None, rope_theta=1000000, sliding_window=None, use_sliding_window=False,
        tie_word_embeddings=False, vocab_size=151936),
    "Qwen3-30B-A3B": dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", attention_bias=False, decoder_sparse_step=1,
        head_dim=128, hidden_act="silu", hidden_size=2048, intermediate_size=6144, max_position_embeddings=40960,
        max_window_layers=48, mlp_only_layers=[], moe_intermediate_size=768, norm_topk_prob=True,
        num_attention_heads=32, num_experts=128, num_experts_per_tok=8, num_hidden_layers=48, num_key_value_heads=4,
        output_router_logits=False, rms_norm_eps=1e-06, rope_scaling=None, rope_theta=1000000.0,
        router_aux_loss_coef=0.001, sliding_window=None, use_sliding_window=False, tie_word_embeddings=False,
        vocab_size=151936),
    "gpt-oss-20b": dict(
        architectures=["GptOssForCausalLM"], model_type="gpt_oss", attention_bias=True, eos_token_id=200002,
        experts_per_token=4, head_dim=64, hidden_act="silu", hidden_size=2880, initial_context_length=4096,
        intermediate_size=2880, layer_types=["sliding_attention", "full_attention"] * 12,
        max_position_embeddings=131072, num_attention_heads=64, num_experts_per_tok=4, num_hidden_layers=24,
        num_key_value_heads=8, num_local_experts=32, pad_token_id=199999,
        quantization_config={"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                        "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
        rms_norm_eps=1e-05,
        rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                      "rope_type": "yarn", "truncate": False},
        rope_theta=150000, router_aux_loss_coef=0.9, sliding_window=128, swiglu_limit=7.0,
        tie_word_embeddings=False, vocab_size=201088),
}


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_the_released_configs_are_accepted_as_transformers_reads_them(name: str) -> None:
    cfg = RELEASED[name]
    family, arch = registry.architecture(cfg)
    hf_cfg = transformers.AutoConfig.for_model(**cfg)  # transformers' own reading of the same fields
    assert family.__name__.lower().startswith(cfg["model_type"].replace("_", ""))
    head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
    assert arch.head_dim == head_dim and arch.rope.theta == hf_cfg.rope_parameters["rope_theta"]
    assert arch.rope.kind == hf_cfg.rope_parameters["rope_type"]
    types = getattr(hf_cfg, "layer_types", None)
    window = getattr(hf_cfg, "sliding_window", None)
    if cfg["model_type"] in ("mistral", "qwen3_moe"):
        types = ["sliding_attention" if window else "full_attention"] * arch.num_layers  # no layer_types there
    expect = tuple(window if t == "sliding_attention" else None for t in types) if window else ()
    assert (arch.layer_windows or ()) == (expect if any(w is not None for w in expect) else ())
    if arch.moe is not None:
        assert arch.moe.num_experts == hf_cfg.num_experts and arch.moe.top_k == hf_cfg.num_experts_per_tok
