"""Tests for planner.megatron.rules: each Megatron/FlagScale rule (reference/megatron.md sections 2,
6, 8) refuses a plan that breaks it, with the message Megatron (or FlagScale) itself gives."""

from __future__ import annotations

from itertools import product

import pytest

from planner.errors import PlannerInputError
from planner.megatron import rules
from planner.megatron.rules import assert_plan_ok, check_plan, check_runtime_expressible
from planner.schemas import ModelSpec, Plan, Recompute, StagePlan, TrainingSpec

DENSE = ModelSpec(num_layers=8, hidden_size=1024, num_attention_heads=16, vocab_size=1000, seq_length=2048)
MOE = DENSE.model_copy(update={"num_experts": 8, "add_bias_linear": False})


def _plan(stages=((4, 4), (4, 4)), types=("A100", "A100"), **kw) -> Plan:
    """Plan with stages given as (layers, dp)."""
    kw.setdefault("gbs", 64)
    return Plan(
        stages=tuple(StagePlan(device_type=t, num_layers=n, dp=dp) for (n, dp), t in zip(stages, types)),
        **kw,
    )


def _rules(model, plan, training=None) -> dict[str, str]:
    return {v.rule: v.message for v in check_plan(model, plan, training)}


def test_valid_plans_pass_on_both_runtimes():
    """A plan that keeps every rule has no violations, dense and MoE, megatron and flagscale."""
    assert check_plan(DENSE, _plan(tp=2)) == []
    assert check_plan(MOE, _plan(tp=2, ep=4, etp=2)) == []
    assert check_plan(MOE, _plan(runtime="flagscale", tp=2, ep=4, stages=((5, 4), (3, 2)))) == []


def test_heads_must_be_a_multiple_of_tp():
    """Rule 2 (TC): heads % TP."""
    model = DENSE.model_copy(update={"num_attention_heads": 12, "hidden_size": 1200})
    msg = _rules(model, _plan(tp=8, gbs=64))["heads_tp"]
    assert msg == "num_attention_heads (12) must be a multiple of tensor_model_parallel_size (8)."


def test_query_groups_multiple_or_divisor_of_tp():
    """Rule 3 (TC, core >= 0.16): groups % TP == 0 or TP % groups == 0."""
    model = ModelSpec(num_layers=8, hidden_size=1536, num_attention_heads=24, num_query_groups=6, vocab_size=1000)
    msg = _rules(model, _plan(tp=4))["query_groups_tp"]
    assert msg == "num_query_groups (6) must be a multiple or divisor of tensor_model_parallel_size (4)."
    ok = ModelSpec(num_layers=8, hidden_size=1536, num_attention_heads=24, num_query_groups=2, vocab_size=1000)
    assert "query_groups_tp" not in _rules(ok, _plan(tp=4))  # TP a multiple of the groups: allowed


def test_expert_parallel_needs_experts_and_divides_them():
    """Rule 10 (VA): EP>1 needs --num-experts; experts % EP."""
    assert _rules(DENSE, _plan(ep=2))["ep_needs_experts"] == (
        "num_experts must be non None to use expert model parallelism"
    )
    msg = _rules(MOE, _plan(ep=3, stages=((4, 3), (4, 3)), gbs=48))["experts_ep"]
    assert msg == "Number of experts should be a multiple of expert model parallel_size."


def test_expert_folding_rule_from_parallel_state():
    """Rule 11 (PS only): W=16, TP2, PP2, EP8, ETP2 passes VA/TC but fails initialize_model_parallel."""
    plan = _plan(tp=2, ep=8, etp=2, stages=((4, 4), (4, 4)))
    msg = _rules(MOE, plan)["expert_folding"]
    assert msg == "world_size (16) is not divisible by expert_tensor_model_pipeline_parallel size (32)"


def test_sequence_length_multiple_of_twice_cp():
    """Rule 5 (VA): seq % (2*CP) when CP > 1."""
    model = DENSE.model_copy(update={"seq_length": 1002})
    msg = _rules(model, _plan(cp=2))["seq_cp"]
    assert msg == (
        "seq-length should be a multiple of 2 * context-parallel-size if context-parallel-size > 1."
    )


def test_sequence_parallel_needs_a_sequence_that_tp_and_cp_divide():
    """RT (megatron/core/tensor_parallel/mappings.py, _split_along_first_dim at the embedding's
    scatter_to_sequence_parallel_region): with SP each rank's seq/CP tokens are split over TP.  TP 2, SP and
    seq 4095 passed every check and asserted at the first forward (issue 33)."""
    odd = DENSE.model_copy(update={"seq_length": 4095, "max_position_embeddings": 4096})
    msg = _rules(odd, _plan(tp=2))["seq_tp_sp"]
    assert msg == "First dimension of the tensor should be divisible by tensor parallel size"
    assert "seq_tp_sp" not in _rules(odd, _plan(tp=2, sequence_parallel=False))  # no SP: nothing is split
    assert "seq_tp_sp" not in _rules(odd, _plan(tp=1))
    six = DENSE.model_copy(update={"seq_length": 6, "max_position_embeddings": 6})
    assert "seq_tp_sp" in _rules(six, _plan(tp=2, cp=2, stages=((4, 2), (4, 2))))  # 6 / CP 2 = 3 tokens over TP 2
    assert "seq_tp_sp" not in _rules(six.model_copy(update={"seq_length": 4}), _plan(tp=2, cp=2, stages=((4, 2),
                                                                                                     (4, 2))))


