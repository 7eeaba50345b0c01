"""Search: HS-DP against a brute-force oracle, the driver end to end, bounds, and the plan checker.

The oracle (solver_models/brute.py) enumerates every option sequence and layer split over the same
integer tables; a second oracle prices every plan with the float evaluator directly, so the tables
themselves are checked against the cost model.
"""

from __future__ import annotations

import itertools
import math
import time

import pytest

from planner.checker import plan_problems
from planner.cost.model import CostModel
from planner.inputs.cluster import parse_cluster
from planner.inputs.resolve import resolve_run
from planner.schemas.plan import Plan, StagePlan
from planner.search.driver import search
from planner.search.pruning import Pruning
from planner.search.screening import Screening
from planner.search.settings import SearchSettings
from planner.search.space import SearchSpace, enumerate_globals, stage_options
from solver_models.brute import solve_brute
from solver_models.fitting import has_fitting_layout
from solver_models.hsdp import solve_hsdp
from planner.search.tables import TableBuilder

from helpers.cases import reduced_cost_model

# (model preset, layers kept, cluster, global batch)
SCENARIOS = [
    ("llama2-7b", 6, "A100:8,910B:8", 32),
    ("mixtral-s", 8, "H800:8,MI300X:8", 32),
    ("mixtral-s", 6, "H800:8,MI300X:8,910B:8", 48),
    ("qwen3-30b-a3b", 6, "H100:16", 32),
    ("llama2-7b", 8, "A100:16,910B:16", 64),
]
SMALL_SPACE = SearchSpace(tp=(1, 2, 4, 8), cp=(1,), mbs=(1,), vpp=(1, 2), max_pp=4)


def _globals(cm: CostModel, space: SearchSpace):
    gpn = {h: cm.domain_gpus(h) for h in cm.cluster.gpus_by_type()}
    for g in enumerate_globals(cm.model, cm.training, cm.cluster, space, gpn):
        opts = stage_options(g, cm.model, cm.training, cm.cluster, space, gpn)
        if opts:
            yield g, opts


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[f"{s[0]}-{s[2]}" for s in SCENARIOS])
def test_hsdp_equals_brute_force_per_configuration(scenario):
    """Without pruning, HS-DP's optimum equals brute force on every sampled global configuration."""
    cm = reduced_cost_model(*scenario)
    tb = TableBuilder(cm)
    checked = 0
    for g, opts in itertools.islice(_globals(cm, SMALL_SPACE), 0, None, 7):
        if g.pp > 3:
            continue
        t = tb.build(g, opts)
        brute = solve_brute(t)
        dp = solve_hsdp(t)
        assert (brute is None) == (dp is None), g.label()
        if brute is not None:
            assert dp.objective_us == brute.objective_us, g.label()
            checked += 1
        if checked >= 12:
            break
    assert checked >= 3


def _float_objective(cm: CostModel, g, t, stages) -> float:
    plan = Plan(runtime=g.runtime, tp=g.tp, cp=g.cp, ep=g.ep, etp=g.etp, vpp=g.vpp, mbs=g.mbs,
                gbs=cm.training.global_batch_size, sequence_parallel=g.tp > 1,
                stages=tuple(StagePlan(device_type=t.options[o].device_type, num_layers=n, dp=t.options[o].dp,
                                       recompute=t.options[o].recompute) for o, _, n in stages))
    return cm.evaluate(plan).iteration_time_s


def _tables_match_evaluator(cm: CostModel, configs, limit: int) -> list:
    """Each configuration's brute-force optimum over its integer tables against the float evaluator's iteration
    time of that plan: the tables round down, so never above the evaluator and below it by at most the
    quantisation.  The shapes checked (those with a feasible plan, at most `limit`)."""
    tb = TableBuilder(cm)
    checked = []
    for g, opts in configs:
        t = tb.build(g, opts)
        sol = solve_brute(t)
        if sol is None:
            continue
        table_s = sol.objective_us * 1e-6 / g.vpp
        float_s = _float_objective(cm, g, t, sol.stages)
        assert table_s <= float_s <= table_s + t.quantisation_us * 1e-6 / g.vpp, g.label()
        checked.append(tb.shape(g))
        if len(checked) >= limit:
            break
    return checked


def test_tables_price_plans_like_the_evaluator():
    """The integer tables' objective of a plan equals the float evaluator's iteration time (to rounding)."""
    cm = reduced_cost_model("mixtral-s", 8, "H800:8,MI300X:8,910B:8", 48)
    assert len(_tables_match_evaluator(cm, itertools.islice(_globals(cm, SMALL_SPACE), 0, None, 5), 8)) >= 3


