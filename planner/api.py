"""The one orchestrator behind `solve` and `compare`: inputs -> search -> checked plan + cost."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.checker import plan_problems
from planner.cost.model import CostModel, PlanCost
from planner.errors import PlanCheckError
from planner.inputs.script import LauncherScript
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan
from planner.search.driver import ProgressFn, SearchResult, SearchSettings, search
from planner.search.space import SearchSpace


@dataclass
class IdleGpus:
    """GPUs of one device type the plan leaves idle, and why."""

    device_type: str
    count: int
    why: str


@dataclass
class SolveOutcome:
    run: MegatronRun
    cluster: ClusterSpec
    result: SearchResult
    plans: list[Plan]
    costs: list[PlanCost]
    problems: list[list[str]] = field(default_factory=list)
    idle: list[IdleGpus] = field(default_factory=list)
    script: LauncherScript | None = None  # the input launcher (--megatron-script), for the launcher files


def make_space(run: MegatronRun, runtime: str, mbs: int | None = None, **narrow) -> SearchSpace:
    space = SearchSpace(runtime=runtime, **narrow)
    if mbs is not None:
        space = space.with_(mbs=(mbs,))
    return space


def solve(run: MegatronRun, cluster: ClusterSpec, profiles, *, settings: SearchSettings, space: SearchSpace,
          progress: ProgressFn | None = None) -> SolveOutcome:
    """Search, then check every returned plan with the independent checker: a plan that breaks a
    rule, overflows memory or uses GPUs the cluster lacks raises PlanCheckError (exit status 2),
    never a printed problem."""
    cost = CostModel(run.model, run.training, cluster, profiles)
    result = search(cost, space, settings, progress=progress)
    plans = [c.plan for c in result.best]
    costs, problems = [], []
    for p in plans:
        probs, c = plan_problems(cost, p)
        if probs:
            raise PlanCheckError(f"the {settings.backend} search returned a plan the checker rejects "
                                 f"({p.runtime} runtime): " + "; ".join(probs))
        costs.append(c)
        problems.append(probs)
    return SolveOutcome(run=run, cluster=cluster, result=result, plans=plans, costs=costs, problems=problems,
                        idle=idle_gpus(plans[0], cluster, result))


def idle_gpus(plan: Plan, cluster: ClusterSpec, result: SearchResult) -> list[IdleGpus]:
    """Per device type, the GPUs the plan leaves idle and why: too few left for one more stage of
    the plan's shape, or (when more stages would fit) the search found no faster plan using them."""
    used = plan.gpus_by_type()
    out = []
    proof = "the search proved that no plan using them is faster" if result.certified_optimal else \
        "no plan using them was faster among those searched"
    sizes = sorted({plan.tp * plan.cp * s.dp for s in plan.stages})
    for h, n in cluster.gpus_by_type().items():
        idle = n - used.get(h, 0)
        if idle <= 0:
            continue
        if idle < sizes[0]:
            why = (f"fewer than one more stage of the plan's TP x CP x DP = {sizes[0]} GPUs; " + proof)
        else:
            why = proof
        out.append(IdleGpus(h, idle, why))
    return out
