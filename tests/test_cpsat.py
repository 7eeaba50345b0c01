"""CP-SAT backend micro tests on hand-made tables: each constraint family with a feasible and an
infeasible (or binding) case, objectives worked out by hand in the comments."""

from __future__ import annotations


import pytest

from planner.schemas.plan import Recompute
from solver_models.base import SolverSettings
from solver_models.brute import solve_brute
from solver_models.cpsat.cells import all_cells, lower_hull
from solver_models.cpsat.model import solve_cpsat
from solver_models.hsdp import solve_hsdp
from solver_models.tables import StageTables

from helpers.tables import make_tables

SETTINGS = SolverSettings(time_limit_s=10.0, num_workers=2)


def solve(t: StageTables, **kw):
    delta = kw.pop("delta", None)
    if delta is not None:
        t = t.pruned(delta=delta, memory=t.memory_prune)
    kw.setdefault("upper_bound_us", None)
    return solve_cpsat(t, settings=SETTINGS, **kw)


# Two options on two device types, one GPU each; A = 10 us/layer, B = 20 us/layer, N = 4, m = 4:
# objective = t1 + t2 + 3 * max.  Best: 3 layers on A, 1 on B: 30 + 20 + 3*30 = 140.
AB = [[10] * 4, [20] * 4]


def test_basic_optimum_by_hand():
    """Two types, one GPU each: the 3/1 split on the fast/slow option, objective 140, OPTIMAL."""
    sol = solve(make_tables(AB))
    assert sol is not None and sol.objective_us == 140 and sol.status == "OPTIMAL" and sol.exact
    assert sol.bound_us == 140
    assert sorted((n, o) for o, _, n in sol.stages) == [(1, 1), (3, 0)]
    assert [s for _, s, _ in sol.stages] == [0, sol.stages[0][2]]


def test_gpu_budget_binds_and_infeasible():
    """Budget: two GPUs of type A allow A,A (2+2: 20+20+3*20 = 100); no type-B GPU and one A -> None."""
    sol = solve(make_tables(AB, budget=[2, 1]))
    assert sol.objective_us == 100 and [o for o, _, _ in sol.stages] == [0, 0]
    stats: dict = {}
    assert solve(make_tables(AB, budget=[1, 0]), stats=stats) is None
    assert stats["status"] == "INFEASIBLE"


def test_memory_binds_and_infeasible():
    """Memory: A holds at most 2 layers -> 2/2 split, 20+40+3*40 = 180; nothing holds a layer -> None."""
    sol = solve(make_tables(AB, cap_layers=[2.0, 4.0]))
    assert sol.objective_us == 180
    assert solve(make_tables(AB, cap_layers=[0.5, 0.5])) is None


def test_pipeline_links_charged_on_both_stages():
    """A 5 us link adds 5 to both stages: A2+B2 = 25+45 -> 70 + 3*45 = 205 when A holds <= 2 layers."""
    sol = solve(make_tables(AB, cap_layers=[2.0, 4.0], p2p_us=5))
    assert sol.objective_us == 205


def test_asymmetric_links_pick_the_order():
    """p2p[A][B] = 0, p2p[B][A] = 50: A must come first; same 140 as without links."""
    sol = solve(make_tables(AB, p2p_us=[[0, 0], [50, 0]]))
    assert sol.objective_us == 140 and sol.stages[0][0] == 0


def _megatron(t):
    """The same tables under the megatron runtime, where stage 0 must have the global DP (dp0)."""
    from dataclasses import replace

    t.g = replace(t.g, runtime="megatron")
    return t


def test_stage0_only_dp0_options():
    """megatron runtime: stage 0 needs DP == dp0: B (DP 2, 2 GPUs) cannot lead, so A leads; 140
    still reachable.  flagscale: stage 0's DP is free (G fixes DP0*mbs instead)."""
    t = _megatron(make_tables(AB, dps=[1, 2], budget=[1, 2]))
    sol = solve(t)
    assert sol.stages[0][0] == 0 and sol.objective_us == 140
    t2 = _megatron(make_tables(AB, dps=[2, 1], budget=[2, 1], cap_layers=[0.5, 4.0]))  # dp0 option fits nowhere
    assert solve(t2) is None
    t3 = make_tables(AB, dps=[1, 2], budget=[1, 2], cap_layers=[4.0, 4.0])  # flagscale: B (DP 2) may lead
    assert all(t3.first_stage_ok(o) for o in range(2))


