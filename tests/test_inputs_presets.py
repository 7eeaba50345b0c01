"""Model presets (profiles/models/*.yaml) and HuggingFace config.json conversion."""

from __future__ import annotations

import pytest

from planner.errors import PlannerInputError
from planner.inputs.hf_config import hf_config_notes, model_from_hf_config
from planner.inputs.presets import list_model_presets, load_model_preset
from planner.schemas.model import ModelSpec

from helpers.hf_configs import (DSV2_LITE, DSV3, GLM45_AIR, GPT_OSS_120B, HF_PRESETS, LLAMA2_7B, LLAMA3_70B, MIXTRAL_8X7B,
                                OLMOE_1B_7B, QWEN2_57B, QWEN3_30B)

# Published totals (model cards / papers), in billions of parameters.
PUBLISHED_TOTAL_B = {
    "llama2-7b": 6.74,  # Llama-2-7b-hf: 6,738,415,616
    "llama2-13b": 13.02,  # Llama-2-13b-hf: 13,015,864,320
    "llama2-70b": 68.98,  # Llama-2-70b-hf: 68,976,648,192
    "llama3-8b": 8.03,  # Meta-Llama-3-8B: 8,030,261,248
    "llama3-70b": 70.55,  # Meta-Llama-3-70B: 70,553,706,496
    "mixtral-s": 46.7,  # Mixtral paper: 47B total (46.7B)
    "mixtral-l": 141.0,  # Mixtral 8x22B card: 141B total
    "qwen2-57b-a14b": 57.4,  # Qwen2 report: 57B total
    "qwen3-30b-a3b": 30.5,  # Qwen3-30B-A3B card: 30.5B
    "qwen3-235b-a22b": 235.0,  # Qwen3-235B-A22B card: 235B
    "deepseek-v2-lite": 15.7,  # DeepSeek-V2-Lite card: 15.7B (16B)
    "deepseek-v3": 671.0,  # DeepSeek-V3 report: 671B main model (MTP module excluded)
}
# Activated parameters per token, where the card publishes them.
PUBLISHED_ACTIVE_B = {"mixtral-s": 12.9, "qwen3-30b-a3b": 3.3, "qwen3-235b-a22b": 22.0, "deepseek-v3": 37.0}


def attention_params(m: ModelSpec) -> int:
    """Weights of one attention block (no biases), written from the architecture, not from planner code."""
    h, heads = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk
        else:
            q = h * heads * qk
        kv = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank + m.kv_lora_rank * heads * (
            m.qk_head_dim + m.v_head_dim
        )
        return q + kv + heads * m.v_head_dim * h
    d = m.kv_channels or h // heads
    groups = m.num_query_groups or heads
    out = h * heads * d + 2 * h * groups * d + heads * d * h
    return out + (2 * d if m.qk_layernorm else 0)


def mlp_params(m: ModelSpec, size: int) -> int:
    return (3 if m.swiglu else 2) * m.hidden_size * size


def param_counts(m: ModelSpec) -> tuple[int, int]:
    """(total, activated) parameters of the decoder (no MTP), from the spec's fields."""
    total = active = 0
    moe_layers = m.moe_layer_pattern or (1,) * m.num_layers
    for i in range(m.num_layers):
        common = attention_params(m) + 2 * m.hidden_size
        if m.num_experts and moe_layers[i]:
            shared = mlp_params(m, m.moe_shared_expert_intermediate_size or 0) if m.moe_shared_expert_intermediate_size else 0
            expert = mlp_params(m, m.moe_ffn_hidden_size)
            router = m.hidden_size * m.num_experts
            total += common + router + shared + m.num_experts * expert
            active += common + router + shared + m.moe_router_topk * expert
        else:
            dense = mlp_params(m, m.ffn_hidden_size)
            total += common + dense
            active += common + dense
    embed = m.vocab_size * m.hidden_size * (2 if m.untie_embeddings_and_output_weights else 1) + m.hidden_size
    return total + embed, active + embed


