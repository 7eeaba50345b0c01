"""DeepSpeed-MoE / Tutel-style: expert parallelism plus data parallelism, unaware of heterogeneity.

EP as wide as the experts allow over the job's GPUs (EP = number of experts when it divides the GPUs
of a stage, else the largest power of two that does), TP = ETP = CP = 1, DP over every GPU of the
stage for the dense part (ZeRO-1-like sharding = Megatron's distributed optimizer, as the run says),
no pipeline unless it cannot fit (then PP = 2, 4, ... nodes' worth, Megatron's even split), every
device treated alike (stages take GPUs in cluster order; a stage spanning device types runs at its
slowest member's pace and must fit on its smallest).  Micro-batch 1, the least recompute that fits.
Not applicable to dense models (returns None).
"""

from __future__ import annotations

from planner.baselines.common import (
    PricedPlan, build_plan, cost_model, divisors, even_split, least_recompute, num_nodes, stage_members,
)
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan


def search_deepspeed(run: MegatronRun, cluster: ClusterSpec, profiles, *, notes: list[str] | None = None,
                     runtime: str = "megatron", **_ignored) -> PricedPlan | None:
    """EP+DP with the fewest pipeline stages that fit (None for dense models or when nothing fits)."""
    model, gbs = run.model, run.training.global_batch_size
    if not model.is_moe:
        if notes is not None:
            notes.append("DeepSpeed-MoE/Tutel-style: not applicable to a dense model")
        return None
    cost = cost_model(run, cluster, profiles)
    world = cluster.world_size
    for pp in divisors(num_nodes(cluster)):
        layers = even_split(model.num_layers, pp)
        if layers is None or world % pp:
            continue
        dp = world // pp
        if gbs % dp:
            continue
        ep = max(e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256)
                 if e <= (model.num_experts or 1) and (model.num_experts or 1) % e == 0 and dp % e == 0)
        members = stage_members(cluster, dp, pp)
        if members is None:
            continue
        priced = least_recompute(
            cost, run,
            lambda rc: build_plan(tp=1, cp=1, ep=ep, etp=1, mbs=1, gbs=gbs, dp=dp, types=[m[0] for m in members],
                                  layers=layers, recompute=rc, runtime=runtime),
            members)
        if priced is not None:
            if notes is not None:
                notes.append(f"DeepSpeed-MoE/Tutel-style: EP={ep} DP={dp} PP={pp}")
                notes.extend(priced.notes)
            return priced
    if notes is not None:
        notes.append("DeepSpeed-MoE/Tutel-style: does not fit with EP+DP at any pipeline depth tried")
    return None


def plan_deepspeed(run: MegatronRun, cluster: ClusterSpec, profiles, **kw) -> Plan | None:
    """DeepSpeed-MoE / Tutel-style plan, or None."""
    priced = search_deepspeed(run, cluster, profiles, **kw)
    return priced.plan if priced else None
