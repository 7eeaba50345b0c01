"""CP-SAT over one global configuration's integer tables: the stage problem HS-DP solves (see
solver_models/hsdp.py), as a model CP-SAT can prove optimal.  The search's CP-SAT master over the
degrees (master.py) adds these as subproblems, one configuration at a time.

    minimise  sum_i t_i + (m*v - 1) * max_i t_i + v * max_i sync_i
    over      one option and a layer count per stage, layers in order and covering all N,
              GPUs per device type within the budget, every stage fitting in memory,
              the tables' rules (contiguous types, first and last stage options) and prunings
              (load-balance windows, least recompute that fits), optionally objective < a bound.

Order as in OR-Tools' samples: data (cells.py) -> variables (variables.py) -> constraints
(constraints.py) -> objective -> hint (a plan the caller already has) -> solve -> solution ->
statistics.  Nothing here calls HS-DP: the CP-SAT backend is independent of it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ortools.sat.python import cp_model

import solver_models.cpsat.constraints as cons
from solver_models.base import Solution, SolverSettings
from solver_models.cpsat.cells import all_cells, canonical_plan
from solver_models.cpsat.variables import create_vars, extract_plan, hint_plan, variable_counts
from solver_models.tables import StageTables, check_deadline


@dataclass
class CpSatSolution(Solution):
    """A Solution plus CP-SAT's statistics (wall time, branches, conflicts, model size, hint)."""

    stats: dict[str, Any] = field(default_factory=dict)


class CpSatStageModel:
    """The CP-SAT model of one configuration; build once, then solve.

    stats["variables"] and stats["constraints"]: counts per family (the names of
    variables.variable_counts and of the constraint functions below)."""

    def __init__(self, tables: StageTables, *, upper_bound_us: int | None,
                 max_equality: bool = False, drop_dominated: bool = True):
        t0 = time.perf_counter()
        self.tables = tables
        self.upper_bound_us = upper_bound_us
        self.model = cp_model.CpModel()
        self.cells = all_cells(tables, drop_dominated=drop_dominated)
        self.stats: dict[str, Any] = {"variables": {}, "constraints": {}}
        self.infeasible_reason: str | None = None
        self.classes = cons.link_classes(tables)
        missing = [i for i in range(tables.pp) if not any(k[0] == i for k in self.cells)]
        if missing:
            # a stage with no allowed cell: nothing to build
            self.infeasible_reason = f"stage {missing[0]} has no option that fits"
            self.vars = None
            self.stats["build_s"] = time.perf_counter() - t0
            return
        m, t, c = self.model, tables, self.cells
        check_deadline(t.deadline)
        self.vars = v = create_vars(m, t, c, self.classes)
        family = self._family
        family("one_option_per_stage", lambda: cons.add_one_option_per_stage(m, t, v))
        family("layer_counts", lambda: cons.add_layer_counts(m, t, c, v))
        forms = family("stage_costs", lambda: cons.add_stage_costs(m, c, v))
        cuts = family("relaxation_cuts", lambda: cons.add_relaxation_cuts(m, c, v))
        family("links", lambda: cons.add_pipeline_links(m, t, v, self.classes))
        family("stage_times", lambda: cons.add_stage_times(m, t, v))
        family("gpu_budget", lambda: cons.add_gpu_budget(m, t, v))
        blocks = family("contiguous_types", lambda: cons.add_contiguous_types(m, t, v))
        family("bottleneck", lambda: cons.add_bottleneck(m, t, v, max_equality=max_equality))
        balance = family("load_balance", lambda: cons.add_load_balance(m, c, v, t.windows))
        self.objective = cons.objective_expr(t, v)
        family("upper_bound", lambda: cons.add_upper_bound(m, self.objective, upper_bound_us))
        m.minimize(self.objective)
        self.stats["variables"] = variable_counts(v)
        self.stats.update(build_s=time.perf_counter() - t0, cost_forms=forms, cuts=cuts,
                          balance_constraints=balance, contiguous_types=blocks, options=len(c),
                          link_classes=len(set(self.classes)))

    def _family(self, name: str, add: Callable[[], Any]) -> Any:
        """Run one constraint family's function and count the constraints it added (DeadlinePassed
        between families once the tables' deadline passes)."""
        check_deadline(self.tables.deadline)
        before = len(self.model.proto.constraints)
        out = add()
        self.stats["constraints"][name] = len(self.model.proto.constraints) - before
        return out

    def hint(self, stages: list[tuple[int, int, int]]) -> bool:
        """Hint every variable with a known plan [(option, start, n)] (moved off dominated cells);
        False if the plan is not one of the model's."""
        if self.vars is None:
            return False
        plan = canonical_plan(self.tables, self.cells, stages)
        if plan is None or not self.allows(plan):
            return False
        hint_plan(self.model, self.vars, self.tables, plan, self.classes)
        return True

    def allows(self, stages: list[tuple[int, int, int]]) -> bool:
        """Whether a plan on allowed cells also keeps the GPU budget, the contiguity rule and the
        load-balance windows (the families a hint could break)."""
        t = self.tables
        used = [0] * len(t.types)
        for o, _, _ in stages:
            used[int(t.option_type[o])] += int(t.option_gpus[o])
        if any(u > b for u, b in zip(used, t.budget)):
            return False
        if not t.type_sequence_ok([o for o, _, _ in stages]):
            return False
        return all(t.in_window(o, n) for o, _, n in stages)

    def solve(self, *, time_limit_s: float, num_workers: int, log: bool = False) -> CpSatSolution | None:
        """Solve; None when no plan exists (or none beats the upper bound) or when the time limit
        ends before any plan is found (stats["status"]: INFEASIBLE or UNKNOWN)."""
        t = self.tables
        if self.vars is None:
            self.stats.update(status="INFEASIBLE", reason=self.infeasible_reason, wall_s=0.0, branches=0)
            return None
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = float(time_limit_s)
        # Ctrl-C is the planner's (planner/signals.py): CP-SAT would take it as 'stop this solve' and the search
        # would go on
        solver.parameters.catch_sigint_signal = False
        solver.parameters.num_workers = int(num_workers)
        solver.parameters.log_search_progress = log
        status = solver.solve(self.model)
        self.stats.update(status=solver.status_name(status), wall_s=solver.wall_time,
                          branches=solver.num_branches, conflicts=solver.num_conflicts,
                          booleans=solver.num_booleans)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
            self.stats["bound_us"] = math.ceil(solver.best_objective_bound - 1e-6)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        stages = extract_plan(solver, self.vars, t.pp)
        objective_us = t.plan_objective_us(stages)
        if objective_us != int(round(solver.objective_value)):
            raise AssertionError(f"CP-SAT objective {solver.objective_value} != tables' {objective_us}")
        bound_us = min(objective_us, self.stats["bound_us"])
        self.stats.update(objective_us=objective_us, bound_us=bound_us)
        optimal = status == cp_model.OPTIMAL
        return CpSatSolution(objective_us=objective_us, bound_us=objective_us if optimal else bound_us,
                             stages=stages, status="OPTIMAL" if optimal else "FEASIBLE",
                             exact=optimal and t.exact, stats=dict(self.stats))


