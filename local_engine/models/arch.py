"""What a decoder-only checkpoint computes, read from its HF `config.json`, failing closed.

`DecoderArch` holds every knob the shared decoder (`decoder.py`) implements: grouped-query attention with
optional q/k/v and output biases, per-head q/k RMSNorm, learned attention sinks, a sliding window per layer,
a rope type, dense SwiGLU or a mixture of experts. Each family file (llama.py, qwen2.py, ...) maps its config
onto these fields in a `from_hf_config` of its own.

Failing closed: a config field that changes the computation and that parley does not implement is refused
at load with `ModelLoadError` naming the field, never silently ignored (`refuse_unimplemented`). That covers
the fields other families use (soft-capping, Granite's multipliers, NoPE layers, shared experts, ...), an
unknown rope type or rope key, an unsupported activation and quantised weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from parley.local_engine.errors import ModelLoadError
from parley.local_engine.models.rope import RopeSpec

# Fields of other families that change the computation, with the values that mean "off". Present with any
# other value, the field is refused unless the family implements it (`implemented` in `refuse_unimplemented`).
_FOREIGN_FIELDS: dict[str, tuple[Any, ...]] = {
    "attn_logit_softcapping": (None, 0, 0.0),
    "final_logit_softcapping": (None, 0, 0.0),
    "logit_softcapping": (None, 0, 0.0),
    "query_pre_attn_scalar": (None,),
    "embedding_multiplier": (None, 1, 1.0),
    "logits_scaling": (None, 1, 1.0),
    "residual_multiplier": (None, 1, 1.0),
    "attention_multiplier": (None,),
    "use_qk_norm": (None, False),
    "qk_layernorm": (None, False),
    "clip_qkv": (None,),
    "no_rope_layer_interval": (None, 0),
    "attention_chunk_size": (None,),
    "use_parallel_residual": (None, False),
    "parallel_attn": (None, False),
    "shared_expert_intermediate_size": (None, 0),
    "n_shared_experts": (None, 0),
    "use_mrope": (None, False),
    "mrope_section": (None,),
    "scale_embeddings": (None, False),
    "normalize_embeddings": (None, False),
    "pretraining_tp": (None, 1),
    "mlp_bias": (None, False),
    "attention_bias": (None, False),
    "sliding_window": (None, 0),
    "use_sliding_window": (None, False),
    "num_experts": (None, 0),
    "num_local_experts": (None, 0),
    "moe_intermediate_size": (None, 0),
    "layer_types": (None,),
}
_ACTIVATIONS = ("silu", "swish")  # both SiLU in transformers' ACT2FN
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class MoeSpec:
    """A mixture-of-experts MLP: a router picks `top_k` of `num_experts` SwiGLU experts per token."""

    num_experts: int
    top_k: int
    intermediate_size: int
    router: Literal["softmax_topk", "topk_softmax"]
    """softmax_topk: softmax over all router logits, then the top k (Qwen3-MoE; renormalised when
    `norm_topk_prob`). topk_softmax: the top k logits, then softmax over those k (gpt-oss)."""
    norm_topk_prob: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    activation: Literal["silu", "clamped_swiglu"] = "silu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


@dataclass(frozen=True)
class DecoderArch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: RopeSpec = field(default_factory=lambda: RopeSpec(theta=10000.0))
    model_type: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    layer_windows: tuple[int | None, ...] = ()
    """Sliding window of each layer (None = full causal attention); () = every layer full."""
    moe: MoeSpec | None = None
    moe_layers: tuple[bool, ...] = ()
    """Which layers use `moe` (the others a dense SwiGLU of `intermediate_size`); () = all, when `moe` is set."""

    family: ClassVar[str] = "decoder"

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> DecoderArch:
        """The architecture a HF `config.json` describes; `ModelLoadError` naming the field it cannot use."""
        try:
            arch = cls._parse(cfg)
        except KeyError as exc:
            raise ModelLoadError(f"config.json has no {exc.args[0]!r} (a {cls.family} config needs it)") from exc
        except (TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
            raise ModelLoadError(f"config.json has a value parley cannot use: {exc}") from exc
        arch.validate()
        return arch

    @classmethod
    def _parse(cls, cfg: dict[str, Any]) -> DecoderArch:
        """The family's mapping of its config onto the fields (overridden by each family)."""
        raise NotImplementedError

    def validate(self) -> None:
        sizes = {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                 "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                 "intermediate_size": self.intermediate_size, "head_dim": self.head_dim,
                 "max_position_embeddings": self.max_position_embeddings}
        bad = next((name for name, value in sizes.items() if value < 1), None)
        if bad is not None:
            raise ModelLoadError(f"config.json: {bad} must be >= 1, got {sizes[bad]}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads ({self.num_heads}) is not a multiple of num_key_value_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"config.json: head_dim must be even for rotary embeddings, got {self.head_dim}")
        for name, per_layer in (("layer_types", self.layer_windows), ("mlp_only_layers", self.moe_layers)):
            if per_layer and len(per_layer) != self.num_layers:
                raise ModelLoadError(
                    f"config.json: {name} describes {len(per_layer)} layers; num_hidden_layers is {self.num_layers}"
                )
        if any(w is not None and w < 1 for w in self.layer_windows):
            raise ModelLoadError("config.json: sliding_window must be >= 1")
        if self.moe is not None:
            m = self.moe
            if not 1 <= m.top_k <= m.num_experts or m.intermediate_size < 1:
                raise ModelLoadError(
                    f"config.json: num_experts_per_tok ({m.top_k}) must be in [1, num_experts ({m.num_experts})] "
                    f"and moe_intermediate_size >= 1"
                )

    # -------------------------------------------------------------- shared reading
    @staticmethod
    def common(
        cfg: dict[str, Any], *, default_theta: float = 10000.0, default_head_dim: int | None = None,
        default_eps: float = 1e-6,
    ) -> dict[str, Any]:
        """The fields every family reads the same way (`KeyError` for a missing required one); the defaults
        are the family's config class defaults, for a config.json that leaves them out."""
        heads = int(_required(cfg, "num_attention_heads"))
        hidden = int(_required(cfg, "hidden_size"))
        return dict(
            vocab_size=int(_required(cfg, "vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(_required(cfg, "intermediate_size")),
            num_layers=int(_required(cfg, "num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or default_head_dim or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", default_eps)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope=RopeSpec.from_hf_config(cfg, default_theta=default_theta),
            model_type=str(cfg.get("model_type") or "llama"),
        )


def _required(cfg: dict[str, Any], name: str) -> Any:
    value = cfg.get(name)
    if value is None:
        raise KeyError(name)
    return value


def refuse_unimplemented(cfg: dict[str, Any], family: str, implemented: Iterable[str] = ()) -> None:
    """`ModelLoadError` naming the first field that changes the computation in a way `family` does not do."""
    skip = set(implemented)
    for name, off in _FOREIGN_FIELDS.items():
        if name in skip or name not in cfg:
            continue
        value = cfg[name]
        if value in off or (name == "layer_types" and set(value or ()) <= {"full_attention"}):
            continue
        raise ModelLoadError(
            f"config.json: {name} = {value!r} is not supported for {family} models (parley refuses a field it "
            "does not implement rather than compute something else)"
        )
    no_rope = cfg.get("no_rope_layers")
    if no_rope is not None and not all(no_rope):
        raise ModelLoadError(f"config.json: no_rope_layers = {no_rope!r} is not supported (every layer uses RoPE)")
    quant = cfg.get("quantization_config")
    if quant and "quantization_config" not in skip:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise ModelLoadError(f"config.json: quantization_config (quant_method {method!r}) is not supported")


def check_activation(cfg: dict[str, Any], family: str, name: str = "hidden_act") -> None:
    act = cfg.get(name, "silu")
    if act not in _ACTIVATIONS:
        raise ModelLoadError(f"config.json: {name} {act!r} is not supported for {family} models (only silu)")


def windows_from_layer_types(
    cfg: dict[str, Any], num_layers: int, window: int | None, *, max_window_layers: int | None = None
) -> tuple[int | None, ...]:
    """Per-layer windows from `layer_types` (or, without it, Qwen2's rule: sliding from `max_window_layers` on)."""
    types = cfg.get("layer_types")
    if types is None:
        if window is None:
            return ()
        first = 0 if max_window_layers is None else max_window_layers
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if not isinstance(types, list):
        raise ModelLoadError(f"config.json: layer_types must be a list, got {types!r}")
    for i, kind in enumerate(types):
        if kind not in LAYER_TYPES:
            raise ModelLoadError(
                f"config.json: layer_types[{i}] = {kind!r} is not supported ({', '.join(LAYER_TYPES)})"
            )
    if len(types) != num_layers:
        raise ModelLoadError(
            f"config.json: layer_types describes {len(types)} layers; num_hidden_layers is {num_layers}"
        )
    if "sliding_attention" in types and window is None:
        raise ModelLoadError("config.json: layer_types has sliding_attention layers but sliding_window is null")
    windows = tuple(window if kind == "sliding_attention" else None for kind in types)
    return windows if any(w is not None for w in windows) else ()


def positive_window(cfg: dict[str, Any], name: str = "sliding_window") -> int | None:
    value = cfg.get(name)
    if value is None:
        return None
    window = int(value)
    if window < 1:
        raise ModelLoadError(f"config.json: {name} must be >= 1 or null, got {value!r}")
    return window
