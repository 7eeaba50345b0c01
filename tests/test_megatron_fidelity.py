"""Issue 20: what Megatron accepts is read and searched, what the planner writes Megatron accepts.

Layouts as Megatron reads them (round trip of the user's own), the rules the planner lacked (each with
the message Megatron's source gives, and the research probe that ran it through Megatron's validator),
the user's plan that never blocks planning, flags written once, and stages whose DP spans two device
types.  The property test against Megatron's validator itself is tests/test_megatron_properties.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from planner.api import estimate, input_script, load_inputs, make_space, price_input_plan
from planner.api_search import solve
from planner.errors import PlannerInputError
from planner.inputs.cluster import parse_cluster
from planner.launcher import render_launch_files
from planner.megatron.layout import chunk_split, format_layout, layout_stages
from planner.megatron.rules import check_plan, input_violations
from planner.schemas.plan import Plan, StagePlan
from planner.schemas.search import stage_min_layers
from planner.search.settings import SearchSettings
from planner.search.space import RECOMPUTE_LADDER, pipeline_in_space, recompute_ladder, shared_pools

from helpers.launch import args_of

LAUNCHERS = Path(__file__).parent / "launchers"

BASE = ("--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
        "--micro-batch-size 1 --global-batch-size 16 --vocab-size 1000 --bf16")
MOE = BASE + " --num-experts 8 --moe-router-topk 2 --disable-bias-linear"
QWEN3 = ("--num-layers 94 --hidden-size 4096 --ffn-hidden-size 12288 --num-attention-heads 64 --kv-channels 128 "
         "--group-query-attention --num-query-groups 4 --qk-layernorm --swiglu --normalization RMSNorm "
         "--position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear "
         "--vocab-size 151936 --max-position-embeddings 40960 --num-experts 128 --moe-router-topk 8 "
         "--moe-ffn-hidden-size 1536 --moe-grouped-gemm --use-distributed-optimizer --overlap-grad-reduce "
         "--overlap-param-gather --bf16 --seq-length 4096 --micro-batch-size 1 --global-batch-size 2048 "
         "--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 32 "
         "--pipeline-model-parallel-layout E|(t|)*94L --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 "
         "--moe-token-dispatcher-type alltoall --recompute-granularity selective --recompute-modules layernorm moe_act")
"""NVIDIA's measured run H100-qwen3-235B-a2a (../shared/calibration/measured_runs.csv, 24.2 s)."""


def _refusal(args: str, cluster: str = "H100:8") -> str:
    with pytest.raises(PlannerInputError) as err:
        estimate(load_inputs(megatron_args=args, cluster=cluster))
    return str(err.value)


# ------------------------------------------------------------------------------------------ layouts
def test_nvidias_qwen3_layout_is_estimated_and_written_back_as_given(profiles):
    """E|(t|)*94L on PP 32 gives VPP 3 with an embedding-only first and a loss-only last chunk (probe 10:
    Megatron accepts it); estimate prices it without --allow-invalid and the launcher writes the same
    pipeline back, not another split of the same per-rank counts."""
    inputs = load_inputs(megatron_args=QWEN3, cluster="H100:256", profiles=profiles)
    priced = estimate(inputs)
    assert priced.plan.vpp == 3 and [s.num_layers for s in priced.plan.stages] == [2] + [3] * 30 + [2]
    argv = args_of(render_launch_files(inputs.run, priced.plan, inputs.cluster))
    written = argv[argv.index("--pipeline-model-parallel-layout") + 1]
    assert layout_stages(written) == layout_stages("E|(t|)*94L") and written == "E|(t|)*94L"


@pytest.mark.parametrize("text", ["|Et*4|t*4|L", "Et*4|t*4L|", "E|t*4|t*4|L", "E||t*8|L", "Et*0t*8|L"])
def test_layouts_megatron_accepts_are_accepted_and_kept(text):
    """Empty chunks, E written in stage 1, L in the last rank's chunk 0 (research probes L1-L3, L12, L13:
    Megatron accepts each): estimate prices them and keeps the chunk split in the plan."""
    pp = {"|Et*4|t*4|L": 2, "Et*4|t*4L|": 3, "E|t*4|t*4|L": 2, "E||t*8|L": 2, "Et*0t*8|L": 2}[text]
    args = BASE + f" --pipeline-model-parallel-size {pp} --pipeline-model-parallel-layout {text}"
    plan = estimate(load_inputs(megatron_args=shlex.split(args), cluster=f"H100:{pp}")).plan
    assert plan.layout == tuple(layout_stages(text))


