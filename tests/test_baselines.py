"""Baseline planners (planner/baselines): recipes, mappings, validity of their plans, and HAPMoE against them."""

from __future__ import annotations

import pytest

from planner.baselines import (
    PLANNERS, get_planner, plan_deepspeed, plan_mi, run_planner, search_ablation, search_alpa, search_deepspeed,
    search_hapmoe, search_hetermoe, search_metis, search_mi, solve_with_limit,
)
from planner.baselines.common import (
    PricedPlan, build_plan, cost_model, even_split, homogeneous_cluster, mixed_cluster, price_members, stage_members,
    types_by_speed,
)
from planner.checker import plan_problems
from planner.errors import PlannerInputError
from planner.inputs.cluster import parse_cluster
from planner.inputs.resolve import resolve_run
from planner.schemas.plan import Plan, Recompute
import planner.baselines.metis as metis

from helpers.once import once_per_run


def scenario(profiles, model, cluster_name):
    cluster = parse_cluster(cluster_name, profiles)
    run = resolve_run(model=model, world_size=cluster.world_size, overrides={"gbs": 16 * cluster.world_size})
    return run, cluster


@pytest.fixture(scope="module")
def hetero(profiles):
    """Two device types one upstream Megatron-LM job holds (both NVIDIA: profiles/runtimes.yaml)."""
    return scenario(profiles, "mixtral-s", "H800:16,A100:16")


@pytest.fixture(scope="module")
def homo(profiles):
    return scenario(profiles, "mixtral-s", "h800-16")


@pytest.fixture(scope="module")
def hapmoe_hetero(profiles, hetero):
    """HAPMoE's megatron plan on `hetero`, searched once per test run (the module's tests may run on several
    pytest-xdist workers), priced by the one evaluator as search_hapmoe prices it."""
    run, cluster = hetero

    def plan_json() -> dict:
        priced = search_hapmoe(run, cluster, profiles, runtimes=("megatron",), time_limit_s=60)
        return priced.plan.model_dump(mode="json")

    plan = Plan.model_validate(once_per_run("baselines-hapmoe-hetero", plan_json))
    return PricedPlan(plan=plan, cost=cost_model(run, cluster, profiles).evaluate(plan))


# ---- helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize("layers,pp,expected", [
    (32, 4, [8, 8, 8, 8]),
    (56, 8, [7] * 8),
    (56, 6, [10, 9, 9, 9, 9, 10]),  # 9 per middle stage, the 20 left split 10/10 by the first/last flags
    (32, 3, [11, 10, 11]),
    (7, 2, [3, 4]),
])
def test_even_split_follows_megatron(layers, pp, expected):
    """Even when PP divides the layers; otherwise equal middle stages and the rest on the first and last."""
    assert even_split(layers, pp) == expected


def test_even_split_refuses_empty_stages():
    """A stage without a layer is no plan."""
    assert even_split(3, 4) is None


def test_stage_members_follow_cluster_order(profiles):
    """Stages take GPUs group by group in the listed order; a stage over the boundary spans both types."""
    cluster = parse_cluster("a100-910b", profiles)
    assert stage_members(cluster, 16, 2) == [("A100",), ("910B",)]
    assert stage_members(cluster, 32, 1) == [("A100", "910B")]
    assert stage_members(cluster, 8, 4) == [("A100",), ("A100",), ("910B",), ("910B",)]
    assert stage_members(cluster, 32, 2) is None


def test_homogeneous_cluster_keeps_size(profiles):
    """The Alpa/Metis helper cluster has as many GPUs as the real one, all of the asked type."""
    cluster = parse_cluster("h800-mi300x-910b", profiles)
    fake = homogeneous_cluster(cluster, "910B", profiles)
    assert fake.world_size == 48 and fake.gpus_by_type() == {"910B": 48}


def test_types_by_speed_puts_the_slower_type_last(profiles, hetero):
    """The A100 (312 bf16 TFLOP/s) is slower per layer than the H800 (about 990)."""
    run, cluster = hetero
    assert types_by_speed(cost_model(run, cluster, profiles)) == ["H800", "A100"]


