"""Invariants of the cost model (issue 2 "Cost model"): each test states one property that a wrong
model would break."""

from __future__ import annotations

import math
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cost.estimate import estimate_run
from planner.cost.flops import model_flop_per_iteration, parameter_counts, parameter_totals
from planner.cost.dispatch import expected_destination_ranks
from planner.cost.model import CostModel, GlobalShape
from planner.errors import PlannerInputError
from planner.inputs.cluster import parse_cluster
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.inputs.presets import load_model_preset
from planner.schemas.plan import Recompute

from helpers.cases import flags_cost_model

GPT = ("--num-layers 8 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
       "--max-position-embeddings 4096 --vocab-size 51200 --bf16")
MOE = ("--num-layers 8 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
       "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
       "--untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 32000 --seq-length 4096 "
       "--max-position-embeddings 4096 --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm "
       "--moe-token-dispatcher-type alltoall --moe-router-force-load-balancing --bf16")


def _setup(model_flags: str, cluster: str, *, tp=1, cp=1, ep=1, mbs=1, gbs=64, extra=""):
    """Parse a run, build its plan and a CostModel on `cluster` (one pipeline stage)."""
    flags = (f"{model_flags} --tensor-model-parallel-size {tp} --context-parallel-size {cp} "
             f"--expert-model-parallel-size {ep} --micro-batch-size {mbs} --global-batch-size {gbs} {extra}")
    if tp > 1:
        flags += " --sequence-parallel"
    return flags_cost_model(flags, cluster)


def _stage(cm: CostModel, plan, *, device: str | None = None, layers: int | None = None,
           recompute: Recompute = Recompute(), mbs: int | None = None):
    """The single stage of `plan`, optionally with another device, layer count, recompute or mbs."""
    g = GlobalShape.of(plan)
    if mbs is not None:
        g = GlobalShape(**{**g.__dict__, "mbs": mbs, "gbs": mbs * g.dp0 * 8})
    n = plan.stages[0].num_layers if layers is None else layers
    return cm.stage(g, index=0, device_type=device or plan.stages[0].device_type, start=0, end=n,
                    dp=plan.stages[0].dp, recompute=recompute, prev_type=None, next_type=None, offset_gpus=0)


# ------------------------------------------------------------------ communication vanishes with degree 1


def test_tp1_means_no_tp_traffic():
    """TP=1 gives zero TP time per layer and per stage; TP=2 on the same model gives some."""
    _, plan, cm = _setup(GPT, "H100:8", tp=1)
    assert _stage(cm, plan).tp_comm_s == 0.0
    _, plan2, cm2 = _setup(GPT, "H100:8", tp=2)
    assert _stage(cm2, plan2).tp_comm_s > 0.0


def test_cp1_means_no_cp_traffic():
    """CP=1 gives zero CP time; CP=2 across two nodes (TP=8 fills a node) at a short sequence, where
    attention is too short to hide the K/V ring, gives some."""
    short = GPT.replace("--seq-length 4096", "--seq-length 512").replace(
        "--max-position-embeddings 4096", "--max-position-embeddings 512")
    _, plan, cm = _setup(short, "H100:8", tp=8, cp=1)
    assert _stage(cm, plan).cp_comm_s == 0.0
    _, plan2, cm2 = _setup(short, "H100:16", tp=8, cp=2)
    assert _stage(cm2, plan2).cp_comm_s > 0.0


def test_ep1_means_no_ep_traffic():
    """EP=1 gives zero EP time on an MoE model; EP=8 gives some."""
    _, plan, cm = _setup(MOE, "H100:8", ep=1)
    assert _stage(cm, plan).ep_comm_s == 0.0
    _, plan8, cm8 = _setup(MOE, "H100:8", ep=8)
    assert _stage(cm8, plan8).ep_comm_s > 0.0


def test_flex_dispatcher_sends_fewer_copies_than_alltoall():
    """Distinct destination ranks of top-k routing: 1 with EP=1, k when every expert is on its own rank
    (k=1 or E=EP with k<=EP still gives fewer than k), and strictly fewer than k for Qwen3-235B's
    128 experts, top-8 over EP=8 (8 * (1 - C(112,8)/C(128,8)) ~ 5.36, computed here by hand)."""
    assert expected_destination_ranks(128, 1, 8) == 1.0
    assert expected_destination_ranks(8, 8, 1) == pytest.approx(1.0)
    by_hand = 8 * (1 - math.comb(112, 8) / math.comb(128, 8))
    assert expected_destination_ranks(128, 8, 8) == pytest.approx(by_hand)
    assert 5.3 < by_hand < 5.4


