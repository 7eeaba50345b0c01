"""Plans chosen with their uncertainty (issue 19 item 5) and the memory headroom (item 4) as the user meets
them: the iteration-time range (planner/cost/ranges.py), the pessimistic objective the search optimises, the
"keep yours" verdict, and --memory-headroom in solve, estimate and the checker."""

from __future__ import annotations

import json
import math
import shlex

import pytest
from click.testing import CliRunner

from cli import main
from planner.api import estimate, load_inputs
from planner.api_search import compare_rows
from planner.calibration.memory import memory_rows
from planner.calibration.runs import load_annotations, load_runs, priced_argv
from planner.calibration.uncertainty import COVERAGE_TARGET, HeldOutRow, fit_mechanisms, memory_headroom
from planner.cost.mechanisms import MECHANISM_OF_KIND, MECHANISM_OF_PART, MECHANISMS, Conditions, chunk_pattern
from planner.cost.model import TIME_PARTS, PlanCost
from planner.megatron.flags import NOT_MODELLED, UNPRICED_ENV, UNPRICED_IN, unmodelled_notes
from planner.cost.ranges import RangeModel, TimeRange, schedule_stall
from planner.profile_tables import TIME_CORRECTION_KINDS
from planner.uncertainty import Region, Uncertainty, cell_of, shipped_uncertainty
from planner.user_plan import UserPlan
from tools.fuzz.inputs import TINY_FLAGS

from helpers.cases import flags_cost_model
from helpers.cli import solve_searches_once
from helpers.held_out import loso_report
from helpers.once import run_once

RUNNER = CliRunner()
DENSE = ("--num-layers 8 --hidden-size 8192 --num-attention-heads 64 --seq-length 4096 --max-position-embeddings 4096 "
         "--micro-batch-size 4 --global-batch-size 32 --vocab-size 32000 --bf16 --tensor-model-parallel-size 8")
"""A dense stage whose GPU work outlasts the host's (at hidden 4096 and micro-batch 1 on TP 8 the host's Python-level
operations set the pace, planner/cost/layer.py, and GEMMs hold no share of the time)."""


def _invoke(args: list[str]):
    return RUNNER.invoke(main, args)


def test_every_time_part_and_correction_kind_belongs_to_one_mechanism():
    """A part or kind outside every mechanism would carry no uncertainty and could not be calibrated from trials;
    the pipeline bubble is no part of a stage (it follows from the stages' times)."""
    assert set(MECHANISM_OF_PART) >= set(TIME_PARTS) - {"pipeline_bubble"}
    assert set(MECHANISM_OF_KIND) == set(TIME_CORRECTION_KINDS)
    assert sum(len(m.parts) for m in MECHANISMS) == len(MECHANISM_OF_PART)


def test_the_range_brackets_the_nominal_time_and_is_a_point_without_uncertainty():
    run, plan, cm = flags_cost_model(DENSE, "H100:8")
    none = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=Uncertainty())
    r0 = none.time_range(plan)
    assert r0.low_s == r0.nominal_s == r0.high_s
    r = RangeModel(run.model, run.training, cm.cluster, cm.profiles).time_range(plan)
    assert r.low_s < r.nominal_s < r.high_s


def _shares_by_mechanism(rm: RangeModel, plan) -> dict[str, float]:
    out: dict[str, float] = {}
    for c, s in rm.shares(plan).items():
        out[c.mechanism] = out.get(c.mechanism, 0.0) + s
    return out


def test_the_range_follows_the_mechanisms_the_plan_leans_on():
    """With an uncertainty on one mechanism only, the top of the range exceeds the nominal time by that
    mechanism's share of the time times its scaling, the bottom falls short by the same share times its own
    (one stage, no overlap: the time is linear in the mechanism's seconds); the widening names it alone."""
    run, plan, cm = flags_cost_model(DENSE, "H100:8")
    probe = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=Uncertainty())
    shares = _shares_by_mechanism(probe, plan)
    assert 0.9 < sum(shares.values()) <= 1.0 + 1e-6 and shares["gemm"] > 0.3
    for name in ("gemm", "attention"):
        unc = Uncertainty(mechanisms={name: 0.2}, source="test")
        r = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=unc).time_range(plan)
        assert r.high_s / r.nominal_s == pytest.approx(1.0 + shares[name] * (1 / 0.8 - 1), rel=2e-3), name
        assert r.low_s / r.nominal_s == pytest.approx(1.0 + shares[name] * (1 / 1.2 - 1), rel=2e-3), name
        assert [m for m, _ in r.widening_s] == [name]