def test_tables_price_ep_overlap_like_the_evaluator():
    """With --overlap-moe-expert-parallel-comm the tables charge the schedule's unpaired steps as the evaluator does
    (a share that depends on PP, which the cached arrays do not): equal to rounding, on shapes where that share is
    charged."""
    base = reduced_cost_model("qwen3-30b-a3b", 6, "H100:16", 32)
    training = base.training.model_copy(update={"overlap_moe_expert_parallel_comm": True})
    cm = CostModel(base.model, training, base.cluster, base.profiles)
    assert cm.model.is_moe
    checked = _tables_match_evaluator(cm, ((g, o) for g, o in _globals(cm, SMALL_SPACE) if g.ep > 1), 12)
    assert len(checked) >= 3
    assert sum(cm.ep_unpaired_share(gs) > 0.05 for gs in checked) >= 3


def test_lower_bounds_never_exceed_the_optimum():
    """The driver's cheap and tight bounds are below each configuration's exact optimum."""
    from planner.search.bounds import lower_bound_s as _lower_bound_s, option_bound as _option_bound

    cm = reduced_cost_model("llama2-7b", 6, "A100:8,910B:8", 32)
    tb = TableBuilder(cm)
    budget = cm.cluster.gpus_by_type()
    checked = 0
    for g, opts in itertools.islice(_globals(cm, SMALL_SPACE), 0, None, 3):
        t = tb.build(g, opts)
        sol = solve_hsdp(t)
        gs = tb.shape(g)
        obs = {o: _option_bound(cm, gs, o) for o in opts}
        inflight = [cm.inflight_microbatches(gs, i) for i in range(g.pp)]
        lb = _lower_bound_s(obs, g, opts, budget, cm.model.num_layers, gs.num_microbatches, inflight, tight=True)
        if sol is None:
            continue
        assert lb <= sol.objective_us * 1e-6 / g.vpp + 1e-6, g.label()
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("scenario", SCENARIOS[:3], ids=[f"{s[0]}-{s[2]}" for s in SCENARIOS[:3]])
def test_search_without_pruning_equals_brute_force_search(scenario):
    """The whole search (every configuration) with HS-DP equals the same search with brute force,
    and is reported as certified optimal; with pruning on, the gap to that optimum is printed."""
    cm = reduced_cost_model(*scenario)
    exact = search(cm, SMALL_SPACE, SearchSettings(backend="hsdp").without_pruning())
    oracle = search(cm, SMALL_SPACE, SearchSettings(backend="brute").without_pruning())
    assert exact.best[0].objective_s == pytest.approx(oracle.best[0].objective_s, rel=1e-9)
    assert exact.certified_optimal
    pruned = search(cm, SMALL_SPACE, SearchSettings(backend="hsdp", pruning=Pruning(delta=0.2, memory=True)))
    gap = pruned.best[0].objective_s / exact.best[0].objective_s - 1
    print(f"{scenario[0]} on {scenario[2]}: optimum {exact.best[0].objective_s:.4f} s, pruned "
          f"{pruned.best[0].objective_s:.4f} s, gap {gap * 100:.2f}%")
    assert gap >= -1e-9  # pruning can only lose


def test_returned_plans_pass_the_checker():
    """Every plan the search returns covers the layers once, fits, and keeps every rule."""
    for scenario in SCENARIOS:
        cm = reduced_cost_model(*scenario)
        res = search(cm, SMALL_SPACE, SearchSettings(backend="hsdp", top_k=3))
        for cand in res.best:
            problems, cost = plan_problems(cm, cand.plan)
            assert problems == [], problems
            # tables round each time down to 1 us; t_max counts m*v - 1 times: allow that, no more
            v = cand.plan.vpp
            quant_s = (3 * (cand.plan.pp + cand.plan.num_microbatches * v - 1) + v) * 1e-6 / v
            assert cand.objective_s <= cost.iteration_time_s <= cand.objective_s + quant_s


def test_checker_catches_broken_plans():
    """The checker reports a plan with missing layers, too many GPUs, and one that does not fit."""
    cm = reduced_cost_model("llama2-7b", 6, "A100:8,910B:8", 32)
    ok = Plan(tp=2, gbs=32, mbs=1, stages=(StagePlan(device_type="A100", num_layers=3, dp=4),
                                          StagePlan(device_type="910B", num_layers=3, dp=4)))
    assert plan_problems(cm, ok)[0] == []
    short = ok.model_copy(update={"stages": (StagePlan(device_type="A100", num_layers=2, dp=4),
                                              StagePlan(device_type="910B", num_layers=3, dp=4))})
    assert any("decoder layers" in p for p in plan_problems(cm, short)[0])
    greedy = ok.model_copy(update={"stages": (StagePlan(device_type="A100", num_layers=3, dp=8),
                                               StagePlan(device_type="910B", num_layers=3, dp=8))})
    assert any("GPUs" in p for p in plan_problems(cm, greedy)[0])
    big = reduced_cost_model("llama2-70b", 80, "A100:8", 8)
    huge = Plan(tp=1, gbs=8, mbs=1, stages=(StagePlan(device_type="A100", num_layers=80, dp=1),))
    assert any("needs" in p for p in plan_problems(big, huge)[0])


