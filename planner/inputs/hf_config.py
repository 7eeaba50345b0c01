"""HuggingFace `config.json` -> ModelSpec, for the families the planner knows.

Field meanings follow the transformers configuration classes (LlamaConfig, MixtralConfig,
Qwen2MoeConfig, Qwen3MoeConfig, DeepseekV2Config/DeepseekV3Config, GptOssConfig, Glm4MoeConfig, OlmoeConfig); a key
the config leaves out takes that class's default.  Every architecture field is read, so that the launcher trains the
model that was priced: rotary position embeddings (rope_theta, partial_rotary_factor, Llama-3.x
and YaRN rope_scaling), the norm's epsilon, biases, QK-norm, the router (softmax or sigmoid,
top-k renormalisation as Megatron's --moe-router-pre-softmax, groups, expert bias, scaling),
shared experts and their gate, dense-first layers, MTP.  The router mapping follows the NVIDIA
reference flag sets for these models (Megatron-LM examples/post_training/modelopt/conf/).
Megatron-side choices that a HF config does not state (token dispatcher, grouped GEMM) get the
usual Megatron MoE recipe values: alltoall dispatcher and grouped GEMM on.

`hf_config_notes(cfg)` says what of the config the plan leaves out (a vision tower, a rope
scaling Megatron has no flag for), one line each, for the caller to print.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from planner.errors import PlannerInputError
from planner.inputs.files import parse_json, path_kind, read_text
from planner.schemas.model import ModelSpec
from planner.schemas.types import MAX_EXPERTS, MAX_INT, MAX_LAYERS, MAX_SIZE

DEFAULT_SEQ_LENGTH = 4096  # training sequence when the caller gives none (capped by the model's context)


def _get(cfg: dict[str, Any], key: str, default: Any = ...) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        raise PlannerInputError(f"config.json:{key}", "missing; the HuggingFace config must give it")
    return default


def _int(cfg: dict[str, Any], key: str, default: Any = ..., *, minimum: int = 1, maximum: int = MAX_SIZE) -> Any:
    """An integer key in minimum..maximum (no bool, string or float coercion); None stays None."""
    value = _get(cfg, key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlannerInputError(f"config.json:{key}", f"expected an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise PlannerInputError(f"config.json:{key}", f"expected an integer in {minimum}..{maximum}, got {value}")
    return value


def _bool(cfg: dict[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise PlannerInputError(f"config.json:{key}", f"expected true or false, got {value!r}")
    return value


def _int_list(cfg: dict[str, Any], key: str, *, minimum: int, maximum: int) -> list[int]:
    """A list of integers in minimum..maximum (missing or null: empty)."""
    value = cfg.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise PlannerInputError(f"config.json:{key}", f"expected a list of integers, got {value!r}")
    bad = [v for v in value if not minimum <= v <= maximum]
    if bad:
        raise PlannerInputError(f"config.json:{key}", f"entries must be in {minimum}..{maximum}, got {bad[:5]}")
    return value


def _float(cfg: dict[str, Any], key: str, default: float, *, positive: bool = True, within: str = "") -> float:
    """A number (no bool or string), finite, positive unless told otherwise; `within`: the mapping it is a key of
    (`rope_scaling`), for the error's field."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
            float("inf"), float("-inf")) or (positive and value <= 0):
        raise PlannerInputError(f"config.json:{within + '.' if within else ''}{key}",
                                f"expected a {'positive ' if positive else ''}number, got {value!r}")
    return float(value)


def _non_negative(cfg: dict[str, Any], key: str, default: float = 0.0) -> float:
    """A finite number >= 0: a loss's weight, a clamp."""
    value = _float(cfg, key, default, positive=False)
    if value < 0:
        raise PlannerInputError(f"config.json:{key}", f"expected a number >= 0, got {value!r}")
    return value


def _choice(cfg: dict[str, Any], key: str, default: str, allowed: Any) -> str:
    """A string key whose value is one of `allowed` (a list, a list inside it or a number is refused by name)."""
    value = cfg.get(key, default)
    if not isinstance(value, str) or value not in allowed:
        raise PlannerInputError(f"config.json:{key}", f"expected one of {', '.join(allowed)}, got {value!r}")
    return value


# transformers' defaults where the families differ (the configuration classes' __init__)
_EPS_DEFAULT = {"mixtral": 1e-5, "glm4_moe": 1e-5, "olmoe": 1e-5}  # every other supported family: 1e-6
_THETA_DEFAULT = {"mixtral": 1e6}  # every other supported family: 10000
_ROTARY_DEFAULT = {"glm4_moe": 0.5}  # Glm4MoeConfig(partial_rotary_factor=0.5); every other family: 1.0