def test_outside_the_region_a_mechanism_is_named_and_its_width_multiplied():
    """The plan's own conditions as the region: nothing is unmeasured.  An empty region: every mechanism with a
    share of 3% or more is named, and the top of the range moves by the extrapolation factor times as much, or by
    the floor on unmeasured conditions where that is larger."""
    run, plan, cm = flags_cost_model(DENSE, "H100:8")
    probe = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=Uncertainty())
    own = Region.of(cell_of(c, "self") for c in probe.plan_conditions(plan))
    inside = Uncertainty(mechanisms={"gemm": 0.1}, extrapolation=2.0, region=own)
    outside = Uncertainty(mechanisms={"gemm": 0.1}, extrapolation=2.0, region=Region())
    r_in = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=inside).time_range(plan)
    r_out = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=outside).time_range(plan)
    assert not r_in.evidence.extrapolated and r_in.evidence.unmeasured == ()
    assert r_out.evidence.extrapolated
    assert any(u.startswith("dense GEMMs in bf16 on H100/H800/H200/H20 (no calibration run measured it")
               for u in r_out.evidence.to_json()["unmeasured"]), r_out.evidence.unmeasured
    share = _shares_by_mechanism(probe, plan)["gemm"]
    assert r_in.high_s / r_in.nominal_s == pytest.approx(1 + share * (1 / 0.9 - 1), rel=2e-3)
    assert r_out.high_s / r_out.nominal_s == pytest.approx(1 + share * (1 / 0.8 - 1), rel=2e-3)
    # a floor above the multiplied figure sets the width outside the region, and only there: with an empty region
    # every mechanism is unmeasured, so all of the plan's seconds are divided by 1 - 0.3
    floored = Uncertainty(mechanisms={"gemm": 0.1}, extrapolation=2.0, unmeasured_floor=0.3, region=Region())
    r_floor = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=floored).time_range(plan)
    assert r_floor.high_s / r_floor.nominal_s == pytest.approx(1 / 0.7, rel=2e-3)
    floored_in = Uncertainty(mechanisms={"gemm": 0.1}, extrapolation=2.0, unmeasured_floor=0.3, region=own)
    r_floor_in = RangeModel(run.model, run.training, cm.cluster, cm.profiles, uncertainty=floored_in).time_range(plan)
    assert r_floor_in.high_s == pytest.approx(r_in.high_s, rel=1e-9)


def _gemm(device: str) -> Conditions:
    return Conditions("gemm", (("device", device), ("precision", "bf16")))


def test_fit_weights_residuals_in_the_region_and_widens_outside_it():
    """Sources a and b measured the same conditions, one 10% too fast, one 10% too slow: each is inside the
    region the other measured, the figure is their root mean square 0.1, and the scale that holds both is 1.
    Source c, alone on its device, is 30% too fast: outside, so the extrapolation factor must reach 3 (the
    cap) to hold it, and its residual does not enter the figure."""
    rows = [HeldOutRow("a1", "a", 1.0, 0.9, {_gemm("X"): 1.0}), HeldOutRow("b1", "b", 1.0, 1.1, {_gemm("X"): 1.0}),
            HeldOutRow("c1", "c", 1.0, 0.7, {_gemm("Y"): 1.0})]
    fit = fit_mechanisms(rows)
    assert fit.spread["gemm"] == pytest.approx(0.1)
    assert 1.0 <= fit.scale <= 1.021
    assert fit.extrapolated_rows == 1 and fit.extrapolation == pytest.approx(3.0)
    assert fit.coverage == 1.0
    two = fit_mechanisms(rows[:2])
    assert two.extrapolation == 1.0 and two.extrapolated_rows == 0


def test_fit_judges_each_row_with_the_other_sources_figures():
    """Three sources measured the same conditions: 10% too fast, 10% too slow, 30% too slow.  Over all three the
    figure is sqrt((0.01 + 0.01 + 0.09) / 3) = 0.19, and a scale of 1.57 would make it 0.3, enough to hold the
    30% row.  But judged as a new source, that row meets the figure of the other two alone, 0.1: it needs a scale
    of 3 (u >= 0.3), and holding 80% of three rows means holding all three."""
    rows = [HeldOutRow("a1", "a", 1.0, 0.9, {_gemm("X"): 1.0}), HeldOutRow("b1", "b", 1.0, 1.1, {_gemm("X"): 1.0}),
            HeldOutRow("c1", "c", 1.0, 1.3, {_gemm("X"): 1.0})]
    fit = fit_mechanisms(rows)
    assert fit.spread["gemm"] == pytest.approx(math.sqrt(0.11 / 3))
    assert 3.0 <= fit.scale <= 3.0 * 1.021
    assert fit.extrapolated_rows == 0 and fit.coverage == 1.0


def test_fit_sets_a_floor_outside_the_region_when_the_extrapolation_cap_falls_short():
    """As above, but three sources each alone on its device are 40% too fast: at the cap (x3) their figure is
    0.3 and holds none of them, so the range would hold 2 of 5 rows.  The floor on unmeasured conditions rises
    until it holds 80%: each needs u >= 0.4 (the floor grid is 0.5% apart, so exactly 0.4).  The scale stays what
    the measured rows need (1), so their ranges do not widen for the others."""
    rows = [HeldOutRow("a1", "a", 1.0, 0.9, {_gemm("X"): 1.0}), HeldOutRow("b1", "b", 1.0, 1.1, {_gemm("X"): 1.0})]
    rows += [HeldOutRow(f"{s}1", s, 1.0, 0.6, {_gemm(f"Y{s}"): 1.0}) for s in "cde"]
    fit = fit_mechanisms(rows)
    assert fit.spread["gemm"] == pytest.approx(0.1) and fit.extrapolation == pytest.approx(3.0)
    assert fit.floor == pytest.approx(0.4)
    assert 1.0 <= fit.scale <= 1.021
    assert fit.coverage == 1.0
    unc = fit.uncertainty(Region())
    assert unc.unmeasured_floor == pytest.approx(0.4)


