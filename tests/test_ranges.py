"""Plans chosen with their uncertainty (issue 19 item 5) and the memory headroom (item 4) as the user meets
them: the iteration-time range (planner/cost/ranges.py), the pessimistic objective the search optimises, the
"keep yours" verdict, and --memory-headroom in solve, estimate and the checker."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from cli import main
from planner.api import compare_rows, load_inputs
from planner.calibration.memory import memory_rows
from planner.calibration.uncertainty import HeldOutResidual, fit_mechanisms, memory_headroom
from planner.cost.model import PlanCost
from planner.cost.ranges import MECHANISMS, RangeModel, TimeRange, time_shares
from planner.uncertainty import Uncertainty, shipped_uncertainty
from planner.user_plan import UserPlan

from helpers.cases import flags_cost_model

RUNNER = CliRunner()
DENSE = ("--num-layers 8 --hidden-size 8192 --num-attention-heads 64 --seq-length 4096 --max-position-embeddings 4096 "
         "--micro-batch-size 4 --global-batch-size 32 --vocab-size 32000 --bf16 --tensor-model-parallel-size 8")
"""A dense stage whose GPU work outlasts the host's (at hidden 4096 and micro-batch 1 on TP 8 the host's Python-level
operations set the pace, planner/cost/layer.py, and GEMMs hold no share of the time)."""


def _invoke(args: list[str]):
    return RUNNER.invoke(main, args)


def test_the_range_brackets_the_nominal_time_and_is_a_point_without_uncertainty():
    run, plan, cm = flags_cost_model(DENSE, "H100:8")
    none = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=Uncertainty())
    r0 = none.time_range(plan)
    assert r0.low_s == r0.nominal_s == r0.high_s
    r = RangeModel(run.model, run.training, cm.cluster, cm.profiles).time_range(plan)
    assert r.low_s < r.nominal_s < r.high_s


def test_the_range_follows_the_mechanisms_the_plan_leans_on():
    """With an uncertainty on one family only, the top of the range exceeds the nominal time by that family's
    share of the time times its scaling (one stage, no overlap: the time is linear in the family's seconds)."""
    run, plan, cm = flags_cost_model(DENSE, "H100:8")
    shares = time_shares(run.model, run.training, cm.cluster, cm.profiles, plan)
    assert 0.5 < sum(shares.values()) <= 1.0 + 1e-6 and shares["gemm"] > 0.3
    for family in ("gemm", "attention"):
        unc = Uncertainty(mechanisms={f"{family}.slow": 0.2}, source="test")
        r = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=unc).time_range(plan)
        expected = 1.0 + shares[family] * (1 / 0.8 - 1)
        assert r.high_s / r.nominal_s == pytest.approx(expected, rel=2e-3), family
        assert r.low_s == r.nominal_s  # no "fast" uncertainty given


def test_fit_weights_each_rows_residual_by_its_share():
    """Two families, two rows: one all GEMM, too fast by 20%; one all attention, too slow by 10%."""
    rows = [HeldOutResidual("a", "s1", -0.2, {"gemm": 1.0}), HeldOutResidual("b", "s2", 0.1, {"attention": 1.0})]
    fit = fit_mechanisms(rows)
    assert fit.slow["gemm"] == pytest.approx(0.2) and fit.fast["gemm"] == 0.0
    assert fit.fast["attention"] == pytest.approx(0.1) and fit.slow["attention"] == 0.0
    assert fit.coverage == 1.0 and fit.scale == 1.0  # each row's own range already holds its measurement
    assert set(MECHANISMS) == set(fit.slow)


def test_shipped_headroom_is_the_derivation_from_the_measured_peaks(profiles):
    """profiles/uncertainty.yaml's headroom is what the measured peaks give today (regenerate with
    python -m planner.calibration.report --write); its time part is checked by the slow test below."""
    h, why = memory_headroom(memory_rows(profiles))
    assert shipped_uncertainty().memory_headroom == h, why
    assert 0.0 <= h < 0.2


