"""The master of --backend cpsat (solver_models/cpsat/master.py, pipeline.py; the loop in
planner/search/certify.py): micro-models per constraint family of the pipeline block, each with a
feasible case whose optimum is worked out by hand and an infeasible one; the shape screen by hand;
on small real cases, the block's rule constraints admit exactly the pipelines the enumerator yields
and neither relaxation ever exceeds a configuration's brute-force optimum; and the rule predicates
agree with check_plan."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import numpy as np
import pytest
from ortools.sat.python import cp_model

from planner.cost.model import recomputed_layer_count
from planner.megatron import rules
from planner.megatron.rules import check_plan
from planner.schemas.plan import Plan, Recompute, StagePlan
from planner.search.certify import MICROBATCH_SCOPE, BendersSearch
from planner.search.settings import SearchSettings
from planner.search.space import SearchSpace
from solver_models.brute import solve_brute
from solver_models.cpsat.master import Price, Room, RuleFamily, StageClass, pipeline_floor_us, shape_bound_us
from solver_models.cpsat.pipeline import BlockSpec, PipelineBlock

from helpers.cases import reduced_cost_model

A = StageClass("A", 0)
B = StageClass("B", 1)


def price(tau=10, *, units=8, max_layers=64, stage=0, first=0, last=0, link=0, room=None, sync=()):
    return Price((tau,), stage, first, last, max_layers, units, link, link, room=room, sync_us=tuple(sync))


def block(n, prices, *, pps=(1, 2, 3, 4), vpps=(1,), m=4, rules_=(), classes=(A,), memory=True, inflight=None):
    """A block over one recompute setting with `prices` {class: Price} and n layers of one kind."""
    inflight = inflight or {(pp, v): (1.0, 1.0) for pp in pps for v in vpps}
    spec = BlockSpec(shape={}, families=("recompute", "pp", "vpp"), domains={"recompute": (0,), "pp": tuple(pps),
                     "vpp": tuple(vpps)}, rules=list(rules_), classes=list(classes), groups=(n,), microbatches=m,
                     prices=[prices], inflight=inflight, memory=memory)
    return PipelineBlock(spec)


def optimum(b, cutoff=None):
    res = b.solve(time_limit_s=10, num_workers=1, cutoff_us=cutoff)
    return res.status, res.objective_us, res.degrees


# ---- pipeline block: one family each, by hand (W = n * tau, theta = W + (m*v - 1) * T for v = 1) ----
def test_layers_are_integral():
    """5 layers on 2 stages of 10 us/layer: the busier holds 3, T = 30, theta = 50 + 3 * 30 = 140."""
    assert optimum(block(5, {0: price()}, pps=(2,)))[:2] == ("OPTIMAL", 140)
    assert optimum(block(5, {0: price()}, pps=(2,)), cutoff=140)[0] == "INFEASIBLE"


def test_pipeline_budget_binds():
    """One stage's worth of GPUs: only PP = 1 (T = 50, theta = 50 + 3 * 50 = 200); PP = 2 is infeasible."""
    assert optimum(block(5, {0: price(units=1)}))[:2] == ("OPTIMAL", 200)
    assert optimum(block(5, {0: price(units=1)}, pps=(2,)))[0] == "INFEASIBLE"


def test_memory_binds_and_is_switchable():
    """At most 2 layers a stage: 5 layers need PP >= 3 (T = 20, theta = 50 + 3 * 20 = 110); with PP
    at most 2 nothing fits, unless the memory family is off (PP = 2: 140)."""
    assert optimum(block(5, {0: price(max_layers=2)}, pps=(1, 2, 3)))[:2] == ("OPTIMAL", 110)
    assert optimum(block(5, {0: price(max_layers=2)}, pps=(1, 2)))[0] == "INFEASIBLE"
    assert optimum(block(5, {0: price(max_layers=2)}, pps=(1, 2), memory=False))[:2] == ("OPTIMAL", 140)