def test_shipped_headroom_is_the_derivation_from_the_measured_peaks(profiles):
    """profiles/uncertainty.yaml's headroom is what the measured peaks give today (regenerate with
    python -m planner.calibration.report --write); its time part is checked by the slow test below."""
    h, why = memory_headroom(memory_rows(profiles))
    assert shipped_uncertainty().memory_headroom == h, why
    assert 0.0 <= h < 0.2



def test_headroom_counts_allocated_peaks_and_fixed_shape_reserved_peaks_only():
    """The headroom is the smallest whole percent that would have fitted every allocated peak and every reserved
    peak of a fixed-shape run (its recorded peak is the needed one the fit check prices); a variable-shape run's
    recorded reserved peak, which holds cache the allocator would release, does not set it."""
    from helpers.cases import memory_row_stub as row

    alloc = row("a", "max_allocated_gib", 51.0, 50.0)  # 2% over the prediction: 2% headroom
    fixed = row("f", "max_reserved_gib", 10.4, 10.0)  # 4% over: 4%
    vary = row("v", "max_reserved_gib", 20.0, 10.0, vary=True)  # 100% over, not used
    assert memory_headroom([alloc])[0] == pytest.approx(0.02)
    assert memory_headroom([alloc, fixed])[0] == pytest.approx(0.04)
    h, why = memory_headroom([alloc, fixed, vary])
    assert h == pytest.approx(0.04) and "not used: v" in why

@pytest.fixture(scope="module")
def held_out_report():
    return loso_report()  # once per test run: test_calibration_runs' leave-one-source-out target reads it too


@pytest.mark.slow
def test_shipped_time_uncertainty_is_the_fit_and_stays_narrow_held_out(held_out_report):
    """The shipped figures are a fresh derivation, and the range, with every source left out of everything in turn
    (corrections, figures, region), stays narrow where runs exist: a median half-width <= 10% on the rows whose
    conditions the other sources all measured (issue 31: "stay narrow where runs exist"), and wider on the rows
    marked extrapolated, which get at least the unmeasured floor on what no run measured.  (Over all 59 rows the
    median half-width is 15.4%, above issue 31's 15% for held-out runs: the floor traded 13.0% at 76% coverage
    for 15.4% at 81%, the coverage the range promises; planner/calibration/uncertainty.py.)"""
    from planner.calibration.uncertainty import stale

    rep = held_out_report
    h, _ = memory_headroom(rep.memory)
    assert stale(shipped_uncertainty(), h, rep.uncertainty, rep.region) == [], \
        "run python -m planner.calibration.report --write"
    summary = rep.coverage.summary()
    measured, extrapolated = summary["measured"], summary["extrapolated"]
    assert measured["median_half_width"] <= 0.10, measured
    assert extrapolated["median_half_width"] > measured["median_half_width"], summary


@pytest.mark.slow
def test_the_range_holds_what_it_promises_held_out(held_out_report):
    """Issue 31's acceptance asks >= 75% of held-out runs; the range is fitted to hold 80% (COVERAGE_TARGET), and
    held out by source, each source left out of everything, it must deliver that: on all rows, and on the
    measured and the extrapolated rows alike (each within one row of 80%)."""
    summary = held_out_report.coverage.summary()
    assert summary["all"]["coverage"] >= COVERAGE_TARGET, summary["all"]
    for group in ("measured", "extrapolated"):
        g = summary[group]
        assert g["covered"] + 1 >= COVERAGE_TARGET * g["rows"], (group, g)


def test_every_calibration_run_priced_as_its_own_plan_is_measured():
    """The published plans of the calibration set, with the flags the calibration prices them with (annotations.csv
    `extra_flags` included), lie inside the region their own runs recorded."""
    ann = load_annotations()
    for row in load_runs():
        args = shlex.join(priced_argv(row, ann))
        inputs = load_inputs(megatron_args=args, cluster=row["cluster"], allow_invalid=True)
        ev = estimate(inputs, allow_invalid=True).time_range.evidence
        assert not ev.extrapolated, (row["id"], ev.unmeasured)


def test_a_router_without_a_balancing_loss_is_outside_what_the_calibration_measured():
    """A calibration run with real routing (Megatron CI's Mixtral 8x7B, --moe-aux-loss-coeff 1e-2, dropless) lies in
    its own region; the same run with the coefficient left out (Megatron's 0.0: no load-balancing loss, which no
    calibration run trained with) leans on expert mechanisms no run measured, and says so."""
    ann = load_annotations()
    row = next(r for r in load_runs() if r["id"] == "H100-mlmci-mixtral8x7b-tp2pp4ep4-rel")
    argv = priced_argv(row, ann)
    at = argv.index("--moe-aux-loss-coeff")
    assert argv[at + 1] == "1e-2"
    for flags, extrapolated in ((argv, False), (argv[:at] + argv[at + 2:], True)):
        inputs = load_inputs(megatron_args=shlex.join(flags), cluster=row["cluster"], allow_invalid=True)
        ev = estimate(inputs, allow_invalid=True).time_range.evidence
        unbalanced = [u for u in ev.to_json()["unmeasured"] if "real routing, dropless, no load balancing" in u]
        assert ev.extrapolated is extrapolated and bool(unbalanced) is extrapolated, ev.unmeasured
        assert not extrapolated or any(u.startswith("expert GEMMs") for u in unbalanced)


