"""Shared pieces of the baseline planners: device ranking, stage-to-device mapping in cluster order,
Megatron's even layer split, pricing of stages that span device types, the least recompute that fits.

Every baseline plans under the one cost model (planner.cost.model.CostModel) so that its predicted
iteration time is comparable with HAPMoE's; the searches they run minimise the nominal time (`solve`'s
objective "nominal": the planners they stand for know nothing of the cost model's uncertainty), with the same
memory headroom.  Conventions used by all baselines:

* "cluster order": GPUs are numbered group by group in the order the cluster lists its node groups,
  and pipeline stage s owns GPUs [s*S, (s+1)*S) with S = TP*CP*DP (Megatron's default rank order
  with the nodes given to torchrun in that order).
* A stage whose GPUs span two device types cannot be expressed in our schema (a stage has one device
  type).  Synchronous data parallelism runs at the pace of its slowest member and holds the same
  shard on every member, so such a stage is priced as its slowest member type (by profiled per-layer
  time) and must fit in memory on every member type.  The returned Plan names the slowest type for
  that stage; `PricedPlan.mixed_stages` records which stages were approximated this way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from planner.cost.model import CostModel, GlobalShape, PlanCost, type_offsets
from planner.inputs.cluster import default_domain
from planner.megatron.rules import check_plan, tp_allowed
from planner.runtime import runtime_of
from planner.schemas.cluster import ClusterSpec, NodeGroup
from planner.schemas.model import ModelSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan, Recompute, StagePlan
from planner.search.space import RECOMPUTE_LADDER, recompute_ladder


@dataclass(frozen=True)
class PricedPlan:
    """A baseline's plan with its float cost; `mixed_stages` lists stages priced as their slowest member."""

    plan: Plan
    cost: PlanCost
    mixed_stages: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())


def cost_model(run: MegatronRun, cluster: ClusterSpec, profiles) -> CostModel:
    """The one evaluator bound to this run and cluster."""
    return CostModel(run.model, run.training, cluster, profiles)


def layer_time_s(cost: CostModel, device_type: str) -> float:
    """Forward+backward seconds of one decoder layer (the model's heaviest kind) on one GPU of
    `device_type` with TP=CP=EP=ETP=DP=1 and micro-batch 1: a profiled per-layer speed used to rank
    device types (smaller is faster)."""
    g = GlobalShape(tp=1, cp=1, ep=1, etp=1, vpp=1, mbs=1, gbs=cost.training.global_batch_size, dp0=1, pp=2,
                    sequence_parallel=False)
    kinds = cost.model.layer_is_moe
    j = kinds.index(True) if any(kinds) else 0
    core = cost.stage_core(g, device_type=device_type, start=j, end=j + 1, dp=1, recompute=Recompute.none(),
                           is_first=False, is_last=False)
    return core.time_s


def types_by_speed(cost: CostModel) -> list[str]:
    """The cluster's device types, fastest first (profiled per-layer time; ties by cluster order)."""
    types = list(cost.cluster.device_types)
    return sorted(types, key=lambda h: (layer_time_s(cost, h), types.index(h)))