# ------------------------------------------------------------------ recompute, micro-batch, layers


@pytest.mark.parametrize("flags,ep,selective", [(GPT, 1, ("core_attn",)), (MOE, 8, ("moe_act",))])
def test_more_recompute_less_memory_more_time(flags, ep, selective):
    """none -> selective -> full block 4 of 8 layers -> full uniform: activation memory strictly falls
    and per-micro-batch time strictly rises at every step."""
    _, plan, cm = _setup(flags, "H100:8", ep=ep)
    ladder = [Recompute.none(), Recompute.selective(selective), Recompute.full("block", 4),
              Recompute.full("uniform", 1)]
    stages = [_stage(cm, plan, recompute=r) for r in ladder]
    for lo, hi in zip(stages, stages[1:]):
        assert hi.activations_bytes < lo.activations_bytes, (lo.recompute, hi.recompute)
        assert hi.time_s > lo.time_s, (lo.recompute, hi.recompute)
        assert hi.recompute_s > lo.recompute_s or lo.recompute_s == hi.recompute_s == 0.0


@pytest.mark.parametrize("flags,ep,small,large", [
    (GPT, 1, ("core_attn",), ("core_attn", "layernorm", "mlp")),
    (MOE, 8, ("moe_act",), ("layernorm", "moe")),
    (MOE, 8, ("layernorm",), ("layernorm", "moe_act")),
])
def test_more_selective_modules_less_memory_more_time(flags, ep, small, large):
    """Recomputing a superset of modules keeps strictly less and costs strictly more."""
    _, plan, cm = _setup(flags, "H100:8", ep=ep)
    a, b = (_stage(cm, plan, recompute=Recompute.selective(m)) for m in (small, large))
    assert b.activations_bytes < a.activations_bytes and b.time_s > a.time_s


def test_full_block_more_layers_is_more_recompute():
    """Full block recompute of k+1 layers keeps less and costs more than of k layers."""
    _, plan, cm = _setup(GPT, "H100:8")
    a, b = (_stage(cm, plan, recompute=Recompute.full("block", k)) for k in (2, 3))
    assert b.activations_bytes < a.activations_bytes and b.time_s > a.time_s


@pytest.mark.parametrize("flags,ep", [(GPT, 1), (MOE, 8)])
def test_memory_grows_with_micro_batch(flags, ep):
    """Activation memory and total memory per GPU grow strictly with the micro-batch size."""
    _, plan, cm = _setup(flags, "H100:8", ep=ep)
    stages = [_stage(cm, plan, mbs=m) for m in (1, 2, 4)]
    for lo, hi in zip(stages, stages[1:]):
        assert hi.activations_bytes > lo.activations_bytes
        assert hi.memory_bytes > lo.memory_bytes
        assert hi.time_s > lo.time_s


@pytest.mark.parametrize("flags,ep", [(GPT, 1), (MOE, 8)])
def test_more_layers_cost_more(flags, ep):
    """A stage with one more layer takes longer and holds more memory (weights and activations)."""
    _, plan, cm = _setup(flags, "H100:8", ep=ep)
    for n in (1, 4, 7):
        a, b = _stage(cm, plan, layers=n), _stage(cm, plan, layers=n + 1)
        assert b.time_s > a.time_s
        assert b.memory_bytes > a.memory_bytes
        assert b.weights_bytes > a.weights_bytes


# ------------------------------------------------------------------ faster devices


@pytest.mark.parametrize("slow,fast", [("A100", "H100"), ("H100", "H200"), ("A100-40GB", "A100"), ("V100", "A100")])
@pytest.mark.parametrize("flags,ep,tp", [(GPT, 1, 1), (GPT, 1, 8), (MOE, 8, 1)])
def test_faster_device_never_slower(slow, fast, flags, ep, tp):
    """The same stage on a device that is at least as fast in every datasheet number (peak, HBM, NVLink)
    is never slower, in total and in each of compute, TP and EP time."""
    precision_flags = flags if slow != "V100" else flags.replace("--bf16", "--fp16")
    _, plan, cm_slow = _setup(precision_flags, f"{slow}:8", tp=tp, ep=ep)
    _, _, cm_fast = _setup(precision_flags, f"{fast}:8", tp=tp, ep=ep)
    a = _stage(cm_slow, plan, device=slow)
    b = _stage(cm_fast, plan, device=fast)
    assert b.time_s <= a.time_s
    assert b.compute_s <= a.compute_s
    assert b.tp_comm_s <= a.tp_comm_s + 1e-12
    assert b.ep_comm_s <= a.ep_comm_s + 1e-12