@pytest.mark.parametrize("text, pp, mtp, words", [
    ("tE|t*7|L", 3, 0, "The first layer must be embedding, but got LayerType.decoder"),      # probe L6
    ("Et*8||", 3, 0, "The last layer must be loss, but got LayerType.decoder"),              # probe L7
    ("E|(t|)*8L", 3, 0, "num_stages=10, args.pipeline_model_parallel_size=3"),                # probe L4
    ("Et*4|t*4|m|mL", 2, 2, "All of the MTP layers must be in the same one virtual pipeline stage"),  # X27
    ("Et*4|t*4|m||L|", 2, 1, "Currently we restrict that the MTP should be always in the last"),  # L19
])
def test_layouts_megatron_refuses_are_refused_in_its_words(text, pp, mtp, words):
    args = BASE + f" --pipeline-model-parallel-size {pp} --pipeline-model-parallel-layout {text}"
    if mtp:
        args += f" --mtp-num-layers {mtp} --position-embedding-type rope"
    assert words in _refusal(shlex.split(args), f"H100:{pp}")


def test_the_planners_own_split_puts_spare_chunks_next_to_embedding_and_loss():
    """A plan without its own layout: ranks holding one layer fewer give an E-only first chunk and an
    L-only last chunk, and the space allows exactly the chunk counts that keep every other chunk busy."""
    assert format_layout(chunk_split([2] + [3] * 30 + [2], 3)) == "E|(t|)*94L"
    assert [stage_min_layers(i, 4, 3) for i in range(4)] == [2, 3, 3, 2]
    assert pipeline_in_space(94, 32, 3) and not pipeline_in_space(94, 32, 4) and pipeline_in_space(94, 24, 4)


# ------------------------------------------------------------------------------------------ rules
@pytest.mark.parametrize("extra, words", [
    ("--moe-router-topk 1", "Please use --moe-router-pre-softmax when topk is 1."),                        # probe 1
    ("--multi-latent-attention --group-query-attention --num-query-groups 4",
     "Group query attention is mutually exclusive with multi latent attention."),                           # probe 2
    ("--mtp-num-layers 1", "Multi-Token Prediction (MTP) is not supported with learned_absolute position "
                           "embedding type.The supported position embedding types are rope and none."),    # probe 3
    ("--moe-router-num-groups 3 --moe-router-group-topk 1",
     "num_moe_experts (8) should be divisible by moe_router_num_groups (3)."),                              # probe 4
    ("--moe-pad-expert-input-to-capacity",
     "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity"),                    # probe 5
    ("--cp-comm-type a2a+p2p",
     "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm"),                 # probe 6
    ("--recompute-granularity selective --recompute-modules mla_up_proj",
     "mla_up_proj in recompute_modules is only supported with multi_latent_attention."),                   # probe 7
    ("--fp8-format hybrid --fp8-recipe delayed --moe-grouped-gemm --recompute-granularity selective "
     "--recompute-modules moe_act", "Delayed scaling does not support moe_act and layernorm recompute for fp8."),  # 8
    ("--overlap-moe-expert-parallel-comm --moe-token-dispatcher-type alltoall --expert-model-parallel-size 4 "
     "--pipeline-model-parallel-size 2", "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size "
                                         "must be specified when pipeline_model_parallel_size > 1"),           # 9
    ("--moe-router-enable-expert-bias", "Expert bias for aux-loss-free routing only supports 'sigmoid'"),     # X2
    ("--cuda-graph-impl transformer_engine --recompute-granularity full --recompute-method uniform "
     "--recompute-num-layers 1", "full recompute is only supported with full iteration CUDA graph."),        # X34
])
def test_rules_the_issue_names_refuse_with_megatrons_message(extra, words):
    """Each flag set Megatron's validator refuses (research/megatron probe_results.md, the probe named
    beside it) is refused by estimate, with Megatron's message."""
    assert words in _refusal(shlex.split(MOE + " " + extra))


def test_megatrons_batch_message_is_the_one_it_prints():
    """GBS not divisible by mbs x DP: validate_args checks the evaluation batch first (probe X30)."""
    assert "eval_global_batch_size (6) must be divisible by eval_micro_batch_size (1) * data_parallel_size (4)" in \
        _refusal(shlex.split(BASE.replace("--global-batch-size 16", "--global-batch-size 6")), "H100:4")


