"""Backend against backend on seeded random stage tables (Alpa's style of solver testing): for
random per-layer times, pipeline links, GPU budgets, memory caps and sync, the CP-SAT stage model,
HS-DP and brute force find the same optimum, or all find none.  The tables are made up, so a
disagreement is a solver's, never the cost model's."""

from __future__ import annotations

import random

import pytest

from solver_models.base import SolverSettings
from solver_models.brute import solve_brute
from solver_models.cpsat.model import solve_cpsat
from solver_models.hsdp import solve_hsdp

from helpers.tables import make_tables

SETTINGS = SolverSettings(time_limit_s=20.0, num_workers=2)


def random_tables(seed: int, positional: bool = False):
    """Random tables; `positional`: links that cost less inside a node (1-2 GPUs per option, 2-4 per node,
    budgets of several nodes), with traffic (M) that can outlast a stage's forward or backward and a fill (X)."""
    rng = random.Random(seed)
    n_layers = rng.randint(3, 7)
    num_o = rng.randint(1, 3)
    pp = rng.randint(1, min(4, n_layers))
    option_type = [rng.randrange(2) for _ in range(num_o)]
    layer_us = [[rng.randint(5, 60) for _ in range(n_layers)] for _ in range(num_o)]
    p2p = [[rng.randint(0, 15) for _ in range(num_o)] for _ in range(num_o)]
    extra = {}
    budget = [rng.randint(1, 3) for _ in range(max(option_type) + 1)]
    if positional:
        budget = [rng.randint(4, 8) for _ in budget]
        extra = dict(dps=[rng.randint(1, 2) for _ in range(num_o)], gpus_per_node=[rng.choice([2, 4]) for _ in budget],
                     p2p_near_us=[[rng.randint(0, p2p[a][b]) for b in range(num_o)] for a in range(num_o)],
                     traffic_us=[[[rng.randint(0, 90) for _ in range(num_o)] for _ in range(num_o)] for _ in range(2)],
                     fill_us=[[[rng.randint(0, 30) for _ in range(num_o)] for _ in range(num_o)] for _ in range(2)])
    return make_tables(
        layer_us, pp=pp, m=rng.randint(1, 8), vpp=1, option_type=option_type, budget=budget, p2p_us=p2p,
        first_extra_us=rng.randint(0, 20), cap_layers=[float(rng.randint(1, n_layers)) for _ in range(num_o)],
        sync_per_layer_us=[rng.randint(0, 10) for _ in range(num_o)], **extra)


@pytest.mark.parametrize("positional", [False, True], ids=["links", "positional-links"])
@pytest.mark.parametrize("seed", range(40))
def test_backends_agree_on_random_tables(seed, positional):
    """The same optimum from every backend; with positional links and traffic too (the link of each boundary
    from where the stages' GPUs land: tables.plan_links, priced against brute force's enumeration)."""
    t = random_tables(seed, positional)
    brute = solve_brute(t)
    dp = solve_hsdp(t)
    cp = solve_cpsat(t, upper_bound_us=None, settings=SETTINGS)
    if brute is None:
        assert dp is None and cp is None, seed
        return
    assert dp is not None and cp is not None, seed
    assert cp.status == "OPTIMAL", seed
    assert dp.objective_us == brute.objective_us == cp.objective_us, (seed, dp.objective_us, brute.objective_us,
                                                                      cp.objective_us)
    assert t.plan_objective_us(cp.stages) == cp.objective_us