# ------------------------------------------------------------------ FLOP accounting


@pytest.mark.parametrize("b,s,l,h,v", [(8, 2048, 24, 2048, 51200), (1536, 2048, 96, 12288, 51200),
                                       (16, 4096, 32, 4096, 131072)])
def test_dense_gpt_flops_match_causal_megatron_formula(b, s, l, h, v):
    """Dense GPT (MHA, GELU, ffn 4h): per token and layer the forward is 24h^2 (QKV 6h^2, out 2h^2,
    MLP 16h^2) plus 2sh for QK^T and AV halved by the causal mask, plus 2hV for the logits; x3 for
    backward gives 72*B*s*l*h^2*(1 + s/(12h) + V/(12*l*h)), the old formula with s/(6h) -> s/(12h)."""
    run = parse_megatron_flags(shlex.split(
        f"--num-layers {l} --hidden-size {h} --num-attention-heads {h // 128} --seq-length {s} "
        f"--max-position-embeddings {s} --vocab-size {v} --micro-batch-size 1 --global-batch-size {b} --bf16"))
    got = model_flop_per_iteration(run.model, global_batch_size=b, tp=1)
    causal = 72.0 * b * s * l * h**2 * (1 + s / (12 * h) + v / (12 * l * h))
    old = 72.0 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert got == pytest.approx(causal, rel=1e-9)
    assert old - got == pytest.approx(72.0 * b * s * l * h**2 * s / (12 * h), rel=1e-9)


def test_mixtral_8x7b_has_46_7b_parameters():
    """Mixtral 8x7B (preset mixtral-s) counts 46.7B parameters (Mistral's published total)."""
    model, _ = load_model_preset("mixtral-s")
    total = sum(parameter_counts(model).values())
    assert total == pytest.approx(46.7e9, rel=0.005)


def _hf(name: str):
    from helpers import hf_configs
    from planner.inputs.hf_config import model_from_hf_config
    return model_from_hf_config(getattr(hf_configs, name), name)


def test_total_and_active_parameters_match_the_published_counts():
    """Each published count against ours as it counts (planner/cost/flops.py `parameter_totals`), like with like, to
    the digits it is given, from the preset and from the model's HuggingFace config.json:
    - Mixtral 8x7B: "46.7B total parameters but only uses 12.9B parameters per token" (Mistral AI, 'Mixtral of
      experts', 2023-12-11): embeddings in both (without the input embedding the active count would read 12.7B).
    - Mixtral 8x22B: "only 39B active parameters out of 141B" (Mistral AI, 'Cheaper, Better, Faster, Stronger',
      2024-04-17), counted as 8x7B's.
    - Qwen3-30B-A3B: 30.5B in total, 29.9B non-embedding, 3.3B activated (Qwen/Qwen3-30B-A3B model card): the
      non-embedding count is the total less the input embedding and the output layer; the activated one holds both
      (it would read 3.0B without the input embedding) and is given truncated, 3.35B -> 3.3B.
    - Qwen3-235B-A22B: 235B in total, 234B non-embedding, 22B activated (its model card).
    - DeepSeek-V3: 671B total, 37B activated per token (technical report, arXiv 2412.19437): the main model, without
      the MTP module (README_WEIGHTS.md: 671B main model weights + 14B MTP module); the 37B rounds our count only
      without the input embedding (with it 37.6B), which is what it is compared with.
    - gpt-oss-120b: 5.1B active per token (OpenAI's gpt-oss model card), without the input embedding as well (with it
      5.7B); the total, 116.83B, is test_gpt_oss_120b_has_116_8b_parameters."""
    def b(n: float, digits: int = 0) -> float:
        return round(n / 1e9, digits)

    for name, model in (("mixtral", load_model_preset("mixtral-s")[0]), ("mixtral", _hf("MIXTRAL_8X7B")),
                        ("mixtral-8x22b", load_model_preset("mixtral-l")[0]),
                        ("qwen3-30b", load_model_preset("qwen3-30b-a3b")[0]), ("qwen3-30b", _hf("QWEN3_30B")),
                        ("qwen3-235b", load_model_preset("qwen3-235b-a22b")[0]),
                        ("deepseek-v3", load_model_preset("deepseek-v3")[0]), ("deepseek-v3", _hf("DSV3")),
                        ("gpt-oss", _hf("GPT_OSS_120B"))):
        p = parameter_totals(model)
        both_tables = parameter_counts(model)["embedding"]  # input embedding and output layer (untied)
        if name == "mixtral":
            assert (b(p.total, 1), b(p.active, 1)) == (46.7, 12.9) and p.mtp == 0
        elif name == "mixtral-8x22b":
            assert (b(p.total), b(p.active)) == (141, 39)
        elif name == "qwen3-30b":
            assert (b(p.total, 1), b(p.total - both_tables, 1)) == (30.5, 29.9)
            assert int(p.active / 1e8) == 33
        elif name == "qwen3-235b":
            assert (b(p.total), b(p.total - both_tables), b(p.active)) == (235, 234, 22)
        elif name == "deepseek-v3":
            assert model.mtp_num_layers == 1 and p.mtp > 10e9
            main = model.model_copy(update={"mtp_num_layers": 0})
            q = parameter_totals(main)
            assert q.total == p.total - p.mtp and b(q.total) == 671
            assert b(q.active - q.input_embedding) == 37 and b(q.active) == 38
        else:
            assert b(p.active - p.input_embedding, 1) == 5.1 and b(p.active, 1) == 5.7