def test_sync_term_and_virtual_chunks():
    """Objective = sum + (m*v - 1)*max + v*max sync: sync 1 us/layer, v = 2.  Each rank holds a layer
    per virtual chunk, but the first rank's first chunk may hold only the embedding and the last rank's
    last chunk only the loss (schemas/search.py stage_min_layers): on two ranks each needs one layer, so
    one rank holding 3 layers and the other 1 (50 + 7*30 + 2*3 = 266) beats A2/B2 (60 + 7*40 + 2*2 = 344)."""
    sol = solve(make_tables(AB, vpp=2, sync_per_layer_us=[1, 1]))
    assert sol.objective_us == 266 and sorted(n for _, _, n in sol.stages) == [1, 3]


def test_upper_bound_is_strict():
    """objective < upper bound: bound = optimum -> None; bound = optimum + 1 -> the optimum."""
    t = make_tables(AB)
    assert solve(t, upper_bound_us=140) is None
    sol = solve(t, upper_bound_us=141)
    assert sol.objective_us == 140


def test_load_balance_switchable():
    """A holds <= 1 layer: unpruned A1/B3 = 10+60+3*60 = 250; with delta = 0 A's window is [2, 3]
    (w_A = 2/3 of N = 4), so nothing is left; HS-DP agrees."""
    t = make_tables(AB, cap_layers=[1.0, 4.0])
    assert solve(t).objective_us == 250
    stats: dict = {}
    assert solve(t, delta=0.0, stats=stats) is None and solve_hsdp(t.pruned(delta=0.0, memory=False)) is None
    assert stats["balance_constraints"] > 0


def test_start_dependent_costs_use_a_table_and_match_brute():
    """Layers of two kinds (cheap first half, dear second half) make a middle stage's cost depend
    on its start: the model uses a table there and still equals brute force."""
    layer_us = [[10, 10, 10, 40, 40, 40], [15, 15, 15, 20, 20, 20], [12, 12, 30, 30, 30, 30]]
    t = make_tables(layer_us, pp=3, option_type=[0, 1, 2], budget=[1, 1, 1], p2p_us=3, first_extra_us=7)
    sol = solve(t)
    assert sol.stats["cost_forms"]["table"] > 0
    assert sol.objective_us == solve_brute(t).objective_us


def test_dominated_cells_dropped_optimum_kept():
    """Two recompute variants of one type (no recompute: fast, 2 layers of memory; full: slower,
    any count) collapse to one cell per count; the optimum equals brute force's."""
    t = make_tables([[10] * 6, [13] * 6, [20] * 6], pp=3, option_type=[0, 0, 1], budget=[2, 1],
                    cap_layers=[2.0, 6.0, 6.0], min_layer_us=[10, 10, 20],
                    recomputes=[Recompute.none(), Recompute.full("uniform", 1), Recompute.none()])
    cells = all_cells(t)
    full = all_cells(t, drop_dominated=False)
    assert sum(len(c.cells) for c in cells.values()) < sum(len(c.cells) for c in full.values())
    for (i, o), c in cells.items():
        if o == 1:
            assert all(n > 2 for _, n, *_ in c.cells)  # counts <= 2 go to the faster variant
    assert solve(t).objective_us == solve_brute(t).objective_us


def test_hint_and_statistics():
    """A plan given as hint_stages is used; stats carry wall time, branches and conflicts."""
    t = make_tables(AB, p2p_us=2)
    plan = solve_brute(t).stages
    sol = solve(t, hint_stages=plan)
    assert sol.stats["hinted"] is True and sol.objective_us == solve_brute(t).objective_us
    for key in ("wall_s", "branches", "conflicts", "status", "build_s", "total_s"):
        assert key in sol.stats
    assert solve(t).stats["hinted"] is False  # nothing to hint with: the CP-SAT backend runs no HS-DP


def test_lower_hull_lines_under_points():
    """Every hull line lies on or under every point and touches the hull's vertices."""
    pts = {1: 30, 2: 45, 3: 50, 4: 70, 6: 80}
    lines = lower_hull(pts)
    for d, a, b in lines:
        assert all(d * v >= a * n + b for n, v in pts.items())
    # (1,30), (3,50), (6,80) lie on one line of slope 10, the others above it
    assert any(all(d * pts[n] == a * n + b for n in (1, 3, 6)) for d, a, b in lines)


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_pipeline_depths_match_brute(pp):
    """PP = 1 (only stage), 2 and 4 with three options and links: CP-SAT = brute force = HS-DP."""
    layer_us = [[11, 12, 13, 14, 15, 16], [20, 19, 18, 17, 16, 15], [14] * 6]
    p2p = [[0, 4, 6], [4, 0, 2], [6, 2, 0]]
    t = make_tables(layer_us, pp=pp, m=6, budget=[2, 1, 2], p2p_us=p2p, first_extra_us=9,
                    sync_per_layer_us=[2, 1, 3], cap_layers=[3.0, 6.0, 4.0])
    b = solve_brute(t)
    sol = solve(t)
    assert b is not None and sol.objective_us == b.objective_us == solve_hsdp(t).objective_us
    assert sol.status == "OPTIMAL"


