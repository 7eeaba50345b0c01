"""Metis-style: heterogeneity-aware PP/DP/TP/CP placement with the MoE degrees fixed beforehand.

Following the paper's adaptation: EP and ETP come from homogeneous profiling, i.e. the best plan on a
cluster of the same size made only of the fastest device type (the next fastest if the model does not
fit there: "the best feasible configuration"); then the heterogeneous placement search
(planner.api_search.solve, megatron runtime: per-stage device type and layer count, one DP) runs on the real
cluster with SearchSpace(ep=(EP,), etp=(ETP,)).  Nothing else about MoE is taken into account beyond
what the shared cost model prices.
"""

from __future__ import annotations

from planner.api import make_space
from planner.api_search import solve
from planner.baselines.common import PricedPlan, cost_model, homogeneous_cluster, types_by_speed
from planner.errors import InfeasibleError, SearchTimeLimitError
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan
from planner.search.settings import SearchSettings


def search_metis(run: MegatronRun, cluster: ClusterSpec, profiles, *, notes: list[str] | None = None,
                 time_limit_s: float = 30.0, runtime: str = "megatron", **_ignored) -> PricedPlan | None:
    """EP/ETP from a homogeneous fastest-type search, then placement search on the real cluster."""
    cost = cost_model(run, cluster, profiles)
    space = make_space(run, "megatron")
    fixed = ""
    if run.model.is_moe:
        first, profiled = None, None
        for h in types_by_speed(cost):  # the fastest type whose homogeneous cluster holds the model
            try:
                first = solve(run, homogeneous_cluster(cluster, h, profiles),
                              profiles, settings=SearchSettings(backend="hsdp", time_limit_s=time_limit_s), space=space,
                              objective="nominal")
                profiled = h
                break
            except (InfeasibleError, SearchTimeLimitError) as exc:
                if notes is not None:
                    why = ("its search ran out of time" if isinstance(exc, SearchTimeLimitError)
                           else "the model does not fit")
                    notes.append(f"Metis-style: {why} on a homogeneous {h}:{cluster.world_size}")
        if first is None:
            if notes is not None:
                notes.append("Metis-style: no homogeneous plan to take EP/ETP from")
            return None
        ep, etp = first.plans[0].ep, first.plans[0].etp
        space = space.with_(ep=(ep,), etp=(etp,))
        fixed = f"EP={ep} ETP={etp} from a homogeneous {profiled}:{cluster.world_size} search; "
    try:
        outcome = solve(run, cluster, profiles, settings=SearchSettings(backend="hsdp", time_limit_s=time_limit_s),
                        space=space, objective="nominal", as_runtime=runtime)
    except (InfeasibleError, SearchTimeLimitError) as exc:
        if notes is not None:
            why = "the search ran out of time" if isinstance(exc, SearchTimeLimitError) else "no placement fits"
            notes.append(f"Metis-style: {fixed}{why}")
        return None
    if notes is not None:
        notes.append(f"Metis-style: {fixed}heterogeneous placement searched on the real cluster")
    return PricedPlan(plan=outcome.plans[0], cost=outcome.costs[0])


def plan_metis(run: MegatronRun, cluster: ClusterSpec, profiles, **kw) -> Plan | None:
    """Metis-style plan, or None."""
    priced = search_metis(run, cluster, profiles, **kw)
    return priced.plan if priced else None