def test_a_sinkhorn_router_is_outside_what_the_calibration_measured():
    """Sinkhorn routing is priced as fully balanced (dispatch.py `balancing_pull` 0), but no calibration run trained
    with it: the same Megatron CI Mixtral run with --moe-router-load-balancing-type sinkhorn leans on expert mechanisms
    no run measured and is marked extrapolated, and the MoE imbalance it prints says that its balance is an
    assumption, not a measurement."""
    ann = load_annotations()
    row = next(r for r in load_runs() if r["id"] == "H100-mlmci-mixtral8x7b-tp2pp4ep4-rel")
    argv = priced_argv(row, ann)
    at = argv.index("--moe-router-load-balancing-type")
    assert argv[at + 1] == "aux_loss"
    flags = argv[:at + 1] + ["sinkhorn"] + argv[at + 2:]
    inputs = load_inputs(megatron_args=shlex.join(flags), cluster=row["cluster"], allow_invalid=True)
    ev = estimate(inputs, allow_invalid=True).time_range.evidence
    sinkhorn = [u for u in ev.to_json()["unmeasured"] if "real routing, dropless, Sinkhorn" in u]
    assert ev.extrapolated and any(u.startswith("expert GEMMs") for u in sinkhorn), ev.unmeasured
    imbalance = {a.name: a for a in inputs.run.assumed}["MoE imbalance"]
    assert "Sinkhorn" in imbalance.source and "assum" in imbalance.source and "unmeasured" in imbalance.source


def test_fewer_local_experts_than_measured_are_covered_more_are_not():
    """Local experts are covered from 1 up to the most a run measured (planner/uncertainty.py AT_MOST_AXES): at a
    covered tokens per expert a smaller grouped call is priced from the measured dense-GEMM curve, a larger one is a
    grouped kernel no run timed.  Tokens per expert keep their slack of one table step either way."""
    key = (("device", "H100/H800/H200/H20"), ("precision", "bf16"), ("routing", "forced balance"))

    def expert(tokens: float, local: float) -> Conditions:
        return Conditions("expert_gemm", key, (("tokens_per_expert", tokens), ("local_experts", local)))

    region = Region.of([cell_of(expert(1024.0, 8.0), "a"), cell_of(expert(4096.0, 16.0), "b")])
    assert region.covers(expert(2048.0, 1.0)) and region.covers(expert(4096.0, 16.0))
    assert not region.covers(expert(2048.0, 17.0))  # more local experts than any run: a grouped call no run timed
    assert region.covers(expert(8192.0, 2.0)) and not region.covers(expert(8193.0, 2.0))  # one step above 4096
    assert region.covers(expert(512.0, 4.0)) and not region.covers(expert(511.0, 4.0))  # one step below 1024
    assert region.why_not(expert(2048.0, 17.0)).startswith("no calibration run at this size")


def test_unpriced_flags_are_matched_one_by_one_against_the_runs_that_had_them():
    """The `unpriced` axis (the run's flags that change a mechanism's time without a price): conditions are covered
    when their other axes are and every one of their unpriced flags was in some run of the mechanism; two flags
    measured in different runs cover their pair, a flag no run had does not, and the reason names it."""
    base = (("device", "H100/H800/H200/H20"),)

    def bound(flags: str = "") -> Conditions:
        return Conditions("memory_bound", base + ((("unpriced", flags),) if flags else ()))

    region = Region.of([cell_of(bound(), "a"), cell_of(bound("--moe-permute-fusion"), "b"),
                        cell_of(bound("--moe-router-fusion"), "c")])
    assert region.covers(bound()) and region.covers(bound("--moe-permute-fusion, --moe-router-fusion"))
    assert not region.covers(bound("--deterministic-mode, --moe-permute-fusion"))
    assert region.why_not(bound("--deterministic-mode, --moe-permute-fusion")) == \
        "no calibration run had --deterministic-mode"
    other = Conditions("memory_bound", (("device", "B300"), ("unpriced", "--deterministic-mode")))
    assert region.why_not(other).startswith("no calibration run had --deterministic-mode; no calibration run in these")
    assert "with --deterministic-mode (not priced)" in other.words()


