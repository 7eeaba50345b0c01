"""Scenario suite: on small real cases (dense and MoE, one to three device types, up to 32 GPUs,
megatron and flagscale runtimes, one with NVLink domains of several hosts) brute force, HS-DP and CP-SAT agree on every configuration's
optimum over the shared integer tables; with load-balance pruning on, HS-DP and CP-SAT agree and
the gap to the true optimum is printed."""

from __future__ import annotations

import pytest

from planner.schemas.plan import Recompute
from planner.search.space import SearchSpace, enumerate_globals, stage_options
from solver_models.base import SolverSettings
from solver_models.brute import solve_brute
from solver_models.cpsat.model import solve_cpsat
from solver_models.hsdp import solve_hsdp
from planner.search.tables import TableBuilder

from helpers.cases import reduced_cost_model

SETTINGS = SolverSettings(time_limit_s=20.0, num_workers=2)
SHORT_LADDER = (Recompute.none(), Recompute.full("uniform", 1))

# (id, model preset, layers, MoE pattern or None, cluster, runtime, configurations to sample)
CASES = [
    ("moe-3types", "mixtral-s", 8, None, "H800:8,910B:8,MI300X:8", "megatron", 5),
    ("moe-mixed-kinds", "deepseek-v2-lite", 10, (0, 1, 0, 1, 1, 0, 1, 1, 0, 1), "H800:8,MI300X:8,910B:16",
     "megatron", 5),
    ("dense-2types", "llama2-7b", 10, None, "H800:8,A100:16", "megatron", 5),
    ("dense-1type", "llama3-8b", 12, None, "H800:16", "megatron", 3),
    ("dense-flagscale", "llama2-7b", 8, None, "H800:8,A100:8,910B:8", "flagscale", 4),
    ("moe-flagscale", "mixtral-s", 8, None, "H800:8,MI300X:8", "flagscale", 3),
    # an NVLink domain wider than a host (GB200: trays of 4, all 16 in one domain): pipeline boundaries inside it
    # stay on NVLink although they cross hosts, in every backend's positional prices alike
    ("moe-nvl-domain", "mixtral-s", 8, None, "GB200:16,H100:8", "megatron", 4),
]


def build_case(model: str, layers: int, pattern, cluster: str, runtime: str, count: int):
    """Tables for `count` configurations with PP in 2..4 (evenly spread over the sorted labels)."""
    cm = reduced_cost_model(model, layers, cluster, 64, pattern=pattern, seq=4096)
    spec, training, cl = cm.model, cm.training, cm.cluster
    builder = TableBuilder(cm)
    gpn = {h: cm.domain_gpus(h) for h in cl.gpus_by_type()}
    space = SearchSpace(runtime=runtime, recompute=SHORT_LADDER)
    out = []
    for g in enumerate_globals(spec, training, cl, space, gpn):
        if 2 <= g.pp <= 4:
            options = stage_options(g, spec, training, cl, space, gpn)
            if options:
                out.append((g, options))
    out.sort(key=lambda e: e[0].label())
    step = max(1, len(out) // count)
    return [builder.build(g, options) for g, options in out[::step][:count]]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case_tables(request):
    return build_case(*request.param[1:])


def test_unpruned_backends_equal_brute_force(case_tables):
    """Without pruning, CP-SAT (OPTIMAL, exact) and HS-DP both reach brute force's optimum."""
    feasible = 0
    for t in case_tables:
        brute = solve_brute(t)
        dp = solve_hsdp(t)
        cp = solve_cpsat(t, upper_bound_us=None, settings=SETTINGS)
        if brute is None:
            assert dp is None and cp is None, t.g.label()
            continue
        feasible += 1
        assert dp.objective_us == brute.objective_us, t.g.label()
        assert cp is not None and cp.objective_us == brute.objective_us, t.g.label()
        assert cp.status == "OPTIMAL" and cp.exact and cp.bound_us == cp.objective_us
        assert check_plan(t, cp.stages) == cp.objective_us
    assert feasible >= 1


def test_pruned_backends_agree_and_gap_printed(case_tables):
    """With delta = 0.2 CP-SAT equals HS-DP (both exact for the pruned problem, not marked exact);
    prints the gap of the pruned optimum to the true one."""
    for t in case_tables:
        truth = solve_brute(t)
        pruned = t.pruned(delta=0.2, memory=False)
        dp = solve_hsdp(pruned)
        cp = solve_cpsat(pruned, upper_bound_us=None, settings=SETTINGS)
        assert (dp is None) == (cp is None), t.g.label()
        if cp is None:
            print(f"{t.g.label()}: pruning leaves no plan (true optimum {truth and truth.objective_us})")
            continue
        assert cp.objective_us == dp.objective_us and not cp.exact
        assert cp.objective_us >= truth.objective_us
        gap = (cp.objective_us - truth.objective_us) / truth.objective_us
        print(f"{t.g.label()}: pruned {cp.objective_us} us vs optimum {truth.objective_us} us, gap {100 * gap:.2f}%")


def test_upper_bound_at_optimum_gives_none(case_tables):
    """An upper bound equal to the optimum leaves nothing (strict); one above returns the optimum."""
    t = next((t for t in case_tables if solve_brute(t) is not None), None)
    if t is None:
        pytest.skip("no feasible configuration in this case")
    best = solve_brute(t).objective_us
    assert solve_cpsat(t, upper_bound_us=best, settings=SETTINGS) is None
    assert solve_cpsat(t, upper_bound_us=best + 1, settings=SETTINGS).objective_us == best


def check_plan(t, stages) -> int:
    """Independent check of a plan against the tables: layers covered once and in order, stage 0
    on DP0, GPUs per type within budget, every stage fits; returns its objective."""
    assert stages[0][1] == 0 and sum(n for _, _, n in stages) == t.num_layers
    for (o, s, n), (_, s_next, _) in zip(stages, stages[1:]):
        assert s + n == s_next and n >= 1
    assert t.first_stage_ok(stages[0][0])
    used = [0] * len(t.types)
    for o, _, _ in stages:
        used[t.option_type[o]] += t.option_gpus[o]
    assert all(u <= b for u, b in zip(used, t.budget))
    assert all(t.fits(o, i, s, n) for i, (o, s, n) in enumerate(stages))
    return t.plan_objective_us(stages)