def test_infeasible_request_says_why(profiles):
    """A model that fits nowhere gets an InfeasibleError naming the stage, the shortfall and remedies."""
    from planner.errors import InfeasibleError

    cl = parse_cluster("V100:2", profiles)
    run = resolve_run(model="llama2-70b", world_size=2, overrides={"gbs": 8})
    cm = CostModel(run.model.model_copy(update={}), run.training.model_copy(update={"precision": "fp16"}), cl,
                   profiles)
    with pytest.raises(InfeasibleError) as err:
        search(cm, SearchSpace(), SearchSettings(backend="hsdp"))
    text = str(err.value)
    assert "GiB" in text and "short" in text and "more GPUs" in text


@pytest.mark.parametrize("cluster,gbs", [("H800:4,MI300X:4", 16), ("H800:4,MI300X:4,910B:4", 24)])
def test_flagscale_search_without_pruning_equals_exhaustive_brute_force(cluster, gbs):
    """The per-stage-DP (flagscale) search without pruning, bounds and warm start included, finds
    the optimum of brute force run on every configuration (no bounding), and says it is certified."""
    from planner.schemas.plan import Recompute

    cm = reduced_cost_model("mixtral-s", 4, cluster, gbs)
    short = (Recompute.none(), Recompute.full("uniform", 1))
    space = SearchSpace(runtime="flagscale", tp=(1, 2), mbs=(1, 2), max_pp=3, stage_recompute=short)
    tb = TableBuilder(cm)
    truth = math.inf
    for g, opts in _globals(cm, space):
        sol = solve_brute(tb.build(g, opts))
        if sol is not None:
            truth = min(truth, sol.objective_us * 1e-6 / g.vpp)
    assert math.isfinite(truth)
    res = search(cm, space, SearchSettings(backend="hsdp").without_pruning())
    assert res.best[0].objective_s == pytest.approx(truth, rel=1e-9)
    assert res.certified_optimal and res.configs_bounded > 0


def test_nothing_fits_is_proven_by_the_bounds_alone():
    """Qwen3-235B cut to 16 layers on 8 H800: no configuration of the megatron space has a layout that fits
    (each sampled one's tables say so), and the HS-DP screening proves it from its bounds alone: every
    configuration infeasible, no plan, no table built.  (The memory test once let full block recompute spare
    k x VPP layers' activations on stages holding fewer layers: 138 configurations reached their tables.)"""
    cm = reduced_cost_model("qwen3-235b-a22b", 16, "H800:8", 64)
    space = SearchSpace(runtime="megatron")
    tb = TableBuilder(cm)
    sampled = 0
    for g, opts in itertools.islice(_globals(cm, space), 0, None, 97):
        assert not has_fitting_layout(tb.build(g, opts)), g.label()
        sampled += 1
    assert sampled >= 50
    settings = SearchSettings(backend="hsdp", pruning=Pruning.off(), deadline=time.perf_counter() + 600)
    scr = Screening(cm, space, settings, time.perf_counter(), None)
    scr.enumerate(until=math.inf)
    scr.run()
    assert not scr.cands and not scr.timed_out and scr.enumeration_complete
    assert scr.enumerated > 5000 and scr.infeasible == scr.enumerated
    assert scr.tables_built == 0
    # no stage holds even its layers' weights, gradients and optimizer state: every shape is settled as it is
    # enumerated, and no configuration enters the queue
    assert scr.seq == 0 and scr.total == scr.done == scr.enumerated


def test_configurations_settled_with_their_shape_count_in_all():
    """Qwen3-235B cut to 12 layers on 8 H800: most shapes hold no layout (the relaxed bound's memory test settles
    them as they are enumerated), the rest hold the plan.  The counts still add up to every configuration of
    the space with a stage option (enumerated here on their own), with and without the prunings ordering the
    work."""
    cm = reduced_cost_model("qwen3-235b-a22b", 12, "H800:8", 64)
    space = SearchSpace(runtime="megatron")
    every = sum(1 for _ in _globals(cm, space))
    for settings in (SearchSettings(backend="hsdp"), SearchSettings(backend="hsdp").without_pruning()):
        res = search(cm, space, settings)
        assert res.certified_optimal and res.configs_infeasible > every // 2
        parts = (res.configs_solved + res.configs_bounded + res.configs_infeasible + res.configs_pruned_memory
                 + res.configs_pruned_cp + res.configs_unsearched)
        assert parts == res.configs_total == every
