"""--backend cpsat holds a plan early (planner/search/first_plan.py, FirstPlans): with no plan yet, the first shapes
priced for the degree master are laid out at once, rather than only once every shape is priced; those plans serve
a search cut short (or one that found none) and change nothing a search that runs to its end returns."""

from __future__ import annotations

import pytest

from helpers.cases import reduced_cost_model
from helpers.rule_cases import cluster_for, draw_cases, profiles
from planner.api import load_inputs
from planner.api_search import solve
from planner.search import first_plan
from planner.search.certify import BendersSearch
from planner.search.driver import search
from planner.search.prices import PriceBook
from planner.search.settings import SearchSettings
from planner.search.space import SearchSpace

SPACE = SearchSpace(runtime="megatron")
SETTINGS = SearchSettings(backend="cpsat", time_limit_s=600)
TIMES = ("wall_s", "master_wall_s", "stage_wall_s", "pricing_s", "seed_s", "tight_s")


class _FirstPlan(Exception):
    """Raised by the progress callback at the first event that carries a plan: the search stops there."""


def test_the_first_plan_comes_before_the_shapes_are_priced(monkeypatch):
    """case059 of the Megatron property test (a 12-layer MoE on 72 H100, 2,702 shapes): the first progress event
    with a plan comes while a few shapes are priced, not after all of them (about 3 s on an idle 2-core machine,
    so a 3 s time limit could end with no plan); it shows no bound and nothing closed, as nothing is bounded yet."""
    case = next(c for c in draw_cases(20, 250) if c.name == "case059")
    inputs = load_inputs(megatron_args=list(case.argv), cluster=cluster_for(case.world), profiles=profiles(),
                         allow_invalid=True)
    books: list[PriceBook] = []
    real = PriceBook.__init__

    def keep(self, *args, **kwargs):
        real(self, *args, **kwargs)
        books.append(self)

    monkeypatch.setattr(PriceBook, "__init__", keep)
    first = []

    def progress(ev):
        if ev.best_s is not None:
            first.append((ev, len(books[0].master), len(books[0].shapes)))
            raise _FirstPlan

    with pytest.raises(_FirstPlan):
        solve(inputs.run, inputs.cluster, inputs.profiles, settings=SETTINGS, space=SearchSpace(), progress=progress)
    (ev, priced, shapes), = first
    assert shapes > 1000 and priced <= 8, (priced, shapes)
    assert ev.phase == "pricing" and ev.solved == 0 and ev.best_plan is not None and ev.best_plan.stages
    assert ev.bound_s is None and ev.done == 0


@pytest.fixture(scope="module")
def small():
    """Llama2-7B cut to 2 layers on two H800 and two H20: searched to the end in seconds."""
    return reduced_cost_model("llama2-7b", 2, "H800:2,H20:2", 8)


@pytest.fixture
def eager(monkeypatch):
    """A first plan however soon the pricing ends (it is priced in milliseconds)."""
    monkeypatch.setattr(first_plan, "FIRST_PLAN_WAIT_S", 0.0)
    monkeypatch.setattr(first_plan, "FIRST_PLAN_PACE_SHAPES", 1)


def _answer(res) -> tuple:
    cpsat = {k: v for k, v in res.cpsat.items() if k not in TIMES}
    return ([c.plan for c in res.best], [c.objective_s for c in res.best], [c.plan for c in res.runners_up],
            res.costs[0].iteration_time_s, res.lower_bound_s, res.pruned_lower_bound_s, res.certified_optimal,
            res.timed_out, res.notes, res.configs_solved, res.configs_bounded, res.configs_infeasible,
            res.configs_unsearched, cpsat)


def test_a_search_that_runs_to_its_end_returns_what_it_returned_without_them(small, eager, monkeypatch):
    """The same plans, objective, bounds, notes and work (every counter of search.cpsat) with and without the
    first plans, and the search with them reported a plan while it priced the shapes."""
    seen = []
    with_them = search(small, SPACE, SETTINGS, progress=seen.append)
    assert any(e.phase == "pricing" and e.best_s is not None for e in seen)
    monkeypatch.setattr(first_plan, "FIRST_PLAN_SHAPES", 0)
    without = search(small, SPACE, SETTINGS)
    assert with_them.certified_optimal and without.certified_optimal
    assert _answer(with_them) == _answer(without)


def test_a_search_cut_short_before_its_first_plan_returns_the_first_plan(small, eager, monkeypatch):
    """No seeds and the loop stopped by the time limit at once (as on a loaded machine): the plan found while
    pricing is returned, FEASIBLE, held against the search's bounds, rather than no plan (exit status 3)."""
    monkeypatch.setattr(BendersSearch, "_seed", lambda self: None)
    monkeypatch.setattr(BendersSearch, "_late", lambda self: True)
    res = search(small, SPACE, SETTINGS)
    assert res.timed_out and not res.certified_optimal and res.cpsat["status"] == "FEASIBLE"
    assert res.configs_solved == 0 and res.best and res.best[0].plan.stages
    assert res.cpsat["self_check"]["configs_checked"] >= 1 and not res.cpsat["self_check"]["contradictions"]
    assert res.lower_bound_s is None or res.lower_bound_s <= res.best[0].objective_s


def test_a_first_plan_against_a_search_that_proved_there_is_none_withdraws_the_certificate(small, eager, monkeypatch):
    """A search made to prove wrongly that no plan exists (no seeds, every shape dropped when opened): the plan
    found while pricing contradicts it, so the result claims neither OPTIMAL nor a bound, and says why."""
    monkeypatch.setattr(BendersSearch, "_seed", lambda self: None)
    monkeypatch.setattr(BendersSearch, "_open_shape", lambda self, key, theta_us: None)
    res = search(small, SPACE, SETTINGS)
    assert not res.certified_optimal and res.cpsat["status"] == "FEASIBLE"
    assert res.lower_bound_s is None and res.pruned_lower_bound_s is None
    assert any("self-check" in n and "proved the space holds none" in n for n in res.notes)

