"""--backend cpsat: a first plan while the shapes are priced (FirstPlans).

Pricing every shape for the degree master (planner/search/prices.py PriceBook.price_master) comes before the
seeds and the Benders loop (planner/search/certify.py) and takes most of a large space's time before its first
plan (2,702 shapes and about 3 s on a 12-layer MoE over 72 GPUs).  With no plan yet, each shape just priced (up
to FIRST_PLAN_SHAPES, FIRST_PLAN_BUDGET_S in all; those the shape screen shows no pipeline holds skipped; none
while the pricing would end within FIRST_PLAN_WAIT_S at the pace of its first FIRST_PLAN_PACE_SHAPES shapes or
more) is tried at once: its most recompute (the likeliest to fit) at its least VPP, the deepest FIRST_PLAN_TRIES
pipelines whose tables hold a layout that fits, laid out by the seeds' rounding heuristic
(planner/search/seeds.py), or, when rounding places none, a short exact stage solve of the first; then the best
of those at each other recompute setting.  The first shape that gives a plan ends it.

Those plans are kept apart (`plans`): they change nothing the search does (its plans, cut-offs, bounds, tables of
tight bounds, counters), and join its plans only when it is cut short or ends with none
(BendersSearch._adopt_first_plans), so a search that runs to its end returns exactly what it returned without
them.  They prove nothing.  Not under --prune (the pruned space a plan may leave), as the seeds.
"""

from __future__ import annotations

import time
from typing import Callable

from planner.schemas.search import GlobalChoice
from planner.search.screening import FIRST_PLAN_SHAPES, plan_from_solution
from planner.search.seeds import sequences, shape_settings
from planner.search.settings import Candidate
from solver_models.base import SolverSettings
from solver_models.cpsat.model import solve_cpsat
from solver_models.fitting import has_fitting_layout
from solver_models.rounding import rounded_plan
from solver_models.scaling import from_us
from solver_models.tables import DeadlinePassed, StageTables

# with no plan yet: at most FIRST_PLAN_SHAPES shapes are tried as they are priced (HS-DP's number: screening.py),
# each at most this many pipelines (the deepest whose tables hold a layout that fits), of its deepest
# FIRST_PLAN_TABLES
FIRST_PLAN_TRIES = 3
FIRST_PLAN_TABLES = 6
# all the shapes tried take at most this long (s), the exact stage solve when rounding places no layout included
FIRST_PLAN_BUDGET_S = 0.5
# nothing is tried while the shapes left would be priced within this long (s) at the pace so far (measured over
# this many shapes at least, the first ones warming caches): the seeds come soon enough
FIRST_PLAN_WAIT_S = 0.3
FIRST_PLAN_PACE_SHAPES = 4


