"""The registry of search backends over the shared integer cost tables (solver_models/tables.py).

BACKENDS maps a name to a Backend (solver_models/base.py) solving one configuration under the
tables' rules and prunings.  The search (planner/search/screening.py) takes a backend from here by
name: `hsdp` (the dynamic program), `cpsat` (the CP-SAT stage model, hinted with HS-DP) and
`brute` (enumeration, small cases).
"""

from __future__ import annotations

from typing import Any

from solver_models.base import Backend, Solution, SolverSettings
from solver_models.brute import solve_brute
from solver_models.cpsat.model import CpSatSolution, solve_cpsat
from solver_models.hsdp import DPStats, solve_hsdp
from solver_models.tables import StageTables


class HSDPBackend:
    name = "hsdp"

    def solve(self, tables: StageTables, *, upper_bound_us: int | None, settings: SolverSettings
              ) -> Solution | None:
        stats = DPStats()
        deadline = settings.deadline or float("inf")
        sol = solve_hsdp(tables, upper_bound_us=upper_bound_us, stats=stats, deadline=deadline)
        if sol is None:
            if not stats.complete:
                return Solution(0, 0, [], "UNKNOWN", exact=False)
            return None
        status = "OPTIMAL" if stats.complete else "FEASIBLE"
        return Solution(sol.objective_us, sol.objective_us if stats.complete else 0, sol.stages, status,
                        exact=stats.complete and tables.exact)


class BruteBackend:
    name = "brute"

    def solve(self, tables: StageTables, *, upper_bound_us: int | None, settings: SolverSettings
              ) -> Solution | None:
        deadline = settings.deadline or float("inf")
        sol = solve_brute(tables, deadline=deadline)
        if sol is not None and not sol.complete:
            if not sol.stages:
                return Solution(0, 0, [], "UNKNOWN", exact=False)
            return Solution(sol.objective_us, 0, sol.stages, "FEASIBLE", exact=False)
        if sol is None or (upper_bound_us is not None and sol.objective_us >= upper_bound_us):
            return None
        return Solution(sol.objective_us, sol.objective_us, sol.stages, "OPTIMAL", exact=tables.exact)


class CpSatBackend:
    name = "cpsat"

    def solve(self, tables: StageTables, *, upper_bound_us: int | None, settings: SolverSettings,
              hint_stages: list[tuple[int, int, int]] | None = None, stats: dict[str, Any] | None = None
              ) -> CpSatSolution | None:
        """The CP-SAT stage model; `hint_stages` a known plan to hint with, `stats` a dict filled
        with CP-SAT's statistics (also when the result is None)."""
        return solve_cpsat(tables, upper_bound_us=upper_bound_us, settings=settings, hint_stages=hint_stages,
                           stats=stats)


BACKENDS: dict[str, Backend] = {"cpsat": CpSatBackend(), "hsdp": HSDPBackend(), "brute": BruteBackend()}


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"--backend: unknown backend {name!r}; allowed: {', '.join(BACKENDS)}") from None
