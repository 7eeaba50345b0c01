"""Launchers train the model that was priced (issue 20 item 4).

Every architecture field of ModelSpec has a row in planner/megatron/flags.py that writes it as its
Megatron flag; the planner's own flag reader reads those flags back into the same spec, for every
shipped preset and HF config fixture and for every field changed on its own; and the launchers the
planner writes from them pass Megatron's own validator (slow; needs the validator environment).
"""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from planner.errors import PlannerInputError
from planner.inputs.hf_config import hf_config_notes, model_from_hf_config
from planner.inputs.megatron_flags import build_run, parse_megatron_draft
from planner.inputs.presets import list_model_presets, load_model_file, load_model_preset
from planner.inputs.resolve import resolve_run
from planner.launcher import render_launch_files
from planner.megatron.flags import MODEL_FLAGS, model_flags
from planner.cost.model import CostModel
from planner.inputs.script import read_launcher_script
from planner.schemas.model import AUX_LOSS_ASSUMED, ModelSpec
from planner.schemas.plan import Plan, StagePlan

from helpers.hf_configs import DSV3, HF_CONFIG_FILES, HF_PRESETS, LLAMA3_70B, MIXTRAL_8X7B, QWEN3_30B
from helpers.launch import cluster_of
from tools.fuzz.inputs import SCRIPT
from helpers.megatron import NEEDS_MEGATRON, validate

ARCH_FIELDS = [f for f in ModelSpec.model_fields if f != "name"]


def flags_of(spec: ModelSpec) -> list[str]:
    return [tok for name, values in model_flags(spec) for tok in (name, *values)]


def read_back(spec: ModelSpec) -> ModelSpec:
    """spec -> its Megatron flags -> the planner's flag reader -> a spec."""
    argv = flags_of(spec) + ["--global-batch-size", "8"]
    return build_run(parse_megatron_draft(argv, name=spec.name)).model


def differences(a: ModelSpec, b: ModelSpec) -> dict:
    """Fields that differ; the balance loss's weight as the run trains with it (the flags state the
    coefficient a spec left unstated: the one it is priced with)."""
    da, db = (dict(m.model_dump(), moe_aux_loss_coeff=m.trained_aux_loss_coeff) for m in (a, b))
    return {k: (da[k], db[k]) for k in da if da[k] != db[k]}


def test_every_model_field_is_written_by_a_flag():
    """No ModelSpec field without a writer: a field the launcher left out would train another model."""
    written = {f.field for f in MODEL_FLAGS if f.write is not None and f.field}
    assert sorted(set(ARCH_FIELDS) - written) == []


@pytest.mark.parametrize("name", list_model_presets())
def test_every_preset_round_trips_through_its_flags(name):
    spec, _ = load_model_preset(name)
    assert differences(spec, read_back(spec)) == {}


HF_CONFIGS = {**{name: cfg for name, (cfg, _) in HF_PRESETS.items()}, **HF_CONFIG_FILES}
"""Every HF config fixture: those a preset describes and the published files of tests/data/hf_configs/."""


@pytest.mark.parametrize("cfg", HF_CONFIGS.values(), ids=list(HF_CONFIGS))
def test_every_hf_config_round_trips_through_its_flags(cfg):
    spec = model_from_hf_config(cfg, "hf")
    assert differences(spec, read_back(spec)) == {}


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-s", "qwen3-30b-a3b", "deepseek-v3"])
def test_presets_train_with_rotary_embeddings(name):
    """Llama, Mixtral, Qwen and DeepSeek use RoPE; Megatron's default (learned absolute) is another model."""
    flags = flags_of(load_model_preset(name)[0])
    assert flags[flags.index("--position-embedding-type") + 1] == "rope"


# A base for each kind of model, and for every field a value other than the base's: each field changed
# on its own must reach the flags and come back.
GQA_MOE = ModelSpec(name="gqa", num_layers=4, hidden_size=512, num_attention_heads=8, num_query_groups=2,
                    vocab_size=1000, seq_length=1024, max_position_embeddings=1024, num_experts=8, moe_router_topk=2)
MLA_MOE = ModelSpec(name="mla", num_layers=4, hidden_size=512, num_attention_heads=8, vocab_size=1000,
                    max_position_embeddings=1024,
                    seq_length=1024, multi_latent_attention=True, num_experts=8, moe_router_topk=2,
                    position_embedding_type="rope")
