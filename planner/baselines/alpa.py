"""Alpa-style: a full automatic search that assumes homogeneous devices.

It searches (planner.api_search.solve, megatron runtime) as if every GPU were the slowest device type of the
cluster (by profiled per-layer time, planner.baselines.common.layer_time_s), so layer counts and memory
use that type's speed and capacity, then maps the plan onto the real devices: stages take GPUs in the
order the cluster lists them.  A stage that lands on two device types is priced as its slowest member.
The mapped plan is re-evaluated on the real cluster (raising the recompute setting if a stage no
longer fits).  The best few plans of the search are mapped and the fastest real one kept.
"""

from __future__ import annotations

from planner.api import make_space
from planner.api_search import solve
from planner.baselines.common import (
    PricedPlan, better, build_plan, cost_model, homogeneous_cluster, ladder, least_recompute, stage_members,
    types_by_speed,
)
from planner.errors import InfeasibleError, SearchTimeLimitError
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan
from planner.search.settings import SearchSettings

ALPA_TOP_K = 3


def search_alpa(run: MegatronRun, cluster: ClusterSpec, profiles, *, notes: list[str] | None = None,
                time_limit_s: float = 30.0, runtime: str = "megatron", **_ignored) -> PricedPlan | None:
    """Search on an all-slowest-type cluster, map onto the real one, keep the fastest fitting plan."""
    cost = cost_model(run, cluster, profiles)
    slowest = types_by_speed(cost)[-1]
    fake = homogeneous_cluster(cluster, slowest, profiles)
    settings = SearchSettings(backend="hsdp", time_limit_s=time_limit_s, top_k=ALPA_TOP_K)
    try:
        outcome = solve(run, fake, profiles, settings=settings, space=make_space(run, "megatron"),
                        objective="nominal", as_runtime=runtime)
    except (InfeasibleError, SearchTimeLimitError) as exc:
        if notes is not None:
            why = "the search ran out of time" if isinstance(exc, SearchTimeLimitError) else "nothing fits"
            notes.append(f"Alpa-style: {why} when every GPU is a {slowest}")
        return None
    rank = {r.label: k for k, r in enumerate(ladder(run.model))}
    best: PricedPlan | None = None
    for plan in outcome.plans:
        stage_gpus = plan.tp * plan.cp * plan.dp0
        members = stage_members(cluster, stage_gpus, plan.pp)
        if members is None:
            continue
        layers = [s.num_layers for s in plan.stages]
        base = rank.get(plan.stages[0].recompute.label, 0)
        allowed = ladder(run.model)[base:]  # the homogeneous plan's recompute, raised if needed

        def make(rc, plan=plan, layers=layers, members=members):
            rc = rc if rank[rc.label] >= base else allowed[0]
            return build_plan(tp=plan.tp, cp=plan.cp, ep=plan.ep, etp=plan.etp, mbs=plan.mbs, gbs=plan.gbs,
                              dp=plan.dp0, types=[m[0] for m in members], layers=layers, recompute=rc,
                              vpp=plan.vpp, runtime=runtime)

        best = better(best, least_recompute(cost, run, make, members))
    if notes is not None:
        notes.append(f"Alpa-style: searched as if all {cluster.world_size} GPUs were {slowest}; "
                     f"mapped the best {len(outcome.plans)} plans onto the cluster in its listed order")
        if best is not None:
            notes.extend(best.notes)
    return best


def plan_alpa(run: MegatronRun, cluster: ClusterSpec, profiles, **kw) -> Plan | None:
    """Alpa-style plan (homogeneous assumption, mapped onto the real devices), or None."""
    priced = search_alpa(run, cluster, profiles, **kw)
    return priced.plan if priced else None
