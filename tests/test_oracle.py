"""The search against an independent brute force over the whole space (tests/helpers/oracle.py, which
reads only the rules module and the evaluator), on reduced models: both runtimes, both backends,
every pruning switch.  Without pruning each backend's certified optimum is the brute-force
optimum (to the tables' quantisation, below a microsecond per stage); with any pruning the status
is not OPTIMAL, the plan is no better than the optimum, and every reported bound is at most it.

Also the three holes of issue 15, with their values worked out by the brute force."""

from __future__ import annotations

import pytest

from planner.cost.model import CostModel
from planner.megatron.rules import check_plan
from planner.schemas.plan import Recompute
from planner.search.driver import search
from planner.search.pruning import Pruning
from planner.search.settings import SearchSettings
from planner.search.space import SearchSpace

from helpers.cases import reduced_cost_model
from helpers.oracle import Menus, brute_force

NONE, FULL = Recompute.none(), Recompute.full("uniform", 1)
SEL = Recompute.selective(("core_attn",))


def space_of(m: Menus) -> SearchSpace:
    """The search space with the same menus as the brute force."""
    return SearchSpace(runtime=m.runtime, tp=m.tp, cp=m.cp, ep=m.ep, etp=m.etp, mbs=m.mbs, vpp=m.vpp,
                       recompute=m.recompute, stage_recompute=m.recompute, selective=m.selective,
                       contiguous_types=m.contiguous)


def quantisation_s(res) -> float:
    """Most the tables' objective can fall short of the float cost for the returned plan (StageTables.quantisation_us
    at its largest: four rounded terms per stage time, one per sync, one fill per boundary when interleaved)."""
    p = res.best[0].plan
    fill = p.vpp * (p.pp - 1) if p.vpp > 1 else 0
    return (4 * (p.pp + p.num_microbatches * p.vpp - 1) + p.vpp + fill) * 1e-6 / p.vpp


def check_exact(cm: CostModel, menus: Menus, truth: float, backend: str):
    """Unpruned search: certified, and its plan's float cost is the brute-force optimum."""
    res = search(cm, space_of(menus), SearchSettings(backend=backend, time_limit_s=120).without_pruning())
    got = res.costs[0].iteration_time_s
    assert res.status == "OPTIMAL" and res.certified_optimal, (backend, res.notes)
    assert truth <= got <= truth + quantisation_s(res), (backend, got, truth)
    assert res.lower_bound_s is not None and res.lower_bound_s <= truth, (backend, res.lower_bound_s, truth)
    assert not check_plan(cm.model, res.best[0].plan, cm.training)
    if backend == "cpsat":
        assert res.cpsat["status"] == "OPTIMAL" and res.cpsat["bound_s"] <= truth
    return res


PRUNINGS = {  # restricting the space (solve --prune)
    "load-balance": Pruning(delta=0.2, memory=False, cp_min_seq_tokens=None, restrict=True),
    "memory": Pruning(delta=None, memory=True, cp_min_seq_tokens=None, restrict=True),
    "cp-min-seq": Pruning(delta=None, memory=False, cp_min_seq_tokens=2048, restrict=True),
    "all": Pruning(delta=0.2, memory=True, cp_min_seq_tokens=2048, restrict=True),
}


def check_pruned(cm: CostModel, menus: Menus, truth: float, backend: str, pruning: Pruning):
    """Pruned search: never claims OPTIMAL over the whole space, its plan costs at least the
    optimum, and its whole-space bound (if any) is at most the optimum."""
    res = search(cm, space_of(menus), SearchSettings(backend=backend, time_limit_s=120, pruning=pruning))
    assert res.status == "FEASIBLE" and not res.certified_optimal
    assert res.costs[0].iteration_time_s >= truth - 1e-12
    assert res.lower_bound_s is None or res.lower_bound_s <= truth, (res.lower_bound_s, truth)
    if res.pruned_space_optimal:  # the pruned space's own optimum is proven: no better than the whole's
        assert res.best[0].objective_s >= res.lower_bound_s if res.lower_bound_s is not None else True
    return res