def test_all_required_presets_exist():
    """Every preset the brief names is bundled."""
    assert set(PUBLISHED_TOTAL_B) <= set(list_model_presets())


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL_B))
def test_preset_parameter_count_matches_published(name):
    """Each preset's parameter count, computed from its fields, is within 2% of the published total."""
    spec, training = load_model_preset(name)
    total, active = param_counts(spec)
    assert total / 1e9 == pytest.approx(PUBLISHED_TOTAL_B[name], rel=0.02)
    if name in PUBLISHED_ACTIVE_B:
        assert active / 1e9 == pytest.approx(PUBLISHED_ACTIVE_B[name], rel=0.05)
    assert spec.name == name
    assert training["micro_batch_size"] == 1 and training["global_batch_size"] > 0
    assert spec.seq_length == training["seq_length"] == 4096


def test_preset_names_are_case_insensitive_and_unknown_lists_known():
    """Preset lookup ignores case; an unknown name lists the known ones."""
    assert load_model_preset("Mixtral-S")[0] == load_model_preset("mixtral-s")[0]
    with pytest.raises(PlannerInputError) as exc:
        load_model_preset("gpt-5")
    assert exc.value.field == "--model" and "mixtral-s" in str(exc.value) and "llama2-7b" in str(exc.value)


def test_preset_yaml_path_and_errors(tmp_path):
    """A YAML path in preset format loads; bad keys are named."""
    f = tmp_path / "tiny.yaml"
    f.write_text(
        "num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 100\n"
        "num_experts: 4\nmoe_layer_freq: '([0]+[1]*3)'\ntraining:\n  global_batch_size: 16\n  seq_length: 512\n"
    )
    spec, training = load_model_preset(str(f))
    assert spec.name == "tiny" and spec.seq_length == 512 and spec.layer_is_moe == (False, True, True, True)
    assert training == {"global_batch_size": 16, "seq_length": 512}
    f.write_text("num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 100\ntraining:\n  lr: 1\n")
    with pytest.raises(PlannerInputError, match="lr"):
        load_model_preset(str(f))
    f.write_text("num_layers: 4\nhidden_size: 63\nnum_attention_heads: 4\nvocab_size: 100\n")
    with pytest.raises(PlannerInputError, match="divisible"):
        load_model_preset(str(f))
    with pytest.raises(PlannerInputError, match="not found"):
        load_model_preset(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("cfg, preset", HF_PRESETS.values(), ids=HF_PRESETS)
def test_hf_config_agrees_with_preset(cfg, preset):
    """Converting the published config.json gives the same ModelSpec as the hand-written preset, but for
    the balance loss's weight: config.json states its own (router_aux_loss_coef), the presets leave it to
    the planner's assumption (reported as assumed, and written into the launcher)."""
    from_hf = model_from_hf_config(cfg, preset)
    spec, _ = load_model_preset(preset)
    assert spec.moe_aux_loss_coeff is None
    assert from_hf.moe_aux_loss_coeff == cfg.get("router_aux_loss_coef")
    assert from_hf.model_dump(exclude={"moe_aux_loss_coeff"}) == spec.model_dump(exclude={"moe_aux_loss_coeff"})


def test_hf_family_details():
    """Family-specific fields: GQA groups, shared experts, QK-norm/head_dim, MLA ranks, dense-first layers, MTP."""
    assert model_from_hf_config(LLAMA2_7B, "x").num_query_groups is None
    assert model_from_hf_config(LLAMA3_70B, "x").query_groups == 8
    q2 = model_from_hf_config(QWEN2_57B, "q2")
    assert q2.moe_shared_expert_intermediate_size == 20480 and q2.moe_ffn_size == 2560 and q2.moe_router_topk == 8
    q3 = model_from_hf_config(QWEN3_30B, "q3")
    assert q3.qk_layernorm and q3.head_dim == 128 and q3.num_experts == 128
    v2 = model_from_hf_config(DSV2_LITE, "v2")
    assert v2.multi_latent_attention and v2.q_lora_rank is None and v2.kv_lora_rank == 512
    assert v2.layer_is_moe[:2] == (False, True) and v2.moe_shared_expert_intermediate_size == 2 * 1408
    v3 = model_from_hf_config(DSV3, "v3")
    assert v3.layer_is_moe.count(False) == 3 and v3.mtp_num_layers == 1 and v3.q_lora_rank == 1536


def test_hf_hidden_act_is_the_gated_mlps_activation():
    """`hidden_act` silu (or unset) is --swiglu; a gated activation Megatron has no flag for is refused by name;
    gpt-oss's experts are Megatron's --quick-geglu (GptOssExperts ignores hidden_act), with biases on every linear."""
    assert model_from_hf_config({**LLAMA2_7B, "hidden_act": "silu"}, "x").swiglu
    with pytest.raises(PlannerInputError, match=r"hidden_act.*'gelu_pytorch_tanh'.*silu"):
        model_from_hf_config({**LLAMA2_7B, "hidden_act": "gelu_pytorch_tanh"}, "x")
    oss = model_from_hf_config(GPT_OSS_120B, "gpt-oss-120b")
    assert oss.quick_geglu and not oss.swiglu and oss.gated_linear_unit and oss.add_bias_linear
    assert (oss.num_experts, oss.moe_router_topk, oss.moe_ffn_size, oss.head_dim) == (128, 4, 2880, 64)
    assert any("--softmax-type learnable" in note for note in hf_config_notes(GPT_OSS_120B))


def test_hf_gpt_oss_windows_and_clamp_are_read_as_megatron_bridge_sets_them():
    """gpt-oss's `sliding_window` 128 is --window-size 127,0 (a query sees itself and 127 keys before it) on the layers
    `layer_types` marks sliding: every second one, --window-attn-skip-freq 2 (GPTOSSProvider); `swiglu_limit` is
    --activation-func-clamp-value.  Another pattern is kept layer by layer; a bad one is refused by name."""
    oss = model_from_hf_config(GPT_OSS_120B, "gpt-oss-120b")
    assert (oss.window_size, oss.window_attn_skip_freq, oss.activation_func_clamp_value) == ((127, 0), 2, 7.0)
    assert oss.layer_is_windowed == (True, False) * 18  # Megatron's layer 1 (index 0) slides, as layer_types[0]
    assert oss.clamped_quick_geglu
    kinds = ["sliding_attention"] * 3 + ["full_attention"]
    other = model_from_hf_config({**GPT_OSS_120B, "layer_types": kinds * 9}, "x")
    assert other.window_attn_skip_freq == (1, 1, 1, 0) * 9 and sum(other.layer_is_windowed) == 27
    full = model_from_hf_config({**GPT_OSS_120B, "layer_types": ["full_attention"] * 36, "swiglu_limit": None}, "x")
    assert full.window_size is None and not any(full.layer_is_windowed) and full.activation_func_clamp_value is None
    with pytest.raises(PlannerInputError, match=r"config.json:layer_types.*36 entries"):
        model_from_hf_config({**GPT_OSS_120B, "layer_types": ["sliding_attention"] * 35}, "x")
    with pytest.raises(PlannerInputError, match=r"config.json:layer_types.*sliding_attention, full_attention"):
        model_from_hf_config({**GPT_OSS_120B, "layer_types": ["chunked_attention"] * 36}, "x")


def test_hf_mistral_and_mixtral_windows_are_read():
    """Mistral-7B-v0.1's `sliding_window` 4096 slides on every layer (MistralAttention), --window-size 4095,0, as
    gpt-oss's; a Mistral config without the key gets MistralConfig's 4096, null is full attention; Mixtral reads its
    own (null in the published configs).  Were dropped: priced and launched with full attention at any --seq."""
    mistral = {**LLAMA2_7B, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 4096}
    model = model_from_hf_config(mistral, "mistral-7b")
    assert model.window_size == (4095, 0) and all(model.layer_is_windowed)
    assert model_from_hf_config({k: v for k, v in mistral.items() if k != "sliding_window"}, "x").window_size == (4095, 0)
    assert model_from_hf_config({**mistral, "sliding_window": None}, "x").window_size is None
    assert model_from_hf_config({**MIXTRAL_8X7B, "sliding_window": 2048}, "x").window_size == (2047, 0)
    assert model_from_hf_config(MIXTRAL_8X7B, "x").window_size is None


def test_hf_qwen_sliding_window_is_named():
    """A Qwen config with use_sliding_window true is planned with full attention, and a note says so (was silent)."""
    cfg = {**QWEN3_30B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 28}
    assert any("use_sliding_window" in note for note in hf_config_notes(cfg))
    assert not any("sliding" in note for note in hf_config_notes({**QWEN3_30B, "use_sliding_window": False}))


def test_hf_qwen3_null_head_dim_is_hidden_over_heads():
    """Qwen3's `head_dim: null` is hidden_size / heads (Qwen3Config), not a missing key (was refused as missing)."""
    assert model_from_hf_config({**QWEN3_30B, "head_dim": None}, "x").head_dim == 2048 // 32
    assert model_from_hf_config({**QWEN3_30B, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                                 "head_dim": None}, "x").head_dim == 2048 // 32


def test_hf_sparse_step_and_dense_only_layers():
    """Qwen3-MoE's decoder_sparse_step / mlp_only_layers and DeepSeek's moe_layer_freq pick the MoE layers."""
    cfg = {**QWEN3_30B, "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    assert model_from_hf_config(cfg, "x").layer_is_moe == (False, True, False, False, False, True)
    ds = {**DSV2_LITE, "num_hidden_layers": 6, "first_k_dense_replace": 1, "moe_layer_freq": 2}
    assert model_from_hf_config(ds, "x").layer_is_moe == (False, False, True, False, True, False)


def test_hf_unknown_architecture_lists_supported():
    """An unsupported architecture is refused with the supported list."""
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "x")
    for fam in ("llama", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "glm4_moe",
                "olmoe", "Glm4MoeForCausalLM", "OlmoeForCausalLM"):
        assert fam in str(exc.value)


def test_hf_glm4_moe_reads_each_field_as_transformers_builds_it():
    """GLM-4.5-Air's config.json as transformers' Glm4MoeAttention, Glm4MoeDecoderLayer, Glm4MoeMoE and
    Glm4MoeTopkRouter build it (was refused: "unsupported architecture"): head_dim 128 with 96 heads over hidden 4096,
    biases on Q, K and V only, RoPE on half of each head, one dense layer of intermediate_size then MoE layers of 128
    experts of 1408 with one ungated shared expert of 1408, a sigmoid router with the expert bias, one MTP layer."""
    m = model_from_hf_config(GLM45_AIR, "glm-4.5-air")
    assert (m.head_dim, m.query_groups, m.rotary_percent, m.rotary_base, m.norm_epsilon) == (128, 8, 0.5, 1000000, 1e-5)
    assert m.add_qkv_bias and not m.add_bias_linear and not m.qk_layernorm and m.swiglu
    assert m.layer_is_moe == (False,) + (True,) * 45 and m.ffn_size == 10944
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_size, m.moe_shared_expert_intermediate_size) == (128, 8, 1408, 1408)
    assert not m.moe_shared_expert_gate and m.untie_embeddings_and_output_weights and m.mtp_num_layers == 1
    assert (m.moe_router_score_function, m.moe_router_enable_expert_bias, m.moe_router_pre_softmax) == ("sigmoid", True,
                                                                                                        False)
    assert m.moe_router_num_groups is None and m.moe_router_topk_scaling_factor is None  # n_group 1, scaling 1.0
    assert m.moe_aux_loss_coeff is None and m.trained_aux_loss_coeff == 0.0  # no balancing loss in Glm4MoeForCausalLM
    assert hf_config_notes(GLM45_AIR) == []
    # GLM-4.5's own switches: QK norm per head, 3 dense layers, grouped routing, routed scaling 2.5
    glm45 = model_from_hf_config({**GLM45_AIR, "use_qk_norm": True, "first_k_dense_replace": 3, "n_group": 8,
                                  "topk_group": 4, "routed_scaling_factor": 2.5}, "glm-4.5")
    assert glm45.qk_layernorm and glm45.layer_is_moe[:4] == (False, False, False, True)
    assert (glm45.moe_router_num_groups, glm45.moe_router_group_topk, glm45.moe_router_topk_scaling_factor) == (8, 4, 2.5)
    # Glm4MoeConfig's defaults where a key is left out; by architecture without model_type
    bare = {k: v for k, v in GLM45_AIR.items() if k not in ("partial_rotary_factor", "n_shared_experts", "model_type",
                                                             "first_k_dense_replace", "rms_norm_eps", "use_qk_norm")}
    assert model_from_hf_config(bare, "x").model_dump() == m.model_copy(update={"name": "x"}).model_dump()
    assert model_from_hf_config({**GLM45_AIR, "n_shared_experts": 2}, "x").moe_shared_expert_intermediate_size == 2816
    assert model_from_hf_config({**GLM45_AIR, "n_shared_experts": 0}, "x").moe_shared_expert_intermediate_size is None
    assert model_from_hf_config({**GLM45_AIR, "first_k_dense_replace": 0}, "x").moe_layer_pattern is None