@pytest.mark.slow
def test_shipped_time_uncertainty_is_the_fit():
    from planner.calibration.report import build_report
    from planner.calibration.uncertainty import stale

    rep, _ = build_report(loso=True)
    h, _ = memory_headroom(rep.memory)
    assert stale(shipped_uncertainty(), h, rep.uncertainty) == [], "run python -m planner.calibration.report --write"


def _cost(seconds: float) -> PlanCost:
    return PlanCost(iteration_time_s=seconds, pipeline_s=seconds, bubble_s=0.0, sync_s=0.0, num_microbatches=1,
                    world_size=1, model_flop_per_iteration=1.0, peak_flop_per_s_total=1.0, stages=())


def test_keep_yours_when_your_time_lies_within_our_range():
    ours = TimeRange(low_s=9.0, nominal_s=10.0, high_s=11.5)
    inside = UserPlan(source="--megatron-args", cost=_cost(11.0))
    inside.judge(ours, _cost(10.0))
    assert inside.keep_yours and "lies within our plan's range" in inside.keep_why and "+10.0%" in inside.keep_why
    outside = UserPlan(source="--megatron-args", cost=_cost(13.0))
    outside.judge(ours, _cost(10.0))
    assert not outside.keep_yours and "above our plan's pessimistic" in outside.keep_why
    faster = UserPlan(source="--megatron-args", cost=_cost(9.5))
    faster.judge(ours, _cost(10.0))
    assert faster.keep_yours and "no slower than ours" in faster.keep_why
    broken = UserPlan(source="--megatron-args", error="does not divide the cluster")
    broken.judge(ours, _cost(10.0))
    assert not broken.keep_yours


def test_pessimistic_search_agrees_with_brute_force():
    """compare on a reduced preset, pruning off: hsdp, cpsat and brute force, all over tables built from the
    top of the range, find the same pessimistic optimum (within the tables' whole-microsecond quantisation)."""
    run, cluster, profiles = load_inputs(model="mixtral-s", cluster="H800:4,A100:4", overrides={"gbs": 16})
    cut = run.model.model_validate({**run.model.model_dump(), "num_layers": 3, "moe_layer_pattern": None})
    run = run.model_copy(update={"model": cut})
    rows = compare_rows(run, cluster, profiles, runtime="megatron", backends=["hsdp", "cpsat", "brute"],
                        time_limit_s=120, delta=0.2, no_prune=True, objective="pessimistic")
    objs = [r["objective_s"] for r in rows]
    assert all(o is not None for o in objs), rows
    assert max(objs) - min(objs) <= 1e-4 * min(objs) + 1e-5, rows
    # the objective is the pessimistic time: above the nominal one of the same plan
    assert all(r["objective_s"] > r["iteration_time_s"] for r in rows)
    nominal = compare_rows(run, cluster, profiles, runtime="megatron", backends=["brute"], time_limit_s=120,
                           delta=0.2, no_prune=True, objective="nominal")
    assert nominal[0]["objective_s"] <= min(r["iteration_time_s"] for r in rows) + 1e-5


SOLVE = ["solve", "--model", "mixtral-s", "--cluster", "H800:8,MI300X:8", "--gbs", "64", "--json", "--quiet"]


def test_solve_json_carries_the_range_the_objective_and_the_headroom():
    res = _invoke(SOLVE)
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    lo, hi = d["iteration_time_range_s"]
    assert lo <= d["iteration_time_s"] <= hi and d["objective"] == "pessimistic"
    assert d["objective_s"] == pytest.approx(hi)
    f_lo, f_hi = d["tflops_per_gpu_range"]
    assert f_lo <= d["tflops_per_gpu"] <= f_hi
    h = d["memory_headroom"]
    assert h == shipped_uncertainty().memory_headroom
    for s in d["stages"]:
        assert s["usable_gib"] == pytest.approx(s["capacity_gib"] * (1 - h))
        assert s["memory_gib"] <= s["usable_gib"]


