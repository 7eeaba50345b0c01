"""What every search backend takes and returns: the settings of one solve (SolverSettings), the
solution (Solution) and the backend's interface (Backend).  The registry of backends is
solver_models/backends.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from solver_models.tables import StageTables


@dataclass(frozen=True)
class SolverSettings:
    """How long one configuration's solve may run and on how many workers.

    `deadline` is a time.perf_counter() value (None: only the time limit); a solve stops at the
    earlier of the two."""

    time_limit_s: float
    num_workers: int = 2
    deadline: float | None = None


@dataclass
class Solution:
    objective_us: int  # v x iteration time in integer us, from the tables
    bound_us: int  # proven lower bound on this configuration's table optimum (= objective when exact)
    stages: list[tuple[int, int, int]]  # (option, start layer, layer count)
    status: str  # OPTIMAL | FEASIBLE | UNKNOWN (no plan within the time limit: no stages)
    exact: bool  # the configuration's optimum is proven on unpruned tables


class Backend(Protocol):
    """A backend solves one configuration under its tables' rules and prunings: None when no plan
    exists or none beats `upper_bound_us`; a Solution with status UNKNOWN and no stages when the
    time ran out first."""

    name: str

    def solve(self, tables: StageTables, *, upper_bound_us: int | None, settings: SolverSettings
              ) -> Solution | None: ...