def test_mixed_stage_pays_slowest_member_and_cross_link(profiles):
    """A stage spanning A100 and 910B is priced no faster than the same stage on its slower type alone (its
    compute is that type's and its DP traffic crosses the slower cross-type link)."""
    run, cluster = scenario(profiles, "llama2-7b", "a100-910b")
    cost = cost_model(run, cluster, profiles)
    slow = types_by_speed(cost)[-1]
    plan = build_plan(tp=1, cp=1, ep=1, etp=1, mbs=1, gbs=run.training.global_batch_size, dp=32, types=["A100"],
                      layers=[32], recompute=Recompute.full("uniform", 1))
    priced = price_members(cost, plan, [("A100", "910B")])
    assert priced is not None and priced.mixed_stages == (0,)
    assert priced.plan.stages[0].device_type == slow
    pure = cost.evaluate(plan.model_copy(update={"stages": (plan.stages[0].model_copy(
        update={"device_type": slow}),)}))
    assert priced.cost.iteration_time_s >= pure.iteration_time_s * (1 - 1e-12)
    assert priced.cost.sync_s > pure.sync_s  # the gradient sync crosses the slower cross-type link
    capped = mixed_cluster(cluster, profiles, {"A100", "910B"})
    cross = profiles.cross_link("A100", "910B", cluster).bandwidth_gb_per_s
    assert all(g.inter_node_bandwidth_gb_per_s <= cross for g in capped.groups)


# ---- the baselines ------------------------------------------------------------------------


def test_mi_is_uniform_megatron(profiles, homo):
    """MI: even split, one DP and recompute, TP and EP inside a node, a valid plan that fits."""
    run, cluster = homo
    plan = plan_mi(run, cluster, profiles)
    assert plan is not None and plan.runtime == "megatron" and plan.vpp == 1 and plan.cp == 1
    assert [s.num_layers for s in plan.stages] == even_split(32, plan.pp)
    assert plan.tp <= 8 and plan.ep * plan.etp <= 8
    assert len({(s.dp, s.recompute.label) for s in plan.stages}) == 1
    problems, _ = plan_problems(cost_model(run, cluster, profiles), plan)
    assert problems == []


@pytest.fixture(scope="module")
def homo_cut(profiles):
    """mixtral-s cut to 16 layers on one node of 8 H800 (the whole model needs 16 H800): the optimum has EP 4 and
    two pipeline stages, and each of the three searches below takes a third of what h800-16's took."""
    run, cluster = scenario(profiles, "mixtral-s", "H800:8")
    cut = run.model.model_validate({**run.model.model_dump(), "num_layers": 16, "moe_layer_pattern": None})
    return run.model_copy(update={"model": cut}), cluster


@pytest.fixture(scope="module")
def hapmoe_homo(profiles, homo_cut):
    run, cluster = homo_cut
    return search_hapmoe(run, cluster, profiles, runtimes=("megatron",), time_limit_s=60)


@pytest.mark.parametrize("search", [search_alpa, search_metis])
def test_alpa_and_metis_equal_hapmoe_megatron_on_one_type(profiles, homo_cut, hapmoe_homo, search):
    """On a homogeneous cluster 'as if the slowest type' and 'EP/ETP from the fastest type' change nothing:
    both baselines find HAPMoE's megatron-runtime optimum."""
    run, cluster = homo_cut
    ours = hapmoe_homo
    theirs = search(run, cluster, profiles, time_limit_s=60)
    assert theirs.cost.iteration_time_s == pytest.approx(ours.cost.iteration_time_s, rel=1e-9)


def test_metis_fixes_ep_from_homogeneous_search(profiles, hetero):
    """Metis-style uses the EP/ETP of the fastest type's homogeneous plan and places stages on both types."""
    run, cluster = hetero
    notes: list[str] = []
    priced = search_metis(run, cluster, profiles, notes=notes, time_limit_s=60)
    assert priced is not None
    assert f"EP={priced.plan.ep} ETP={priced.plan.etp} from a homogeneous H800:32" in notes[0]
    assert plan_problems(cost_model(run, cluster, profiles), priced.plan)[0] == []


def test_hetermoe_gives_slower_gpus_fewer_layers(profiles, hetero):
    """HeterMoE-style: fastest type first, and an A100 stage holds fewer layers than an H800 stage of the same size."""
    run, cluster = hetero
    priced = search_hetermoe(run, cluster, profiles)
    assert priced is not None
    stages = priced.plan.stages
    assert stages[0].device_type == "H800"
    h800 = min(s.num_layers for s in stages if s.device_type == "H800")
    slower = [s.num_layers for s in stages if s.device_type == "A100"]
    assert slower and max(slower) < h800
    assert plan_problems(cost_model(run, cluster, profiles), priced.plan)[0] == []


def test_deepspeed_is_expert_and_data_parallel(profiles, homo):
    """DeepSpeed-MoE/Tutel-style: TP=ETP=1, EP = the 8 experts, DP over every GPU of a stage."""
    run, cluster = homo
    plan = plan_deepspeed(run, cluster, profiles)
    assert plan is not None
    assert (plan.tp, plan.etp, plan.ep, plan.cp) == (1, 1, 8, 1)
    assert plan.dp0 * plan.pp == cluster.world_size


