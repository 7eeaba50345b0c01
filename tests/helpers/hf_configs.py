"""HuggingFace config.json fixtures: the published files of the preset models, with the keys the reader
uses (copied from each model's config.json on huggingface.co), and which preset each one is."""

from __future__ import annotations

import json
from pathlib import Path

CONFIG_FILES = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
"""Published config.json files kept whole, with their sources (SOURCES.md there)."""


def _config_file(name: str) -> dict:
    return json.loads((CONFIG_FILES / f"{name}.json").read_text())


LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": None,
    "attention_bias": False,
}  # fmt: skip
LLAMA3_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "attention_bias": False,
}  # fmt: skip
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "max_position_embeddings": 32768, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02,
}  # fmt: skip
QWEN2_57B = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 3584,
    "intermediate_size": 18944, "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
    "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "vocab_size": 151936, "max_position_embeddings": 32768,
    "decoder_sparse_step": 1, "tie_word_embeddings": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "norm_topk_prob": False,
}  # fmt: skip
QWEN3_30B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "norm_topk_prob": True, "attention_bias": False, "router_aux_loss_coef": 0.001,
}  # fmt: skip
DSV2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": None, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
    "num_experts_per_tok": 6, "n_shared_experts": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "vocab_size": 102400, "max_position_embeddings": 163840, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "scoring_func": "softmax", "norm_topk_prob": False,
    "topk_method": "greedy", "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
}  # fmt: skip
DSV3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "num_nextn_predict_layers": 1, "vocab_size": 129280, "max_position_embeddings": 163840,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-06, "rope_theta": 10000, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
}  # fmt: skip

GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4,
    "vocab_size": 201088, "max_position_embeddings": 131072, "initial_context_length": 4096,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-05, "rope_theta": 150000, "attention_bias": True,
    "hidden_act": "silu", "swiglu_limit": 7.0, "sliding_window": 128, "router_aux_loss_coef": 0.9,
    "output_router_logits": False,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": False},
}  # fmt: skip
"""openai/gpt-oss-120b (no preset): OpenAI's model card counts 116.83B parameters."""

GLM45_AIR = _config_file("GLM-4.5-Air")
"""zai-org/GLM-4.5-Air (no preset): 106B total, 12B active (its model card and arXiv 2508.06471)."""
OLMOE_1B_7B = _config_file("OLMoE-1B-7B-0924")
"""allenai/OLMoE-1B-7B-0924 (no preset): 6.9B total, 1.3B active (arXiv 2409.02060, Table 1)."""

# the config.json files of tests/data/hf_configs/, by model, for the tests that take every config (no preset describes
# them)
HF_CONFIG_FILES: dict[str, dict] = {"GLM-4.5-Air": GLM45_AIR, "OLMoE-1B-7B-0924": OLMOE_1B_7B}


# config -> the preset it describes
HF_PRESETS: dict[str, tuple[dict, str]] = {
    "Llama-2-7b-hf": (LLAMA2_7B, "llama2-7b"),
    "Meta-Llama-3-70B": (LLAMA3_70B, "llama3-70b"),
    "Mixtral-8x7B-v0.1": (MIXTRAL_8X7B, "mixtral-s"),
    "Qwen2-57B-A14B": (QWEN2_57B, "qwen2-57b-a14b"),
    "Qwen3-30B-A3B": (QWEN3_30B, "qwen3-30b-a3b"),
    "DeepSeek-V2-Lite": (DSV2_LITE, "deepseek-v2-lite"),
    "DeepSeek-V3": (DSV3, "deepseek-v3"),
}