def test_hf_glm4_moe_says_what_megatron_routes_otherwise_and_refuses_bad_keys():
    """Megatron renormalises sigmoid top-k scores whatever norm_topk_prob says, and ranks a group by its top
    topk/topk_group scores where GLM takes the top 2: both named in a note; a missing or mistyped key is named."""
    (note,) = hf_config_notes({**GLM45_AIR, "norm_topk_prob": False})
    assert "norm_topk_prob is false" in note and "renormalises" in note
    assert hf_config_notes({**GLM45_AIR, "n_group": 8, "topk_group": 4}) == []  # top 8 / 4 groups = top 2: the same
    (note,) = hf_config_notes({**GLM45_AIR, "n_group": 8, "topk_group": 2})
    assert "n_group 8" in note and "= 4" in note
    with pytest.raises(PlannerInputError, match="n_routed_experts"):
        model_from_hf_config({k: v for k, v in GLM45_AIR.items() if k != "n_routed_experts"}, "x")
    with pytest.raises(PlannerInputError, match="use_qk_norm"):
        model_from_hf_config({**GLM45_AIR, "use_qk_norm": "yes"}, "x")
    with pytest.raises(PlannerInputError, match="norm_topk_prob"):
        model_from_hf_config({**GLM45_AIR, "norm_topk_prob": 1}, "x")


