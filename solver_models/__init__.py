"""Search backends over the shared integer cost tables (solver_models/tables.py).

BACKENDS maps a name to an object with `solve(tables, *, delta, upper_bound_us, settings) -> Solution | None`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Solution:
    objective_us: int  # v x iteration time in integer us, from the tables
    bound_us: int  # proven lower bound on this configuration's optimum (= objective when exact)
    stages: list[tuple[int, int, int]]  # (option, start layer, layer count)
    status: str  # OPTIMAL | FEASIBLE
    exact: bool  # the configuration's optimum is proven (not just a feasible plan)


class HSDPBackend:
    name = "hsdp"

    def solve(self, tables, *, delta, upper_bound_us, settings) -> Solution | None:
        from solver_models.hsdp import DPStats, solve_hsdp

        stats = DPStats()
        deadline = getattr(settings, "deadline", None) or float("inf")
        sol = solve_hsdp(tables, delta=delta, upper_bound_us=upper_bound_us, stats=stats, deadline=deadline)
        if sol is None:
            if not stats.complete:
                return Solution(0, 0, [], "UNKNOWN", exact=False)
            return None
        status = "OPTIMAL" if stats.complete else "FEASIBLE"
        return Solution(sol.objective_us, sol.objective_us if stats.complete else 0, sol.stages, status,
                        exact=stats.complete and delta is None)


class BruteBackend:
    name = "brute"

    def solve(self, tables, *, delta, upper_bound_us, settings) -> Solution | None:
        from solver_models.brute import solve_brute

        sol = solve_brute(tables)
        if sol is None:
            return None
        return Solution(sol.objective_us, sol.objective_us, sol.stages, "OPTIMAL", exact=True)


class CpSatBackend:
    name = "cpsat"

    def solve(self, tables, *, delta, upper_bound_us, settings) -> Solution | None:
        from solver_models.cpsat import solve_cpsat

        return solve_cpsat(tables, delta=delta, upper_bound_us=upper_bound_us, settings=settings)


BACKENDS = {"cpsat": CpSatBackend(), "hsdp": HSDPBackend(), "brute": BruteBackend()}


def get_backend(name: str):
    try:
        return BACKENDS[name]
    except KeyError:
        from planner.errors import PlannerInputError

        raise PlannerInputError("--backend", f"unknown backend {name!r}; allowed: {', '.join(BACKENDS)}") from None
