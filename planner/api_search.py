"""The use cases that search: `solve` and `compare` (planner/api.py has the others, which price or emit a given plan
and never load the search's backends, so that `estimate`, `emit` and `calibrate` start without OR-Tools)."""

from __future__ import annotations

import time
from dataclasses import replace

from planner.api import (
    OBJECTIVES, SolveOutcome, assumed_for_plan, compare_stages, idle_gpus, left_out_lines, make_space, relabel_result,
    runtime_choice, uniform_space_for,
)
from planner.checker import plan_problems
from planner.cost.model import CostModel, PlanCost
from planner.cost.ranges import RangeModel
from planner.errors import InfeasibleError, PlanCheckError, PlannerInputError, SearchTimeLimitError
from planner.megatron.flags import rule_options
from planner.megatron.rules import format_violations, input_violations
from planner.placement import contiguous_order
from planner.runtime import RuntimeChoice
from planner.sanity import check_prediction
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan
from planner.search.pools import search_with_pools
from planner.search.pruning import Pruning
from planner.search.settings import ProgressFn, SearchResult, SearchSettings
from planner.search.space import SearchSpace


def solve(run: MegatronRun, cluster: ClusterSpec, profiles, *, settings: SearchSettings, space: SearchSpace,
          progress: ProgressFn | None = None, memory_headroom: float | None = None,
          objective: str = "pessimistic", choice: RuntimeChoice | None = None,
          as_runtime: str | None = None) -> SolveOutcome:
    """Search, then check every returned plan with the independent checker: a plan that breaks a
    rule, overflows memory (its headroom kept free) or uses GPUs the cluster lacks raises PlanCheckError
    (exit status 2), never a printed problem.  Flags Megatron refuses whatever the plan (the model's, the run's
    other flags: planner/megatron/rules.py input_violations) are refused first, naming them.

    `objective` "pessimistic" (the default) searches tables built from the top of the range
    (planner/cost/ranges.py: each mechanism's seconds at their held-out uncertainty), so the plan whose
    pessimistic time is best wins; "nominal" searches the cost model itself.  Either way the reported time is
    the nominal float cost model's, with the range beside it.

    The search runs on the part of the cluster `choice` names (`--runtime auto` may leave device types
    no job of the runtime can hold idle); without `choice`, `space.runtime` must run the whole cluster
    (profiles/runtimes.yaml), else PlannerInputError: the megatron runtime never prices a cross-vendor job.

    `as_runtime`: search the megatron space (one DP and one recompute for every stage: what a baseline
    plans) for a job of another runtime, narrowed to what that runtime expresses (flagscale: CP 1, no
    VPP, each device type's stages contiguous); the plans come back as that runtime's."""
    if objective not in OBJECTIVES:
        raise PlannerInputError("--objective", f"expected one of {', '.join(OBJECTIVES)}, got {objective!r}")
    fixed = input_violations(run.model, run.training)
    if fixed:
        raise PlannerInputError(" / ".join(sorted({rule_options(v.rule) or "flags" for v in fixed})),
                                "Megatron refuses these flags whatever the plan: " + format_violations(fixed))
    target = as_runtime or space.runtime
    if as_runtime is not None and as_runtime != space.runtime:
        space = uniform_space_for(space, as_runtime)
    if choice is None:
        choice = runtime_choice(target, cluster, profiles, run, memory_headroom)
    elif choice.runtime.name != target:
        raise ValueError(f"the search is for {target}, the runtime choice is {choice.runtime.name}")
    ranges = RangeModel(run.model, run.training, choice.cluster, profiles, memory_headroom=memory_headroom)
    cost = ranges.nominal
    try:
        result = search_with_pools(ranges.high if objective == "pessimistic" else cost, space, settings,
                                   progress=progress)
    except InfeasibleError as exc:  # say which GPUs the runtime choice left out of the search
        if not choice.left_out:
            raise
        raise InfeasibleError(exc.reason, left_out_lines(choice, cluster, profiles) + exc.hints) from None
    if target != space.runtime:
        result = relabel_result(result, target)
    plans = [c.plan for c in result.best]
    costs, problems = [], []
    for p in plans:
        probs, c = plan_problems(cost, p)
        if probs:
            raise PlanCheckError(f"the {settings.backend} search returned a plan the checker rejects "
                                 f"({p.runtime} runtime): " + "; ".join(probs))
        costs.append(c)
        problems.append(probs)
    if not choice.runtime.contiguous_types:
        result, plans, costs = _grouped_by_type(cost, result, plans, costs)
    distinct = [k for k, p in enumerate(plans) if p not in plans[:k]]  # grouping by type can make two plans one
    if len(distinct) < len(plans):
        result = replace(result, best=[result.best[k] for k in distinct], costs=[result.costs[k] for k in distinct])
        plans, costs, problems = ([xs[k] for k in distinct] for xs in (plans, costs, problems))
    if profiles is not None:  # the MoE imbalance assumed is the pick's (its EP and micro-batch), as it is priced
        run = assumed_for_plan(run, plans[0], choice.cluster, profiles, "the pick's")
    return SolveOutcome(run=run, cluster=cluster, result=result, plans=plans, costs=costs, problems=problems,
                        idle=idle_gpus(plans[0], cluster, result, choice.left_out, space, objective), choice=choice,
                        profiles=profiles,
                        ranges=[ranges.time_range(p, c) for p, c in zip(plans, costs)], objective=objective,
                        memory_headroom=cost.memory_headroom, range_model=ranges, space=space)


