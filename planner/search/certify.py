"""The certificate of --backend cpsat: the CP-SAT master over the degrees
(solver_models/cpsat/master.py) on the rows screening left, with stage subproblems added lazily.

Rows: every configuration of the space being searched (the pruned space when pruning is on) that
is not proven infeasible, valued by what screening proved about it (its optimum when solved, its
lower bound otherwise).  The master picks the least row; while that row is not solved and could
beat the best plan, its bound is tightened or its stage problem solved by the CP-SAT stage model
(hinted with HS-DP's plan when there is one), and the master is solved again.  It stops when the
master proves that no row can beat the best plan (status OPTIMAL over the space), or at the
deadline (FEASIBLE, with CP-SAT's bound).  Rows whose bound already reaches the best plan beyond
MAX_ROWS are left out of the model; the bound they carry enters the reported bound.

The winner's stage problem is then solved once more by the CP-SAT stage model, hinted with the
plan, so the chosen configuration's own optimum is CP-SAT's too.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from planner.megatron import rules
from planner.cost.model import CostModel
from planner.runtime import runtime_of
from planner.schemas.search import GlobalChoice
from planner.search.screening import QueueEntry, Screening, plan_from_solution
from planner.search.settings import FEASIBLE, OPTIMAL, Candidate
from planner.search.space import SearchSpace, pipeline_in_space, recompute_ladder
from solver_models.cpsat.master import DegreeMaster, RuleFamily
from solver_models.cpsat.model import CpSatSolution, solve_cpsat
from solver_models.scaling import bound_s, from_us
from solver_models.tables import DeadlinePassed, StageTables

MAX_ROWS = 2_000
# the winner's CP-SAT stage solve runs only with this much time left, and takes at most this share
# of the time limit (HS-DP has already solved it; CP-SAT confirms)
STAGE_SOLVE_MIN_S = 1.0
STAGE_SOLVE_SHARE = 0.1

MEGATRON_FAMILIES = ("tp", "cp", "ep", "etp", "mbs", "dp", "pp", "vpp", "recompute")
FLAGSCALE_FAMILIES = ("tp", "cp", "ep", "etp", "samples", "pp", "recompute", "first_dp")


def rule_families(cost: CostModel, space: SearchSpace) -> list[RuleFamily]:
    """Megatron's and FlagScale's rules on the degrees (planner/megatron/rules.py), plus the space's own
    requirement that the cluster holds PP stages.  FlagScale's per-stage rules (stage micro-batch,
    folding, recompute, tied embeddings, contiguous types) are the stage subproblem's."""
    model, training, cluster = cost.model, cost.training, cost.cluster
    gbs, n_layers = training.global_batch_size, model.num_layers
    budget = cluster.gpus_by_type()
    gpn = {h: cost.gpus_per_node(h) for h in budget}
    runtime = space.runtime
    common = [
        RuleFamily("heads_tp", ("tp",), lambda tp: rules.tp_allowed(model, tp)),
        RuleFamily("seq_cp", ("cp",), lambda cp: rules.cp_allowed(model, cp)),
        RuleFamily("experts_ep", ("ep",), lambda ep: rules.ep_allowed(model, ep)),
        RuleFamily("moe_etp_bias", ("tp", "etp"), lambda tp, etp: rules.etp_allowed(model, tp, etp)),
    ]
    flags_ok = rules.degree_flags_check(model, training)
    if runtime_of(runtime).per_stage_meshes:
        return common + [
            RuleFamily("flagscale_query_groups_tp", ("tp",), lambda tp: rules.runtime_tp_ok("flagscale", model, tp)),
            RuleFamily("flagscale_cp", ("cp",), lambda cp: rules.runtime_degrees_ok("flagscale", cp, 1)),
            RuleFamily("gbs_microbatch", ("samples",), lambda b: rules.batch_ok(gbs, b, 1)),
            RuleFamily("pipeline_in_space", ("pp",), lambda pp: pipeline_in_space(n_layers, pp, 1)),
        ] + ([] if flags_ok is None else [RuleFamily(
            "degree_flags", ("tp", "cp", "ep", "etp", "pp"), lambda tp, cp, ep, etp, pp: flags_ok(tp, cp, ep, etp, None, pp, 1))])

    overlap_p2p = training.megatron.overlap_p2p_comm
    flag_family = [] if flags_ok is None else [
        RuleFamily("degree_flags", ("tp", "cp", "ep", "etp", "dp", "pp", "vpp"), flags_ok)]

    def stages_fit(tp: int, cp: int, dp: int, pp: int) -> bool:
        s = tp * cp * dp
        return sum(n // s for h, n in budget.items() if tp <= gpn[h]) >= pp

    return common + [
        RuleFamily("expert_folding", ("tp", "cp", "dp", "ep", "etp"), rules.expert_folding_ok),
        RuleFamily("gbs_microbatch", ("mbs", "dp"), lambda mbs, dp: rules.batch_ok(gbs, mbs, dp)),
        RuleFamily("vpp_microbatches", ("mbs", "dp", "pp", "vpp"),
                   lambda mbs, dp, pp, vpp: rules.interleave_ok(gbs, mbs, dp, pp, vpp, overlap_p2p)),
        RuleFamily("pipeline_in_space", ("pp", "vpp"), lambda pp, vpp: pipeline_in_space(n_layers, pp, vpp)),
        RuleFamily("runtime_degrees", ("cp", "vpp"), lambda cp, vpp: rules.runtime_degrees_ok(runtime, cp, vpp)),
        RuleFamily("stages_fit", ("tp", "cp", "dp", "pp"), stages_fit),
    ] + flag_family


def degree_row(scr: Screening, g: GlobalChoice) -> tuple[int, ...]:
    """G's degrees in the order of the runtime's families (recompute as its index)."""
    if g.per_stage_meshes:
        modes = [None] + recompute_ladder(scr.cost.model, tuple(scr.space.selective) + tuple(
            r for r in scr.space.stage_recompute if r.granularity == "selective"), scr.cost.training)
        rc = modes.index(g.recompute)
        return (g.tp, g.cp, g.ep, g.etp, g.samples_per_microbatch, g.pp, rc, g.first_dp or 0)
    return (g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.pp, g.vpp, scr.recompute_rank(g))


def _floor_us(seconds: float) -> int:
    return int(math.floor(seconds * 1e6))


def certify_with_cpsat(scr: Screening) -> dict[str, Any]:
    """Run the master loop (module docstring) on the screening's state (through its certificate
    interface); offers the screening any better plan and returns the `search.cpsat` statistics."""
    s = scr.settings
    stats: dict[str, Any] = {"status": "UNKNOWN", "objective_s": None, "bound_s": None, "wall_s": 0.0,
                             "branches": 0, "variables": {}, "constraints": {}, "master_solves": 0,
                             "subproblems": 0, "rows": 0, "rows_left_out": 0,
                             "space": "pruned" if scr.pruning.any else "whole"}
    families = FLAGSCALE_FAMILIES if scr.space.runtime_spec.per_stage_meshes else MEGATRON_FAMILIES
    rule_fams = rule_families(scr.cost, scr.space)
    while True:
        incumbent_us = _floor_us(scr.best.objective_s)
        _expand_open_shapes(scr, incumbent_us)
        rows = _rows(scr)
        rows.sort(key=lambda r: r[0])
        keep = rows[:max(MAX_ROWS, 1)]
        left_out = [r[0] for r in rows[len(keep):]]
        left_out += [_floor_us(e.bound_s) for e in scr.queued_shapes()]  # shapes not expanded
        rest_us = min(left_out, default=None)
        stats["rows"], stats["rows_left_out"] = len(keep), len(left_out)
        remaining = s.deadline - time.perf_counter()
        if not keep or remaining <= 0.05:
            if not keep:  # every row is solved or reaches the best plan: nothing left to decide
                stats.update(status=OPTIMAL, objective_s=scr.best.objective_s,
                             bound_s=min(scr.best.objective_s, (rest_us or math.inf) * 1e-6))
            break
        master = DegreeMaster(families, [degree_row(scr, r[2]) for r in keep], [r[0] for r in keep], rule_fams)
        res = master.solve(time_limit_s=remaining, num_workers=s.num_workers)
        stats["master_solves"] += 1
        stats["wall_s"] += res.wall_s
        stats["branches"] += res.branches
        _merge_counts(stats["variables"], res.variables, replace=True)
        _merge_counts(stats["constraints"], res.constraints, replace=True)
        bound_us = res.bound_us if res.bound_us is not None else None
        if bound_us is not None and rest_us is not None:
            bound_us = min(bound_us, rest_us)
        stats["bound_s"] = None if bound_us is None else min(bound_us * 1e-6, scr.best.objective_s)
        stats["objective_s"] = scr.best.objective_s
        if res.status != "OPTIMAL":
            stats["status"] = res.status  # the master's own: FEASIBLE, UNKNOWN, ...
            break
        value, solved, g = keep[res.row][0], keep[res.row][1], keep[res.row][2]
        if (value >= incumbent_us or solved) and (rest_us is None or rest_us >= incumbent_us):
            stats["status"] = OPTIMAL
            stats["bound_s"] = min(value * 1e-6, scr.best.objective_s)
            break
        if value >= incumbent_us or solved:  # the master's rows are settled; what was left out is not
            stats["status"] = FEASIBLE
            break
        if not _refine(scr, g, stats):
            stats["status"] = FEASIBLE
            break
    _stage_solve_winner(scr, stats)
    return stats


def _rows(scr: Screening) -> list[tuple[int, bool, GlobalChoice]]:
    """(value us, solved?, G) for every configuration not proven infeasible (shapes not yet
    expanded are not rows)."""
    out = [(_floor_us(r.bound_s), r.solved, r.g) for r in scr.known() if r.feasible and math.isfinite(r.bound_s)]
    out += [(_floor_us(e.bound_s), False, e.g) for e in scr.queued_choices() if scr.record_of(e.g) is None]
    return out


def _expand_open_shapes(scr: Screening, incumbent_us: int) -> None:
    """Shapes still in the queue whose bound is below the best plan become rows (their global
    choices), as long as there is time and room for them."""
    while scr.queue_size() and time.perf_counter() < scr.settings.deadline:
        shapes = [e for e in scr.queued_shapes() if _floor_us(e.bound_s) < incumbent_us]
        if not shapes or scr.queue_size() > MAX_ROWS:
            return
        scr.expand_queued(min(shapes))


def _refine(scr: Screening, g: GlobalChoice, stats: dict) -> bool:
    """Cut on row g: tighten its bound, or solve its stage problem with CP-SAT.  False when the
    time is up."""
    if time.perf_counter() > scr.settings.deadline:
        return False
    entry = scr.queued_entry(g)
    if entry is not None and entry.level < 2:
        scr.tighten(entry)
        return True
    if entry is not None:
        scr.dequeue(entry)
    else:
        entry = scr.entry_for(g)
    rec = scr.record_of(g)
    hint = rec.stages if rec is not None and rec.stages else None
    sub: dict = {}
    try:
        tables = scr.tables(g, entry.options)
        sol = solve_cpsat(tables, upper_bound_us=None, settings=scr.solver_settings, hint_stages=hint, stats=sub)
    except DeadlinePassed:
        _keep_unsolved(scr, entry)
        return False
    stats["subproblems"] += 1
    _add_stage_stats(stats, sub)
    if sol is None:
        scr.record(entry, math.inf, math.inf if tables.exact else entry.bound_s, solved=True, feasible=False)
        return True
    if not sol.stages:
        _keep_unsolved(scr, entry)
        return False
    _take(scr, entry, tables, sol)
    return sol.status == "OPTIMAL"


def _keep_unsolved(scr: Screening, entry: QueueEntry) -> None:
    """A row taken off the queue whose stage problem the time limit cut short: keep its bound on
    record, so the pruned- and whole-space bounds still count the configuration."""
    if scr.record_of(entry.g) is None:
        scr.record(entry, entry.bound_s, entry.bound_s, solved=False)


def _take(scr: Screening, entry: QueueEntry, tables: StageTables, sol: CpSatSolution) -> None:
    """Record a CP-SAT stage solution and keep its plan when it is among the best."""
    g = entry.g
    obj = from_us(sol.objective_us) / g.vpp
    complete = sol.status == "OPTIMAL"
    scr.record(entry, obj if complete else entry.bound_s, obj if sol.exact else entry.bound_s,
               solved=complete, stages=sol.stages)
    plan = plan_from_solution(g, tables, sol.stages, scr.cost.training.global_batch_size)
    scr.offer(Candidate(g=g, objective_s=obj, plan=plan, backend="cpsat", status=sol.status,
                        bound_s=bound_s(sol.bound_us, g.vpp), options=entry.options, stages=sol.stages))


def _stage_solve_winner(scr: Screening, stats: dict) -> None:
    """The best configuration's stage problem once more in CP-SAT, hinted with its plan."""
    best = scr.best
    rec = scr.record_of(best.g)
    if rec is None or not best.stages or scr.settings.deadline - time.perf_counter() < STAGE_SOLVE_MIN_S:
        return
    sub: dict = {}
    capped = replace(scr.solver_settings, time_limit_s=max(STAGE_SOLVE_MIN_S, STAGE_SOLVE_SHARE * scr.budget_s))
    try:
        tables = scr.tables(best.g, rec.options)
        sol = solve_cpsat(tables, upper_bound_us=None, settings=capped, hint_stages=best.stages, stats=sub)
    except DeadlinePassed:
        return
    stats["subproblems"] += 1
    _add_stage_stats(stats, sub)
    stats["winner_stage_status"] = sub.get("status")
    if sol is not None and sol.stages and from_us(sol.objective_us) / best.g.vpp < best.objective_s - 1e-12:
        _take(scr, scr.entry_for(best.g), tables, sol)
        stats["objective_s"] = scr.best.objective_s
    elif sol is not None and sol.stages:
        best.backend, best.status = "cpsat", sol.status


def _add_stage_stats(stats: dict, sub: dict) -> None:
    stats["wall_s"] += float(sub.get("wall_s", 0.0) or 0.0)
    stats["branches"] += int(sub.get("branches", 0) or 0)
    _merge_counts(stats["variables"], sub.get("variables", {}))
    _merge_counts(stats["constraints"], sub.get("constraints", {}))


def _merge_counts(into: dict, new: dict, replace: bool = False) -> None:
    for k, v in new.items():
        into[k] = v if replace else into.get(k, 0) + v