def _unknown(stats: dict[str, Any]) -> CpSatSolution:
    """No plan and no proof within the time limit: the driver's "unproven" marker (no stages)."""
    return CpSatSolution(objective_us=0, bound_us=0, stages=[], status="UNKNOWN", exact=False, stats=stats)


def plan_count(t: StageTables) -> int:
    """Option sequences x layer splits (what brute force would enumerate)."""
    return t.num_options ** t.pp * math.comb(t.num_layers - 1, t.pp - 1)


def solve_cpsat(tables: StageTables, *, upper_bound_us: int | None, settings: SolverSettings,
                hint_stages: list[tuple[int, int, int]] | None = None,
                max_equality: bool = False, drop_dominated: bool = True, log: bool = False,
                stats: dict[str, Any] | None = None) -> CpSatSolution | None:
    """Best plan for the configuration under the tables' rules and prunings (None if nothing fits
    or nothing beats upper_bound_us).

    settings: the time limit, workers and deadline (the limit is cut to the deadline).  When
    time runs out with no plan and no proof: a solution with status UNKNOWN and no stages (as
    the other backends report it).  Hint: hint_stages, a plan [(option, start, n)] the caller
    already has (e.g. from the same configuration under the load-balance window), used as given.
    The returned objective is recomputed from the tables;
    status is OPTIMAL or FEASIBLE (time limit), exact = OPTIMAL on unpruned tables.
    Statistics: .stats on the result, and `stats` (a dict the caller passes, filled also when
    the result is None).  Raises DeadlinePassed when the tables carry a deadline that passes
    while the model is built (the search's callers catch it)."""
    t0 = time.perf_counter()
    out_stats = stats if stats is not None else {}
    out_stats.clear()
    limit_s = float(settings.time_limit_s)
    if settings.deadline is not None:
        limit_s = min(limit_s, settings.deadline - t0)
    if limit_s <= 0:
        out_stats.update(status="UNKNOWN", reason="deadline passed before solving")
        return _unknown(dict(out_stats))
    hint_obj = tables.plan_objective_us(hint_stages) if hint_stages is not None else None
    if hint_obj is not None and upper_bound_us is not None and hint_obj >= upper_bound_us:
        hint_stages = hint_obj = None  # it cannot satisfy objective < upper bound
    m = CpSatStageModel(tables, upper_bound_us=upper_bound_us, max_equality=max_equality,
                        drop_dominated=drop_dominated)
    hinted = hint_stages is not None and m.hint(hint_stages)
    remaining_s = max(0.01, limit_s - (time.perf_counter() - t0))
    sol = m.solve(time_limit_s=remaining_s, num_workers=settings.num_workers, log=log)
    if sol is None and m.stats.get("status") == "UNKNOWN":
        if hinted:
            # CP-SAT found nothing in time, but the hinted plan is feasible: report it, unproven
            bound_us = min(hint_obj, max(0, int(m.stats.get("bound_us", 0))))
            sol = CpSatSolution(objective_us=hint_obj, bound_us=bound_us, stages=list(hint_stages),
                                status="FEASIBLE", exact=False)
        else:
            sol = _unknown({})
    m.stats.update(hinted=hinted, hint_objective_us=hint_obj if hinted else None,
                   total_s=time.perf_counter() - t0)
    out_stats.update(m.stats)
    if sol is not None:
        sol.stats = dict(m.stats)
    return sol
