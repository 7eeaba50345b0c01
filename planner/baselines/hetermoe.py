"""HeterMoE-style (Wu et al. 2025), as far as our Megatron-based cost model can express it.

What HeterMoE does: inside each MoE layer it disaggregates attention (on the newer GPUs) from the
experts (on the older GPUs), overlaps the two across micro-batches ("zebra" parallelism), and assigns
experts asymmetrically so that the older GPUs' share matches their speed.  It does no global 6D search.

What we can express: a Megatron stage runs whole layers on one device type, with one EP for the job,
so a layer cannot be split between device types and EP cannot differ per type.  This baseline is
therefore a CRUDE approximation that credits HeterMoE with its heterogeneity-aware asymmetric work
assignment at layer granularity only:

* degrees from the manual grid (TP, EP, ETP in a node, micro-batch 1 or 2, CP = 1, no interleaving),
  no search over them beyond that grid;
* one stage per node group slice (PP = number of nodes, or a divisor keeping stages on one type),
  stages ordered newest/fastest device type first (where HeterMoE puts attention);
* layer counts per stage chosen to minimise the slowest stage (asymmetric assignment: slower GPUs
  get fewer layers), each stage fitting in memory, the least recompute that admits such a split.

The attention/expert disaggregation and its overlap are not modelled (neither their gain nor the extra
cross-type all-to-all they would cost); the bench output says so next to this baseline.
"""

from __future__ import annotations

from planner.baselines.common import (
    PricedPlan, better, build_plan, cost_model, divisors, ladder, min_bottleneck_split, num_nodes,
    rule_problems, stage_members, types_by_speed,
)
from planner.baselines.mi import manual_degrees
from planner.schemas.cluster import ClusterSpec, NodeGroup
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan

APPROXIMATION_NOTE = ("HeterMoE-style is a crude approximation: attention/expert disaggregation and its overlap "
                      "cannot be expressed in Megatron stages; modelled as manual degrees + speed-proportional "
                      "(min-bottleneck) layer split with the fastest device types first")


def _newest_first(cluster: ClusterSpec, order: list[str]) -> ClusterSpec:
    """The cluster with its node groups listed fastest type first."""
    groups: list[NodeGroup] = sorted(cluster.groups, key=lambda g: order.index(g.device_type))
    return cluster.model_copy(update={"groups": tuple(groups)})


def search_hetermoe(run: MegatronRun, cluster: ClusterSpec, profiles, *, notes: list[str] | None = None,
                    runtime: str = "megatron", **_ignored) -> PricedPlan | None:
    """Manual degrees, newest-first stages, min-bottleneck layer split (see the module docstring)."""
    cost = cost_model(run, cluster, profiles)
    model, gbs = run.model, run.training.global_batch_size
    ordered = _newest_first(cluster, types_by_speed(cost))
    world = cluster.world_size
    node_gpus = min(g.domain_gpus for g in cluster.groups)
    best: PricedPlan | None = None
    for pp in sorted(divisors(num_nodes(cluster)), reverse=True):
        if pp > model.num_layers or world % pp:
            continue
        stage_gpus = world // pp
        members = stage_members(ordered, stage_gpus, pp)
        if members is None or any(len(m) > 1 for m in members):
            continue  # the point is to put each stage on one device type
        types = [m[0] for m in members]
        for tp, dp, ep, etp, mbs in manual_degrees(model, node_gpus, stage_gpus, gbs):
            for rc in ladder(model):
                start = [model.num_layers // pp] * pp
                start[-1] += model.num_layers - sum(start)
                template = build_plan(tp=tp, cp=1, ep=ep, etp=etp, mbs=mbs, gbs=gbs, dp=dp, types=types,
                                      layers=start, recompute=rc, runtime=runtime)
                if rule_problems(model, template, run):
                    break
                layers = min_bottleneck_split(cost, template)
                if layers is None:
                    continue
                plan = template.model_copy(update={"stages": tuple(
                    s.model_copy(update={"num_layers": n}) for s, n in zip(template.stages, layers))})
                pc = cost.evaluate(plan)
                if pc.fits and not rule_problems(model, plan, run):
                    best = better(best, PricedPlan(plan=plan, cost=pc, notes=(APPROXIMATION_NOTE,)))
                    break
    if notes is not None:
        notes.append(APPROXIMATION_NOTE)
    return best


def plan_hetermoe(run: MegatronRun, cluster: ClusterSpec, profiles, **kw) -> Plan | None:
    """HeterMoE-style plan (crude approximation, see module docstring), or None."""
    priced = search_hetermoe(run, cluster, profiles, **kw)
    return priced.plan if priced else None