def test_glm45_air_and_olmoe_count_their_published_parameters():
    """Ours (`parameter_totals`) from the published config.json files (tests/data/hf_configs/) against the published
    counts, like with like, the totals within 1% and the active counts to the digits given:
    - GLM-4.5-Air: 106B total, 12B active (zai-org/GLM-4.5-Air model card; GLM-4.5 report, arXiv 2508.06471): the main
      model, without its MTP layer (with it 109.2B), and the active count without the input embedding and the output
      layer (12.18B; with them 13.4B).  GLM-4.5 (355B / 32B; its sizes in Megatron-Bridge's test fixture and slime's
      scripts/models/glm4.5-355B-A32B.sh) counts alike: 352.8B and 32.1B.
    - OLMoE-1B-7B: 6.9B total, 1.3B active (arXiv 2409.02060, Table 1): both tables in both (1.28B active; without
      them 1.08B).  Ours has Megatron's per-head QK norms, 61,440 weights fewer than OLMoE's (hf_config_notes)."""
    from helpers.hf_configs import GLM45_AIR, OLMOE_1B_7B
    from planner.inputs.hf_config import model_from_hf_config

    def b(n: float, digits: int = 0) -> float:
        return round(n / 1e9, digits)

    glm45 = {**GLM45_AIR, "hidden_size": 5120, "num_hidden_layers": 92, "first_k_dense_replace": 3,
             "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160, "use_qk_norm": True}
    for name, cfg, total_b, active_b in (("GLM-4.5-Air", GLM45_AIR, 106, 12), ("GLM-4.5", glm45, 355, 32)):
        model = model_from_hf_config(cfg, name)
        assert model.mtp_num_layers == 1
        main = parameter_totals(model.model_copy(update={"mtp_num_layers": 0}))
        both_tables = parameter_counts(model)["embedding"]
        assert main.total == pytest.approx(total_b * 1e9, rel=0.01)
        assert b(main.active - both_tables) == active_b and b(main.active) > active_b
    olmoe = parameter_totals(model_from_hf_config(OLMOE_1B_7B, "olmoe"))
    assert olmoe.total == pytest.approx(6.9e9, rel=0.01) and olmoe.mtp == 0
    assert b(olmoe.active, 1) == 1.3


def test_active_parameters_are_the_total_less_the_experts_a_token_skips():
    """A dense model uses every parameter per token; a MoE model all but (experts - top-k) experts in each MoE layer,
    the MTP layer's included (DeepSeek-V3: 58 MoE layers and one MTP layer, 248 of 256 experts of 3 x 7168 x 2048)."""
    llama = parameter_totals(load_model_preset("llama2-7b")[0])
    assert llama.active == llama.total and llama.input_embedding == 32000 * 4096
    dsv3 = parameter_totals(load_model_preset("deepseek-v3")[0])
    assert dsv3.total - dsv3.active == (256 - 8) * 3 * 7168 * 2048 * (58 + 1)


GPT_OSS_ROW = "B200-gptoss-120B-64-bf16"
"""Megatron-Bridge's GPT-OSS-120B on 64 B200 (calibration row): published 8047 tokens/s/GPU and 219 TFLOP/s/GPU."""


def _gpt_oss_run():
    from planner.calibration.runs import load_runs
    row = next(r for r in load_runs() if r["id"] == GPT_OSS_ROW)
    return parse_megatron_flags(shlex.split(row["megatron_args"]))


def test_gpt_oss_120b_has_116_8b_parameters():
    """gpt-oss-120b counts 116.83B parameters (OpenAI's model card) from its HuggingFace config.json and from the
    published run's --quick-geglu flags: its gated experts have three matrices (two would give 78.6B)."""
    from helpers.hf_configs import GPT_OSS_120B
    from planner.inputs.hf_config import model_from_hf_config
    for model in (model_from_hf_config(GPT_OSS_120B, "gpt-oss-120b"), _gpt_oss_run().model):
        assert sum(parameter_counts(model).values()) == pytest.approx(116.83e9, rel=1e-4)


def test_megatrons_flop_count_gives_quick_geglu_two_matrices_and_the_price_three():
    """TFLOP/s/GPU is Megatron's count, which gives the gate to --swiglu only: Megatron-Bridge's GPT-OSS-120B
    reports 219 TFLOP/s/GPU at 8047 tokens/s/GPU, 27.2 GFLOP per token, the two-matrix count (the three-matrix
    count is 34.3).  The time is priced with three matrices: a --quick-geglu model's experts take as long and
    weigh as much as the same model's with --swiglu."""
    run = _gpt_oss_run()
    per_token = model_flop_per_iteration(run.model, global_batch_size=1, tp=1) / run.model.seq_length
    assert per_token == pytest.approx(219e12 / 8047, rel=0.005)
    quick = _setup(MOE.replace("--swiglu", "--quick-geglu"), "H100:8", ep=8)[2]
    silu = _setup(MOE, "H100:8", ep=8)[2]
    ungated = _setup(MOE.replace("--swiglu ", ""), "H100:8", ep=8)
    cores = [_stage(cm, ungated[1]) for cm in (quick, silu, ungated[2])]
    assert dict(cores[0].parts)["expert_gemm"] == pytest.approx(dict(cores[1].parts)["expert_gemm"], rel=1e-12)
    assert dict(cores[0].parts)["expert_gemm"] > 1.4 * dict(cores[2].parts)["expert_gemm"]
    assert cores[0].weights_bytes == pytest.approx(cores[1].weights_bytes, rel=1e-12)
    assert cores[0].optimizer_bytes == pytest.approx(cores[1].optimizer_bytes, rel=1e-12)


def test_tflops_times_time_times_world_is_model_flops(profiles):
    """Predicted TFLOP/s/GPU x iteration time x world size gives back Megatron's model FLOPs, and MFU is
    that over the summed dense peak."""
    run, plan, cm = _setup(MOE, "H100:16", ep=8, gbs=128)
    cost = cm.evaluate(plan)
    flop = model_flop_per_iteration(run.model, global_batch_size=128, tp=1)
    assert cost.tflops_per_gpu * 1e12 * cost.iteration_time_s * cost.world_size == pytest.approx(flop, rel=1e-9)
    assert cost.mfu == pytest.approx(cost.tflops_per_gpu * 1e12 / profiles.device("H100").peak_flop_per_s("bf16"))


def test_mfu_counts_every_gpu_at_its_own_peak_where_a_stage_straddles_two_types(profiles):
    """walk54: a flags plan whose one stage spans 8 A100 and 8 H800 is priced on the slower A100, and its MFU was
    taken at 16 A100 peaks (69.6% for llama3-8b); its 16 GPUs are 8 of each, so the peak is 8 x 312 + 8 x 989."""
    run, plan, cm = _setup(GPT, "A100:8,H800:8", gbs=64)
    cost = cm.evaluate(plan)
    assert {s.device_type for s in plan.stages} == {"A100"} and plan.world_size == 16
    peak = sum(8 * profiles.device(t).peak_flop_per_s("bf16") for t in ("A100", "H800"))
    assert cost.mfu == pytest.approx(cost.model_flop_per_iteration / (cost.iteration_time_s * peak), rel=1e-9)
    assert cost.mfu < cost.tflops_per_gpu * 1e12 / profiles.device("A100").peak_flop_per_s("bf16")


# ------------------------------------------------------------------ property test


@st.composite
def configurations(draw):
    """A random valid Megatron configuration on a homogeneous cluster, as (flags, cluster)."""
    device = draw(st.sampled_from(["H100", "A100", "H200", "MI300X", "910B", "H800"]))
    head_dim = draw(st.sampled_from([64, 128]))
    heads = draw(st.sampled_from([8, 16, 32]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, 8, heads) if heads % g == 0]))
    hidden = heads * head_dim
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if groups % t == 0 and heads % t == 0]))
    pp = draw(st.sampled_from([1, 2, 4]))
    layers = pp * draw(st.integers(1, 3))
    cp = draw(st.sampled_from([1, 2]))
    seq = draw(st.sampled_from([512, 1024, 4096])) * cp
    dp = draw(st.sampled_from([1, 2, 4]))
    world = tp * pp * cp * dp
    mbs = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 8))
    flags = [
        f"--num-layers {layers} --hidden-size {hidden} --num-attention-heads {heads}",
        f"--group-query-attention --num-query-groups {groups}" if groups != heads else "",
        f"--seq-length {seq} --max-position-embeddings {seq} --vocab-size {draw(st.integers(1000, 160000))}",
        f"--ffn-hidden-size {draw(st.sampled_from([2, 3, 4])) * hidden}",
        draw(st.sampled_from(["--bf16", "--bf16 --swiglu --normalization RMSNorm --disable-bias-linear", "--fp16"])),
        f"--tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp} --context-parallel-size {cp}",
        f"--micro-batch-size {mbs} --global-batch-size {mbs * dp * m}",
        draw(st.sampled_from(["", "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"])),
        draw(st.sampled_from(["", "--recompute-granularity selective",
                              f"--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
                              f"--recompute-granularity full --recompute-method block --recompute-num-layers {layers // pp}"])),
    ]
    if tp > 1:
        flags.append("--sequence-parallel")
    if draw(st.booleans()):
        experts = draw(st.sampled_from([4, 8, 16, 64]))
        ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if experts % e == 0 and (tp * cp * dp) % e == 0]))
        flags.append(f"--num-experts {experts} --moe-router-topk {draw(st.integers(1, min(4, experts)))} "
                     f"--moe-ffn-hidden-size {draw(st.sampled_from([256, 1024, 2048]))} --moe-grouped-gemm --disable-bias-linear "
                     f"--expert-model-parallel-size {ep} {draw(st.sampled_from(['', '--expert-tensor-parallel-size 1']))} "
                     f"--moe-token-dispatcher-type {draw(st.sampled_from(['alltoall', 'allgather', 'flex']))}")
    return " ".join(f for f in flags if f), f"{device}:{world}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configurations())