def test_contiguous_types_rule():
    """Types A (2 GPUs) and B (1), one layer per stage, A->A link 100 us, A<->B free, m = 4:
    A,B,A gives 30 + 3*10 = 60, but with each type in one block A,A,B costs
    (110 + 110 + 10) + 3*110 = 560; brute force agrees in both settings."""
    p2p = [[100, 0], [0, 100]]
    t = make_tables([[10] * 3, [10] * 3], pp=3, budget=[2, 1], p2p_us=p2p)
    assert t.contiguous_types
    sol = solve(t)
    assert sol.objective_us == 560 == solve_brute(t).objective_us
    assert t.type_sequence_ok([o for o, _, _ in sol.stages])
    t.contiguous_types = False
    sol = solve(t)
    assert sol.objective_us == 60 == solve_brute(t).objective_us
    assert [o for o, _, _ in sol.stages] == [0, 1, 0]


def test_deadline_passed_reports_unknown():
    """A deadline already passed: status UNKNOWN with no stages (the driver's "unproven"), not None."""
    import time

    settings = SolverSettings(time_limit_s=10.0, num_workers=2, deadline=time.perf_counter() - 1.0)
    sol = solve_cpsat(make_tables(AB), upper_bound_us=None, settings=settings)
    assert sol is not None and sol.status == "UNKNOWN" and sol.stages == [] and not sol.exact


def test_hint_breaking_a_rule_is_not_used():
    """A hinted plan over the GPU budget is refused as a hint; the solve is still optimal."""
    t = make_tables(AB)
    sol = solve(t, hint_stages=[(0, 0, 2), (0, 2, 2)])  # two A stages, one A GPU
    assert sol.stats["hinted"] is False and sol.objective_us == 140


def test_rounded_plan_is_a_plan_and_no_better_than_the_optimum():
    """The rounding heuristic (solver_models/rounding.py) returns a plan the tables accept (every
    layer once, memory, options as asked), never better than brute force's optimum; it finds the
    optimum on a small case where the greedy split is the best one, and none when memory rules every
    split out."""
    from solver_models.rounding import rounded_plan

    t = make_tables(AB, p2p_us=0, budget=[1, 1])
    plan = rounded_plan(t, [[0], [1]])
    assert plan is not None and sum(n for _, _, n in plan) == 4
    assert [o for o, _, _ in plan] == [0, 1]
    assert t.plan_objective_us(plan) == solve_brute(t).objective_us == 140  # 3 layers on A, 1 on B
    tight = make_tables(AB, cap_layers=[1.0, 1.0], budget=[1, 1])
    assert rounded_plan(tight, [[0], [1]]) is None  # two stages hold 2 of the 4 layers at most


def test_rounded_plan_leaves_every_later_stage_a_layer_per_virtual_chunk():
    """With interleaving, a stage holds at least a layer per virtual chunk (the first and the last one
    fewer: stage_min_layers): the greedy split leaves every later stage that many.  Three stages, VPP 2, six
    layers, the last stage on a slow option: the first may take at most 6 - 2 - 1 = 3 layers (leaving one a
    stage, the rounding found no plan at all)."""
    from planner.schemas.search import stage_min_layers
    from solver_models.rounding import rounded_plan

    t = make_tables([[10] * 6, [40] * 6], pp=3, vpp=2, option_type=[0, 1], budget=[2, 1])
    plan = rounded_plan(t, [[0], [0], [1]])
    assert plan is not None and sum(n for _, _, n in plan) == 6 and [o for o, _, _ in plan] == [0, 0, 1]
    assert all(n >= stage_min_layers(i, 3, 2) for i, (_, _, n) in enumerate(plan))
    assert [n for _, _, n in plan] == [3, 2, 1]  # the slowest stage holds one layer: 40 us, the least cap
    assert t.plan_objective_us(plan) >= solve_brute(t).objective_us