def test_an_unpriced_flag_no_run_had_makes_the_estimate_extrapolated_and_wider():
    """Megatron's --deterministic-mode (NCCL's ring, TE's deterministic attention backward, cuBLAS's fixed workspace,
    torch's deterministic algorithms: Megatron-LM megatron/training/determinism.py) is priced as if absent; no shipped
    calibration run had it, so the plan is extrapolated on the mechanisms it changes, named with the flag, and the
    range is wider around the same nominal time.  --manual-gc, which fitted runs had, changes nothing."""
    def priced(extra: str):
        inputs = load_inputs(megatron_args=f"{DENSE} {extra}", cluster="H100:8")
        return inputs.run.training.unpriced_flags, estimate(inputs).time_range

    flags0, plain = priced("")
    flags1, det = priced("--deterministic-mode")
    flags2, gc = priced("--manual-gc")
    assert (flags0, flags1, flags2) == ((), ("--deterministic-mode",), ("--manual-gc",))
    assert gc.evidence == plain.evidence and det.evidence.extrapolated
    named = [u for u in det.evidence.to_json()["unmeasured"] if u not in plain.evidence.to_json()["unmeasured"]]
    assert any(u.startswith("dense GEMMs in bf16 on H100/H800/H200/H20, with --deterministic-mode (not priced)")
               for u in named), named
    assert all("no calibration run had --deterministic-mode" in u for u in named), named
    assert det.nominal_s == pytest.approx(plain.nominal_s)
    assert det.high_s > plain.high_s and det.low_s < plain.low_s
    assert gc.high_s == pytest.approx(plain.high_s) and gc.low_s == pytest.approx(plain.low_s)


def test_the_default_softmax_is_priced_as_is_and_attention_sinks_are_not():
    """--softmax-type vanilla is Megatron's default softmax, which the cost model prices; another value is an
    unpriced flag (its note and its evidence axis)."""
    def read(extra: str):
        return load_inputs(megatron_args=f"{DENSE} {extra}", cluster="H100:8").run

    assert read("--softmax-type vanilla").training.unpriced_flags == ()
    assert read("--softmax-type off-by-one").training.unpriced_flags == ("--softmax-type",)
    assert not unmodelled_notes(["--softmax-type", "vanilla"])
    assert unmodelled_notes(["--softmax-type=learnable"])[0].startswith("--softmax-type is not modelled")


UNPRICED_ENV_ENTRIES = tuple(f"{n}={v}" if v else n for n, (v, _, _) in UNPRICED_ENV.items())


def test_unpriced_flags_name_mechanisms_of_the_cost_model():
    """Every flag or environment setting marked as changing time unpriced names mechanisms that exist."""
    names = {m.name for m in MECHANISMS}
    assert UNPRICED_IN and all(ms and set(ms) <= names for ms in UNPRICED_IN.values()), UNPRICED_IN
    assert set(UNPRICED_IN) - set(UNPRICED_ENV_ENTRIES) <= set(NOT_MODELLED)


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
    run, cluster, profiles, *_ = load_inputs(model="mixtral-s", cluster="H800:4,A100:2", overrides={"gbs": 16})
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
    res = run_once(*SOLVE)  # test_cli.py reads the same solve
    assert res.exit_code == 0, res.stdout + res.stderr
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
    # no headroom at all is a headroom too (the tiny model on two GPUs: it is the option's value that is checked)
    zero = _invoke(["solve", "--megatron-args", TINY_FLAGS, "--cluster", "H800:2", "--json", "--quiet",
                    "--memory-headroom", "0"])
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


def test_estimate_says_what_the_range_rests_on():
    """estimate --json: `evidence` {extrapolated, unmeasured} (dispatch inside an H800 node: no calibration run
    measured it) and, per mechanism, what its uncertainty alone adds at the top, which together make the top of
    the range (to first order: within 5%); the text says it in one line."""
    args = ["estimate", "--model", "mixtral-s", "--cluster", "H800:32", "--tp", "2", "--pp", "4", "--ep", "4"]
    d = json.loads(_invoke(args + ["--json"]).stdout)
    ev = d["evidence"]
    assert ev["extrapolated"] is True and all(isinstance(u, str) for u in ev["unmeasured"])
    assert any(u.startswith("alltoall dispatch with EP inside a node (nvlink) on H800") for u in ev["unmeasured"]), ev
    lo, hi = d["iteration_time_range_s"]
    added = sum(d["range_by_mechanism_s"].values())
    assert added == pytest.approx(hi - d["iteration_time_s"], rel=0.05)
    assert list(d["range_by_mechanism_s"].values()) == sorted(d["range_by_mechanism_s"].values(), reverse=True)
    text = " ".join(_invoke(args).output.split())  # the terminal wraps lines
    assert "evidence: EXTRAPOLATED" in text and "alltoall dispatch with EP inside a node" in text


MODEL = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 --max-position-embeddings "
         "4096 --global-batch-size 64 --vocab-size 32000 --bf16 --micro-batch-size 1")


def test_keep_yours_end_to_end(monkeypatch):
    """The planner's own pick given back as the user's flags is no slower than itself: keep yours, in the JSON
    and the text.  Eight pipeline stages of one layer each at 4 micro-batches (a long bubble) do not.  (The text
    run prints the --json run's search: helpers/cli.py solve_searches_once.)"""
    solve_searches_once(monkeypatch)
    base = ["solve", "--cluster", "H100:8", "--quiet"]
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


