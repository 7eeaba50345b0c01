"""The one orchestrator behind `solve` and `compare`: inputs -> search -> checked plan + cost."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.checker import plan_problems
from planner.cost.model import CostModel, PlanCost
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan
from planner.search.driver import ProgressFn, SearchResult, SearchSettings, search
from planner.search.space import SearchSpace


@dataclass
class SolveOutcome:
    run: MegatronRun
    cluster: ClusterSpec
    result: SearchResult
    plans: list[Plan]
    costs: list[PlanCost]
    problems: list[list[str]] = field(default_factory=list)


def make_space(run: MegatronRun, runtime: str, mbs: int | None = None, **narrow) -> SearchSpace:
    space = SearchSpace(runtime=runtime, **narrow)
    if mbs is not None:
        space = space.with_(mbs=(mbs,))
    return space


def solve(run: MegatronRun, cluster: ClusterSpec, profiles, *, settings: SearchSettings, space: SearchSpace,
          progress: ProgressFn | None = None) -> SolveOutcome:
    cost = CostModel(run.model, run.training, cluster, profiles)
    result = search(cost, space, settings, progress=progress)
    plans = [c.plan for c in result.best]
    costs, problems = [], []
    for p in plans:
        probs, c = plan_problems(cost, p)
        costs.append(c)
        problems.append(probs)
    return SolveOutcome(run=run, cluster=cluster, result=result, plans=plans, costs=costs, problems=problems)
