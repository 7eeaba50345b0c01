"""HuggingFace `config.json` -> ModelSpec, for the families the planner knows.

Field meanings follow the transformers configuration classes (LlamaConfig, MixtralConfig,
Qwen2MoeConfig, Qwen3MoeConfig, DeepseekV2Config/DeepseekV3Config).  Megatron-side choices
that a HF config does not state (token dispatcher, grouped GEMM) get the usual Megatron MoE
recipe values: alltoall dispatcher and grouped GEMM on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from planner.errors import PlannerInputError
from planner.inputs.files import parse_json, path_kind, read_text
from planner.schemas.model import ModelSpec
from planner.schemas.types import MAX_EXPERTS, MAX_LAYERS, MAX_SIZE

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


def _common(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """Fields every supported family shares: shape, vocabulary, GQA, RMSNorm + SwiGLU, no biases."""
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
        "swiglu": True,
        "normalization": "RMSNorm",
        "untie_embeddings_and_output_weights": not _bool(cfg, "tie_word_embeddings", False),
        "add_bias_linear": False,
    }
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim != out["hidden_size"] // heads:
        out["kv_channels"] = _int(cfg, "head_dim")
    elif out["hidden_size"] % heads:
        out["kv_channels"] = _int(cfg, "head_dim")
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
    return _moe_recipe(out)


def _moe_recipe(out: dict[str, Any]) -> dict[str, Any]:
    out["moe_token_dispatcher_type"] = "alltoall"
    out["moe_grouped_gemm"] = True
    return out


def _llama(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return _common(cfg, name)


def _mixtral(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    out = _common(cfg, name)
    _experts(cfg, out)
    if out["num_experts"] is None:
        raise PlannerInputError("config.json:num_local_experts", "missing; a Mixtral config must give its experts")
    return out


def _qwen_moe_pattern(cfg: dict[str, Any], num_layers: int) -> tuple[int, ...] | None:
    """Qwen2/3-MoE: layer i is sparse unless listed in mlp_only_layers, when
    (i + 1) % decoder_sparse_step == 0."""
    step = _int(cfg, "decoder_sparse_step", 1)
    dense_only = set(_int_list(cfg, "mlp_only_layers", minimum=0, maximum=num_layers - 1))
    pattern = tuple(
        1 if (i not in dense_only and (i + 1) % step == 0) else 0 for i in range(num_layers)
    )
    return None if all(pattern) else pattern


def _qwen2_moe(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    out = _experts(cfg, _common(cfg, name))
    if out["num_experts"] is None:
        raise PlannerInputError("config.json:num_experts", "missing; a Qwen-MoE config must give its experts")
    out["moe_router_topk"] = _first_int(cfg, EXPERT_TOPK_KEYS, maximum=MAX_EXPERTS)
    out["moe_ffn_hidden_size"] = _int(cfg, "moe_intermediate_size")
    out["moe_layer_pattern"] = _qwen_moe_pattern(cfg, out["num_layers"])
    return out


def _qwen3_moe(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    out = _qwen2_moe(cfg, name)
    out["qk_layernorm"] = True
    if "head_dim" in cfg:
        out["kv_channels"] = _int(cfg, "head_dim")
    return out


def _qwen3(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    out = _common(cfg, name)
    out["qk_layernorm"] = True
    if "head_dim" in cfg:
        out["kv_channels"] = _int(cfg, "head_dim")
    return out


def _deepseek(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """DeepSeek-V2/V3: multi-latent attention, routed + shared experts, first k layers dense."""
    out = _common(cfg, name)
    out["num_query_groups"] = None  # MLA has no GQA groups
    out.pop("kv_channels", None)
    out["multi_latent_attention"] = True
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
    mtp = _int(cfg, "num_nextn_predict_layers", 0, minimum=0, maximum=MAX_LAYERS)
    if mtp:
        out["mtp_num_layers"] = mtp
        out["position_embedding_type"] = "rope"  # DeepSeek's RoPE; Megatron's MTP needs rope or none
    return out


_FAMILIES: dict[str, Callable[[dict[str, Any], str], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _llama,
    "qwen3": _qwen3,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
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


def model_fields_from_hf_config(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """ModelSpec field values for a HuggingFace config dict (not yet validated)."""
    if not isinstance(cfg, dict):
        raise PlannerInputError("config.json", "expected a JSON object")
    if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg:
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures")}
    check_expert_keys(cfg)
    fields = _FAMILIES[_family(cfg)](cfg, name)
    if fields.get("num_experts") is None and expert_count(cfg):
        _experts(cfg, fields)  # a family read as dense whose config names experts: read them
    return {k: v for k, v in fields.items() if v is not None or k in ("num_query_groups",)}


def model_from_hf_config(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Build a ModelSpec from a HuggingFace config dict; unsupported families raise
    PlannerInputError listing the supported ones."""
    fields = model_fields_from_hf_config(cfg, name)
    try:
        return ModelSpec(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())) or "model"
        raise PlannerInputError(f"config.json ({loc})", str(err.get("msg")).removeprefix("Value error, ")) from None


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