def _interleaved(second_chunk: int):
    """PP 4 with VPP 2 as a layout (Megatron refuses unequal chunks from --num-virtual-stages-per-pipeline-rank):
    two layers in every rank's first chunk, `second_chunk` in its second."""
    c = "t" * second_chunk
    layout = f"Et*2|t*2|t*2|t*2|{c}|{c}|{c}|{c}L"
    flags = DENSE.replace("--num-layers 8", f"--num-layers {8 + 4 * second_chunk}") + \
        f" --pipeline-model-parallel-size 4 --pipeline-model-parallel-layout {layout}"
    return flags_cost_model(flags, "H100:32")


def test_unequal_interleaved_chunks_are_priced_and_named_unmeasured():
    """PP 4 with VPP 2, 2 and 1 layers in a rank's chunks, and 2 and 2.  The middle stages of the first pay the
    schedule's stall (1 - (b + 2) / PP = 0.25 of a layer's time per micro-batch, b = 1; the ends none), the second
    none; no calibration run has unequal chunks, so the shipped region names the first plan's schedule, with its
    own simulated stall, and not the second's."""
    run, plan, cm = _interleaved(1)
    assert chunk_pattern(plan) == (2, 1)
    cost = cm.evaluate(plan)
    for i, st in enumerate(cost.stages):
        stall = dict(st.parts).get("chunk_stall", 0.0)
        if i in (0, plan.pp - 1):
            assert stall == 0.0
        else:
            assert stall == pytest.approx(0.25 / 3 * (st.time_s - stall - st.pp_comm_s), rel=1e-9)
    rm = RangeModel(run.model, run.training, cm.cluster, cm.profiles)
    ev = rm.time_range(plan).evidence
    simulated = schedule_stall(cm, plan)
    assert simulated > 0.02
    assert ev.extrapolated and any("unequal virtual chunks" in what and f"{100 * simulated:.0f}% of the pipeline"
                                   in what for what, _ in ev.unmeasured), ev

    run, plan, cm = _interleaved(2)
    assert chunk_pattern(plan) == (2, 2)
    assert all("chunk_stall" not in dict(st.parts) for st in cm.evaluate(plan).stages)
    assert abs(schedule_stall(cm, plan)) < 0.005
    ev = RangeModel(run.model, run.training, cm.cluster, cm.profiles).time_range(plan).evidence
    assert not any("virtual chunks" in what for what, _ in ev.unmeasured), ev


def test_a_plan_over_the_headroom_but_within_the_device_is_compared_not_refused(monkeypatch):
    """A user's plan predicted above the usable memory (the device less the headroom) but within the device may
    run (the headroom is the memory model's worst under-prediction; NVIDIA's Qwen3-235B TP2 PP32 EP8 run is
    predicted 0.5 GiB over it, and ran): it is priced against the pick and said to be at risk, not called a plan
    that does not run.  Above the whole device it still does not fit.  (The text run prints the --json run's search:
    helpers/cli.py solve_searches_once.)"""
    solve_searches_once(monkeypatch)
    base = ["solve", "--cluster", "H100:8", "--quiet", "--json"]
    mine = MODEL.replace("--micro-batch-size 1", "--micro-batch-size 4")
    probe = json.loads(_invoke(["estimate", "--cluster", "H100:8", "--json", "--megatron-args", mine]).stdout)
    worst = max(probe["stages"], key=lambda s: s["memory_gib"])
    used = worst["memory_gib"] / worst["capacity_gib"]
    assert 0.2 < used < 0.9, used  # room for a headroom between the plan's need and the device
    over = _invoke(base + ["--memory-headroom", f"{1 - used + 0.05:.3f}", "--megatron-args", mine])
    assert over.exit_code == 0, over.output
    u = json.loads(over.stdout)["user_plan"]
    assert not u["fits"] and u["fits_device"] and u["over_headroom"] and not u["runs"], u
    assert "does not run as given" not in u["keep_yours_why"] and "may run out of memory" in u["keep_yours_why"]
    text = " ".join(_invoke(base[:-1] + ["--memory-headroom", f"{1 - used + 0.05:.3f}", "--megatron-args",
                                         mine]).output.split())
    assert "over the memory headroom" in text and "would not run as is" not in text
    fits = json.loads(_invoke(base + ["--megatron-args", mine]).stdout)["user_plan"]
    assert fits["fits"] and not fits["over_headroom"]
    est = ["estimate", "--cluster", "H100:8", "--memory-headroom", f"{1 - used + 0.05:.3f}", "--megatron-args", mine]
    e = json.loads(_invoke(est + ["--json"]).stdout)
    assert not e["fits"] and e["fits_device"] and e["overflow"]["fits_device"], e["overflow"]
    text = " ".join(_invoke(est).output.split())
    assert "(over the headroom, within the device)" in text and "it may run or run out of memory" in text