def test_estimate_is_finite_and_positive_on_random_configurations(profiles, conf):
    """For any valid configuration the estimate never crashes and returns finite positive numbers."""
    flags, cluster_text = conf
    cl = parse_cluster(cluster_text, profiles)
    try:
        run = parse_megatron_flags(shlex.split(flags), world_size=cl.world_size)
    except PlannerInputError:
        return  # a combination Megatron's own validator rejects; the input tests cover those
    cost = estimate_run(run, cl, profiles)
    for value in (cost.iteration_time_s, cost.tflops_per_gpu, cost.mfu, cost.max_memory_gib):
        assert math.isfinite(value) and value > 0
    for s in cost.stages:
        assert math.isfinite(s.time_s) and s.time_s > 0
        assert math.isfinite(s.memory_bytes) and s.memory_bytes > 0
        assert s.activations_bytes > 0 and s.weights_bytes > 0
        for part in (s.tp_comm_s, s.cp_comm_s, s.ep_comm_s, s.pp_comm_s, s.dp_comm_s, s.recompute_s):
            assert math.isfinite(part) and part >= 0


# ------------------------------------------------------------------ pipeline sends (issue 31, items 8 and 9)

SLOW_NODES = "groups: [{device_type: V100, num_nodes: 4, gpus_per_node: 4, inter_node_bandwidth_gb_per_s: 0.3125}]\n"
SMALL_GPT = ("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
             "--max-position-embeddings 1024 --vocab-size 52256 --global-batch-size 32 --fp16 --micro-batch-size 2")