CASES = [
    # id, preset, layers, cluster, gbs, menus (, tied)
    ("dense-megatron", "llama2-7b", 6, "H100:4,A100:4", 32,
     Menus(tp=(1, 2, 4), cp=(1, 2), mbs=(1, 2), vpp=(1, 2), recompute=(NONE, SEL, FULL))),
    ("dense-megatron-contiguous", "llama2-7b", 6, "H100:4,A100:4", 32,
     Menus(tp=(1, 2, 4), mbs=(1, 2), recompute=(NONE, FULL), contiguous=True)),
    ("moe-megatron", "mixtral-s", 4, "H800:4,MI300X:4", 16,
     Menus(tp=(1, 2), ep=(1, 2, 4), etp=(1, 2), mbs=(1, 2), vpp=(1, 2), recompute=(NONE, SEL, FULL))),
    ("dense-flagscale", "llama2-7b", 6, "H100:4,A100:2", 24,
     Menus(runtime="flagscale", tp=(1, 2), mbs=(1, 2), recompute=(NONE, FULL), selective=(SEL,))),
    ("moe-flagscale", "mixtral-s", 4, "H800:4,910B:2", 16,
     Menus(runtime="flagscale", tp=(1, 2), ep=(1, 2), etp=(1,), mbs=(1, 2), recompute=(NONE, FULL),
           selective=(SEL,))),
    ("tied-flagscale", "llama2-7b", 4, "H100:4,A100:2", 24,
     Menus(runtime="flagscale", tp=(1, 2), mbs=(1, 2, 4), recompute=(NONE, FULL)), True),
]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request):
    _, preset, layers, cluster, gbs, menus, *tied = request.param
    cm = reduced_cost_model(preset, layers, cluster, gbs, tied=bool(tied and tied[0]))
    truth = brute_force(cm, menus)
    assert truth is not None
    return cm, menus, truth


@pytest.mark.parametrize("backend", ["hsdp", "cpsat"])
def test_unpruned_search_equals_brute_force(case, backend):
    """Each backend, pruning off: OPTIMAL, the brute-force optimum, bounds at most it."""
    cm, menus, truth = case
    check_exact(cm, menus, truth.best_s, backend)


@pytest.mark.parametrize("backend", ["hsdp", "cpsat"])
def test_default_search_equals_brute_force(case, backend):
    """The default settings (the prunings only order the work): OPTIMAL over the whole space, the
    brute-force optimum."""
    cm, menus, truth = case
    res = search(cm, space_of(menus), SearchSettings(backend=backend, time_limit_s=120))
    assert res.status == "OPTIMAL" and res.certified_optimal, (backend, res.notes)
    assert truth.best_s <= res.costs[0].iteration_time_s <= truth.best_s + quantisation_s(res)
    assert res.lower_bound_s is not None and res.lower_bound_s <= truth.best_s


@pytest.mark.parametrize("pruning", list(PRUNINGS), ids=list(PRUNINGS))
@pytest.mark.parametrize("backend", ["hsdp", "cpsat"])
def test_pruned_search_claims_no_more_than_it_proved(case, backend, pruning):
    """Each backend and each pruning switch: not OPTIMAL, no better than the optimum, bounds at
    most the optimum."""
    cm, menus, truth = case
    check_pruned(cm, menus, truth.best_s, backend, PRUNINGS[pruning])


# ---- issue 15's three holes, with the values the brute force works out ----
HOLE_MENUS = dict(tp=(1,), mbs=(1, 2, 4), recompute=(NONE,))


@pytest.mark.parametrize("runtime", ["megatron", "flagscale"])
def test_hole_dp_need_not_divide_the_cluster(runtime):
    """llama2-7b, 8 layers, H100:8,A100:4, gbs 96: the optimum runs DP 8 on the 8 H100s with
    micro-batch 4 and leaves the 4 A100s idle (issues 15.1 and 15.2: a DP that does not divide
    the 12 GPUs, and on flagscale B = 32 samples per micro-batch).  Both backends find it."""
    cm = reduced_cost_model("llama2-7b", 8, "H100:8,A100:4", 96)
    menus = Menus(runtime=runtime, **HOLE_MENUS)
    truth = brute_force(cm, menus)
    plan = truth.plan
    assert [(s.device_type, s.dp) for s in plan.stages] == [("H100", 8)] and plan.mbs == 4
    assert plan.world_size == 8 < cm.cluster.world_size
    for backend in ("hsdp", "cpsat"):
        res = check_exact(cm, menus, truth.best_s, backend)
        assert res.best[0].plan.world_size == 8
    print(f"{runtime}: brute-force optimum {truth.best_s:.6f} s over {truth.plans} plans")


def test_hole_flagscale_recompute_rule():
    """mixtral-l, 8 layers, H800:4,910B:4, gbs 64, flagscale (issue 15.3): with stages free to
    mix none and selective recompute the search once returned a plan FlagScale forbids.  The
    space now holds only none/full per stage or one selective setting on every stage; both
    backends return the brute-force optimum over that space, and it keeps the rule."""
    cm = reduced_cost_model("mixtral-l", 8, "H800:4,910B:4", 64)
    menus = Menus(runtime="flagscale", tp=(1, 2, 4), ep=(1, 2, 4), etp=(1,), mbs=(1, 2),
                  recompute=(NONE, FULL), selective=(Recompute.selective(("core_attn", "layernorm", "moe_act")),))
    truth = brute_force(cm, menus)
    labels = {s.recompute.label for s in truth.plan.stages}
    assert not any(lab.startswith("selective") for lab in labels) or len(labels) == 1
    for backend in ("hsdp", "cpsat"):
        res = check_exact(cm, menus, truth.best_s, backend)
        assert not check_plan(cm.model, res.best[0].plan, cm.training)
    print(f"flagscale recompute rule: brute-force optimum {truth.best_s:.6f} s ({sorted(labels)})")