def test_deepspeed_not_for_dense(profiles):
    """Expert parallelism has nothing to do on a dense model."""
    run, cluster = scenario(profiles, "llama2-7b", "a100-910b")
    notes: list[str] = []
    assert search_deepspeed(run, cluster, profiles, notes=notes) is None
    assert "not applicable" in notes[0]


def test_ablation_is_uniform(profiles, hetero, hapmoe_hetero):
    """The ablation keeps one DP and gives every stage the same number of layers."""
    run, cluster = hetero
    priced = search_ablation(run, cluster, profiles, hapmoe_plan=hapmoe_hetero.plan)
    assert priced is not None and priced.plan.runtime == "megatron"
    assert len({s.num_layers for s in priced.plan.stages}) == 1
    assert len({s.dp for s in priced.plan.stages}) == 1
    assert priced.cost.fits


def test_ablation_enumeration_prices_only_what_fits(profiles, homo_cut, monkeypatch):
    """The even-split enumeration screens each configuration's memory (CostModel.fits, the evaluator's own memory
    figures) before pricing its time: every plan it evaluates fits, and its best plan is the fastest of those."""
    from planner.baselines.hapmoe import uniform_enumeration
    from planner.cost.model import CostModel

    run, cluster = homo_cut
    priced: list = []
    evaluate = CostModel.evaluate

    def counted(self, plan):
        priced.append(evaluate(self, plan))
        return priced[-1]

    monkeypatch.setattr(CostModel, "evaluate", counted)
    best = uniform_enumeration(run, cluster, profiles)
    assert priced and all(pc.fits for pc in priced)
    assert best.cost.iteration_time_s == min(pc.iteration_time_s for pc in priced)


def test_min_bottleneck_split_prices_no_stage_when_no_split_fits(profiles, homo_cut, monkeypatch):
    """Every expert of 16 mixtral-s layers on 8 H800 without expert parallelism: no split over two stages fits, which
    the stages' memory alone shows (CostModel.stage_memory), so HeterMoE-style's split prices no stage's time."""
    from planner.baselines.common import min_bottleneck_split
    from planner.cost.model import CostModel

    run, cluster = homo_cut
    cost = cost_model(run, cluster, profiles)
    plan = build_plan(tp=1, cp=1, ep=1, etp=1, mbs=1, gbs=run.training.global_batch_size, dp=4, types=["H800", "H800"],
                      layers=[8, 8], recompute=Recompute.none())
    priced: list[int] = []
    stage = CostModel.stage

    def counted(self, *args, **kw):
        priced.append(kw["index"])
        return stage(self, *args, **kw)

    monkeypatch.setattr(CostModel, "stage", counted)
    assert min_bottleneck_split(cost, plan) is None
    assert priced == []


def test_hapmoe_beats_every_baseline_on_mixed_cluster(profiles, hetero, hapmoe_hetero):
    """Target: on H800+A100 HAPMoE's plan is at least as fast as each baseline's and clearly faster than MI's."""
    run, cluster = hetero
    ours = hapmoe_hetero.cost.iteration_time_s
    for search in (search_mi, search_hetermoe, search_deepspeed):
        theirs = search(run, cluster, profiles)
        if theirs is not None:
            assert ours <= theirs.cost.iteration_time_s * (1 + 1e-9), search.__name__
    assert ours * 1.5 < search_mi(run, cluster, profiles).cost.iteration_time_s


def test_solve_with_limit_times_out(profiles, hetero):
    """A search that cannot finish within the hard limit comes back as a timeout without a plan."""
    run, cluster = hetero
    sr = solve_with_limit(run, cluster, profiles, runtime="megatron", hard_limit_s=0.01)
    assert sr.status == "timeout" and sr.plan is None
    assert sr.search_time_s < 10


def test_registry(profiles, homo):
    """Every planner is registered; an unknown name is refused naming the known ones; run_planner times it."""
    assert {"mi", "alpa", "metis", "hetermoe", "deepspeed", "ablation", "hapmoe"} <= set(PLANNERS)
    with pytest.raises(PlannerInputError, match="known: mi"):
        get_planner("nope")
    run, cluster = homo
    res = run_planner("mi", run, cluster, profiles)
    assert res.priced is not None and res.search_time_s >= 0 and res.notes


