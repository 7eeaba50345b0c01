"""The CP-SAT master over the global degrees: which configuration is best, proven over every
configuration of the space.

A decomposition (issue 12): every configuration G of the space is a row with its degrees and a
lower bound on its optimum, integer microseconds of iteration time, rounded down:

    variables   one integer per degree family (TP, CP, EP, ETP, micro-batch or samples per
                micro-batch, DP, PP, VPP, recompute), a row index k and the row's value
    constraints rule families on the degrees, one per rule of planner/megatron/rules.py (each a table of
                the degree values its predicate allows); element constraints tying k to the
                degrees and to the value (the per-configuration bounds)
    objective   minimise the value

A row's value is the configuration's optimum once a stage subproblem (the CP-SAT stage model,
hinted with HS-DP, or HS-DP itself) has solved it, and a lower bound (planner/search/bounds.py)
before.  The caller solves the master, solves the chosen row's subproblem if it is not solved yet
(a cut: the row's value rises to its optimum), and solves the master again, until the chosen row
is solved: then CP-SAT's OPTIMAL proves that no configuration beats it.

The rows were enumerated under the same rules, so the rule families do not cut rows; they state
the space in the model (tests/test_master.py checks that the rule families alone admit exactly
the enumerated degrees).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ortools.sat.python import cp_model

# largest product of domains a rule family's table is built over (else: from the rows)
MAX_RULE_TABLE = 200_000


@dataclass(frozen=True)
class RuleFamily:
    """One rule as a constraint: the degree families it reads and its predicate over them."""

    name: str
    scope: tuple[str, ...]
    allowed: Callable[..., bool]


@dataclass
class MasterResult:
    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN | MODEL_INVALID
    row: int | None  # the chosen row
    objective_us: int | None
    bound_us: int | None
    wall_s: float
    branches: int
    variables: dict[str, int] = field(default_factory=dict)
    constraints: dict[str, int] = field(default_factory=dict)


class DegreeMaster:
    """The master model over `rows` (degree tuples in the order of `families`) with `values`
    (integer microseconds, lower bounds or optima) and `rules`."""

    def __init__(self, families: Sequence[str], rows: Sequence[tuple[int, ...]], values: Sequence[int],
                 rules: Sequence[RuleFamily]):
        self.families = tuple(families)
        self.model = m = cp_model.CpModel()
        self.constraints: dict[str, int] = {}
        cols = list(zip(*rows))
        n = len(rows)
        self.deg = {f: m.new_int_var_from_domain(cp_model.Domain.from_values(sorted(set(col))), f)
                    for f, col in zip(self.families, cols)}
        self.row = m.new_int_var(0, n - 1, "row")
        self.value = m.new_int_var(min(values), max(values), "value_us")

        def family(name: str, add: Callable[[], None]) -> None:
            before = len(m.proto.constraints)
            add()
            self.constraints[name] = len(m.proto.constraints) - before

        # the rules, each a table over the degrees it reads
        for rule in rules:
            family(rule.name, lambda rule=rule: m.add_allowed_assignments(
                [self.deg[f] for f in rule.scope], self._allowed(rule, rows)))

        # the configuration rows: the row index fixes every degree and the row's bound
        def link() -> None:
            for f, col in zip(self.families, cols):
                m.add_element(self.row, list(col), self.deg[f])

        family("configuration_degrees", link)
        family("configuration_bounds", lambda: m.add_element(self.row, list(values), self.value))
        m.minimize(self.value)
        self.variables = {"degrees": len(self.deg), "rows": 1, "bound": 1}

    def _allowed(self, rule: RuleFamily, rows: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The tuples of the scope's domains the rule's predicate allows."""
        idx = [self.families.index(f) for f in rule.scope]
        domains = [sorted({r[i] for r in rows}) for i in idx]
        if math.prod(len(d) for d in domains) <= MAX_RULE_TABLE:
            candidates = itertools.product(*domains)
        else:  # too many combinations: the rows' own projections, still filtered by the rule
            candidates = sorted({tuple(r[i] for i in idx) for r in rows})
        return [c for c in candidates if rule.allowed(*c)]

    def hint(self, row: int) -> None:
        self.model.add_hint(self.row, row)

    def solve(self, *, time_limit_s: float, num_workers: int) -> MasterResult:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, float(time_limit_s))
        solver.parameters.num_workers = int(num_workers)
        # presolve expands the rule tables and the row elements into clauses over every row
        # (seconds for a few thousand rows); the search itself needs well under a second
        solver.parameters.cp_model_presolve = False
        status = solver.solve(self.model)
        name = solver.status_name(status)
        found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        bound = None
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
            bound = int(math.floor(solver.best_objective_bound + 1e-6))
        return MasterResult(
            status=name, row=int(solver.value(self.row)) if found else None,
            objective_us=int(round(solver.objective_value)) if found else None, bound_us=bound,
            wall_s=solver.wall_time, branches=solver.num_branches, variables=dict(self.variables),
            constraints=dict(self.constraints))