def test_hf_glm4_moe_refuses_expert_groups_its_router_cannot_form():
    """Glm4MoeMoE views the n_routed_experts scores as n_group equal groups and takes each group's top 2: 128 experts
    in 3 groups leave a remainder, in 128 groups of one, or a single expert, have no top 2 (was: accepted, or refused
    under Megatron's --moe-router-num-groups, a flag the config does not have)."""
    for groups in (3, 128, 256):
        with pytest.raises(PlannerInputError) as exc:
            model_from_hf_config({**GLM45_AIR, "n_group": groups, "topk_group": 1}, "x")
        assert exc.value.field == "config.json:n_group" and "at most 64" in str(exc.value)
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**GLM45_AIR, "n_routed_experts": 1, "num_experts_per_tok": 1}, "x")
    assert exc.value.field == "config.json:n_routed_experts"
    assert model_from_hf_config({**GLM45_AIR, "n_group": 64, "topk_group": 4}, "x").moe_router_num_groups == 64


def test_hf_olmoe_reads_each_field_as_transformers_builds_it():
    """OLMoE-1B-7B's config.json as transformers' OlmoeAttention and OlmoeSparseMoeBlock build it (was refused):
    every layer MoE with 64 experts of intermediate_size 1024, top 8 of a softmax over all of them, not renormalised
    (norm_topk_prob false: --moe-router-pre-softmax), the Switch loss at router_aux_loss_coef, no shared expert, Q and
    K normalised, no biases."""
    m = model_from_hf_config(OLMOE_1B_7B, "olmoe")
    assert (m.head_dim, m.query_groups, m.rotary_percent, m.norm_epsilon) == (128, 16, 1.0, 1e-5)
    assert m.qk_layernorm and not m.add_qkv_bias and not m.add_bias_linear and m.swiglu
    assert all(m.layer_is_moe) and m.moe_shared_expert_intermediate_size is None
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_size) == (64, 8, 1024)
    assert (m.moe_router_score_function, m.moe_router_pre_softmax, m.moe_router_enable_expert_bias) == ("softmax", True,
                                                                                                        False)
    assert (m.moe_aux_loss_coeff, m.moe_router_load_balancing_type) == (0.01, "aux_loss")
    assert not model_from_hf_config({**OLMOE_1B_7B, "norm_topk_prob": True}, "x").moe_router_pre_softmax
    assert model_from_hf_config({**OLMOE_1B_7B, "attention_bias": True}, "x").add_qkv_bias
    with pytest.raises(PlannerInputError, match="num_experts"):
        model_from_hf_config({k: v for k, v in OLMOE_1B_7B.items() if k != "num_experts"}, "x")


