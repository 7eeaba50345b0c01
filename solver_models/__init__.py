"""Search backends over the shared integer cost tables (solver_models/tables.py).

BACKENDS maps a name to an object with `solve(tables, *, upper_bound_us, settings) -> Solution | None`
solving one configuration under the tables' rules and prunings.  The search driver
(planner/search/driver.py) takes a backend from here by name: `hsdp` (the dynamic program),
`cpsat` (the CP-SAT stage model, hinted with HS-DP) and `brute` (enumeration, small cases).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Solution:
    objective_us: int  # v x iteration time in integer us, from the tables
    bound_us: int  # proven lower bound on this configuration's table optimum (= objective when exact)
    stages: list[tuple[int, int, int]]  # (option, start layer, layer count)
    status: str  # OPTIMAL | FEASIBLE | UNKNOWN (no plan within the time limit: no stages)
    exact: bool  # the configuration's optimum is proven on unpruned tables


class HSDPBackend:
    name = "hsdp"

    def solve(self, tables, *, upper_bound_us, settings) -> Solution | None:
        from solver_models.hsdp import DPStats, solve_hsdp

        stats = DPStats()
        deadline = getattr(settings, "deadline", None) or float("inf")
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

    def solve(self, tables, *, upper_bound_us, settings) -> Solution | None:
        from solver_models.brute import solve_brute

        deadline = getattr(settings, "deadline", None) or float("inf")
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

    def solve(self, tables, *, upper_bound_us, settings, hint_stages=None, stats=None) -> Solution | None:
        """The CP-SAT stage model; `hint_stages` a known plan to hint with, `stats` a dict filled
        with CP-SAT's statistics (also when the result is None)."""
        from solver_models.cpsat import solve_cpsat

        return solve_cpsat(tables, upper_bound_us=upper_bound_us, settings=settings, hint_stages=hint_stages,
                           stats=stats)


BACKENDS = {"cpsat": CpSatBackend(), "hsdp": HSDPBackend(), "brute": BruteBackend()}


def get_backend(name: str):
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"--backend: unknown backend {name!r}; allowed: {', '.join(BACKENDS)}") from None