def test_search_keeps_the_runs_flags(profiles):
    """EP overlap with the issue's Qwen3-235B picks in mind (PP > 1 without VPP): every plan the space
    holds keeps it; FP8 delayed scaling drops moe_act and layernorm from the recompute menu."""
    args = MOE + " --moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm"
    inputs = load_inputs(megatron_args=shlex.split(args), cluster="H100:16", profiles=profiles)
    out = solve(inputs.run, inputs.cluster, inputs.profiles, settings=SearchSettings(backend="hsdp", time_limit_s=30),
                space=make_space(inputs.run, "megatron"))
    plan = out.plans[0]
    assert (plan.pp == 1 or plan.vpp > 1) and plan.ep > 1 and plan.stages[0].recompute.granularity != "full"
    fp8 = load_inputs(megatron_args=shlex.split(MOE + " --moe-grouped-gemm --fp8-format hybrid"), cluster="H100:8",
                      profiles=profiles).run
    assert all(not {"moe_act", "layernorm"} & set(r.modules) for r in
               recompute_ladder(fp8.model, RECOMPUTE_LADDER, fp8.training) if r.granularity == "selective")


def test_solve_refuses_what_no_plan_can_fix(profiles):
    inputs = load_inputs(megatron_args=shlex.split(MOE + " --moe-router-topk 1"), cluster="H100:8", profiles=profiles,
                         allow_invalid=True)
    assert input_violations(inputs.run.model, inputs.run.training)
    with pytest.raises(PlannerInputError, match="whatever the plan: Please use --moe-router-pre-softmax"):
        solve(inputs.run, inputs.cluster, inputs.profiles, settings=SearchSettings(backend="hsdp", time_limit_s=10),
              space=make_space(inputs.run, "megatron"))


# ------------------------------------------------------------------------------------------ the user's plan
def test_an_invalid_user_plan_is_priced_reported_and_replaced(profiles):
    """12 layers over PP 8 (Megatron-LM's gptoss/02_train.sh): solve plans anyway; the user's plan is
    priced on the even split and reported with Megatron's message."""
    args = shlex.split(MOE.replace("--num-layers 8", "--num-layers 12") + " --pipeline-model-parallel-size 8")
    with pytest.raises(PlannerInputError, match="Number of layers should be divisible by the pipeline-model-parallel"):
        load_inputs(megatron_args=args, cluster="H100:8", profiles=profiles)
    inputs = load_inputs(megatron_args=args, cluster="H100:8", profiles=profiles, allow_invalid=True)
    user = price_input_plan(inputs, None, " ".join(args))
    assert user.cost is not None and [s.num_layers for s in user.plan.stages] == [2] * 4 + [1] * 4
    assert not user.runs and any("Number of layers should be divisible" in v.message for v in user.violations)
    out = solve(inputs.run, inputs.cluster, inputs.profiles, settings=SearchSettings(backend="hsdp", time_limit_s=20),
                space=make_space(inputs.run, "megatron"))
    assert not check_plan(inputs.run.model, out.plans[0], inputs.run.training)


def test_a_decided_flag_given_again_is_written_once(tmp_path):
    """--megatron-args --pipeline-model-parallel-size on top of a script: the plan's value replaces both."""
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntorchrun pretrain_gpt.py " + MOE + " --pipeline-model-parallel-size 1\n")
    inputs = load_inputs(megatron_script=str(script), megatron_args="--pipeline-model-parallel-size 4",
                         cluster="H100:8", allow_invalid=True)
    out = solve(inputs.run, inputs.cluster, inputs.profiles, settings=SearchSettings(backend="hsdp", time_limit_s=20),
                space=make_space(inputs.run, "megatron"))
    files = render_launch_files(inputs.run, out.plans[0], inputs.cluster,
                                input_script(inputs, "--pipeline-model-parallel-size 4", {}))
    argv = args_of(files)
    assert argv.count("--pipeline-model-parallel-size") == 1
    assert argv[argv.index("--pipeline-model-parallel-size") + 1] == str(out.plans[0].pp)