def _grouped_by_type(cost: CostModel, result: SearchResult, plans: list[Plan], costs: list[PlanCost]):
    """Each plan with its device types' stages in one block when that costs nothing (planner/placement.py);
    the best plan's note says what was done, or why its types interleave."""
    new_plans, new_costs, best = [], [], list(result.best)
    notes = list(result.notes)
    for k, (p, c) in enumerate(zip(plans, costs)):
        p2, c2, note = contiguous_order(cost, p, c)
        new_plans.append(p2)
        new_costs.append(c2)
        best[k] = replace(best[k], plan=p2)
        if note and k == 0:
            notes.append(note)
    return replace(result, best=best, costs=new_costs, notes=notes), new_plans, new_costs



def compare_rows(run, cluster_spec, profiles, *, runtime: str, backends: list[str], time_limit_s: float,
                 delta: float, no_prune: bool, contiguous_types: bool = False, objective: str = "pessimistic",
                 memory_headroom: float | None = None, choice: RuntimeChoice | None = None) -> list[dict]:
    """Solve with each backend in turn, the time limit shared between them (each gets what is
    left divided by the backends still to run), and return one row per backend.  `objective_s` is the
    searched objective's float value (the plan's pessimistic or nominal time); `iteration_time_s` the nominal.
    `choice`: the runtime and the part of the cluster it runs (runtime_choice), when the caller has it."""
    choice = choice or runtime_choice(runtime, cluster_spec, profiles, run, memory_headroom)
    space = make_space(run, choice.runtime.name, contiguous_types=contiguous_types or None)
    end = time.perf_counter() + time_limit_s
    rows = []
    for k, name in enumerate(backends):
        share = max(0.1, (end - time.perf_counter()) / (len(backends) - k))
        settings = SearchSettings(backend=name, pruning=Pruning(delta=delta), time_limit_s=share)
        if no_prune:
            settings = settings.without_pruning()
        try:
            out = solve(run, cluster_spec, profiles, settings=settings, space=space, objective=objective,
                        memory_headroom=memory_headroom, choice=choice)
        except SearchTimeLimitError:
            rows.append({"backend": name, "status": "UNKNOWN", "objective_s": None, "iteration_time_s": None,
                         "lower_bound_s": None, "gap": None, "certified_optimal": False, "search_time_s": share,
                         "configs_solved": 0, "plan": "(no plan within its share of the time limit)",
                         "stages": None})
            continue
        check_prediction(out.costs[0], f"the {name} plan", profiles.user_files)
        r = out.result
        it = out.objective_s
        lb = r.lower_bound_s
        rows.append({
            "backend": name, "status": r.status, "objective_s": it, "iteration_time_s": out.costs[0].iteration_time_s,
            "solver_objective_s": r.best[0].objective_s, "lower_bound_s": lb,
            "gap": max(0.0, (it - lb) / it) if lb is not None else None,
            "pruned_space_status": r.pruned_space_status,
            "certified_optimal": r.certified_optimal, "search_time_s": r.search_time_s, "timed_out": r.timed_out,
            "configs_solved": r.configs_solved, "plan": r.best[0].g.label(), "stages": compare_stages(out.plans[0]),
        })
    found = [row["objective_s"] for row in rows if row["objective_s"] is not None]
    ref = min(found) if found else None
    for row in rows:
        row["vs_best"] = row["objective_s"] / ref - 1.0 if ref and row["objective_s"] is not None else None
        row["runtime"] = choice.runtime.name
    return rows