def test_metis_falls_back_to_next_type_when_fastest_cannot_hold_model(profiles, monkeypatch):
    """Qwen3-235B-A22B does not fit on 32 H800 alone (its weights, grads and optimizer state need
    about 235e9 x 18 bytes = 4.2 TB, the GPUs have 2.5 TB); Metis-style then takes EP/ETP from MI300X.
    H800 is ranked first here: the cost model's own single-GPU probe (EP 1, 256 tokens per expert) now ranks
    MI300X first, because H800's grouped GEMM rests on published tables at few tokens per expert and MI300X's on
    an assumed curve; the fallback is what this test is about."""
    monkeypatch.setattr(metis, "types_by_speed", lambda cost: ["H800", "MI300X"])
    run, cluster = scenario(profiles, "qwen3-235b-a22b", "h800-mi300x")
    notes: list[str] = []
    # the limit only guards against a hang: proving that nothing fits on H800:32 took a whole search (33 s alone on
    # this machine, 101 s with other work running, where 60 s ended it first and the note said "ran out of time");
    # HS-DP's relaxed bound now settles it in about 4 s
    priced = search_metis(run, cluster, profiles, notes=notes, time_limit_s=400, runtime="flagscale")
    assert any("does not fit on a homogeneous H800:32" in n for n in notes), notes
    assert any("from a homogeneous MI300X:32" in n for n in notes)
    # with the memory headroom kept free (issue 19), the EP/ETP Metis takes from MI300X leaves the H800 stages no
    # layout that fits, and Metis-style says so instead of returning a plan
    assert priced is not None or any("no placement fits" in n for n in notes), notes
    if priced is not None:
        assert priced.plan.runtime == "flagscale"  # H800 + MI300X: one job only through FlagScale's FlagCX


@pytest.mark.parametrize("search", [search_mi, search_alpa, search_metis, search_hetermoe, search_deepspeed,
                                    search_ablation])
def test_baselines_plan_flagscale_jobs_across_vendors(profiles, search):
    """On H800 + MI300X no upstream Megatron-LM job runs (profiles/runtimes.yaml): asked for the flagscale
    runtime, each baseline's plan is a FlagScale job (one device type per mesh, CP 1, no VPP) that passes
    the checker, or none."""
    run, cluster = scenario(profiles, "mixtral-s", "H800:8,MI300X:8")
    priced = search(run, cluster, profiles, time_limit_s=60, runtime="flagscale")
    if priced is not None:
        assert priced.plan.runtime == "flagscale" and not priced.mixed_stages
        assert plan_problems(cost_model(run, cluster, profiles), priced.plan)[0] == []


def test_megatron_search_refuses_a_cross_vendor_cluster(profiles):
    """The megatron runtime never prices a cross-vendor job: solve_with_limit reports the refusal."""
    run, cluster = scenario(profiles, "mixtral-s", "H800:8,MI300X:8")
    sr = solve_with_limit(run, cluster, profiles, runtime="megatron", hard_limit_s=30)
    assert sr.plan is None and "upstream Megatron-LM cannot run one job over" in sr.detail
    notes: list[str] = []
    search_hapmoe(run, cluster, profiles, runtimes=("megatron",), notes=notes, time_limit_s=30)
    assert any("HAPMoE megatron: not searched" in n for n in notes)


@pytest.fixture(scope="module")
def mi_hetero(profiles, hetero):
    run, cluster = hetero
    return search_mi(run, cluster, profiles)


def test_seeded_searches_take_each_distinct_degree_tuple_once_on_runtimes_hapmoe_searches(mi_hetero):
    from planner.baselines.hapmoe import seeded_searches

    plan = mi_hetero.plan
    other = plan.model_copy(update={"tp": plan.tp * 2 if plan.tp < 8 else 1})
    flagscale = plan.model_copy(update={"runtime": "flagscale"})
    seeds = seeded_searches({"MI": plan, "Copy": plan, "Other": other, "FS": flagscale}, ["megatron"])
    assert [who for who, _, _ in seeds] == ["MI", "Other"]  # the copy adds nothing; flagscale is not searched
    assert seeds[0][1:] == ("megatron", {k: (getattr(plan, k),) for k in ("tp", "cp", "ep", "etp", "mbs", "vpp")})


def test_the_search_with_an_incumbents_degrees_is_never_behind_it(profiles, hetero, mi_hetero):
    """MI's plan lies in HAPMoE's space (every stage one device type), so the part of the space with its
    degrees holds it: searched to the end, that part gives a plan with those degrees at least as fast."""
    from planner.baselines.hapmoe import seeded_searches

    run, cluster = hetero
    mi = mi_hetero
    assert not mi.mixed_stages
    ((who, rt, narrow),) = seeded_searches({"MI": mi.plan}, ["megatron"])
    sr = solve_with_limit(run, cluster, profiles, runtime=rt, hard_limit_s=60, narrow=narrow, seeded_from=who)
    assert sr.status == "ok" and sr.seeded_from == "MI" and "time limit" not in sr.detail, sr.detail
    assert all((getattr(sr.plan, k),) == v for k, v in narrow.items())
    ours = cost_model(run, cluster, profiles).evaluate(sr.plan)
    assert ours.fits and ours.iteration_time_s <= mi.cost.iteration_time_s * (1 + 1e-9)