# one message: micro-batch 2 x sequence 1024 x hidden 1024 x 2 bytes (fp16), by hand; over 0.3125 GB/s it takes at
# least its bytes over the bandwidth (the link's efficiency is at most 1, its latency adds)
MESSAGE_BYTES = 2 * 1024 * 1024 * 2
ACROSS_NODES_S = MESSAGE_BYTES / 0.3125e9  # 13.42 ms


def _slow_cluster_cost(tmp_path, extra: str):
    path = tmp_path / "slow.yaml"
    path.write_text(SLOW_NODES)
    _, plan, cm = flags_cost_model(f"{SMALL_GPT} {extra}", str(path))
    return plan, cm.evaluate(plan)


def test_pipeline_sends_across_nodes_cost_the_same_at_any_stage_width(tmp_path):
    """4 nodes of 4 V100 with 10 Gb/s between them.  PP4 (DP4: a stage fills a node) sends every message across
    nodes; PP8 (DP2: two stages per node) sends across nodes exactly at its boundaries 1-2, 3-4 and 5-6 (stage
    s holds ranks 2s and 2s+1, nodes hold ranks 4k..4k+3) and those cost what PP4's do; the others stay on
    NVLink."""
    _, pp4 = _slow_cluster_cost(tmp_path, "--pipeline-model-parallel-size 4")
    _, pp8 = _slow_cluster_cost(tmp_path, "--pipeline-model-parallel-size 8")
    across = pp4.stages[0].send_out_s
    assert across >= ACROSS_NODES_S
    assert all(s.send_out_s == pytest.approx(across) for s in pp4.stages[:-1])
    for i, s in enumerate(pp8.stages[:-1]):
        if i % 2:  # boundaries 1-2, 3-4, 5-6 leave a node
            assert s.send_out_s == pytest.approx(across)
        else:  # 4 MiB over NVLink (>= 100 GB/s): well under a millisecond
            assert s.send_out_s < 1e-3
    # 1F1B waits for every message: a middle stage pays both of its links
    assert pp8.stages[1].pp_comm_s == pytest.approx(pp8.stages[0].send_out_s + pp8.stages[1].send_out_s)