# ------------------------------------------------------------------------------------------ pooled types
def test_a_stage_may_span_two_types_of_one_vendor(profiles):
    """H100 with H200 (one vendor, one software stack): a stage's DP may span both, priced as the slower,
    smaller H100; the cluster's GPUs of both count for it.  Different vendors never pool."""
    cluster = parse_cluster("H100:16,H200:16", profiles)
    assert shared_pools(cluster, profiles, "bf16") == ["H100+H200"]
    assert shared_pools(parse_cluster("H800:16,MI300X:16", profiles), profiles, "bf16") == []
    plan = Plan(tp=1, mbs=1, gbs=32, stages=(StagePlan(device_type="H100+H200", num_layers=8, dp=32),))
    assert cluster.shortfalls(plan.gpus_by_type()) == [] and cluster.spread(plan.gpus_by_type()) == {"H100": 16, "H200": 16}
    assert cluster.shortfalls({"H100+H200": 24, "H100": 16})
    assert profiles.device("H100+H200").name == "H100"


def test_solve_matches_a_user_plan_whose_dp_spans_h100_and_h200(profiles):
    """The issue's Llama-3-8B FP8 on H100:16,H200:16: the user's DP 32 over both types was outside the
    space (solve's pick was 0.96x); with pooled stages solve's plan is at least as fast."""
    script = str(LAUNCHERS / "llama3_8b_h100_fp8.sh")  # Megatron-LM's examples/llama FP8 launcher
    inputs = load_inputs(megatron_script=script, cluster="H100:16,H200:16", profiles=profiles)
    user = price_input_plan(inputs, script, None)
    assert user.runs and user.plan.stages[0].device_type == "H100+H200"
    out = solve(inputs.run, inputs.cluster, inputs.profiles, settings=SearchSettings(backend="hsdp", time_limit_s=60),
                space=make_space(inputs.run, "megatron"))
    assert out.costs[0].iteration_time_s <= user.cost.iteration_time_s * (1 + 1e-9)
    files = render_launch_files(inputs.run, out.plans[0], inputs.cluster)
    nodes = [line for line in files["hostfile"].split("\n") if line and not line.startswith("#")]  # template header
    assert nodes and {line.split("type=")[1] for line in nodes} <= {"H100", "H200"}


def test_tp_comm_overlap_keeps_the_search_off_tp_1():
    """--tp-comm-overlap needs sequence parallelism, so TP > 1 (Megatron: 'Tensor parallel communication/GEMM
    overlap can happen only when sequence parallelism is enabled'); the search's degree rule says so (a cpsat pick
    of TP 1 on the published Grok-1 run's flags was rejected by the checker)."""
    from planner.megatron.rules import degree_flags_check

    inputs = load_inputs(model="mixtral-s", cluster="H100:8")
    training = inputs.run.training.model_copy(update={"tp_comm_overlap": True})
    ok = degree_flags_check(inputs.run.model, training)
    assert ok is not None and not ok(1, 1, 1, 1, 8, 1, 1) and ok(2, 1, 1, 1, 4, 1, 1)
    tp1 = Plan(tp=1, mbs=1, gbs=8, stages=(StagePlan(device_type="H100", num_layers=inputs.run.model.num_layers, dp=8),))
    tp2_no_sp = tp1.model_copy(update={"tp": 2, "sequence_parallel": False,
                                       "stages": (tp1.stages[0].model_copy(update={"dp": 4}),)})
    for plan in (tp1, tp2_no_sp):  # one rule, said once, wherever the plan breaks it
        assert [v.rule for v in check_plan(inputs.run.model, plan, training)].count("tp_comm_overlap_sp") == 1
    assert "tp_comm_overlap_sp" not in [v.rule for v in check_plan(
        inputs.run.model, tp2_no_sp.model_copy(update={"sequence_parallel": True}), training)]


def test_degree_rules_of_a_moe_run_hold_before_its_dp_is_known():
    """FlagScale's search asks the degree rules before a stage's DP is chosen (dp None): with a flag that turns them
    on (--cpu-offloading, Pai-Megatron-Patch's AC=offload) a MoE model's expert-DP term multiplied None, an internal
    error; the rules that need no DP still answer (CPU offloading refuses PP > 1)."""
    from planner.megatron.rules import degree_flags_check

    inputs = load_inputs(model="mixtral-s", cluster="H100:8")
    training = inputs.run.training.model_copy(update={"megatron": inputs.run.training.megatron.model_copy(
        update={"cpu_offloading": True})})
    ok = degree_flags_check(inputs.run.model, training)
    assert ok is not None and ok(1, 1, 8, 1, None, 1, 1) and not ok(1, 1, 8, 1, None, 2, 1)