def test_moe_with_tp_needs_sequence_parallel():
    """Rule 14 (RT, MoELayer.forward): MoE + TP>1 without SP."""
    msg = _rules(MOE, _plan(tp=2, sequence_parallel=False))["moe_tp_sequence_parallel"]
    assert "tensor parallelismare enabled without also enabling sequence parallelism" in msg
    assert "moe_tp_sequence_parallel" not in _rules(DENSE, _plan(tp=2, sequence_parallel=False))


def test_moe_with_etp_needs_bias_disabled():
    """Rule 15 (TC): MoE with add_bias_linear and ETP>1."""
    biased = MOE.model_copy(update={"add_bias_linear": True})
    assert _rules(biased, _plan(tp=2, etp=2))["moe_etp_bias"] == "Bias in Moe is only supported when ETP==1"
    assert "moe_etp_bias" not in _rules(biased, _plan(tp=2, etp=1))


def test_global_batch_divisible_by_mbs_times_dp():
    """Rule 29: GBS % (mbs * DP), in the words Megatron prints: validate_args checks the evaluation batch
    first, which defaults to the training batch (research probe X30)."""
    msg = _rules(DENSE, _plan(gbs=30))["gbs_microbatch"]
    assert msg == "eval_global_batch_size (30) must be divisible by eval_micro_batch_size (1) * data_parallel_size (4)"


def test_interleaving_needs_pipeline_parallelism():
    """Rule 23 (PS): VPP needs PP > 1."""
    plan = _plan(stages=((8, 8),), types=("A100",), vpp=2)
    assert _rules(DENSE, plan)["vpp_needs_pp"] == (
        "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1"
    )  # args.py, megatron-core 0.19


def test_interleaving_microbatch_count():
    """Rule 31 (SCH): with VPP, M >= PP and M % PP == 0 (default group size PP)."""
    four = ((2, 1), (2, 1), (2, 1), (2, 1))
    too_few = _plan(stages=four, types=("A100",) * 4, vpp=2, gbs=2)
    assert _rules(DENSE, too_few)["vpp_microbatches"] == (
        "The number of contiguous micro-batches in a virtual pipeline stageshould range in [PP=4 , M=2]"
    )
    remainder = _plan(stages=four, types=("A100",) * 4, vpp=2, gbs=6)
    assert _rules(DENSE, remainder)["vpp_microbatches"].startswith(
        "The remainder of M (the total micro-batches) divided by N (number of contiguous micro-batches"
    )
    assert "vpp_microbatches" not in _rules(DENSE, _plan(stages=four, types=("A100",) * 4, vpp=2, gbs=8))


def test_layout_must_place_every_layer():
    """Rule 26 (layout): decoder layers placed must equal --num-layers."""
    msg = _rules(DENSE, _plan(stages=((4, 4), (3, 4))))["layout_layers"]
    assert msg == "Number of decoder layers 7must match num_layers 8"


def test_interleaving_allows_ranks_with_fewer_layers_than_chunks():
    """Megatron has no rule that a pipeline rank hold a decoder layer per virtual chunk: a chunk may be
    empty, or hold only the embedding or the loss (NVIDIA's E|(t|)*94L on PP 32, VPP 3)."""
    plan = _plan(stages=((7, 4), (1, 4)), vpp=2, gbs=64)
    assert _rules(DENSE, plan) == {}


def test_training_flag_rules():
    """Rules 8 and 34 (VA): --tp-comm-overlap needs SP; --overlap-param-gather needs the
    distributed optimizer and --overlap-grad-reduce."""
    training = TrainingSpec(global_batch_size=64, tp_comm_overlap=True, overlap_param_gather=True)
    rules = check_plan(DENSE, _plan(tp=1), training)
    names = [v.rule for v in rules]
    assert "tp_comm_overlap_sp" in names
    messages = [v.message for v in rules if v.rule == "overlap_param_gather"]
    assert "Must use --overlap-param-gather with --overlap-grad-reduce" in messages


def test_megatron_runtime_needs_uniform_dp_and_one_recompute():
    """Upstream Megatron: one DP for all stages, one global recompute setting."""
    uneven = _plan(stages=((4, 4), (4, 2)))
    assert [v.rule for v in check_runtime_expressible(uneven)] == ["megatron_uniform_dp"]
    mixed = Plan(
        gbs=64,
        stages=(
            StagePlan(device_type="A100", num_layers=4, dp=4, recompute=Recompute.full("block", 2)),
            StagePlan(device_type="A100", num_layers=4, dp=4),
        ),
    )
    (v,) = check_runtime_expressible(mixed)
    assert v.rule == "megatron_global_recompute" and "flagscale" in v.hint