def test_memory_by_position():
    """free 100, 10 per layer and 10 per layer per micro-batch in flight: a stage holds 100 // 20 = 5
    layers with 1 in flight, 100 // 40 = 2 with 3.  PP = 2 with the first stage keeping 3 in flight:
    2 + 5 = 7 layers at most (T = 50, theta = 70 + 3 * 50 = 220), so 8 do not fit."""
    room = Room(100.0, (10.0,), (10.0,))
    spec = {(2, 1): (3.0, 1.0)}
    assert optimum(block(7, {0: price(room=room)}, pps=(2,), inflight=spec))[:2] == ("OPTIMAL", 220)
    assert optimum(block(8, {0: price(room=room)}, pps=(2,), inflight=spec))[0] == "INFEASIBLE"


def test_memory_bound_middle_stages_hold_unequal_counts():
    """free 100, 10 per layer and 10 per layer per micro-batch in flight, PP = 4, m = 4 (1F1B: 4, 3, 2, 1
    in flight from the first stage): the stages hold at most 2, 2, 3 and 5 layers, 12 in all.  12 layers
    fit only as 2 + 2 + 3 + 5: T = 50, theta = 120 + 3 * 50 = 270.  The two middle stages hold 2 and 3, so
    their total is not their count times the most either holds (a relaxation of S x K <= what their
    positions hold forced K <= 2 and called it infeasible); 13 layers do not fit."""
    room = Room(100.0, (10.0,), (10.0,))
    spec = {(4, 1): (4.0, 1.0)}
    assert [room.holds(a, 64) for a in (4.0, 3.0, 2.0, 1.0)] == [2, 2, 3, 5]
    assert optimum(block(12, {0: price(room=room)}, pps=(4,), inflight=spec))[:2] == ("OPTIMAL", 270)
    assert optimum(block(13, {0: price(room=room)}, pps=(4,), inflight=spec))[0] == "INFEASIBLE"


def test_block_recompute_spares_only_the_layers_it_reruns():
    """free 100, 10 static and 10 activation bytes per layer per micro-batch, a re-run layer spares 8 of
    them, 3 micro-batches in flight.  k = 4 layers a chunk, VPP 2 (at most 8 re-run): 6 layers take
    6 * 40 - 3 * 6 * 8 = 96, 7 take 112, so 6 fit (sparing k x VPP = 8 layers' whatever the stage holds
    would let 7 fit).  k = 1 (at most 2 re-run): 3 layers take 120 - 48 = 72, 4 take 112: 3 fit."""
    room = Room(100.0, (10.0,), (10.0,), saved_bytes=8.0, block_layers=4)
    assert room.holds(3.0, 64, vpp=2) == 6
    assert list(room.holds_each(np.array([3.0, 1.0]), 64, vpp=2)) == [6, room.holds(1.0, 64, vpp=2)]
    assert replace(room, block_layers=1).holds(3.0, 64, vpp=2) == 3