def test_efa_is_a_fabric_of_its_own_for_the_evidence_and_priced_as_infiniband_at_its_rate():
    """The same MoE plan on 64 H100 over InfiniBand (the device's NIC) and over AWS's EFA (preset p5-h100-64,
    `inter_node_kind: efa`, the same 50 GB/s per GPU): NCCL's all-to-all is priced alike on both (EFA at the
    InfiniBand curves), but no calibration run trained over EFA, so there the dispatch across nodes is unmeasured,
    named with its fabric, and the range wider."""
    args = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 --max-position-embeddings "
            "4096 --vocab-size 32000 --num-experts 64 --moe-router-topk 8 --moe-ffn-hidden-size 1024 "
            "--moe-grouped-gemm --moe-router-force-load-balancing --disable-bias-linear --swiglu --micro-batch-size 2 "
            "--global-batch-size 256 "
            "--expert-model-parallel-size 32 --moe-token-dispatcher-type alltoall --bf16")
    ib, efa = (estimate(load_inputs(megatron_args=args, cluster=c)).time_range for c in ("H100:64", "p5-h100-64"))
    assert efa.nominal_s == pytest.approx(ib.nominal_s, rel=1e-9)
    named = [u for u in efa.evidence.to_json()["unmeasured"] if u.startswith("alltoall dispatch with EP across nodes")]
    assert named and "across nodes (efa)" in named[0], efa.evidence.unmeasured
    assert not any("(efa)" in u for u in ib.evidence.to_json()["unmeasured"])
    assert efa.high_s > ib.high_s


def test_flex_dispatch_across_efa_nodes_says_what_training_measured():
    """DeepEP across EFA nodes is priced from AWS's EFA microbenchmark, which AWS's own training runs contradict
    (DeepEP 1.28-1.86x NCCL's iteration time at EP32): the estimate says so, for flex dispatch across EFA nodes
    only (not over InfiniBand, not with NCCL's all-to-all)."""
    args = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 --max-position-embeddings "
            "4096 --vocab-size 32000 --num-experts 64 --moe-router-topk 8 --moe-ffn-hidden-size 1024 "
            "--moe-grouped-gemm --moe-router-force-load-balancing --disable-bias-linear --swiglu --micro-batch-size 2 "
            "--global-batch-size 256 "
            "--expert-model-parallel-size 32 --bf16 --moe-token-dispatcher-type ")

    def efa_notes(dispatcher: str, cluster: str) -> list[str]:
        notes = estimate(load_inputs(megatron_args=args + dispatcher, cluster=cluster)).notes
        return [n for n in notes if "over EFA" in n]

    flex = "flex --moe-flex-dispatcher-backend deepep"
    [note] = efa_notes(flex, "p5-h100-64")
    assert note.startswith("DeepEP dispatch with EP across nodes over EFA") and "1.28-1.86x" in note
    assert efa_notes(flex, "H100:64") == [] and efa_notes("alltoall", "H100:64") == []
    [note] = efa_notes("alltoall", "p5-h100-64")
    assert note.startswith("alltoall dispatch with EP across nodes over EFA") and "1.28-1.86x" not in note


# AWS's DeepSeek-V3 on 256 p6-b300, UCCL-EP's DeepEP drop-in against NCCL's all-to-all, both arms otherwise alike
# (awslabs/awsome-distributed-ai @95b939cd 3.test_cases/megatron/megatron-bridge/dsv3/benchmarks/RESULTS.md: the
# 'arm (mb=1)' table's treatment row, the micro-batch sweep's mb 4 'deepep mean (s)', the overlap=on mb=4 table's
# deepep row): the NCCL arm of each is a held-out row, id -> the UCCL arm's mean iteration seconds
UCCL_DSV3_B300_S = {"B300-aws-dsv3-671B-256-tp8pp8ep32-mb1-a2a-rcfull": 14.117,
                    "B300-aws-dsv3-671B-256-tp8pp8ep32-mb4-a2a-rcfull": 6.263,
                    "B300-aws-dsv3-671B-256-tp8pp8vpp2ep32-mb4-a2a-epovl": 3.839}


def test_flex_across_efa_nodes_note_quotes_what_aws_training_measured_against_this_model():
    """The flex note's range of measured over predicted time is AWS's three UCCL-EP cells re-priced here (the NCCL
    rows' flags with the flex dispatcher and DeepEP backend), and its quoted ratios to NCCL are the table's."""
    from planner.calibration.runs import load_unfitted_runs
    from planner.cost.dispatch import EFA_FLEX_RATIO

    nccl = {r["id"]: r for r in load_unfitted_runs() if r["id"] in UCCL_DSV3_B300_S}
    assert len(nccl) == 3
    ratios = []
    for rid, uccl_s in UCCL_DSV3_B300_S.items():
        r = nccl[rid]
        args = r["megatron_args"].replace("--moe-token-dispatcher-type alltoall",
                                          "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep")
        assert args != r["megatron_args"]
        est = estimate(load_inputs(megatron_args=args, cluster=r["cluster"]))
        ratios.append(uccl_s / est.cost.iteration_time_s)
        [note] = [n for n in est.notes if n.startswith("DeepEP dispatch with EP across nodes over EFA")]
        assert f"{EFA_FLEX_RATIO[0]:.2f}-{EFA_FLEX_RATIO[1]:.2f}x this planner's estimate" in note
        to_nccl = uccl_s / float(r["value"])
        assert f"{to_nccl:.2f}x" in note, (rid, to_nccl)
    assert EFA_FLEX_RATIO[0] <= min(ratios) and max(ratios) <= EFA_FLEX_RATIO[1], ratios
    assert min(ratios) < EFA_FLEX_RATIO[0] + 0.02 and max(ratios) > EFA_FLEX_RATIO[1] - 0.02, ratios


