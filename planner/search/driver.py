"""The search driver: which plan, and what is proven about it.

    --backend cpsat   certify.py: logic-based Benders, a CP-SAT master over the degrees with CP-SAT
                      stage subproblems (no HS-DP code runs)
    --backend hsdp    enumerate (space.py) -> bound (bounds.py) -> best-first screening
    (and brute)       (screening.py, HS-DP or brute force over the integer tables)

With the prunings ordering the work (Pruning.restrict False, the default), the screening first
searches the pruned space (at most ORDER_SHARE of the time limit) and then the whole space,
starting from the pruned space's plans.

What a result claims: planner/search/settings.py (SearchResult, and the settings, progress event
and status wording the search shares with its callers).

Progress: `search(..., progress=fn)` calls fn(ProgressEvent) at most every 0.2 s while it works
and once at the end (phase "done"): configurations done of the total, seconds elapsed, the best
plan's objective so far and the least bound still open.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from planner.cost.model import CostModel
from planner.megatron import rules
from planner.errors import InfeasibleError, SearchTimeLimitError
from planner.schemas.search import GlobalChoice
from planner.search.certify import search_cpsat
from planner.search.explain import explain_infeasible, time_limit_error
from planner.search.screening import Configurations, Screening
from planner.search.pruning import Pruning
from planner.search.settings import FEASIBLE, Candidate, ProgressFn, SearchResult, SearchSettings
from planner.search.space import SearchSpace

# with the prunings ordering the work: the pruned space's screening takes at most this share of the
# time limit, the whole space's the rest
ORDER_SHARE = 0.3


def search(cost: CostModel, space: SearchSpace, settings: SearchSettings, progress: ProgressFn | None = None
           ) -> SearchResult:
    """Find the best plan(s) for the cost model's model/training/cluster over `space`."""
    t0 = time.perf_counter()
    limit = settings.time_limit_s
    deadline = t0 + limit if settings.deadline is None else min(settings.deadline, t0 + limit)
    settings = replace(settings, deadline=deadline)
    if settings.backend == "cpsat":
        return search_cpsat(cost, space, settings, t0, progress)
    pruning = settings.pruning
    if not pruning.any or pruning.restrict:
        return _result(_screen(cost, space, settings, t0, progress, deadline, []), settings, t0)
    # the prunings order the work: the pruned space first, then the whole space from its plans
    first = _screen(cost, space, replace(settings, pruning=pruning.restricting()), t0, progress,
                    t0 + ORDER_SHARE * (deadline - t0), [], allow_empty=True)
    whole = _screen(cost, space, replace(settings, pruning=Pruning.off()), t0, progress, deadline, first.cands,
                    configs=first.configs, early=first.early)
    res = _result(whole, settings, t0)
    res.pruning = pruning
    return res


def _screen(cost: CostModel, space: SearchSpace, settings: SearchSettings, t0: float, progress: ProgressFn | None,
            stop_at: float, seed: list[Candidate], allow_empty: bool = False,
            configs: Configurations | None = None, early: list[Candidate] | None = None) -> Screening:
    """One best-first screening until `stop_at` (the deadline when it has no plan yet), starting
    from the plans `seed` (found in a narrower space, so valid here) and the bounds and tables an
    earlier screening's `configs` cached; `early`: the plans an earlier screening's enumeration found at
    once (Screening.first_plan), which this one adopts only when cut short (allow_empty: never, the
    caller does)."""
    deadline = settings.deadline
    scr = Screening(cost, space, settings, t0, progress, stop_at=stop_at, budget_s=deadline - t0, configs=configs)
    scr.cands = list(seed)
    scr.early = list(early or [])
    scr.enumerate()
    if space.runtime_spec.per_stage_meshes and settings.warm_start and not seed:
        scr.cands += _flagscale_warm_start(cost, space, settings)
    scr.run()
    if scr.timed_out and not scr.cands and time.perf_counter() < deadline and not allow_empty:
        scr.stop_at = deadline  # no plan yet: take the rest of the time limit
        scr.run()
    while not scr.cands and not allow_empty and not scr.enumeration_complete \
            and (now := time.perf_counter()) < deadline:
        # no plan yet and the enumeration stopped at its share (a loaded machine): enumerate on for half of what
        # is left, then solve what that added, rather than stopping with time left
        scr.enumerate(until=now + (deadline - now) / 2)
        scr.stop_at = deadline
        scr.run()
    if scr.timed_out:
        scr.notes.append(f"time limit {settings.time_limit_s:g} s reached after {scr.done} of {scr.total} "
                         "configurations")
    if scr.delta_fallbacks:
        scr.notes.append(f"load-balance pruning (delta {settings.pruning.delta:g}) left no layout that fits in memory "
                         f"for {scr.delta_fallbacks} configuration(s); those were solved without it")
    if not allow_empty:
        scr.adopt_first_plans()
    if not scr.cands and not allow_empty:
        scr.report_progress("done", "", force=True)
        if scr.timed_out or not scr.enumeration_complete:
            raise time_limit_error(cost, space, f"the {settings.time_limit_s:g} s time limit ({scr.solved} of "
                                   f"{scr.total} configurations solved after {time.perf_counter() - t0:.1f} s)")
        raise explain_infeasible(cost, space, scr.enumerated)
    return scr