def homogeneous_cluster(cluster: ClusterSpec, device_type: str, profiles) -> ClusterSpec:
    """A cluster of the same size whose GPUs are all `device_type` (nodes of that type's usual size
    when the size divides, else the original node shapes)."""
    world = cluster.world_size
    gpn = profiles.device(device_type).gpus_per_node
    if world % gpn == 0:
        groups = (NodeGroup(device_type=device_type, num_nodes=world // gpn, gpus_per_node=gpn,
                            scale_up_domain_gpus=default_domain(profiles, device_type, world // gpn, gpn)),)
    else:
        groups = tuple(NodeGroup(device_type=device_type, num_nodes=g.num_nodes, gpus_per_node=g.gpus_per_node,
                                 scale_up_domain_gpus=default_domain(profiles, device_type, g.num_nodes,
                                                                     g.gpus_per_node))
                       for g in cluster.groups)
    return ClusterSpec(name=f"{device_type}:{world}", groups=groups)


def num_nodes(cluster: ClusterSpec) -> int:
    return sum(g.num_nodes for g in cluster.groups)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def stage_members(cluster: ClusterSpec, stage_gpus: int, pp: int) -> list[tuple[str, ...]] | None:
    """Device types each of `pp` stages of `stage_gpus` GPUs spans, GPUs taken in cluster order
    (None if the cluster has too few GPUs)."""
    if stage_gpus * pp > cluster.world_size:
        return None
    gpu_types: list[str] = []
    for g in cluster.groups:
        gpu_types += [g.device_type] * g.num_gpus
    out = []
    for s in range(pp):
        members: list[str] = []
        for h in gpu_types[s * stage_gpus:(s + 1) * stage_gpus]:
            if h not in members:
                members.append(h)
        out.append(tuple(members))
    return out


def even_split(num_layers: int, pp: int) -> list[int] | None:
    """Megatron's split without a layout: num_layers / PP each; when PP does not divide, the middle
    stages take floor(L/PP) and --decoder-first/last-pipeline-num-layers give the first and last stage
    the rest (first the smaller half).  None when a stage would get no layer."""
    if pp < 1 or num_layers < pp:
        return None
    if num_layers % pp == 0:
        return [num_layers // pp] * pp
    per = num_layers // pp
    if pp == 2:
        return [num_layers // 2, num_layers - num_layers // 2]
    rest = num_layers - per * (pp - 2)
    first = rest // 2
    if first < 1:
        return None
    return [first] + [per] * (pp - 2) + [rest - first]


def tp_degrees(model: ModelSpec, max_tp: int, allowed: tuple[int, ...] = (1, 2, 4, 8)) -> list[int]:
    """TP degrees a practitioner would try: within a node and dividing heads / query groups."""
    return [t for t in allowed if t <= max_tp and tp_allowed(model, t)]


def ep_degrees(model: ModelSpec, limit: int) -> list[int]:
    """EP degrees dividing the number of experts, at most `limit` (1 for dense models)."""
    if not model.is_moe:
        return [1]
    e = model.num_experts or 1
    return [d for d in (1, 2, 4, 8, 16, 32, 64, 128, 256) if d <= limit and e % d == 0]


def ladder(model: ModelSpec, training=None) -> list[Recompute]:
    """Recompute settings from least to most recompute (the search's memory-pruning ladder)."""
    return recompute_ladder(model, RECOMPUTE_LADDER, training)


def build_plan(*, tp: int, cp: int, ep: int, etp: int, mbs: int, gbs: int, dp: int, types: list[str],
               layers: list[int], recompute: Recompute, vpp: int = 1, runtime: str = "megatron") -> Plan:
    """A Plan with one DP and one recompute for every stage (what every baseline plans), for `runtime`:
    upstream Megatron-LM, or FlagScale when the job spans vendors (profiles/runtimes.yaml); the runtime's
    rules (rule_problems) then refuse what it cannot run."""
    return Plan(runtime=runtime, tp=tp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs,
                sequence_parallel=tp > 1, stages=tuple(stage_plan(h, n, dp, recompute) for h, n in zip(types, layers)))


@lru_cache(maxsize=4096)
def stage_plan(device_type: str, num_layers: int, dp: int, recompute: Recompute) -> StagePlan:
    """One StagePlan per distinct stage (frozen, so plans share it): the enumerations build plans by the ten
    thousand, most of whose stages are alike."""
    return StagePlan(device_type=device_type, num_layers=num_layers, dp=dp, recompute=recompute)


def rule_problems(model: ModelSpec, plan: Plan, run: MegatronRun) -> list[str]:
    """Megatron / runtime rules the plan breaks (empty: none)."""
    return [f"{v.rule}: {v.message}" for v in check_plan(model, plan, run.training)]


def mixed_cluster(cluster: ClusterSpec, profiles, mixed_types: set[str]) -> ClusterSpec:
    """`cluster` with the inter-node bandwidth of every type in `mixed_types` capped at the slowest
    cross-type link among them: a DP ring that spans device types runs at its slowest hop."""
    types = sorted(mixed_types)
    cross = [profiles.cross_link(a, b, cluster).bandwidth_gb_per_s for i, a in enumerate(types) for b in types[i + 1:]]
    if not cross:
        return cluster
    cap = min(cross)
    groups = []
    for g in cluster.groups:
        if g.device_type in mixed_types:
            own = profiles.group_links(g)[1].bandwidth_gb_per_s
            g = g.model_copy(update={"inter_node_bandwidth_gb_per_s": min(own, cap)})
        groups.append(g)
    return cluster.model_copy(update={"groups": tuple(groups)})


def price_members(cost: CostModel, plan: Plan, members: list[tuple[str, ...]]) -> PricedPlan | None:
    """Price `plan` whose stage i spans the device types `members[i]`.  A mixed stage takes its slowest
    member type for compute, its DP traffic crosses the slowest cross-type link (the cluster's inter-node
    bandwidth of those types is capped at it, see mixed_cluster), and it must fit in memory on every
    member type.  None when memory overflows, or when a stage spans device types on a runtime whose
    meshes each hold one type (FlagScale)."""
    mixed = tuple(i for i, ms in enumerate(members) if len(ms) > 1)
    if mixed and runtime_of(plan.runtime).per_stage_meshes:
        return None
    if mixed:
        mixed_types = {h for i in mixed for h in members[i]}
        cost = cost.on_cluster(mixed_cluster(cost.cluster, cost.profiles, mixed_types))
    speed = {h: layer_time_s(cost, h) for ms in members for h in ms}
    slow = [max(ms, key=lambda h: speed[h]) for ms in members]
    priced = plan.model_copy(update={"stages": tuple(s.model_copy(update={"device_type": slow[i]})
                                                     for i, s in enumerate(plan.stages))})
    if not cost.fits(priced):  # the memory alone: a plan that cannot fit is not priced
        return None
    pc = cost.evaluate(priced)
    for h in {h for i in mixed for h in members[i]}:
        variant = priced.model_copy(update={"stages": tuple(
            s.model_copy(update={"device_type": h}) if (i in mixed and h in members[i]) else s
            for i, s in enumerate(priced.stages))})
        if not cost.fits(variant, stages=[i for i in mixed if h in members[i]]):
            return None
    notes = (f"stages {list(mixed)} span several device types; priced as their slowest member, DP over the "
             "slowest cross-type link",) if mixed else ()
    return PricedPlan(plan=priced, cost=pc, mixed_stages=mixed, notes=notes)


def least_recompute(cost: CostModel, run: MegatronRun, make, members: list[tuple[str, ...]]) -> PricedPlan | None:
    """The first recompute setting on the ladder for which `make(recompute)` (a Plan) obeys the rules
    and fits: the practitioner's "least recompute that fits"."""
    for rc in ladder(run.model, run.training):
        plan = make(rc)
        if rule_problems(run.model, plan, run):
            return None  # the rules do not depend on the recompute setting
        priced = price_members(cost, plan, members)
        if priced is not None:
            return priced
    return None


def better(a: PricedPlan | None, b: PricedPlan | None) -> PricedPlan | None:
    """The faster of two priced plans (None loses)."""
    if a is None:
        return b
    if b is None:
        return a
    return b if b.cost.iteration_time_s < a.cost.iteration_time_s else a


def min_bottleneck_split(cost: CostModel, plan: Plan) -> list[int] | None:
    """Layer counts per stage (same degrees, device types and recompute as `plan`) minimising the
    largest per-micro-batch stage time, each stage holding >= 1 layer and fitting in memory: bisection
    on the bottleneck over every achievable stage time.  None when no split fits (found from the stages'
    memory alone, before any stage is priced)."""
    n_layers = cost.model.num_layers
    pp = plan.pp
    g = GlobalShape.of(plan)
    stages = plan.stages
    offsets = type_offsets([(s.device_type, plan.tp * plan.cp * s.dp) for s in stages])

    @lru_cache(maxsize=None)
    def stage_time(i: int, start: int, end: int) -> float:
        prev_t = stages[i - 1].device_type if i > 0 else None
        next_t = stages[i + 1].device_type if i + 1 < pp else None
        return cost.stage(g, index=i, device_type=stages[i].device_type, start=start, end=end, dp=stages[i].dp,
                          recompute=stages[i].recompute, prev_type=prev_t, next_type=next_t,
                          prev_dp=stages[i - 1].dp if i > 0 else None,
                          next_dp=stages[i + 1].dp if i + 1 < pp else None, offset_gpus=offsets[i]).time_s

    @lru_cache(maxsize=None)
    def stage_fits(i: int, start: int, end: int) -> bool:
        """StageCost.fits of the stage `stage_time` prices, from its memory alone."""
        memory = cost.stage_memory(g, device_type=stages[i].device_type, start=start, end=end, dp=stages[i].dp,
                                   recompute=stages[i].recompute, is_first=i == 0, is_last=i + 1 == pp)
        return memory.fits_at(cost.inflight_microbatches(g, i))

    def over(i: int, start: int, end: int, cap_s: float | None) -> bool:
        """The stage does not fit, or takes longer than `cap_s` (None: no cap)."""
        return not stage_fits(i, start, end) or (cap_s is not None and stage_time(i, start, end) > cap_s * (1 + 1e-12))

    def feasible(cap_s: float | None) -> list[int] | None:
        """Greedy: each stage takes as many layers as fit under the cap (reserving one per later stage)."""
        out, start = [], 0
        for i in range(pp):
            left_for_rest = pp - i - 1
            best = 0
            hi = n_layers - start - left_for_rest
            if i == pp - 1:
                if hi < 1 or over(i, start, n_layers, cap_s):
                    return None
                out.append(n_layers - start)
                return out
            for n in range(1, hi + 1):
                if over(i, start, start + n, cap_s):
                    break
                best = n
            if best == 0:
                return None
            out.append(best)
            start += best
        return None

    # without a cap the greedy fails only where memory binds, as it does under the largest stage time below (no
    # stage it tries is slower): then no split fits, and no stage is priced
    if feasible(None) is None:
        return None
    caps = sorted({stage_time(i, 0, n) for i in range(pp) for n in range(1, n_layers - pp + 2)})
    # stage time depends on the range only through its layer kinds, so (0, n) covers every value for
    # uniform models; add every value for mixed dense/MoE models by probing all ranges lazily if needed
    if len(set(cost.model.layer_is_moe)) > 1:
        caps = sorted({stage_time(i, a, b) for i in range(pp) for a in range(n_layers)
                       for b in range(a + 1, n_layers + 1)})
    lo, hi = 0, len(caps) - 1
    if feasible(caps[hi]) is None:
        # the greedy may still fail when memory, not time, binds: no split fits
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(caps[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    return feasible(caps[lo])


def geomean(values: list[float]) -> float:
    """Geometric mean of positive values (nan when empty)."""
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if not vals:
        return float("nan")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