def test_alltoall_across_efa_nodes_note_quotes_what_aws_training_measured_against_this_model():
    """The note on NCCL's all-to-all across EFA nodes quotes AWS's held-out training rows against this planner's
    own estimate: re-priced here, every row's measured over predicted time lies in the range quoted for its
    micro-batch size (the quote goes stale when the model moves); EP inside one node over EFA gets no note."""
    from planner.calibration.runs import load_unfitted_runs
    from planner.cost.dispatch import EFA_ALLTOALL_RATIO

    rows = [r for r in load_unfitted_runs() if "-aws-" in r["id"] and "-a2a-" in r["id"]]
    assert len(rows) >= 25
    ratios: dict[int, list[float]] = {}
    for r in rows:
        est = estimate(load_inputs(megatron_args=r["megatron_args"], cluster=r["cluster"]))
        ratio = float(r["value"]) / est.cost.iteration_time_s
        lo, hi = EFA_ALLTOALL_RATIO[est.plan.mbs]
        assert lo <= ratio <= hi, (r["id"], ratio)
        notes = [n for n in est.notes if n.startswith("alltoall dispatch with EP across nodes over EFA")]
        assert len(notes) == 1 and f"{lo:.2f}-{hi:.2f}x" in notes[0], r["id"]
        ratios.setdefault(est.plan.mbs, []).append(ratio)
    for mbs, (lo, hi) in EFA_ALLTOALL_RATIO.items():  # the quote is tight: it moves when the model does
        assert min(ratios[mbs]) < lo + 0.02 and max(ratios[mbs]) > hi - 0.02, (mbs, ratios[mbs])
    inside = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 --max-position-embeddings "
              "2048 --vocab-size 32000 --num-experts 16 --moe-router-topk 2 --moe-grouped-gemm "
              "--micro-batch-size 1 --global-batch-size 64 --expert-model-parallel-size 8 --bf16 "
              "--moe-token-dispatcher-type alltoall")
    assert not [n for n in estimate(load_inputs(megatron_args=inside, cluster="p5-h100-64")).notes if "over EFA" in n]


def test_blackwell_eager_moe_note_quotes_nvidias_runs_against_this_model():
    """The note on MoE on Blackwell without full-iteration CUDA graphs quotes NVIDIA's held-out Megatron-Bridge rows
    against this planner's own estimate: re-priced here, each row's measured over predicted time lies in the range
    quoted for its kind (eager, or one full-iteration graph), the ranges are tight (they move when the model does),
    and only the eager rows get the note."""
    from planner.calibration.runs import load_unfitted_runs
    from planner.cost.layer import BLACKWELL_EAGER_MOE_RATIO, BLACKWELL_GRAPHED_MOE_RATIO

    rows = [r for r in load_unfitted_runs() if r["id"].split("-")[0] in {"B200", "B300", "GB200", "GB300"}
            and "-aws-" not in r["id"] and "--num-experts" in r["megatron_args"]]
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for r in rows:
        est = estimate(load_inputs(megatron_args=r["megatron_args"], cluster=r["cluster"]))
        graphed = "--cuda-graph-impl full_iteration" in r["megatron_args"]
        lo, hi = BLACKWELL_GRAPHED_MOE_RATIO if graphed else BLACKWELL_EAGER_MOE_RATIO
        ratio = float(r["value"]) / est.cost.iteration_time_s
        assert lo <= ratio <= hi, (r["id"], ratio)
        notes = [n for n in est.notes if n.startswith("MoE on ") and "full-iteration CUDA graphs" in n]
        assert len(notes) == (0 if graphed else 1), r["id"]
        if notes:
            assert f"{lo:.2f}-{hi:.2f}x on B200 and B300" in notes[0]
        ratios[graphed].append(ratio)
    assert len(ratios[True]) >= 9 and len(ratios[False]) >= 10
    for graphed, (lo, hi) in ((True, BLACKWELL_GRAPHED_MOE_RATIO), (False, BLACKWELL_EAGER_MOE_RATIO)):
        assert min(ratios[graphed]) < lo + 0.02 and max(ratios[graphed]) > hi - 0.02, (graphed, ratios[graphed])


def test_one_local_expert_reads_in_the_singular():
    """"expert GEMMs ... at 8192 tokens per expert and 1 local experts" (EP equal to the expert count) now reads
    "1 local expert"; other counts keep the plural."""
    def words(n: float) -> str:
        return Conditions("expert_gemm", (("device", "MI300X"), ("precision", "bf16"), ("routing", "dropless")),
                          (("tokens_per_expert", 8192.0), ("local_experts", n))).words()

    assert "at 8192 tokens per expert and 1 local expert, dropless" in words(1.0)
    assert "and 2 local experts, dropless" in words(2.0) and "and 16 local experts," in words(16.0)