def test_room_holds_one_and_many_agree():
    """Room.holds (the scalar hot path) and Room.holds_each give the same counts on 2,000 seeded rooms, with and
    without block recompute, at the ends and in between; and a stage never holds fewer layers than fit (brute force
    over n: n x (static + a x act) - a x min(n, k x VPP) x saved <= room), exactly as many where memory grows with n."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        room = Room(float(rng.uniform(-10, 1000)), (float(rng.uniform(1, 50)),), (float(rng.uniform(0, 30)),),
                    float(rng.uniform(0, 30)), float(rng.uniform(0, 100)), float(rng.uniform(0, 50)),
                    float(rng.uniform(0, 5)), float(rng.uniform(0, 50)), float(rng.uniform(0, 5)),
                    int(rng.choice([0, 1, 2, 4])))
        a, v = float(rng.choice([1.0, 2.5, 7.25, 14.0])), int(rng.choice([1, 2, 4]))
        first, last = bool(rng.random() < 0.3), bool(rng.random() < 0.3)
        one = room.holds(a, 60, 0, first, last, v)
        assert one == int(room.holds_each(np.array([a]), 60, 0, first, last, v)[0])
        free = room.free_bytes - room.transient_bytes - (room.first_static_bytes + a * room.first_act_bytes) * first \
            - (room.last_static_bytes + a * room.last_act_bytes) * last
        fit = [n for n in range(61) if free >= 0 and n * (room.static_bytes[0] + a * room.act_bytes[0])
               - a * min(n, room.block_layers * v) * room.saved_bytes <= free * (1 + 1e-9)]
        assert one >= max(fit, default=0)
        if room.static_bytes[0] + a * (room.act_bytes[0] - room.saved_bytes) > 0:  # memory grows with n: exact
            assert one == max(fit, default=0)


def test_bottleneck_counts_the_ends():
    """The last stage pays 25 us more (output layer): 4 layers on 2 stages split 3 + 1, T = max(30,
    10 + 25) = 35; W = 40 + 25; theta = 65 + 3 * 35 = 170."""
    assert optimum(block(4, {0: price(last=25)}, pps=(2,)))[:2] == ("OPTIMAL", 170)
    assert optimum(block(4, {0: price(last=25)}, pps=(2,)), cutoff=170)[0] == "INFEASIBLE"


def test_links_are_charged():
    """5 us links each way: PP = 2, 2 + 2 layers: T = 20 + 5 = 25, theta = 40 + 3 * 25 = 115 (PP = 1,
    no link: 40 + 3 * 40 = 160)."""
    assert optimum(block(4, {0: price(link=5)}, pps=(1, 2)))[:2] == ("OPTIMAL", 115)
    assert optimum(block(4, {0: price(link=5)}, pps=(1, 2)), cutoff=115)[0] == "INFEASIBLE"


def test_rules_are_constraints():
    """A rule allowing only PP = 1: theta = 40 + 3 * 40 = 160; a rule allowing nothing: infeasible."""
    only_one = RuleFamily("pp_one", ("pp",), lambda pp: pp == 1)
    none = RuleFamily("none", ("pp", "vpp"), lambda pp, vpp: False)
    assert optimum(block(4, {0: price()}, rules_=[only_one]))[:2] == ("OPTIMAL", 160)
    assert optimum(block(4, {0: price()}, rules_=[none]))[0] == "INFEASIBLE"


def test_sync_of_the_busiest_middle_stage():
    """6 layers on 3 stages, 2 each (T = 20); the middle stage's sync for 2 layers is 14 us:
    theta = 60 + 3 * 20 + 14 = 134."""
    sync = (0, 7, 14, 21, 28, 35, 42)
    assert optimum(block(6, {0: price(sync=sync)}, pps=(3,)))[:2] == ("OPTIMAL", 134)
    assert optimum(block(6, {0: price(sync=sync)}, pps=(3,)), cutoff=134)[0] == "INFEASIBLE"


def test_objective_interleaving():
    """m = 4, PP = 2, 2 + 2 layers (T = 20), W = 40: v = 1 gives 40 + 3 * 20 = 100; v = 2 gives
    (40 + 7 * 20) / 2 = 90, the optimum."""
    status, value, degrees = optimum(block(4, {0: price()}, pps=(2,), vpps=(1, 2)))
    assert (status, value, degrees["vpp"]) == ("OPTIMAL", 90, 2)
    assert optimum(block(4, {0: price()}, pps=(2,), vpps=(1, 2)), cutoff=90)[0] == "INFEASIBLE"


def test_classes_share_the_pipeline():
    """A (10 us/layer) and B (30 us/layer), one stage each: 4 layers split 3 on A, 1 on B, T = 30,
    W = 4 * 10 (the least per-layer time of the classes in use), theta = 40 + 3 * 30 = 130."""
    b = block(4, {0: price(units=1), 1: price(30, units=1)}, pps=(2,), classes=(A, B))
    assert optimum(b)[:2] == ("OPTIMAL", 130)
    assert optimum(block(4, {0: price(units=1), 1: price(30, units=1)}, pps=(3,), classes=(A, B)))[0] == "INFEASIBLE"


def test_block_recompute_pays_per_layer_rerun():
    """Full block recompute of k = 2 layers per chunk, 3 us per re-run: 6 layers on PP = 2 (3 + 3), m = 4.
    v = 1 re-runs min(2, 3) = 2 layers a stage: T = 30 + 6 = 36, theta = 60 + 3 * 36 = 168.  v = 3 (the
    cost model's count: chunks of 1 layer, all 3 re-run): T = 30 + 9 = 39, 3 * theta >= 60 + 11 * 39 - 2,
    theta = 163.  One re-run a stage (the price before the count) gave T = 33: 159 and 143."""
    rc = Recompute.full("block", 2)
    reruns = tuple((v, tuple(recomputed_layer_count(rc, n, v) for n in range(7))) for v in (1, 3))
    assert reruns == ((1, (0, 1, 2, 2, 2, 2, 2)), (3, (0, 1, 2, 3, 4, 5, 6)))
    p = Price((10,), 3, 0, 0, 64, 8, 0, 0, block_layers=2, rerun_by_vpp=reruns)
    assert optimum(block(6, {0: p}, pps=(2,), vpps=(1,)))[:2] == ("OPTIMAL", 168)
    assert optimum(block(6, {0: p}, pps=(2,), vpps=(3,)))[:2] == ("OPTIMAL", 163)
    # the screen prices min(k, n) re-runs whatever the VPP: two stages, T >= 3 * 10 + 2 * 3; six, 10 + 3
    assert pipeline_floor_us({0: replace(p, units=2)}, [A], (6,), 4) == 36
    assert pipeline_floor_us({0: p}, [A], (6,), 4) == 13


def test_cuts_forbid_settled_configurations():
    """A no-good on the best configuration leaves the next best."""
    b = block(5, {0: price()}, pps=(2, 3))
    first = optimum(b)
    b.forbid([first[2]])
    second = optimum(b)
    assert second[2] != first[2] and second[1] >= first[1]


# ---- the shape screen, by hand ----
def test_screen_deepest_pipeline():
    """One class, 10 us/layer, 6 layers: 2 stages -> T = 30, 3 stages -> T = 20; at most 2 layers a
    stage on 2 stages: they do not fit."""
    assert pipeline_floor_us({0: price(units=2)}, [A], (6,), 8) == 30
    assert pipeline_floor_us({0: price(units=3)}, [A], (6,), 8) == 20
    assert pipeline_floor_us({0: price(units=2, max_layers=2)}, [A], (6,), 8) is None
    # W = 60, m = 8: v = 1 -> 60 + 7 * 20 = 200; v = 2 -> (60 + 15 * 20) // 2 = 180
    assert shape_bound_us({0: price(units=3)}, [A], (6,), 8, (1, 2)) == 180


# ---- on real cases: the block's rules are the space's, and the relaxations are lower bounds ----
CASES = [
    ("mixtral-s", 4, "H800:4,MI300X:4", 24, SearchSpace(tp=(1, 2), cp=(1, 2), mbs=(1, 2), vpp=(1, 2),
                                                         recompute=(Recompute.none(), Recompute.full("uniform", 1)))),
    ("llama2-7b", 4, "H100:4,A100:2", 12, SearchSpace(tp=(1, 2), cp=(1,), mbs=(1, 2), vpp=(1, 2),
                                                      recompute=(Recompute.none(), Recompute.full("block", 1)))),
    # full block recompute of 2 layers per chunk with up to 4 chunks: the block prices the layers each stage re-runs
    ("llama2-7b-block2", 8, "H100:4,A100:2", 16, SearchSpace(tp=(1,), cp=(1,), mbs=(1,), vpp=(1, 2, 4),
                                                             recompute=(Recompute.full("block", 2),))),
    # ... where memory binds (8 Mixtral-8x7B layers on four GPUs)
    ("mixtral-s-block2", 8, "H800:2,A100:2", 16, SearchSpace(tp=(1, 2), cp=(1,), mbs=(1, 2), vpp=(1, 2, 4),
                                                             recompute=(Recompute.full("block", 2),))),
    # ... with dense and MoE layers mixed (the block's per-kind groups)
    ("mixtral-s-mixed", 6, "H800:4,A100:4", 16, SearchSpace(tp=(1,), cp=(1,), mbs=(1,), vpp=(1, 2, 3),
                                                            recompute=(Recompute.none(), Recompute.full("block", 2))),
     (0, 1, 1, 0, 1, 1)),
    # flagscale: each stage its own DP and recompute (none, full block of 1 or 2, full uniform), memory binding
    ("mixtral-s-fs", 6, "H800:2,MI300X:2", 16, SearchSpace(
        runtime="flagscale", tp=(1,), cp=(1,), mbs=(1, 2), selective=(),
        stage_recompute=(Recompute.none(), Recompute.full("block", 1), Recompute.full("block", 2),
                         Recompute.full("uniform", 1)))),
]


def _search(preset, layers, cluster, gbs, space, pattern=None):
    cm = reduced_cost_model(preset.removesuffix("-block2").removesuffix("-mixed").removesuffix("-fs"), layers, cluster,
                            gbs, pattern=pattern)
    return BendersSearch(cm, space, SearchSettings(time_limit_s=600).without_pruning(), time.perf_counter(), None)


MEGATRON_CASES = [c for c in CASES if c[4].runtime == "megatron"]


def _one_worker() -> cp_model.CpSolver:
    """A solver for the tiny feasibility models below: one search worker (CP-SAT's default portfolio starts a worker
    per core for each of the thousands of models, which was most of this file's time), stopped at the first
    solution: whether the block admits a pipeline is a feasibility question, and proving the block's objective
    optimal took one of mixtral-s-block2's models 31 s of the file's 47."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.stop_after_first_solution = True
    return solver


@pytest.mark.parametrize("case", MEGATRON_CASES, ids=[c[0] for c in MEGATRON_CASES])
def test_block_rules_admit_exactly_the_enumerated_pipelines(case):
    """With the memory family off, a shape's pipeline block admits exactly the (recompute, PP, VPP)
    the enumerator yields for the shape (the space's rules and GPU budgets, as constraints)."""
    bs = _search(*case)
    settings = list(range(len(bs.book.settings)))
    for key, shape in bs.book.shapes.items():
        spec = bs._block(key, settings).spec
        spec.memory = False
        wanted = {(bs.book.settings.index(g.recompute), g.pp, g.vpp) for g in shape.choices()}
        got = set()
        for r, pp, vpp in itertools.product(spec.domains["recompute"], spec.domains["pp"], spec.domains["vpp"]):
            b = PipelineBlock(spec)
            for f, v in (("recompute", r), ("pp", pp), ("vpp", vpp)):
                b.model.add(b.x[f] == v)
            if _one_worker().solve(b.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                got.add((r, pp, vpp))
        assert got == wanted, key


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_relaxations_never_exceed_the_optimum(case):
    """For every configuration: the screen's bound (every recompute setting's prices, and its own)
    and the pipeline block's value with its degrees fixed are at most its brute-force optimum over
    the integer tables (microseconds of iteration time)."""
    bs = _search(*case)
    bs.book.price_master(float("inf"))
    lv, book = bs.levels, bs.book
    vpps = lv.domains[lv.vpp] if lv.vpp else (1,)
    checked = 0
    for key, shape in book.shapes.items():
        m = lv.microbatches(*(v for f, v in zip(lv.shape, key) if f in MICROBATCH_SCOPE))
        coarse = shape_bound_us(book.master[key], book.classes, book.groups, m, vpps)
        b = bs._block(key, list(range(len(book.settings))))
        for g in shape.choices():
            sol = solve_brute(bs._tables(g, exact=True))
            if sol is None:
                continue
            best = sol.objective_us / g.vpp
            r = book.settings.index(g.recompute)
            own = shape_bound_us(book.block(key)[r], book.classes, book.groups, m, vpps)
            fixed = PipelineBlock(b.spec)
            for f, v in book.block_degrees(g).items():
                fixed.model.add(fixed.x[f] == v)
            res = fixed.solve(time_limit_s=10, num_workers=1)
            assert coarse <= best and own <= best and res.objective_us <= best, (g.label(), coarse, own, res, best)
            checked += 1
    assert checked > 10


def _plan(tp=1, cp=1, ep=1, etp=1, vpp=1, mbs=1, gbs=16, stages=((4, 1),), runtime="megatron", recompute=None):
    rc = recompute or [Recompute.none()] * len(stages)
    return Plan(runtime=runtime, tp=tp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs, sequence_parallel=tp > 1,
                stages=tuple(StagePlan(device_type="H800", num_layers=n, dp=dp, recompute=r)
                             for (n, dp), r in zip(stages, rc)))


def _names(model, plan) -> set[str]:
    return {v.rule for v in check_plan(model, plan)}


def test_predicates_agree_with_check_plan():
    """Each boolean of planner/megatron/rules.py says yes exactly when check_plan raises none of
    the rules it stands for, over a grid of degrees."""
    moe = reduced_cost_model("mixtral-s", 8, "H800:8", 16).model
    dense = reduced_cost_model("llama2-7b", 8, "H800:8", 16).model
    odd = dense.model_copy(update={"seq_length": 4092})  # a multiple of 2, 3, 4 and 6 only: seq_tp_sp bites
    for model in (moe, dense, odd):
        for tp, cp, ep, etp, dp, mbs, pp, vpp, gbs in itertools.product(
                (1, 2, 3, 4, 8), (1, 2, 3), (1, 2, 3, 4), (1, 2, 4), (1, 2, 3, 4), (1, 2), (1, 2, 3), (1, 2), (12, 16)):
            if not model.is_moe and (ep != 1 or etp != tp):
                continue
            per = model.num_layers // pp
            stages = tuple((per + (model.num_layers - per * pp if i == pp - 1 else 0), dp) for i in range(pp))
            names = _names(model, _plan(tp, cp, ep, etp, vpp, mbs, gbs, stages))
            assert rules.tp_allowed(model, tp) == ("heads_tp" not in names and "query_groups_tp" not in names)
            assert rules.cp_allowed(model, cp) == ("seq_cp" not in names)
            assert rules.sequence_split_ok(model, tp, cp) == ("seq_tp_sp" not in names)
            assert rules.ep_allowed(model, ep) == ("experts_ep" not in names and "ep_needs_experts" not in names)
            if model.is_moe:
                assert rules.etp_allowed(model, tp, etp) == ("moe_etp_bias" not in names)
            assert rules.expert_folding_ok(tp, cp, dp, ep, etp) == ("expert_folding" not in names)
            assert rules.batch_ok(gbs, mbs, dp) == ("gbs_microbatch" not in names)
            if rules.batch_ok(gbs, mbs, dp):
                assert rules.interleave_ok(gbs, mbs, dp, pp, vpp) == (
                    "vpp_needs_pp" not in names and "vpp_microbatches" not in names)


def test_flagscale_predicates_agree_with_check_plan():
    """FlagScale's stage micro-batch, recompute and tied-embedding predicates against check_plan."""
    model = reduced_cost_model("llama2-7b", 8, "H800:8", 16).model
    tied = model.model_copy(update={"untie_embeddings_and_output_weights": False})
    sel, full, none = Recompute.selective(("core_attn",)), Recompute.full("uniform", 1), Recompute.none()
    for dps in itertools.product((1, 2, 3, 4), repeat=2):
        for rcs in itertools.product((none, sel, full, Recompute.selective(("core_attn", "layernorm"))), repeat=2):
            for m in (model, tied):
                plan = _plan(mbs=2, stages=((4, dps[0]), (4, dps[1])), runtime="flagscale", recompute=list(rcs))
                names = _names(m, plan)
                b = plan.mbs * dps[0]
                assert all(rules.flagscale_stage_mbs_ok(b, d) for d in dps) == ("flagscale_stage_mbs" not in names)
                assert rules.flagscale_recompute_ok([r.label for r in rcs]) == ("flagscale_recompute" not in names)
                if rules.flagscale_tied_embeddings(m, None):
                    assert rules.flagscale_shared_embedding_ok(*dps) == ("flagscale_shared_embedding_dp" not in names)
                else:
                    assert "flagscale_shared_embedding_dp" not in names


@pytest.mark.parametrize("runtime", ["megatron", "flagscale"])
def test_cpsat_backend_runs_no_hsdp_code(monkeypatch, runtime):
    """--backend cpsat with HS-DP's dynamic program made to fail on any call: the search still
    certifies its optimum, so none of it ran (HS-DP stays the independent reference)."""
    import solver_models.hsdp as hsdp
    from planner.search.driver import search

    def forbidden(*args, **kwargs):
        raise AssertionError("HS-DP called under --backend cpsat")

    monkeypatch.setattr(hsdp, "solve_hsdp", forbidden)
    monkeypatch.setattr(hsdp._StageDP, "solve", forbidden)
    cm = reduced_cost_model("mixtral-s", 4, "H800:4,MI300X:4", 24)
    space = SearchSpace(runtime=runtime, tp=(1, 2), mbs=(1, 2),
                        recompute=(Recompute.none(), Recompute.full("uniform", 1)))
    for settings in (SearchSettings(backend="cpsat", time_limit_s=60),
                     SearchSettings(backend="cpsat").without_pruning()):
        res = search(cm, space, settings)
        assert res.status == "OPTIMAL" and res.best[0].backend == "cpsat"
