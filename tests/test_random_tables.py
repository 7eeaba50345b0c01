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


def random_tables(seed: int):
    rng = random.Random(seed)
    n_layers = rng.randint(3, 7)
    num_o = rng.randint(1, 3)
    pp = rng.randint(1, min(4, n_layers))
    option_type = [rng.randrange(2) for _ in range(num_o)]
    layer_us = [[rng.randint(5, 60) for _ in range(n_layers)] for _ in range(num_o)]
    p2p = [[rng.randint(0, 15) for _ in range(num_o)] for _ in range(num_o)]
    return make_tables(
        layer_us, pp=pp, m=rng.randint(1, 8), vpp=1, option_type=option_type,
        budget=[rng.randint(1, 3) for _ in range(max(option_type) + 1)], p2p_us=p2p,
        first_extra_us=rng.randint(0, 20), cap_layers=[float(rng.randint(1, n_layers)) for _ in range(num_o)],
        sync_per_layer_us=[rng.randint(0, 10) for _ in range(num_o)])


@pytest.mark.parametrize("seed", range(40))
def test_backends_agree_on_random_tables(seed):
    t = random_tables(seed)
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