def test_hf_olmoe_notes_what_megatron_cannot_build():
    """OLMoE's q_norm is RMSNorm(hidden_size) and its k_norm RMSNorm(key heads x head_dim) over the whole projections
    (OlmoeAttention), Megatron's --qk-layernorm one per head: always named, with the weights that differ, per layer
    (2048 - 128) + (16 x 128 - 128) over 16 layers; an output-projection bias and clip_qkv are named where set."""
    (note,) = hf_config_notes(OLMOE_1B_7B)
    assert "whole Q and K projections" in note and "--qk-layernorm" in note and "time and memory" in note
    assert f"{((2048 - 128) + (16 * 128 - 128)) * 16:,}" in note
    notes = hf_config_notes({**OLMOE_1B_7B, "attention_bias": True, "clip_qkv": 8.0}, "olmoe.json")
    assert len(notes) == 3 and all(n.startswith("olmoe.json") for n in notes)
    assert "output projection" in notes[1] and "clip_qkv 8.0" in notes[2]


def test_hf_rules_between_keys_name_the_config_keys():
    """Key/value heads that do not divide the query heads, and more experts per token than experts, are refused
    under the config's keys (was: "config.json (model): ... num_query_groups" / "moe_router_topk", Megatron's
    names, which the config does not use); a top-k left out is named with its default."""
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**OLMOE_1B_7B, "num_key_value_heads": 3}, "x")
    assert exc.value.field == "config.json:num_key_value_heads" and "num_attention_heads 16" in str(exc.value)
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**MIXTRAL_8X7B, "num_experts_per_tok": 9}, "x")
    assert exc.value.field == "config.json:num_experts_per_tok" and "num_local_experts 8" in str(exc.value)
    bare = {k: v for k, v in GLM45_AIR.items() if k != "num_experts_per_tok"}
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**bare, "n_routed_experts": 4, "n_group": 2}, "x")  # Glm4MoeConfig's default top 8
    assert exc.value.field == "config.json:num_experts_per_tok" and "default" in str(exc.value)
    assert model_from_hf_config({**bare, "n_routed_experts": 8}, "x").moe_router_topk == 8


