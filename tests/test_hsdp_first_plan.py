"""--backend hsdp holds a plan early (planner/search/screening.py, Screening.first_plan): with no plan yet, the
enumeration solves a few configurations of the shapes it bounds at once, rather than only once every shape of the
space is bounded; those plans serve a search cut short and change nothing a search that runs to its end returns."""

from __future__ import annotations

import pytest

from helpers.cases import reduced_cost_model
from helpers.rule_cases import cluster_for, draw_cases, profiles
from planner.api import load_inputs
from planner.api_search import solve
from planner.search import screening
from planner.search.driver import search
from planner.search.screening import Configurations, Screening
from planner.search.settings import SearchSettings
from planner.search.space import SearchSpace

SPACE = SearchSpace(runtime="megatron")


class _FirstPlan(Exception):
    """Raised by the progress callback at the first event that carries a plan: the search stops there."""


def test_the_first_plan_comes_before_the_space_is_bounded(monkeypatch):
    """case059 of the Megatron property test (a 12-layer MoE on 72 H100, hundreds of shapes): the first progress
    event with a plan comes while the enumeration has bounded a few shapes, not after it bounded all of them
    (it used to take seconds, and a 3 s time limit ended with no plan)."""
    case = next(c for c in draw_cases(20, 250) if c.name == "case059")
    inputs = load_inputs(megatron_args=list(case.argv), cluster=cluster_for(case.world), profiles=profiles(),
                         allow_invalid=True)
    bounded: set = set()
    real = Configurations.shape_bounds

    def counting(self, shape):
        bounded.add(shape)
        return real(self, shape)

    monkeypatch.setattr(Configurations, "shape_bounds", counting)
    first = []

    def progress(ev):
        if ev.best_s is not None:
            first.append((ev, len(bounded)))
            raise _FirstPlan

    with pytest.raises(_FirstPlan):
        solve(inputs.run, inputs.cluster, inputs.profiles, settings=SearchSettings(backend="hsdp", time_limit_s=600),
              space=SearchSpace(), progress=progress)
    (ev, shapes_bounded), = first
    assert shapes_bounded <= 4, shapes_bounded
    assert ev.phase == "enumerating" and ev.solved == 0 and ev.best_plan is not None
    assert ev.total < 1000  # the configurations of those shapes: the space holds tens of thousands


@pytest.fixture(scope="module")
def small():
    """Llama2-7B cut to 2 layers on two H800 and two H20: searched to the end in under a second."""
    return reduced_cost_model("llama2-7b", 2, "H800:2,H20:2", 8)


def test_a_search_that_runs_to_its_end_returns_what_it_returned_without_them(small, monkeypatch):
    """The same plan, objective, bound and work with and without the enumeration's plans, and the search with them
    reported a plan before its first solve."""
    settings = SearchSettings(backend="hsdp", time_limit_s=600)
    seen = []
    with_them = search(small, SPACE, settings, progress=seen.append)
    assert any(e.best_s is not None and e.solved == 0 for e in seen)
    monkeypatch.setattr(screening, "FIRST_PLAN_SHAPES", 0)
    without = search(small, SPACE, settings)
    assert with_them.status == without.status == "OPTIMAL"
    assert [c.plan for c in with_them.best] == [c.plan for c in without.best]
    assert [c.objective_s for c in with_them.best] == [c.objective_s for c in without.best]
    assert with_them.costs[0].iteration_time_s == without.costs[0].iteration_time_s
    assert with_them.lower_bound_s == without.lower_bound_s
    assert (with_them.configs_solved, with_them.configs_bounded, with_them.configs_infeasible) == \
        (without.configs_solved, without.configs_bounded, without.configs_infeasible)


def test_a_search_cut_short_before_its_first_solve_returns_the_enumerations_plan(small, monkeypatch):
    """The best-first search stopped by the time limit before it solved anything (as on a loaded machine): the
    plan the enumeration found is returned, FEASIBLE, rather than no plan."""

    def cut_short(self):
        self.timed_out = True

    monkeypatch.setattr(Screening, "run", cut_short)
    res = search(small, SPACE, SearchSettings(backend="hsdp", time_limit_s=600))
    assert res.status == "FEASIBLE" and res.timed_out and res.configs_solved == 0
    assert res.best and res.best[0].plan.stages
    assert res.lower_bound_s is None or res.lower_bound_s <= res.best[0].objective_s