def test_interleaving_hides_sends_only_behind_compute(tmp_path):
    """Interleaving (VPP2) sends each micro-batch twice per link; the sends a stage pays are never cheaper than the
    bytes over the link less the compute that overlaps them: v messages less the stage's forward (its input
    gradients) or its backward (its activations).  Here a message (>= 13.4 ms) outlasts a chunk's compute, so
    interleaving costs more than 1F1B on this cluster."""
    _, flat = _slow_cluster_cost(tmp_path, "--pipeline-model-parallel-size 4")
    plan, inter = _slow_cluster_cost(tmp_path, "--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2")
    v = plan.vpp
    assert v == 2
    for i, s in enumerate(inter.stages):
        fwd, bwd = s.forward_s - s.pp_comm_s / 2, s.backward_s - s.pp_comm_s / 2
        if i > 0:
            assert s.pp_comm_s >= v * ACROSS_NODES_S - fwd
        if i + 1 < plan.pp:
            assert s.pp_comm_s >= v * ACROSS_NODES_S - bwd
            assert v * ACROSS_NODES_S - bwd > 0  # the messages do outlast the compute
    assert inter.iteration_time_s > flat.iteration_time_s


def test_boundary_nodes_follow_the_placement_the_planner_writes(profiles):
    """The cost model's rule for which pipeline boundaries leave a node (type_offsets and
    pipeline_boundary_crosses_nodes) against the hosts the launcher assigns each rank (place_agents), on
    plans with stage widths that do and do not divide the node, and with two device types interleaved."""
    from planner.launcher.common import place_agents, stage_rank_ranges
    from planner.baselines.common import build_plan
    from planner.schemas.pipeline import pipeline_boundary_crosses_nodes
    from planner.cost.model import type_offsets

    cluster = parse_cluster("H100:32,A100:16", profiles)
    cases = [(1, 2, ["H100"] * 8), (2, 1, ["H100"] * 8), (1, 8, ["H100"] * 4), (2, 3, ["H100"] * 4),
             (1, 2, ["H100", "A100", "H100", "A100", "H100"]), (4, 1, ["A100"] * 4)]
    checked = 0
    for tp, dp, types in cases:
        plan = build_plan(tp=tp, cp=1, ep=1, etp=1, mbs=1, gbs=8 * dp, dp=dp, types=types, layers=[1] * len(types),
                          recompute=Recompute.none(), vpp=1)
        agents = place_agents(plan, cluster)
        host_of = {r: a.host for a in agents for r in range(a.first_rank, a.first_rank + a.nproc)}
        ranges = stage_rank_ranges(plan)
        offsets = type_offsets([(s.device_type, tp * s.dp) for s in plan.stages])
        gpn = {"H100": 8, "A100": 8}
        for i in range(len(types) - 1):
            (a0, a1), (b0, _) = ranges[i], ranges[i + 1]
            on_hosts = any(host_of[r] != host_of[b0 + (r - a0)] for r in range(a0, a1))
            if types[i] != types[i + 1]:
                assert on_hosts
                continue
            rule = pipeline_boundary_crosses_nodes(offsets[i], a1 - a0, a1 - a0, gpn[types[i]])
            assert rule == on_hosts, (tp, dp, types, i)
            checked += 1
    assert checked >= 10


