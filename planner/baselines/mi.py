"""MI: Megatron-Infinigence-style uniform Megatron, the manual recipe a practitioner would run.

Recipe: TP and EP (x ETP) inside a node, PP across nodes (the number of nodes or a divisor of it),
DP fills the rest, CP = 1, no interleaving, devices in the order the cluster lists them, Megatron's
even layer split (first/last-stage flags when PP does not divide the layers), one recompute setting
for all stages (the least that fits).  The practitioner tries a small grid (TP in {1,2,4,8} x EP in
{1,2,4,8} x ETP in {1, TP} x micro-batch in {1,2} x PP) and keeps the fastest under the cost model.
"""

from __future__ import annotations

from planner.baselines.common import (
    PricedPlan, better, build_plan, cost_model, divisors, ep_degrees, even_split, least_recompute, num_nodes,
    stage_members, tp_degrees,
)
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan

MI_MBS = (1, 2)


def search_mi(run: MegatronRun, cluster: ClusterSpec, profiles, *, notes: list[str] | None = None,
              runtime: str = "megatron", **_ignored) -> PricedPlan | None:
    """The fastest plan of the MI recipe grid that fits (None if none fits)."""
    cost = cost_model(run, cluster, profiles)
    model, gbs = run.model, run.training.global_batch_size
    world = cluster.world_size
    node_gpus = min(g.domain_gpus for g in cluster.groups)
    best: PricedPlan | None = None
    tried = 0
    for pp in sorted(divisors(num_nodes(cluster)), reverse=True):
        layers = even_split(model.num_layers, pp)
        if layers is None or world % pp:
            continue
        stage_gpus = world // pp
        members = stage_members(cluster, stage_gpus, pp)
        if members is None:
            continue
        types = [m[0] for m in members]
        for tp, dp, ep, etp, mbs in manual_degrees(model, node_gpus, stage_gpus, gbs):
            tried += 1
            priced = least_recompute(
                cost, run,
                lambda rc: build_plan(tp=tp, cp=1, ep=ep, etp=etp, mbs=mbs, gbs=gbs, dp=dp, types=types,
                                      layers=layers, recompute=rc, runtime=runtime),
                members)
            best = better(best, priced)
    if notes is not None:
        notes.append(f"MI: {tried} manual recipes tried")
        if best is not None:
            notes.extend(best.notes)
    return best


def manual_degrees(model, node_gpus: int, stage_gpus: int, gbs: int):
    """The manual recipe grid: TP, EP and ETP inside a node, DP filling the stage, micro-batch from
    MI_MBS; yields (tp, dp, ep, etp, mbs) that Megatron accepts."""
    for tp in tp_degrees(model, node_gpus):
        if stage_gpus % tp:
            continue
        dp = stage_gpus // tp
        for ep in ep_degrees(model, node_gpus):
            for etp in sorted({1, tp}) if model.is_moe else [tp]:
                if ep * etp > node_gpus or stage_gpus % (ep * etp):
                    continue
                if model.is_moe and etp > 1 and model.add_bias_linear:
                    continue
                for mbs in MI_MBS:
                    if gbs % (mbs * dp) == 0:
                        yield tp, dp, ep, etp, mbs


def plan_mi(run: MegatronRun, cluster: ClusterSpec, profiles, **kw) -> Plan | None:
    """MI's plan (uniform Megatron, manual recipe), or None if no recipe fits."""
    priced = search_mi(run, cluster, profiles, **kw)
    return priced.plan if priced else None