def test_hf_rotary_keys_out_of_range_are_named():
    """A rope_theta past the planner's limit on --rotary-base and a partial_rotary_factor over 1 are refused under
    their keys, the number shown short (was: "config.json (rotary_base)" with all 309 digits of 1e308, and
    "config.json (rotary_percent)": Megatron's names)."""
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**OLMOE_1B_7B, "rope_theta": 1e308}, "x")
    assert exc.value.field == "config.json:rope_theta" and len(str(exc.value)) < 200
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**GLM45_AIR, "partial_rotary_factor": 2}, "x")
    assert exc.value.field == "config.json:partial_rotary_factor" and "(0, 1]" in str(exc.value)
    assert model_from_hf_config({**GLM45_AIR, "partial_rotary_factor": 1}, "x").rotary_percent == 1.0


def test_hf_negative_balancing_loss_weights_are_named():
    """A negative router_aux_loss_coef (OLMoE, Mixtral) or aux_loss_alpha (DeepSeek) is refused under its key (was:
    "config.json (moe_aux_loss_coeff)", Megatron's name)."""
    for cfg, key in ((OLMOE_1B_7B, "router_aux_loss_coef"), (MIXTRAL_8X7B, "router_aux_loss_coef"),
                     (DSV2_LITE, "aux_loss_alpha")):
        with pytest.raises(PlannerInputError) as exc:
            model_from_hf_config({**cfg, key: -0.01}, "x")
        assert exc.value.field == f"config.json:{key}" and ">= 0" in str(exc.value)
    assert model_from_hf_config({**OLMOE_1B_7B, "router_aux_loss_coef": 0}, "x").moe_aux_loss_coeff == 0.0