def _result(scr: Screening, settings: SearchSettings, t0: float) -> SearchResult:
    """What the screening proved, as a SearchResult."""
    whole = scr.enumeration_complete
    pruned_optimal = whole and scr.complete and not scr.timed_out
    pruned_lb = scr.pruned_space_bound() if whole else None
    certified = pruned_optimal and not scr.pruning.any
    whole_lb = pruned_lb if not scr.pruning.any else scr.whole_space_bound()
    best = scr.cands[: settings.top_k]
    cap = best[0].objective_s  # no bound above the best plan (the tables' objective of it)
    pruned_lb = None if pruned_lb is None else min(pruned_lb, cap)
    whole_lb = None if whole_lb is None else min(whole_lb, cap)
    costs = [scr.cost.evaluate(c.plan) for c in best]
    scr.report_progress("done", "", force=True)
    return SearchResult(
        best=best, costs=costs, configs_total=scr.total, configs_solved=scr.solved, configs_bounded=scr.bounded,
        configs_infeasible=scr.infeasible, configs_pruned_memory=scr.pruned_memory, lower_bound_s=whole_lb,
        configs_unsearched=0 if pruned_optimal else max(0, scr.total - scr.solved - scr.bounded - scr.infeasible
                                                        - scr.pruned_memory - scr.pruned_cp),
        space_counted=whole,
        certified_optimal=certified, search_time_s=time.perf_counter() - t0, backend=settings.backend,
        notes=scr.notes, pruning=scr.pruning,
        pruned_space_optimal=pruned_optimal, pruned_lower_bound_s=pruned_lb, configs_pruned_cp=scr.pruned_cp,
        timed_out=scr.timed_out or not whole,
        quantisation_s=max(0.0, costs[0].iteration_time_s - best[0].objective_s),
        runners_up=scr.cands[settings.top_k:],
    )


def _flagscale_warm_start(cost: CostModel, space: SearchSpace, settings: SearchSettings) -> list[Candidate]:
    """An incumbent for the flagscale search: the best plan with one DP and one recompute for
    every stage, types contiguous (the megatron space without CP and interleaving), which FlagScale
    can run as-is.  Every flagscale configuration whose bound cannot beat it is then bounded out
    without solving.  Takes at most a quarter of the time limit."""
    shared = tuple(space.stage_recompute) + tuple(space.selective)
    uniform = space.with_(runtime="megatron", cp=(1,), vpp=(1,), recompute=shared, contiguous_types=True)
    sub = replace(settings, backend="hsdp", warm_start=False, top_k=1, deadline=None,
                  time_limit_s=max(0.5, min(settings.time_limit_s / 4,
                                            (settings.deadline or math.inf) - time.perf_counter())))
    try:
        res = search(cost, uniform, sub, progress=None)
    except (InfeasibleError, SearchTimeLimitError):
        return []
    out = []
    tied = rules.flagscale_tied_embeddings(cost.model, cost.training)
    for c in res.best:
        plan = c.plan.model_copy(update={"runtime": "flagscale"})
        rc = plan.stages[0].recompute
        g = GlobalChoice("flagscale", c.g.tp, c.g.cp, c.g.ep, c.g.etp, c.g.samples_per_microbatch, c.g.pp, 1, 1,
                         rc if rc.granularity == "selective" else None, first_dp=c.g.dp0 if tied else None)
        # the plan was found over the megatron tables: no stage indices to carry over
        out.append(Candidate(g=g, objective_s=c.objective_s, plan=plan, backend="hsdp", status=FEASIBLE,
                             bound_s=c.bound_s))
    return out