VARIANTS: list[tuple[ModelSpec, dict]] = [
    (GQA_MOE, {"num_layers": 6}), (GQA_MOE, {"hidden_size": 768}), (GQA_MOE, {"ffn_hidden_size": 1536}),
    (GQA_MOE, {"num_attention_heads": 16}), (GQA_MOE, {"num_query_groups": 4}), (GQA_MOE, {"kv_channels": 32}),
    (GQA_MOE, {"vocab_size": 50257}), (GQA_MOE, {"make_vocab_size_divisible_by": 64}),
    (GQA_MOE, {"seq_length": 2048, "max_position_embeddings": 4096}), (GQA_MOE, {"max_position_embeddings": 8192}),
    (GQA_MOE, {"position_embedding_type": "rope"}), (GQA_MOE, {"position_embedding_type": "none"}),
    (GQA_MOE, {"rotary_base": 500000}), (GQA_MOE, {"rotary_percent": 0.5}),
    (GQA_MOE, {"use_rope_scaling": True, "rope_scaling_factor": 32.0}),
    (GQA_MOE, {"swiglu": True}), (GQA_MOE, {"quick_geglu": True}),
    (GQA_MOE, {"squared_relu": True, "add_bias_linear": False}),  # with bias, Megatron refuses it (bias fusion)
    (GQA_MOE, {"normalization": "RMSNorm", "norm_epsilon": 1e-6}),
    (GQA_MOE, {"untie_embeddings_and_output_weights": True}), (GQA_MOE, {"add_bias_linear": False}),
    (GQA_MOE, {"add_bias_linear": False, "add_qkv_bias": True}), (GQA_MOE, {"qk_layernorm": True}),
    (MLA_MOE, {"q_lora_rank": 256}), (MLA_MOE, {"kv_lora_rank": 128}), (MLA_MOE, {"qk_head_dim": 64}),
    (MLA_MOE, {"qk_pos_emb_head_dim": 32}), (MLA_MOE, {"v_head_dim": 64}),
    (MLA_MOE, {"rotary_scaling_factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707}),
    (MLA_MOE, {"mtp_num_layers": 1}), (GQA_MOE, {"multi_latent_attention": True, "num_query_groups": None}),
    (GQA_MOE, {"num_experts": 16}), (GQA_MOE, {"moe_router_topk": 4}), (GQA_MOE, {"moe_ffn_hidden_size": 256}),
    (GQA_MOE, {"moe_shared_expert_intermediate_size": 512, "moe_shared_expert_gate": True}),
    (GQA_MOE, {"moe_layer_pattern": (0, 1, 1, 1)}), (GQA_MOE, {"moe_expert_capacity_factor": 1.25}),
    (GQA_MOE, {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}),
    (GQA_MOE, {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}),
    (GQA_MOE, {"moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1e-4}),
    (GQA_MOE, {"moe_router_num_groups": 4, "moe_router_group_topk": 2}),
    (GQA_MOE, {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True}),
    (GQA_MOE, {"moe_router_pre_softmax": True, "moe_router_topk_scaling_factor": 2.5}),
    (GQA_MOE, {"moe_router_dtype": "fp32"}), (GQA_MOE, {"moe_grouped_gemm": True}),
    (GQA_MOE, {"moe_router_force_load_balancing": True}),
    (GQA_MOE, {"quick_geglu": True, "activation_func_clamp_value": 7.0}), (GQA_MOE, {"apply_rope_fusion": False}),
    (GQA_MOE, {"window_size": (127, 0)}), (GQA_MOE, {"window_size": (127, 0), "window_attn_skip_freq": 2}),
    (GQA_MOE, {"window_size": (63, 0), "window_attn_skip_freq": (1, 1, 0, 0)}),
]  # fmt: skip


def test_the_variants_change_every_field():
    changed = {k for base, update in VARIANTS for k in update if getattr(base, k) != update[k]}
    assert sorted(set(ARCH_FIELDS) - changed) == []


@pytest.mark.parametrize("base, update", VARIANTS, ids=[",".join(u) for _, u in VARIANTS])
def test_each_field_changed_alone_round_trips(base, update):
    spec = base.model_validate({**base.model_dump(), **update})
    assert differences(spec, read_back(spec)) == {}
    assert differences(spec, base)  # the variant is another model, which the flags say


def test_a_top1_model_from_yaml_or_hf_config_gets_pre_softmax(tmp_path):
    """Megatron refuses a softmax top-1 router without --moe-router-pre-softmax ("Please use
    --moe-router-pre-softmax when topk is 1."): a YAML or HF config that does not say gets it."""
    cfg = {**MIXTRAL_8X7B, "num_experts_per_tok": 1}
    assert "--moe-router-pre-softmax" in flags_of(model_from_hf_config(cfg, "top1"))
    f = tmp_path / "top1.yaml"
    f.write_text("num_layers: 4\nhidden_size: 256\nnum_attention_heads: 4\nvocab_size: 1000\n"
                 "num_experts: 8\nmoe_router_topk: 1\n")
    assert load_model_file(f)[0].moe_router_pre_softmax
    f.write_text(f.read_text() + "moe_router_score_function: sigmoid\n")
    assert not load_model_file(f)[0].moe_router_pre_softmax  # sigmoid scores: Megatron does not ask for it


def test_router_semantics_follow_the_hf_families():
    """Renormalised top-k (Mixtral, norm_topk_prob true) is Megatron's plain top-k softmax; not renormalised
    is --moe-router-pre-softmax; DeepSeek-V3's sigmoid router keeps its groups, bias and scaling."""
    assert not model_from_hf_config(QWEN3_30B, "x").moe_router_pre_softmax
    assert model_from_hf_config({**QWEN3_30B, "norm_topk_prob": False}, "x").moe_router_pre_softmax
    v3 = model_from_hf_config(DSV3, "x")
    assert (v3.moe_router_score_function, v3.moe_router_num_groups, v3.moe_router_group_topk,
            v3.moe_router_enable_expert_bias, v3.moe_router_topk_scaling_factor) == ("sigmoid", 8, 4, True, 2.5)


def test_hf_rope_theta_and_llama3_scaling():
    cfg = {**LLAMA3_70B, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    spec = model_from_hf_config(cfg, "llama3.1")
    assert (spec.rotary_base, spec.use_rope_scaling, spec.rope_scaling_factor) == (500000, True, 8.0)
    with pytest.raises(PlannerInputError, match="rope_theta"):
        model_from_hf_config({**LLAMA3_70B, "rope_theta": 1234.5}, "x")


def test_a_multimodal_config_is_planned_as_its_text_part_and_says_so():
    """An unused vision tower is named (issue 23: a multimodal HF config planned as its text part)."""
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_vl_moe", "text_config": QWEN3_30B,
           "vision_config": {"depth": 27, "hidden_size": 1152}}
    spec = model_from_hf_config(cfg, "vl")
    assert spec.num_layers == 48
    (note,) = hf_config_notes(cfg)
    assert "multimodal" in note and "vision_config" in note and "text decoder only" in note
    assert hf_config_notes(QWEN3_30B) == []


def test_the_multimodal_note_reaches_the_run_notes(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "text_config": QWEN3_30B,
                                "vision_config": {"depth": 27}}))
    notes: list[str] = []
    resolve_run(model=str(path), notes=notes)
    assert any("vision_config" in n for n in notes)


# ---------------------------------------------------------------- the router setting that was priced
MOE_PRESETS = [n for n in list_model_presets() if load_model_preset(n)[0].is_moe]


@pytest.mark.parametrize("source", [*MOE_PRESETS, "Qwen3-30B-A3B", "Mixtral-8x7B-v0.1", "OLMoE-1B-7B-0924"])
def test_the_aux_loss_coefficient_priced_is_the_one_emitted(tmp_path, profiles, source):
    """The price assumed --moe-aux-loss-coeff 0.01, but megatron_args.txt carried none, so the job trained with
    Megatron's 0.0 (no balancing); HF's router_aux_loss_coef was not read (issue 33).  Now the launcher writes the
    balancing type and the coefficient (none where it is Megatron's 0.0: expert bias), and the flags it writes, read
    back, price the same router imbalance."""
    if source in HF_CONFIGS:
        cfg = HF_CONFIGS[source]
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        run = resolve_run(model=str(tmp_path / "config.json"))
        expected = cfg["router_aux_loss_coef"]  # the published config.json's: 0.001 Qwen3, 0.02 Mixtral, 0.01 OLMoE
    else:
        run = resolve_run(model=source)
        expected = 0.0 if run.model.moe_router_enable_expert_bias else AUX_LOSS_ASSUMED  # no preset states one
    argv, _ = _launcher_argv(run)
    assert argv.count("--moe-aux-loss-coeff") == (1 if expected else 0)
    assert argv.count("--moe-router-load-balancing-type") == 1
    assert not expected or float(argv[argv.index("--moe-aux-loss-coeff") + 1]) == expected
    assert argv[argv.index("--moe-router-load-balancing-type") + 1] == run.model.moe_router_load_balancing_type
    cluster = cluster_of(("H100", 1))
    priced = CostModel(run.model, run.training, cluster, profiles).routing
    back = build_run(parse_megatron_draft(argv, name=run.model.name)).model
    assert CostModel(back, run.training, cluster, profiles).routing == dataclasses.replace(priced, assumed=None)
    stated = source in HF_CONFIGS  # OLMoE states 0.01, the assumed value: stated, so not printed as assumed
    assert (priced.assumed is not None) == (not stated and expected == AUX_LOSS_ASSUMED)  # printed as assumed
    assert priced.assumed is None or f"--moe-aux-loss-coeff {AUX_LOSS_ASSUMED:g} assumed" in priced.assumed


@pytest.mark.parametrize("runtime", ["megatron", "flagscale"])
def test_a_script_keeps_its_own_router_setting(tmp_path, runtime):
    """A script that left --moe-aux-loss-coeff to Megatron's default (0.0: no load-balancing loss) was launched with
    --moe-aux-loss-coeff 0.01 and --moe-router-load-balancing-type aux_loss added, a loss term the user never asked
    for.  The launcher changes the parallel plan only: the script's router setting passes through as it stands, left
    out where the script leaves it out (megatron_args.txt, launch.sh and FlagScale's YAML alike), as written where it
    states it, and the run is priced with what it trains with."""
    for extra, expected in (("", None), ("--moe-aux-loss-coeff 1e-3", "1e-3"), ("--moe-aux-loss-coeff 0", "0")):
        script = tmp_path / "train.sh"
        text = SCRIPT.format(extra="", layers="4")
        script.write_text(text.replace("--moe-grouped-gemm", f"--moe-grouped-gemm {extra}"))
        run = resolve_run(megatron_script=str(script))
        assert run.model.trained_aux_loss_coeff == float(expected or 0)  # what the run trains with is priced
        plan = Plan(runtime=runtime, tp=2, ep=4, gbs=64, stages=(StagePlan(device_type="H100", num_layers=4, dp=4),))
        files = render_launch_files(run, plan, cluster_of(("H100", 1)), read_launcher_script(script))
        argv = shlex.split(files["megatron_args.txt"])
        assert "--moe-router-load-balancing-type" not in argv, extra
        assert (argv[argv.index("--moe-aux-loss-coeff") + 1] if "--moe-aux-loss-coeff" in argv else None) == expected
        assert argv.count("--moe-aux-loss-coeff") == (expected is not None)
        assert "added --moe-aux-loss-coeff" not in files["launch.sh"]
        assert "added --moe-router-load-balancing-type" not in files["launch.sh"]
        yaml_text = "".join(t for path, t in files.items() if path.endswith(".yaml"))
        assert ("moe_aux_loss_coeff" in yaml_text) == (runtime == "flagscale" and expected is not None)
        assert "moe_router_load_balancing_type" not in yaml_text


# ---------------------------------------------------------------- Megatron's validator
LAUNCH_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # launch.sh exports it with TP > 1


def _launcher_argv(run) -> tuple[list[str], int]:
    """The flags the planner's launcher writes for `run` on 8 GPUs: TP 2, EP 4 for MoE, one stage."""
    m = run.model
    tp = 2 if m.num_attention_heads % 2 == 0 and m.query_groups % 2 == 0 else 1
    ep = 4 if m.is_moe and m.num_experts % 4 == 0 else 1
    plan = Plan(tp=tp, ep=ep, gbs=run.training.global_batch_size,
                stages=(StagePlan(device_type="H100", num_layers=m.num_layers, dp=8 // tp),))
    files = render_launch_files(run, plan, cluster_of(("H100", 1)))
    return shlex.split(files["megatron_args.txt"]), plan.world_size


@pytest.mark.slow
@NEEDS_MEGATRON
def test_megatron_accepts_the_launchers_of_every_preset_and_hf_config(tmp_path):
    """Megatron-LM's parse_args, validate_args, TransformerConfig and process-group setup accept the
    flags the launcher writes for every shipped preset and HF config fixture, the published config.json files of
    tests/data/hf_configs/ (GLM-4.5-Air, OLMoE-1B-7B) included (one validator process)."""
    cases = []
    for name in list_model_presets():
        argv, world = _launcher_argv(resolve_run(model=name))
        cases.append({"name": f"preset/{name}", "argv": argv, "world_size": world, "env": LAUNCH_ENV})
    for hf_name, cfg in HF_CONFIGS.items():
        path = tmp_path / hf_name / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(cfg))
        argv, world = _launcher_argv(resolve_run(model=str(path)))
        cases.append({"name": f"hf/{hf_name}", "argv": argv, "world_size": world, "env": LAUNCH_ENV})
    results = validate(cases)
    refused = {name: r["error"] for name, r in results.items() if not r["ok"]}
    assert refused == {}
    assert len(results) == len(list_model_presets()) + len(HF_CONFIGS)