def test_an_nvl72_domain_is_one_node_for_every_link(profiles):
    """On GB200 NVL72 (trays of 4, domains of 64 GPUs in a 256-GPU job) EP64 stays on NVLink, where on 8-GPU B200
    hosts it crosses 8 nodes; past the domain the inter-node link returns; pipeline boundaries leave a node only
    where they leave a domain (stages of 32 GPUs: boundaries 1-2, 3-4, 5-6 of PP8)."""
    from planner.cost.model import type_offsets
    from planner.schemas.pipeline import pipeline_boundary_crosses_nodes

    flags = f"{MOE} --expert-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 256"
    _, _, gb = flags_cost_model(flags, "GB200:256")
    _, _, b2 = flags_cost_model(flags, "B200:256")
    assert (gb.domain_gpus("GB200"), b2.domain_gpus("B200")) == (64, 8)
    assert gb.group_links("GB200", tp=1, cp=1, dp=64, ep=64, etp=1).ep.inter is None
    assert b2.group_links("B200", tp=1, cp=1, dp=64, ep=64, etp=1).ep.inter is not None
    assert gb.group_links("GB200", tp=1, cp=1, dp=128, ep=128, etp=1).ep.inter is not None
    offsets = type_offsets([("GB200", 32)] * 8)
    crossing = [pipeline_boundary_crosses_nodes(offsets[i], 32, 32, gb.domain_gpus("GB200")) for i in range(7)]
    assert crossing == [False, True, False, True, False, True, False]


def test_conditions_name_an_nvlink_domain_beyond_the_host(profiles):
    """The evidence's words tell an EP group across the trays of one NVL72 domain from one inside an 8-GPU host:
    "inside an NVLink domain" / "across NVLink domains" on GB200, "inside a node" / "across nodes" on B200."""
    from planner.cost.mechanisms import node_words, stage_conditions
    from planner.cost.model import GlobalShape
    from planner.schemas.plan import Recompute

    flags = f"{MOE} --expert-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 256"
    _, _, gb = flags_cost_model(flags, "GB200:256")
    _, _, b2 = flags_cost_model(flags, "B200:256")
    assert node_words(gb, "GB200") == ("an NVLink domain", "NVLink domains")
    assert node_words(b2, "B200") == ("a node", "nodes")

    def ep_words(cost, device_type, ep):
        g = GlobalShape(tp=1, cp=1, ep=ep, etp=1, vpp=1, mbs=1, gbs=256, dp0=ep, pp=256 // ep,
                        sequence_parallel=False)
        cond = stage_conditions(cost, g, device_type, dp=ep, recompute=Recompute())
        return dict(cond["expert_dispatch"].key)["ep"]

    assert ep_words(gb, "GB200", 64).startswith("inside an NVLink domain (")
    assert ep_words(gb, "GB200", 128).startswith("across NVLink domains (")
    assert ep_words(b2, "B200", 8).startswith("inside a node (")
    assert ep_words(b2, "B200", 64).startswith("across nodes (")