def test_memory_headroom_option_is_used_by_the_search_and_refused_out_of_range():
    res = _invoke(SOLVE + ["--memory-headroom", "0.3"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["memory_headroom"] == 0.3
    assert all(s["memory_gib"] <= 0.7 * s["capacity_gib"] + 1e-9 for s in d["stages"])
    zero = _invoke(SOLVE + ["--memory-headroom", "0"])
    assert zero.exit_code == 0 and json.loads(zero.stdout)["memory_headroom"] == 0.0
    for bad in ("-0.1", "0.95", "nan", "x"):
        r = _invoke(SOLVE + ["--memory-headroom", bad])
        assert r.exit_code == 2 and "--memory-headroom" in r.output and "Traceback" not in r.output, bad


def test_estimate_states_the_range_and_marks_a_stage_near_its_usable_memory():
    """A plan at 97-100% of usable memory fits but is marked: here the headroom is chosen so the stage sits at
    98.4% of usable memory (not 98.5%, where the printed percent would rest on float rounding)."""
    args = ["estimate", "--model", "mixtral-s", "--cluster", "H800:32", "--tp", "2", "--pp", "4", "--ep", "4"]
    d = json.loads(_invoke(args + ["--json", "--memory-headroom", "0"]).stdout)
    worst = max(d["stages"], key=lambda s: s["memory_gib"])
    h = 1 - worst["memory_gib"] / (0.984 * worst["capacity_gib"])
    near = json.loads(_invoke(args + ["--json", "--memory-headroom", f"{h:.6f}"]).stdout)
    st = near["stages"][worst["index"]]
    assert st["fits"] and st["near_capacity"] and 0.97 <= st["capacity_used_fraction"] <= 1.0
    assert "iteration_time_range_s" in near and "tflops_per_gpu_range" in near
    text = _invoke(args + ["--memory-headroom", f"{h:.6f}"]).output
    assert "98%!" in text and "at 97-100% of usable" in text, text
    assert f"{worst['capacity_gib'] * (1 - h):.1f}" in text  # usable memory, unrounded to whole GiB


MODEL = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 --max-position-embeddings "
         "4096 --global-batch-size 64 --vocab-size 32000 --bf16 --micro-batch-size 1")


def test_keep_yours_end_to_end():
    """The planner's own pick given back as the user's flags is no slower than itself: keep yours, in the JSON
    and the text.  Eight pipeline stages of one layer each at 4 micro-batches (a long bubble) do not."""
    base = ["solve", "--cluster", "H100:16", "--quiet"]
    first = _invoke(base + ["--json", "--megatron-args", MODEL])
    assert first.exit_code == 0, first.output
    p = json.loads(first.stdout)["plan"]
    rec = p["stages"][0]["recompute"]
    flags = (f"{MODEL} --tensor-model-parallel-size {p['tp']} --pipeline-model-parallel-size {p['pp']} "
             f"--context-parallel-size {p['cp']}"
             + (" --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
                if rec["granularity"] == "full" else "")
             + (" --recompute-granularity selective" if rec["granularity"] == "selective" else ""))
    flags = flags.replace("--micro-batch-size 1", f"--micro-batch-size {p['mbs']}")
    same = _invoke(base + ["--json", "--megatron-args", flags])
    assert same.exit_code == 0, same.output
    u = json.loads(same.stdout)["user_plan"]
    assert u["runs"] and u["keep_yours"], u
    assert "no slower than ours" in u["keep_yours_why"]  # the very same plan
    assert "keep yours:" in _invoke(base + ["--megatron-args", flags]).output
    slow = _invoke(base + ["--json", "--megatron-args", MODEL + " --pipeline-model-parallel-size 8"])
    us = json.loads(slow.stdout)["user_plan"]
    assert us["runs"] and not us["keep_yours"] and "above our plan's pessimistic" in us["keep_yours_why"]