def test_flagscale_rules():
    """FlagScale: CP = 1, no VPP, (DP0*mbs) % DP_i, device types contiguous."""
    fs = {"runtime": "flagscale"}
    assert _rules(DENSE, _plan(cp=2, **fs))["flagscale_cp"] == "Context parallelism is not supported."
    assert _rules(DENSE, _plan(vpp=2, **fs))["flagscale_vpp"] == "virtual pipeline not support now!"
    assert "flagscale_stage_mbs" in _rules(DENSE, _plan(stages=((4, 2), (4, 4)), **fs))
    assert "flagscale_stage_mbs" not in _rules(DENSE, _plan(stages=((4, 4), (4, 2)), **fs))
    split = _plan(stages=((3, 2), (3, 2), (2, 2)), types=("A100", "910B", "A100"), gbs=8, **fs)
    assert "flagscale_contiguous_types" in _rules(DENSE, split)


def test_flagscale_tied_embedding_dp_must_divide():
    """FlagScale: with tied embeddings the first and last mesh DP must divide one another."""
    plan = _plan(stages=((4, 4), (4, 6)), mbs=3, gbs=12, runtime="flagscale")
    rules = _rules(DENSE, plan)
    assert "flagscale_stage_mbs" not in rules  # 4*3 = 12 is divisible by 6
    assert "flagscale_shared_embedding_dp" in rules
    untied = DENSE.model_copy(update={"untie_embeddings_and_output_weights": True})
    assert "flagscale_shared_embedding_dp" not in _rules(untied, plan)


def test_flagscale_recompute_per_stage_is_full_or_none():
    """FlagScale's per-stage lists switch full recompute on/off; selective cannot mix with them."""
    plan = Plan(
        runtime="flagscale",
        gbs=64,
        stages=(
            StagePlan(device_type="A100", num_layers=4, dp=4, recompute=Recompute.selective()),
            StagePlan(device_type="A100", num_layers=4, dp=4, recompute=Recompute.full("uniform", 1)),
        ),
    )
    assert "flagscale_recompute" in _rules(DENSE, plan)


def test_assert_plan_ok_lists_every_violation():
    """assert_plan_ok raises one PlannerInputError naming 'plan' with all the reasons."""
    model = DENSE.model_copy(update={"num_attention_heads": 12, "hidden_size": 1200})
    with pytest.raises(PlannerInputError) as err:
        assert_plan_ok(model, _plan(tp=8, gbs=30))
    text = str(err.value)
    assert err.value.field == "plan"
    assert "num_attention_heads (12)" in text and "eval_global_batch_size (30) must be divisible" in text
    assert_plan_ok(DENSE, _plan(tp=2))  # no exception


def valid_degrees(model, world_size, gbs, *, tps, cps, eps, etps, pps, vpps, mbss):
    """Every uniform (upstream Megatron) configuration of `world_size` GPUs whose degrees the rule
    set's booleans accept: the world divides by TP*CP*PP, DP = world / (TP*CP*PP)."""
    for tp, cp, pp, ep, etp, vpp, mbs in product(tps, cps, pps, eps, etps, vpps, mbss):
        if world_size % (tp * cp * pp):
            continue
        dp = world_size // (tp * cp * pp)
        if (rules.tp_allowed(model, tp) and rules.cp_allowed(model, cp) and rules.ep_allowed(model, ep)
                and rules.etp_allowed(model, tp, etp) and rules.expert_folding_ok(tp, cp, dp, ep, etp)
                and rules.batch_ok(gbs, mbs, dp)
                and rules.interleave_ok(gbs, mbs, dp, pp, vpp)):
            yield (tp, cp, ep, etp, dp, pp, vpp, mbs)


def test_valid_degrees_are_exactly_the_uniform_plans_check_plan_accepts():
    """The booleans of the rule set (what the search asks) against brute force: every (TP, CP, EP,
    ETP, PP, VPP, mbs) on 16 GPUs, built as a uniform Plan and judged by check_plan."""
    model = MOE.model_copy(update={"num_layers": 12, "num_query_groups": 4})
    world, gbs = 16, 64
    got = set(valid_degrees(model, world, gbs, tps=(1, 2, 4, 8), cps=(1, 2), eps=(1, 2, 4, 8), etps=(1, 2, 4),
                            pps=(1, 2, 3, 4), vpps=(1, 2, 3), mbss=(1, 2, 4)))
    want = set()
    for tp, cp, ep, etp, pp, vpp, mbs in product((1, 2, 4, 8), (1, 2), (1, 2, 4, 8), (1, 2, 4), (1, 2, 3, 4), (1, 2, 3),
                                                 (1, 2, 4)):
        if world % (tp * cp * pp) or model.num_layers < pp:
            continue
        dp = world // (tp * cp * pp)
        base, extra = divmod(model.num_layers, pp)
        stages = tuple(StagePlan(device_type="A100", num_layers=base + (i < extra), dp=dp) for i in range(pp))
        plan = Plan(tp=tp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs, stages=stages, sequence_parallel=tp > 1)
        if not check_plan(model, plan):
            want.add((tp, cp, ep, etp, dp, pp, vpp, mbs))
    assert got == want and len(got) > 20