def test_hf_moe_families_refuse_zero_experts_without_calling_the_key_missing():
    """An expert count of 0 in a family that is MoE by construction is refused as out of range under the key given
    (was: "missing", though the key is there); a key left out is still called missing."""
    for cfg, key in ((GLM45_AIR, "n_routed_experts"), (OLMOE_1B_7B, "num_experts"), (MIXTRAL_8X7B, "num_local_experts"),
                     (QWEN3_30B, "num_experts"), (GPT_OSS_120B, "num_local_experts")):
        with pytest.raises(PlannerInputError) as exc:
            model_from_hf_config({**cfg, key: 0}, "x")
        assert exc.value.field == f"config.json:{key}" and "got 0" in str(exc.value)
        assert "missing" not in str(exc.value)
        with pytest.raises(PlannerInputError, match="missing"):
            model_from_hf_config({k: v for k, v in cfg.items() if k != key}, "x")


def test_hf_glm4_moe_first_dense_layers_name_the_layer_count_and_the_default():
    """first_k_dense_replace must leave a MoE layer: the refusal names num_hidden_layers, and says where the 1 comes
    from when the key is left out (was: "expected an integer in 0..0, got 1" of a key the config does not have)."""
    bare = {k: v for k, v in GLM45_AIR.items() if k != "first_k_dense_replace"}
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**bare, "num_hidden_layers": 1}, "x")
    assert exc.value.field == "config.json:first_k_dense_replace"
    assert "default" in str(exc.value) and "num_hidden_layers 1" in str(exc.value)
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**GLM45_AIR, "first_k_dense_replace": 46}, "x")
    assert "default" not in str(exc.value) and "0..45" in str(exc.value)


def test_hf_missing_or_bad_fields_are_named():
    """A missing or mistyped config key is named in the error."""
    cfg = dict(LLAMA2_7B)
    del cfg["hidden_size"]
    with pytest.raises(PlannerInputError, match="hidden_size"):
        model_from_hf_config(cfg, "x")
    with pytest.raises(PlannerInputError, match="num_hidden_layers"):
        model_from_hf_config({**LLAMA2_7B, "num_hidden_layers": "32"}, "x")


@pytest.mark.parametrize(
    "rename",
    [
        {"n_routed_experts": "num_routed_experts"},
        {"n_routed_experts": "num_local_experts"},
        {"n_routed_experts": "num_experts", "n_shared_experts": "num_shared_experts"},
    ],
)
def test_hf_expert_key_variants_read_the_same_model(rename):
    """DeepSeek-V3 written with another family's expert keys is the same MoE model, never dense."""
    cfg = {rename.get(k, k): v for k, v in DSV3.items()}
    spec, _ = load_model_preset("deepseek-v3")
    assert model_from_hf_config(cfg, "deepseek-v3").model_dump() == spec.model_dump()


def test_hf_experts_in_a_family_read_as_dense_are_read():
    """A llama-type config that names experts (num_local_experts) is read as MoE with them."""
    cfg = {**LLAMA2_7B, "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 2048,
           "n_shared_experts": 1}  # fmt: skip
    m = model_from_hf_config(cfg, "x")
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size, m.moe_shared_expert_intermediate_size) == (8, 2, 2048, 2048)