def _positions(cfg: dict[str, Any], family: str) -> dict[str, Any]:
    """Rotary embeddings as Megatron writes them: --position-embedding-type rope, --rotary-base
    (an integer in Megatron), --rotary-percent, and Llama-3.x rope scaling; YaRN (DeepSeek) is
    read by the MLA families."""
    theta = _float(cfg, "rope_theta", _THETA_DEFAULT.get(family, 10000.0))
    if theta != int(theta):
        raise PlannerInputError("config.json:rope_theta", f"Megatron's --rotary-base is an integer, got {theta!r}")
    if theta > MAX_INT:
        raise PlannerInputError("config.json:rope_theta", f"expected at most {MAX_INT} (the planner's limit on "
                                f"Megatron's --rotary-base), got {theta:.6g}")
    share = _float(cfg, "partial_rotary_factor", _ROTARY_DEFAULT.get(family, 1.0))
    if share > 1:
        raise PlannerInputError("config.json:partial_rotary_factor", f"expected a number in (0, 1], the share of "
                                f"each head's dimensions that RoPE rotates; got {share!r}")
    out: dict[str, Any] = {"position_embedding_type": "rope", "rotary_base": int(theta), "rotary_percent": share}
    scaling = _rope_scaling(cfg)
    if scaling.get("rope_type") == "llama3":
        out["use_rope_scaling"] = True
        out["rope_scaling_factor"] = _float(scaling, "factor", 8.0, within="rope_scaling")
    return out


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, Any]:
    """rope_scaling with its type under `rope_type` (older configs say `type`); {} when absent."""
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        return {}
    if not isinstance(scaling, dict):
        raise PlannerInputError("config.json:rope_scaling", f"expected a mapping or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind is not None and not isinstance(kind, str):
        raise PlannerInputError("config.json:rope_scaling.rope_type", f"expected a name or null, got {kind!r}")
    return {**scaling, "rope_type": kind}


GATED_ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu"}
"""`hidden_act` of the gated MLP every supported family builds (gate and up projections, then down), as Megatron's
activation flag: SiLU is --swiglu.  Megatron has no flag for other gated activations (GeGLU, ReGLU), so a config
naming one is refused rather than priced with the wrong MLP."""


def _gated_activation(cfg: dict[str, Any]) -> dict[str, Any]:
    """The MLP activation from `hidden_act` (transformers' default for these families: silu)."""
    act = cfg.get("hidden_act", "silu")
    if not isinstance(act, str) or act not in GATED_ACTIVATIONS:
        raise PlannerInputError(
            "config.json:hidden_act",
            f"a gated MLP with {act!r} has no Megatron flag; supported: {', '.join(GATED_ACTIVATIONS)} (--swiglu)")
    return {GATED_ACTIVATIONS[act]: True}


def _common(cfg: dict[str, Any], name: str, family: str = "llama") -> dict[str, Any]:
    """Fields every supported family shares: shape, vocabulary, GQA, RoPE, RMSNorm + a gated MLP (`hidden_act`),
    biases."""
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    max_pos = _int(cfg, "max_position_embeddings", None)
    seq = min(DEFAULT_SEQ_LENGTH, max_pos) if max_pos else DEFAULT_SEQ_LENGTH
    out: dict[str, Any] = {
        "name": name,
        "num_layers": _int(cfg, "num_hidden_layers", maximum=MAX_LAYERS),
        "hidden_size": _int(cfg, "hidden_size"),
        "ffn_hidden_size": _int(cfg, "intermediate_size"),
        "num_attention_heads": heads,
        "num_query_groups": kv_heads if kv_heads != heads else None,
        "vocab_size": _int(cfg, "vocab_size"),
        "seq_length": seq,
        "max_position_embeddings": max_pos,
        **_gated_activation(cfg),
        "normalization": "RMSNorm",
        "norm_epsilon": _float(cfg, "rms_norm_eps", _EPS_DEFAULT.get(family, 1e-6)),
        "untie_embeddings_and_output_weights": not _bool(cfg, "tie_word_embeddings", False),
        "add_bias_linear": _bool(cfg, "attention_bias", False) and _bool(cfg, "mlp_bias", False),
        "add_qkv_bias": _bool(cfg, "attention_bias", False) and not _bool(cfg, "mlp_bias", False),
        **_positions(cfg, family),
    }
    head_dim = _int(cfg, "head_dim", None)  # checked even where it equals hidden/heads: 128.0 is no head size
    if head_dim is not None and head_dim != out["hidden_size"] // heads:
        out["kv_channels"] = _int(cfg, "head_dim")
    elif head_dim is None and out["hidden_size"] % heads:
        raise PlannerInputError(
            "config.json:hidden_size",
            f"{out['hidden_size']} is not divisible by num_attention_heads {heads}, so the head size cannot be "
            f"derived from them (Megatron's --kv-channels defaults to hidden_size / heads); the config must then "
            f"give head_dim")
    return out


# Expert settings, under the names the model families use (transformers' configuration
# classes): the expert count is `num_local_experts` (Mixtral), `num_experts` (Qwen-MoE),
# `n_routed_experts` (DeepSeek) or `num_routed_experts` (some DeepSeek-V3 exports).
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_routed_experts")
EXPERT_TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")
SHARED_COUNT_KEYS = ("n_shared_experts", "num_shared_experts")
KNOWN_EXPERT_KEYS = frozenset({
    *EXPERT_COUNT_KEYS, *EXPERT_TOPK_KEYS, *SHARED_COUNT_KEYS, "moe_intermediate_size",
    "shared_expert_intermediate_size", "moe_layer_freq", "first_k_dense_replace", "decoder_sparse_step",
    "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    "scoring_func", "topk_method", "n_group", "topk_group", "routed_scaling_factor", "aux_loss_alpha", "seq_aux",
    "ep_size", "moe_router_dtype", "shared_expert_gate",
})  # fmt: skip


def check_expert_keys(cfg: dict[str, Any]) -> None:
    """Refuse a config with expert settings the reader does not understand, rather than plan the
    model as dense: any key naming experts or starting with moe_ must be a known one."""
    for key in cfg:
        if not isinstance(key, str) or key in KNOWN_EXPERT_KEYS:
            continue
        low = key.lower()
        if "expert" in low or low.startswith("moe_"):
            raise PlannerInputError(
                f"config.json:{key}",
                "an expert setting the planner does not understand, so it cannot tell how the experts are "
                f"laid out; known expert keys: {', '.join(sorted(KNOWN_EXPERT_KEYS))}",
            )


def _first_int(cfg: dict[str, Any], keys: tuple[str, ...], default: Any = ..., *, minimum: int = 1,
               maximum: int = MAX_SIZE) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return _int(cfg, key, minimum=minimum, maximum=maximum)
    if default is ...:
        raise PlannerInputError(f"config.json:{keys[0]}", f"missing; the config must give one of {', '.join(keys)}")
    return default


def expert_count(cfg: dict[str, Any]) -> int | None:
    """The routed-expert count under any of EXPERT_COUNT_KEYS (None or 0: dense)."""
    return _first_int(cfg, EXPERT_COUNT_KEYS, None, minimum=0, maximum=MAX_EXPERTS) or None


def _no_experts(cfg: dict[str, Any], key: str, family: str) -> PlannerInputError:
    """The refusal of a config of a MoE-only `family` (`a Mixtral config`) without routed experts: `key` missing or
    null, or an expert count of 0 (under whichever of EXPERT_COUNT_KEYS it gives)."""
    given = next((k for k in EXPERT_COUNT_KEYS if cfg.get(k) is not None), None)
    if given is not None:
        return PlannerInputError(f"config.json:{given}",
                                 f"expected an integer in 1..{MAX_EXPERTS}, got {cfg[given]!r}: {family} must give its "
                                 "experts")
    return PlannerInputError(f"config.json:{key}", f"missing; {family} must give its experts")


def _experts(cfg: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """Routed and shared experts, whatever the family calls them."""
    out["num_experts"] = expert_count(cfg)
    out["moe_router_topk"] = _first_int(cfg, EXPERT_TOPK_KEYS, 2, maximum=MAX_EXPERTS)
    out["moe_ffn_hidden_size"] = _int(cfg, "moe_intermediate_size", out.get("ffn_hidden_size"))
    shared = _first_int(cfg, SHARED_COUNT_KEYS, 0, minimum=0, maximum=MAX_EXPERTS)
    shared_size = _int(cfg, "shared_expert_intermediate_size", 0, minimum=0)
    if shared:
        out["moe_shared_expert_intermediate_size"] = shared * out["moe_ffn_hidden_size"]
    elif shared_size:
        out["moe_shared_expert_intermediate_size"] = shared_size
    if cfg.get("router_aux_loss_coef") is not None:  # Mixtral, Qwen-MoE: the load-balancing loss's weight
        out["moe_aux_loss_coeff"] = _non_negative(cfg, "router_aux_loss_coef")
    return _moe_recipe(out)


def _softmax_router(out: dict[str, Any], renormalised: bool) -> dict[str, Any]:
    """A softmax router: top-k weights renormalised (Mixtral; norm_topk_prob true) is Megatron's
    plain top-k softmax; not renormalised is --moe-router-pre-softmax, which Megatron also needs
    for top-1."""
    out["moe_router_pre_softmax"] = not renormalised or out.get("moe_router_topk") == 1
    return out


def _moe_recipe(out: dict[str, Any]) -> dict[str, Any]:
    out["moe_token_dispatcher_type"] = "alltoall"
    out["moe_grouped_gemm"] = True
    return out


def _llama(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return _common(cfg, name, "llama")


MISTRAL_WINDOW_DEFAULT = 4096  # transformers' MistralConfig(sliding_window=4096)


def _mistral(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """Mistral: Llama's layers, each attending over a sliding window (MistralAttention passes `sliding_window` to
    every layer; Mistral-7B-v0.1 states 4096, later releases null)."""
    out = _common(cfg, name, "mistral")
    out.update(_sliding_window(cfg, out["num_layers"], MISTRAL_WINDOW_DEFAULT))
    return out


def _qwen2(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """Qwen2: biases on Q, K and V (always, in transformers' Qwen2Attention)."""
    out = _common(cfg, name, "qwen2")
    out["add_qkv_bias"] = True
    return out


def _mixtral(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    out = _common(cfg, name, "mixtral")
    out.update(_sliding_window(cfg, out["num_layers"]))  # MixtralAttention: every layer (MixtralConfig: None)
    _experts(cfg, out)
    if out["num_experts"] is None:
        raise _no_experts(cfg, "num_local_experts", "a Mixtral config")
    return _softmax_router(out, renormalised=True)  # MixtralSparseMoeBlock renormalises the top-k


def _qwen_moe_pattern(cfg: dict[str, Any], num_layers: int) -> tuple[int, ...] | None:
    """Qwen2/3-MoE: layer i is sparse unless listed in mlp_only_layers, when
    (i + 1) % decoder_sparse_step == 0."""
    step = _int(cfg, "decoder_sparse_step", 1)
    dense_only = set(_int_list(cfg, "mlp_only_layers", minimum=0, maximum=num_layers - 1))
    pattern = tuple(
        1 if (i not in dense_only and (i + 1) % step == 0) else 0 for i in range(num_layers)
    )
    return None if all(pattern) else pattern


def _qwen_moe(cfg: dict[str, Any], name: str, family: str) -> dict[str, Any]:
    out = _experts(cfg, _common(cfg, name, family))
    if out["num_experts"] is None:
        raise _no_experts(cfg, "num_experts", "a Qwen-MoE config")
    out["moe_router_topk"] = _first_int(cfg, EXPERT_TOPK_KEYS, maximum=MAX_EXPERTS)
    out["moe_ffn_hidden_size"] = _int(cfg, "moe_intermediate_size")
    out["moe_layer_pattern"] = _qwen_moe_pattern(cfg, out["num_layers"])
    return _softmax_router(out, renormalised=_bool(cfg, "norm_topk_prob", False))


def _qwen2_moe(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """Qwen2-MoE: QKV biases; the shared expert has a sigmoid gate (Qwen2MoeSparseMoeBlock)."""
    out = _qwen_moe(cfg, name, "qwen2_moe")
    out["add_qkv_bias"] = True
    out["moe_shared_expert_gate"] = bool(out.get("moe_shared_expert_intermediate_size"))
    return out


def _qwen3_moe(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    out = _qwen_moe(cfg, name, "qwen3_moe")
    out["qk_layernorm"] = True
    if cfg.get("head_dim") is not None:  # null: hidden_size / heads, as Qwen3Config reads it
        out["kv_channels"] = _int(cfg, "head_dim")
    return out


def _qwen3(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    out = _common(cfg, name, "qwen3")
    out["qk_layernorm"] = True
    if cfg.get("head_dim") is not None:  # null: hidden_size / heads, as Qwen3Config reads it
        out["kv_channels"] = _int(cfg, "head_dim")
    return out


def _deepseek(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """DeepSeek-V2/V3: multi-latent attention (with its q/kv latent norms: --qk-layernorm, and YaRN
    rope scaling), routed + shared experts, first k layers dense, the router of the family."""
    out = _common(cfg, name, "deepseek")
    out["num_query_groups"] = None  # MLA has no GQA groups
    out.pop("kv_channels", None)
    out["multi_latent_attention"] = True
    out["qk_layernorm"] = True  # q_a_layernorm / kv_a_layernorm
    out.update(_yarn(cfg))
    out["q_lora_rank"] = _int(cfg, "q_lora_rank", None)
    out["kv_lora_rank"] = _int(cfg, "kv_lora_rank")
    out["qk_head_dim"] = _int(cfg, "qk_nope_head_dim")
    out["qk_pos_emb_head_dim"] = _int(cfg, "qk_rope_head_dim", minimum=0)
    out["v_head_dim"] = _int(cfg, "v_head_dim")
    experts = expert_count(cfg)
    if experts:
        num_layers = out["num_layers"]
        _experts(cfg, out)
        out["moe_router_topk"] = _first_int(cfg, EXPERT_TOPK_KEYS, maximum=MAX_EXPERTS)
        out["moe_ffn_hidden_size"] = _int(cfg, "moe_intermediate_size")
        shared = _first_int(cfg, SHARED_COUNT_KEYS, 0, minimum=0, maximum=MAX_EXPERTS)
        out["moe_shared_expert_intermediate_size"] = shared * out["moe_ffn_hidden_size"] if shared else None
        first_dense = _int(cfg, "first_k_dense_replace", 0, minimum=0, maximum=num_layers)
        freq = _int(cfg, "moe_layer_freq", 1)
        pattern = tuple(1 if (i >= first_dense and i % freq == 0) else 0 for i in range(num_layers))
        out["moe_layer_pattern"] = None if all(pattern) else pattern
        _moe_recipe(out)
        out.update(_deepseek_router(cfg, out))
    mtp = _int(cfg, "num_nextn_predict_layers", 0, minimum=0, maximum=MAX_LAYERS)
    if mtp:
        out["mtp_num_layers"] = mtp
        out["position_embedding_type"] = "rope"  # DeepSeek's RoPE; Megatron's MTP needs rope or none
    return out


def _gpt_oss(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """gpt-oss (transformers' GptOssConfig): every layer MoE, biases on the attention, router and expert linears,
    and a gated expert MLP whose activation is x * sigmoid(1.702 x) (GptOssExperts; it ignores `hidden_act`):
    Megatron's --quick-geglu, as Megatron-Bridge's GPT-OSS provider builds it.  Its sliding-window layers and the
    activation's clamp are read as that provider sets them (`_sliding_window`, `swiglu_limit`); its attention sinks
    and the GLU's linear offset are not in the plan (`hf_config_notes`)."""
    out = _common({**cfg, "hidden_act": "silu"}, name, "gpt_oss")
    out.update(swiglu=False, quick_geglu=True, add_bias_linear=True, add_qkv_bias=False)
    _experts(cfg, out)
    if out["num_experts"] is None:
        raise _no_experts(cfg, "num_local_experts", "a gpt-oss config")
    out.update(_sliding_window(cfg, out["num_layers"]))
    limit = _non_negative(cfg, "swiglu_limit")
    if limit:
        out["activation_func_clamp_value"] = limit  # GptOssExperts clamps the gate at +limit, the linear at +-limit
    return _softmax_router(out, renormalised=True)  # GptOssTopKRouter: softmax over the top-k logits


GLM_BRIDGE = "NVIDIA-NeMo/Megatron-Bridge@067f987d src/megatron/bridge/models/glm/glm45_bridge.py"
OLMOE_BRIDGE = "NVIDIA-NeMo/Megatron-Bridge@067f987d src/megatron/bridge/models/olmoe/olmoe_bridge.py"
"""Megatron-Bridge's readers of these families' configs, which the mappings below follow (provider_bridge, on top of
the common CONFIG_MAPPING of src/megatron/bridge/models/conversion/model_bridge.py at that commit)."""


def _glm4_moe(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """GLM-4.5, GLM-4.5-Air, GLM-4.6 (transformers' Glm4MoeConfig and modeling_glm4_moe.py), as GLM_BRIDGE maps them:
    - attention (Glm4MoeAttention): GQA, heads of `head_dim` (128 where hidden / heads is not: --kv-channels),
      biases on Q, K and V only (`attention_bias`; o_proj has none: --add-qkv-bias), Q and K RMSNorm per head when
      `use_qk_norm` (Glm4MoeRMSNorm(head_dim): --qk-layernorm), RoPE on the first `partial_rotary_factor` of each
      head (default 0.5: --rotary-percent);
    - layers (Glm4MoeDecoderLayer): the first `first_k_dense_replace` (default 1) have a dense MLP of
      `intermediate_size`, the others the MoE block (--moe-layer-freq, as the bridge's moe_layer_freq);
    - experts (Glm4MoeMoE): `n_routed_experts` of `moe_intermediate_size` (default 1408), the top
      `num_experts_per_tok` (default 8), and an ungated shared MLP of moe_intermediate_size x `n_shared_experts`
      (default 1) (--moe-shared-expert-intermediate-size; the bridge writes moe_intermediate_size alone, the same
      where n_shared_experts is 1, as in GLM-4.5 and GLM-4.5-Air);
    - router (Glm4MoeTopkRouter): sigmoid scores, the top-k chosen on the scores plus e_score_correction_bias
      (--moe-router-score-function sigmoid, --moe-router-enable-expert-bias; the bridge's moe_router_pre_softmax
      False), within `topk_group` of `n_group` groups (--moe-router-num-groups, --moe-router-group-topk where
      n_group > 1), renormalised over the top-k when `norm_topk_prob` (Megatron always renormalises sigmoid top-k
      scores: false is named in the notes), scaled by `routed_scaling_factor` (--moe-router-topk-scaling-factor);
    - `num_nextn_predict_layers` MTP layers (--mtp-num-layers: transformers leaves them out of its module, the bridge
      trains them).
    Glm4MoeForCausalLM has no balancing loss (the expert bias balances), so none is written, as for DeepSeek-V3's
    noaux_tc; the bridge's recipe adds a sequence-level one (seq_aux_loss, 1e-3) that no config.json states."""
    out = _common(cfg, name, "glm4_moe")
    out.update(add_qkv_bias=_bool(cfg, "attention_bias", False), add_bias_linear=False,
               qk_layernorm=_bool(cfg, "use_qk_norm", False))
    experts = expert_count(cfg)
    if experts is None:
        raise _no_experts(cfg, "n_routed_experts", "a GLM-4.5 config")
    num_layers = out["num_layers"]
    moe_size = _int(cfg, "moe_intermediate_size", 1408)
    shared = _first_int(cfg, SHARED_COUNT_KEYS, 1, minimum=0, maximum=MAX_EXPERTS)
    first_dense = _int(cfg, "first_k_dense_replace", 1, minimum=0, maximum=MAX_LAYERS)
    if first_dense >= num_layers:
        given = cfg.get("first_k_dense_replace") is not None
        stated = "" if given else " (Glm4MoeConfig's default: the key is left out or null)"
        raise PlannerInputError("config.json:first_k_dense_replace", f"{first_dense}{stated} dense layers leave no MoE "
                                f"layer of the num_hidden_layers {num_layers}; expected 0..{num_layers - 1}")
    pattern = tuple(int(i >= first_dense) for i in range(num_layers))
    out.update(num_experts=experts, moe_router_topk=_first_int(cfg, EXPERT_TOPK_KEYS, 8, maximum=MAX_EXPERTS),
               moe_ffn_hidden_size=moe_size, moe_shared_expert_intermediate_size=shared * moe_size or None,
               moe_layer_pattern=None if all(pattern) else pattern)
    _bool(cfg, "norm_topk_prob", True)  # checked here; what Megatron does with it is in the notes
    out.update(_moe_recipe(_glm_router(cfg, experts)))
    mtp = _int(cfg, "num_nextn_predict_layers", 0, minimum=0, maximum=MAX_LAYERS)
    if mtp:
        out["mtp_num_layers"] = mtp
    return out


def _glm_router(cfg: dict[str, Any], experts: int) -> dict[str, Any]:
    """Glm4MoeTopkRouter as Megatron's flags (Glm4MoeConfig's defaults: n_group 1, topk_group 1, scaling 1.0).
    Glm4MoeMoE.route_tokens_to_experts splits the `experts` scores into `n_group` equal groups and ranks each group by
    its top-2 scores, whatever n_group is: a split that leaves a remainder or a group of one fails there."""
    router: dict[str, Any] = {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                              "moe_router_pre_softmax": False}
    groups = _int(cfg, "n_group", 1)
    if experts < 2:
        raise PlannerInputError("config.json:n_routed_experts", f"expected 2 or more, got {experts}: GLM's router "
                                "ranks the experts of a group by their top 2 scores")
    _expert_groups(groups, experts, "GLM's router", top2=True)
    if groups > 1:
        router["moe_router_num_groups"] = groups
        router["moe_router_group_topk"] = _int(cfg, "topk_group", 1, maximum=groups)
    factor = _float(cfg, "routed_scaling_factor", 1.0)
    router["moe_router_topk_scaling_factor"] = factor if factor != 1.0 else None
    return router


def _olmoe(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """OLMoE (transformers' OlmoeConfig and modeling_olmoe.py), as OLMOE_BRIDGE maps it: every layer is the MoE block
    (OlmoeSparseMoeBlock), `num_experts` experts of `intermediate_size` each (the bridge's moe_ffn_hidden_size), no
    shared expert and no dense MLP; the top `num_experts_per_tok` (default 8) of a softmax over all the experts,
    renormalised when `norm_topk_prob` (default false: --moe-router-pre-softmax, which the bridge sets whatever the key
    says); `router_aux_loss_coef` weighs the Switch balancing loss, which transformers takes over every token of the
    batch (Megatron's aux_loss; the bridge's recipe trains seq_aux_loss); Q and K are always normalised (--qk-layernorm,
    as the bridge's qk_layernorm; OLMoE normalises the whole projections, Megatron each head: the notes say so), the
    head size is hidden / heads, and `attention_bias` puts biases on Q, K, V (--add-qkv-bias) and the output
    projection (not in the plan: the notes)."""
    out = _common(cfg, name, "olmoe")
    experts = expert_count(cfg)
    if experts is None:
        raise _no_experts(cfg, "num_experts", "an OLMoE config")
    out.update(qk_layernorm=True, num_experts=experts, moe_ffn_hidden_size=out["ffn_hidden_size"],
               moe_router_topk=_first_int(cfg, EXPERT_TOPK_KEYS, 8, maximum=MAX_EXPERTS))
    if cfg.get("router_aux_loss_coef") is not None:
        out["moe_aux_loss_coeff"] = _non_negative(cfg, "router_aux_loss_coef")
    _float(cfg, "clip_qkv", 1.0)  # checked here; not in the plan (the notes)
    _moe_recipe(out)
    return _softmax_router(out, renormalised=_bool(cfg, "norm_topk_prob", False))


_WINDOW_LAYER_TYPES = {"sliding_attention": 1, "full_attention": 0}


def _sliding_window(cfg: dict[str, Any], num_layers: int, default: int | None = None) -> dict[str, Any]:
    """Sliding-window layers (gpt-oss, Mistral, Mixtral) as Megatron's flags say them: `sliding_window` W keys is
    --window-size W-1,0 (a query sees itself and the W-1 keys before it: transformers' sliding-window mask;
    Megatron-Bridge's GPTOSSProvider sets window_size (sliding_window - 1, 0)), and `layer_types` marks which layers
    slide (--window-attn-skip-freq: 2 when every second layer is full, as the provider sets it, else one 0/1 per
    layer).  Without `layer_types` every layer slides (transformers' default for a config with a sliding window).
    `default`: the window of a config without the key (MistralConfig's 4096); null is full attention."""
    window = _int(cfg, "sliding_window", None) if "sliding_window" in cfg else default
    if window is None:
        return {}
    kinds = cfg.get("layer_types")
    if kinds is None:
        return {"window_size": (window - 1, 0)}
    if not isinstance(kinds, list) or len(kinds) != num_layers or any(
            not isinstance(k, str) or k not in _WINDOW_LAYER_TYPES for k in kinds):
        raise PlannerInputError("config.json:layer_types", f"expected {num_layers} entries, each one of "
                                f"{', '.join(_WINDOW_LAYER_TYPES)}; got {str(kinds)[:120]}")
    pattern = tuple(_WINDOW_LAYER_TYPES[k] for k in kinds)
    if not any(pattern):
        return {}
    every_second = tuple(int((n + 1) % 2 != 0) for n in range(num_layers))
    return {"window_size": (window - 1, 0), "window_attn_skip_freq": 2 if pattern == every_second else pattern}


def _yarn(cfg: dict[str, Any]) -> dict[str, Any]:
    """MLA's YaRN rope scaling: --rotary-scaling-factor, --mscale, --mscale-all-dim."""
    scaling = _rope_scaling(cfg)
    if scaling.get("rope_type") != "yarn":
        return {}
    return {"rotary_scaling_factor": _float(scaling, "factor", 1.0, within="rope_scaling"),
            "mscale": _float(scaling, "mscale", 1.0, within="rope_scaling"),
            "mscale_all_dim": _float(scaling, "mscale_all_dim", 0.0, positive=False, within="rope_scaling")}


_SCORING = {"softmax": "softmax", "sigmoid": "sigmoid"}
_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
"""DeepSeek's `topk_method` values (DeepseekV2MoEGate / DeepseekV3TopkRouter): another would be read as greedy
routing without its groups or expert bias, so it is refused."""


def _expert_groups(groups: int, experts: int, router: str, *, top2: bool) -> None:
    """Group-limited routing as transformers runs it: the scores viewed as `n_group` equal groups
    (`scores.view(..., n_group, -1)`), each ranked by the sum of its top 2 scores (`top2`: DeepseekV3TopkRouter,
    Glm4MoeMoE) or by its best (DeepseekV2MoEGate): n_group must divide the experts, into groups of 2 or more
    with `top2`."""
    smallest = 2 if top2 else 1
    if experts % groups or experts // groups < smallest:
        ranked = "by the sum of its top 2 scores" if top2 else "by its best score"
        raise PlannerInputError(
            "config.json:n_group", f"{groups} groups of the n_routed_experts {experts}: {router} splits the experts "
            f"into n_group equal groups{' of 2 or more' if top2 else ''} (it ranks a group {ranked}), so n_group must "
            f"divide {experts} and be at most {experts // smallest}")


def _deepseek_router(cfg: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """scoring_func, norm_topk_prob, group-limited routing (n_group / topk_group), the
    auxiliary-loss-free expert bias (topk_method noaux_tc) and routed_scaling_factor."""
    scoring = _choice(cfg, "scoring_func", "softmax", tuple(_SCORING))
    router: dict[str, Any] = {"moe_router_score_function": _SCORING[scoring],
                              "moe_router_topk": out["moe_router_topk"]}
    if scoring == "softmax":  # sigmoid scores are renormalised over the top-k whatever the flag says
        _softmax_router(router, renormalised=_bool(cfg, "norm_topk_prob", False))
    method = _choice(cfg, "topk_method", "greedy", _TOPK_METHODS)
    groups = _int(cfg, "n_group", None)
    if method in ("group_limited_greedy", "noaux_tc") and groups and groups > 1:
        _expert_groups(groups, expert_count(cfg), f"topk_method {method!r}", top2=method == "noaux_tc")
        router["moe_router_num_groups"] = groups
        router["moe_router_group_topk"] = _int(cfg, "topk_group", maximum=groups)
    router["moe_router_enable_expert_bias"] = method == "noaux_tc"
    factor = _float(cfg, "routed_scaling_factor", 1.0)
    router["moe_router_topk_scaling_factor"] = factor if factor != 1.0 else None
    if cfg.get("aux_loss_alpha") is not None:  # the balance loss's weight, per sequence with seq_aux
        router["moe_aux_loss_coeff"] = _non_negative(cfg, "aux_loss_alpha")
        router["moe_router_load_balancing_type"] = "seq_aux_loss" if _bool(cfg, "seq_aux", False) else "aux_loss"
    return router


_FAMILIES: dict[str, Callable[[dict[str, Any], str], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss,
    "glm4_moe": _glm4_moe,
    "olmoe": _olmoe,
}
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "Glm4MoeForCausalLM": "glm4_moe",
    "OlmoeForCausalLM": "olmoe",
}
SUPPORTED_MODEL_TYPES = tuple(_FAMILIES)


def _family(cfg: dict[str, Any]) -> str:
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise PlannerInputError("config.json:model_type", f"expected a string, got {model_type!r}")
    architectures = cfg.get("architectures")
    if architectures is not None and (
        not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures)
    ):
        raise PlannerInputError("config.json:architectures", f"expected a list of class names, got {architectures!r}")
    if model_type in _FAMILIES:
        return model_type
    for arch in architectures or []:
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
    shown = model_type or (cfg.get("architectures") or ["(none)"])
    raise PlannerInputError(
        "config.json:model_type",
        f"unsupported architecture {shown!r}; supported model_type values: "
        f"{', '.join(SUPPORTED_MODEL_TYPES)} (architectures {', '.join(_ARCHITECTURES)})",
    )


_QWEN_FAMILIES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")

# the parts of a multimodal config besides its text decoder
_OTHER_TOWERS = ("vision_config", "audio_config", "speech_config", "visual", "vision_tower")


def _text_part(cfg: dict[str, Any]) -> dict[str, Any]:
    """The text decoder's config: `text_config` when the file describes a multimodal model."""
    if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg:
        return {**cfg["text_config"], "architectures": cfg.get("architectures")}
    return cfg


def hf_config_notes(cfg: dict[str, Any], source: str = "config.json") -> list[str]:
    """What of the config the plan and the launcher leave out, one line each, naming the file `source`."""
    return [note.replace("config.json", source, 1) for note in _config_notes(cfg)]


def _config_notes(cfg: dict[str, Any]) -> list[str]:
    notes: list[str] = []
    towers = [k for k in _OTHER_TOWERS if cfg.get(k)]
    if towers or (isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg):
        what = ", ".join(towers) or "a text_config inside a larger model"
        notes.append(f"config.json describes a multimodal model ({what}): planned as its text decoder only; "
                     "the other towers (vision/audio encoders and their projectors) are not in the plan, "
                     "their time or memory, nor in the launcher")
    text = _text_part(cfg)
    if isinstance(text, dict) and _family_or_none(text) == "gpt_oss":
        notes.append("config.json: gpt-oss's attention sinks and the GLU's linear offset are not in the plan (their "
                     "time is not priced) and the launcher leaves out Megatron's --softmax-type learnable and "
                     "--glu-linear-offset 1.0: add them to train gpt-oss itself (its sliding-window layers and "
                     "clamped activation are priced and written: --window-size, --window-attn-skip-freq, "
                     "--activation-func-clamp-value)")
    if isinstance(text, dict) and _family_or_none(text) in _QWEN_FAMILIES and text.get("use_sliding_window") is True \
            and text.get("sliding_window") is not None:
        notes.append("config.json:use_sliding_window is true: Qwen's sliding-window layers (from max_window_layers on) "
                     "are not in the plan: priced, and written to the launcher, with full attention on every layer")
    family = _family_or_none(text) if isinstance(text, dict) else None
    notes.extend(_glm_notes(text) if family == "glm4_moe" else _olmoe_notes(text) if family == "olmoe" else [])
    kind = _rope_scaling(text).get("rope_type") if isinstance(text, dict) else None
    mla = _family_or_none(text) in ("deepseek_v2", "deepseek_v3")
    if kind not in (None, "default", "llama3") and not (kind == "yarn" and mla):
        notes.append(f"config.json:rope_scaling type {kind!r} is not written to the launcher (Megatron's flags "
                     "for it differ per version): the model trains with plain RoPE; time and memory are the same")
    return notes


def _glm_notes(cfg: dict[str, Any]) -> list[str]:
    """What of a GLM-4.5 router Megatron's flags cannot say (megatron-core 0.19.2 moe_utils.py
    topk_routing_with_score_function and group_limited_topk)."""
    notes = []
    if cfg.get("norm_topk_prob") is False:
        notes.append("config.json:norm_topk_prob is false: GLM's router keeps the top-k sigmoid scores as they are, "
                     "Megatron's sigmoid router always renormalises them over the top-k (no flag turns that off): "
                     "the launcher trains renormalised routing weights; time and memory are the same")
    groups, group_topk, topk = (cfg.get(k) for k in ("n_group", "topk_group", "num_experts_per_tok"))
    if all(isinstance(v, int) and v > 0 for v in (groups, group_topk, topk)) and groups > 1 and topk // group_topk != 2:
        notes.append(f"config.json:n_group {groups}: GLM ranks a group by its top-2 scores, Megatron's "
                     f"--moe-router-group-topk by its top num_experts_per_tok / topk_group = {topk // group_topk}: "
                     "the launcher trains that group choice; time and memory are the same")
    return notes


def _olmoe_notes(cfg: dict[str, Any]) -> list[str]:
    """What of OLMoE's attention Megatron-LM's flags cannot say (transformers' OlmoeAttention)."""
    heads, kv_heads, hidden, layers = (cfg.get(k) for k in ("num_attention_heads", "num_key_value_heads",
                                                             "hidden_size", "num_hidden_layers"))
    kv_heads = kv_heads if kv_heads is not None else heads
    sizes = (heads, kv_heads, hidden, layers)
    valid = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes)
    fewer = f" (Megatron's hold {(heads + kv_heads - 2) * (hidden // heads) * layers:,} norm weights fewer than " \
            "OLMoE's)" if valid else ""
    notes = [f"config.json: OLMoE's q_norm and k_norm normalise the whole Q and K projections (one RMSNorm over all "
             f"heads), Megatron's --qk-layernorm each head: the launcher writes --qk-layernorm, which trains per-head "
             f"norms (Megatron-Bridge builds OLMoE's with its own attention module, OLMoESelfAttention, which no "
             f"Megatron-LM flag asks for); time and memory are priced as the per-head norms, which normalise the same "
             f"elements{fewer}"]
    if cfg.get("attention_bias") is True:
        notes.append("config.json:attention_bias is true: OLMoE's output projection has a bias too, which Megatron "
                     "gives only with --add-bias-linear (every MLP's as well): planned and launched with Q, K and V "
                     "biases (--add-qkv-bias) and none on the output projection")
    if cfg.get("clip_qkv") is not None:
        notes.append(f"config.json:clip_qkv {cfg.get('clip_qkv')!r}: Megatron has no flag to clamp Q, K and V: the "
                     "launcher trains without the clamp; time and memory are the same")
    return notes


def _family_or_none(cfg: dict[str, Any]) -> str | None:
    try:
        return _family(cfg)
    except PlannerInputError:
        return None


def model_fields_from_hf_config(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """ModelSpec field values for a HuggingFace config dict (not yet validated)."""
    if not isinstance(cfg, dict):
        raise PlannerInputError("config.json", "expected a JSON object")
    cfg = _text_part(cfg)
    check_expert_keys(cfg)
    fields = _FAMILIES[_family(cfg)](cfg, name)
    if fields.get("num_experts") is None and expert_count(cfg):
        _experts(cfg, fields)  # a family read as dense whose config names experts: read them
    _check_between_keys(cfg, fields)
    return {k: v for k, v in fields.items() if v is not None or k in ("num_query_groups",)}


def _check_between_keys(cfg: dict[str, Any], fields: dict[str, Any]) -> None:
    """The rules between keys that ModelSpec would otherwise refuse under Megatron's names (num_query_groups,
    moe_router_topk), named by the config's keys."""
    heads, groups = fields["num_attention_heads"], fields.get("num_query_groups")
    if groups and heads % groups:
        raise PlannerInputError("config.json:num_key_value_heads", f"{groups} does not divide num_attention_heads "
                                f"{heads}: each key/value head serves an equal group of query heads")
    experts, topk = fields.get("num_experts"), fields.get("moe_router_topk")
    if experts and topk and topk > experts:
        key = next((k for k in EXPERT_TOPK_KEYS if cfg.get(k) is not None), None)
        count_key = next((k for k in EXPERT_COUNT_KEYS if cfg.get(k) is not None), EXPERT_COUNT_KEYS[0])
        raise PlannerInputError(
            f"config.json:{key or EXPERT_TOPK_KEYS[0]}",
            f"{topk} experts per token{'' if key else ' (the default, the config leaves the key out)'} exceed the "
            f"{count_key} {experts} experts")


def hf_dropout(cfg: dict[str, Any], source: str = "config.json") -> dict[str, float]:
    """The training's dropout as the config states it: `attention_dropout` (transformers' default 0.0 for every
    supported family), and no hidden dropout (their HF models have none: 0.0); Megatron's own default, 0.1 each,
    would train another model."""
    text = _text_part(cfg) if isinstance(cfg, dict) else {}
    value = text.get("attention_dropout", 0.0) if isinstance(text, dict) else 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise PlannerInputError(f"{source}:attention_dropout", f"expected a number in [0, 1], got {value!r}")
    return {"attention_dropout": float(value), "hidden_dropout": 0.0}


def model_from_hf_config(cfg: dict[str, Any], name: str, source: str = "config.json") -> ModelSpec:
    """Build a ModelSpec from a HuggingFace config dict; unsupported families raise
    PlannerInputError listing the supported ones.  `source`: the file's own name, which the errors name
    (`unk.json:head_dim`, not `config.json:head_dim`)."""
    try:
        fields = model_fields_from_hf_config(cfg, name)
    except PlannerInputError as exc:
        raise _named(exc, source) from None
    try:
        return ModelSpec(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())) or "model"
        raise PlannerInputError(f"{source} ({loc})", str(err.get("msg")).removeprefix("Value error, ")) from None


def _named(exc: PlannerInputError, source: str) -> PlannerInputError:
    """The error with its `config.json` field under the file's own name."""
    if source == "config.json" or not exc.field.startswith("config.json"):
        return exc
    message = str(exc).removeprefix(exc.field + ": ")
    return PlannerInputError(source + exc.field.removeprefix("config.json"), message)


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """Load a config.json (or the config.json inside a model directory)."""
    p = Path(path)
    if path_kind(p, "--model") == "dir":
        p = p / "config.json"
    data = parse_json(read_text(p, "--model"), "--model", str(p))
    if not isinstance(data, dict):
        raise PlannerInputError("--model", f"{p} does not hold a JSON object")
    return data


def looks_like_hf_config(data: Any) -> bool:
    """True when a loaded JSON/YAML document is a HuggingFace config rather than a ModelSpec."""
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data or "num_hidden_layers" in data)