class FirstPlans:
    """The plans found while the shapes are priced (module docstring), apart from the search's."""

    def __init__(self, search):  # a planner.search.certify.BendersSearch (which imports this module)
        self.search = search
        self.plans: list[tuple[Candidate, float]] = []  # the best: (plan, its iteration time on its tables, us)
        self.shapes_tried = 0
        self.spent_s = 0.0
        self.deadline = search.deadline
        self.since = time.perf_counter()  # when the pricing started (the caller sets it)

    @property
    def wanted(self) -> bool:
        return not self.plans and self.shapes_tried < FIRST_PLAN_SHAPES and self.spent_s < FIRST_PLAN_BUDGET_S \
            and not self.search.pruning.restricts

    def best(self) -> Candidate | None:
        return min((c for c, _ in self.plans), key=lambda c: c.objective_s, default=None)

    def shape_priced(self, key: tuple, until: float, found: Callable[[], None]) -> None:
        """A shape just priced: with no plan yet, try it (module docstring) until `until` (time.perf_counter());
        `found` is called once it gives a plan, before the other recompute settings are tried."""
        if not self.wanted or not self._long_wait() or self.search._screen_bound_us(key) is None:
            return  # a plan already, the pricing ends soon, or the shape's layers fit in no pipeline (the screen)
        self.shapes_tried += 1
        start = time.perf_counter()
        self.deadline = min(self.search.deadline, until, start + FIRST_PLAN_BUDGET_S - self.spent_s)
        try:
            first = self._deepest(key)
            if first is not None:
                self.plans = [first]
                found()
                self._other_settings(key)
        except DeadlinePassed:
            pass
        finally:
            self.spent_s += time.perf_counter() - start

    def _long_wait(self) -> bool:
        """Whether the shapes left to price take FIRST_PLAN_WAIT_S or more at the pace so far (over
        FIRST_PLAN_PACE_SHAPES shapes at least)."""
        book = self.search.book
        priced = len(book.master)
        if priced < min(FIRST_PLAN_PACE_SHAPES, len(book.shapes)):
            return False
        return (len(book.shapes) - priced) * (time.perf_counter() - self.since) / priced >= FIRST_PLAN_WAIT_S

    # ---- which configurations ----
    def _deepest(self, key: tuple) -> tuple[Candidate, float] | None:
        """The most recompute at the least VPP, the deepest FIRST_PLAN_TRIES pipelines that fit (of the deepest
        FIRST_PLAN_TABLES): the best rounded plan, or the first's exact stage solve when rounding placed none."""
        shape = self.search.book.shapes[key]
        vpp = min(v for _, v in shape.pipelines)
        rc = shape_settings(shape)[-1]
        fitting: list[tuple[GlobalChoice, StageTables]] = []
        for pp in sorted((p for p, v in shape.pipelines if v == vpp), reverse=True)[:FIRST_PLAN_TABLES]:
            if len(fitting) >= FIRST_PLAN_TRIES:
                break
            g = shape.choice(pp, vpp, rc)
            tables = self._tables(g)
            if has_fitting_layout(tables):
                fitting.append((g, tables))
        found = _least([self._rounded(g, t) for g, t in fitting])
        if found is None and fitting:
            found = self._solved(*fitting[0])
        return found

    def _other_settings(self, key: tuple) -> None:
        """The plan's pipeline at each other recompute setting of its shape, rounded: the best is kept."""
        shape = self.search.book.shapes[key]
        g = self.plans[0][0].g
        for rc in shape_settings(shape)[:-1]:
            h = shape.choice(g.pp, g.vpp, rc)
            tables = self._tables(h)
            if has_fitting_layout(tables):
                self.plans = [_least(self.plans + [self._rounded(h, tables)])]

    # ---- plans ----
    def _rounded(self, g: GlobalChoice, tables: StageTables) -> tuple[Candidate, float] | None:
        """G laid out by the rounding heuristic over the seeds' stage-type sequences: the best plan."""
        best = None
        for allowed in sequences(tables):
            stages = rounded_plan(tables, allowed)
            if stages is not None:
                best = _least([best, self._candidate(g, tables, stages, tables.plan_objective_us(stages))])
        return best

    def _solved(self, g: GlobalChoice, tables: StageTables) -> tuple[Candidate, float] | None:
        """G's exact stage solve, no upper bound, within what is left of FIRST_PLAN_BUDGET_S: its plan (proven or
        not)."""
        limit = self.deadline - time.perf_counter()
        if limit <= 0:
            raise DeadlinePassed
        sol = solve_cpsat(tables, upper_bound_us=None, settings=SolverSettings(
            time_limit_s=limit, num_workers=self.search.settings.num_workers, deadline=self.deadline))
        if sol is None or not sol.stages:
            return None
        return self._candidate(g, tables, sol.stages, sol.objective_us)

    def _candidate(self, g: GlobalChoice, tables: StageTables, stages: list, objective_us: float
                   ) -> tuple[Candidate, float]:
        plan = plan_from_solution(g, tables, stages, self.search.cost.training.global_batch_size)
        return (Candidate(g=g, objective_s=from_us(objective_us) / g.vpp, plan=plan, backend="cpsat",
                          status="FEASIBLE", bound_s=0.0, options=list(tables.options), stages=list(stages)),
                objective_us / g.vpp)

    def _tables(self, g: GlobalChoice) -> StageTables:
        if time.perf_counter() > self.deadline:
            raise DeadlinePassed
        return self.search._tables(g, exact=True)


def _least(found: list[tuple[Candidate, float] | None]) -> tuple[Candidate, float] | None:
    """The plan of least objective (the first on ties)."""
    return min((f for f in found if f is not None), key=lambda f: f[0].objective_s, default=None)