def test_hf_unknown_expert_keys_are_refused():
    """An expert setting the reader does not know is refused, naming the key, not planned as dense."""
    cfg = {**LLAMA2_7B, "num_experts_total": 64, "experts_topk": 4}
    with pytest.raises(PlannerInputError) as err:
        model_from_hf_config(cfg, "x")
    assert err.value.field in ("config.json:num_experts_total", "config.json:experts_topk")
    assert "does not understand" in str(err.value)


def test_hf_config_dropout_is_the_configs_and_is_written(tmp_path):
    """walk55m: a config's `attention_dropout` (0.0 in current configs, transformers' default) was ignored, the run
    priced and launched at Megatron's default 0.1/0.1, another model than the config's (which has no hidden
    dropout at all).  Now the config's value is priced and written, hidden dropout 0.0, nothing assumed; a model
    YAML stating dropout gets it written too (it was priced and not written); a bad value is refused naming the key."""
    import json

    from click.testing import CliRunner

    from cli import main

    def solve(model: str) -> tuple[list[str], dict]:  # on two GPUs: any plan writes the flags (H100:8: 3x the search)
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        res = CliRunner().invoke(main, ["solve", "--model", model, "--cluster", "H100:2", "--backend", "hsdp",
                                        "--time-limit", "5", "--out", str(out), "--json", "--quiet"])
        assert res.exit_code == 0, res.output
        return (out / "launch" / "megatron_args.txt").read_text().split(), json.loads(res.stdout)

    def dropout(args: list[str]) -> tuple[str | None, str | None]:
        return tuple(args[args.index(f) + 1] if f in args else None for f in ("--attention-dropout", "--hidden-dropout"))

    for value, written in ((None, ("0.0", "0.0")), (0.0, ("0.0", "0.0")), (0.1, (None, "0.0"))):
        cfg = {**MIXTRAL_8X7B, "num_hidden_layers": 2}
        cfg.pop("attention_dropout", None)
        if value is not None:
            cfg["attention_dropout"] = value
        path = tmp_path / f"c{value}.json"
        path.write_text(json.dumps(cfg))
        args, payload = solve(str(path))
        assert dropout(args) == written, (value, args)
        assert "dropout" not in {a["name"] for a in payload["assumed"]}
    yaml_file = tmp_path / "m.yaml"
    yaml_file.write_text("name: tiny\nnum_layers: 2\nhidden_size: 512\nnum_attention_heads: 8\nseq_length: 1024\n"
                         "vocab_size: 32000\ntraining:\n  attention_dropout: 0.0\n  hidden_dropout: 0.0\n")
    args, _ = solve(str(yaml_file))
    assert dropout(args) == ("0.0", "0.0"), args
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**MIXTRAL_8X7B, "attention_dropout": "high"}))
    res = CliRunner().invoke(main, ["estimate", "--model", str(bad), "--cluster", "H100:8"])
    assert res.exit_code == 2 and "bad.json:attention_dropout" in res.output, res.output


def test_hf_deepseek_refuses_expert_groups_its_router_cannot_form():
    """DeepseekV3TopkRouter (noaux_tc) views the 256 scores as n_group equal groups and ranks each by its top 2;
    DeepseekV2MoEGate (group_limited_greedy) by its best: a remainder, or for V3 a group of one, cannot be formed, and
    topk_group cannot exceed n_group (was: refused under Megatron's --moe-router-num-groups / group-topk, flags the
    config does not have, or accepted)."""
    for groups in (3, 256):
        with pytest.raises(PlannerInputError) as exc:
            model_from_hf_config({**DSV3, "n_group": groups, "topk_group": 1}, "x")
        assert exc.value.field == "config.json:n_group" and "at most 128" in str(exc.value)
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**DSV3, "topk_group": 9}, "x")
    assert exc.value.field == "config.json:topk_group" and "1..8" in str(exc.value)
    v2 = {**DSV2_LITE, "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3}  # as DeepSeek-V2's gate
    assert model_from_hf_config(v2, "x").moe_router_num_groups == 8
    with pytest.raises(PlannerInputError) as exc:
        model_from_hf_config({**v2, "n_group": 5}, "x")
    assert exc.value.field == "config.json:n_group" and "at most 64" in str(exc.value)
