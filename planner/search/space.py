"""The search space: which global choices G and which stage options the search considers (README,
"The search space").  Megatron's and FlagScale's rules come from planner/megatron/rules.py (its
booleans); everything else here is the documented space: the menus of degree values below.

megatron runtime: G = (TP, CP, EP, ETP, DP, micro-batch, PP, VPP, recompute); a stage option is a
device type.  flagscale runtime: G = (TP, CP=1, EP, ETP, samples per micro-batch B, PP, recompute
mode); a stage option is (device type, DP, recompute), VPP = 1.

A plan may leave GPUs idle: DP need not divide the cluster, and the stages need not use every GPU
of a type.  Nothing here prunes: the search's prunings (planner/search/pruning.py) are named and
switchable.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Iterator

from planner.megatron import rules
from planner.runtime import Runtime, runtime_of
from planner.schemas.cluster import ClusterSpec, NodeGroup, pool_members
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Recompute
from planner.schemas.search import GlobalChoice, StageOption
from planner.schemas.training import TrainingSpec

__all__ = ["GlobalChoice", "StageOption", "SearchSpace", "enumerate_globals", "stage_options", "pipeline_in_space",
           "shared_pools", "pooled_view",
           "recompute_ladder", "RECOMPUTE_LADDER", "STAGE_RECOMPUTE_LADDER", "FLAGSCALE_SELECTIVE"]


# Recompute settings ordered from least to most recompute (the megatron runtime's menu, and the
# memory-pruning ladder).
RECOMPUTE_LADDER: tuple[Recompute, ...] = (
    Recompute.none(),
    Recompute.selective(("core_attn",)),
    Recompute.selective(("core_attn", "layernorm", "moe_act")),
    Recompute.full("block", 1),
    Recompute.full("block", 2),
    Recompute.full("block", 4),
    Recompute.full("uniform", 1),
)

# flagscale: what each stage may choose on its own (FlagScale's per-stage lists switch full
# recompute on or off per stage) ...
STAGE_RECOMPUTE_LADDER: tuple[Recompute, ...] = (
    Recompute.none(),
    Recompute.full("uniform", 1),
)
# ... and the selective settings, each one shared by every stage (FlagScale's rule).
FLAGSCALE_SELECTIVE: tuple[Recompute, ...] = (
    Recompute.selective(("core_attn", "layernorm", "moe_act")),
)


@dataclass(frozen=True)
class SearchSpace:
    """The menus of values the search tries (narrow them for a test or a baseline).

    TP and ETP stay inside a node (the cost model prices them on intra-node links only).  `ep`
    None: every divisor of the expert count.  `etp` None: the TP menu.  `contiguous_types` None:
    the runtime's own rule (flagscale: each device type's stages form one block; megatron: free)."""

    runtime: str = "megatron"
    tp: tuple[int, ...] = (1, 2, 4, 8)
    cp: tuple[int, ...] = (1, 2, 4, 8)
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] = (1, 2, 4)
    vpp: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    max_pp: int | None = None
    recompute: tuple[Recompute, ...] = field(default_factory=lambda: RECOMPUTE_LADDER)
    # flagscale: the per-stage choices (none/full; a selective entry here becomes a shared mode)
    stage_recompute: tuple[Recompute, ...] = field(default_factory=lambda: STAGE_RECOMPUTE_LADDER)
    # flagscale: selective settings shared by every stage
    selective: tuple[Recompute, ...] = field(default_factory=lambda: FLAGSCALE_SELECTIVE)
    contiguous_types: bool | None = None
    # megatron: stages whose DP spans a pool of two device types that can share one job (shared_pools)
    shared_types: bool = True

    def with_(self, **kw) -> "SearchSpace":
        return replace(self, **kw)

    @property
    def contiguous(self) -> bool:
        """Whether each device type's stages must form one contiguous block of the pipeline."""
        return self.runtime_spec.contiguous_types or bool(self.contiguous_types)

    @property
    def runtime_spec(self) -> Runtime:
        """What the runtime can express (planner/runtime.py)."""
        return runtime_of(self.runtime)


def shared_pools(cluster: ClusterSpec, profiles, precision: str) -> list[str]:
    """Pooled stage types (planner/schemas/cluster.py POOL_SEP) for the megatron runtime on this cluster:
    pairs of device types that can share one job (ProfileSet.pool: one vendor, both run the precision, the
    member with the least memory also the slowest, so that a stage whose DP spans both runs at its speed
    and fits in its memory) with equal GPUs per node and no scale-up domain beyond the host.  Disjoint pairs, the closest in speed first."""
    candidates = []
    types = cluster.device_types
    for i, a in enumerate(types):
        for b in types[i + 1:]:
            pool = profiles.pool(a, b, precision)
            ga, gb = cluster.group_of(a), cluster.group_of(b)
            if pool is None or ga.gpus_per_node != gb.gpus_per_node or ga.domain_gpus != ga.gpus_per_node \
                    or gb.domain_gpus != gb.gpus_per_node:
                continue
            low, high = (profiles.device(m).peak_flop_per_s(precision) for m in pool_members(pool))
            candidates.append((high / low, pool))
    out: list[str] = []
    for _, pool in sorted(candidates):
        if not any(set(pool_members(pool)) & set(pool_members(p)) for p in out):
            out.append(pool)
    return out


def pooled_view(cluster: ClusterSpec, profiles, pools: list[str]) -> ClusterSpec:
    """The cluster as the search sees it with `pools`: each pool's node groups as one group of the pooled
    type, where the first member was, its inter-node link the slowest between members."""
    groups: list[NodeGroup] = []
    for pool in pools:
        members = pool_members(pool)
        nodes = sum(g.num_nodes for g in cluster.groups if g.device_type in members)
        limiting = cluster.group_of(profiles.limiting_member(pool))
        groups.append(NodeGroup(device_type=pool, num_nodes=nodes, gpus_per_node=limiting.gpus_per_node,
                                intra_node_bandwidth_gb_per_s=limiting.intra_node_bandwidth_gb_per_s,
                                inter_node_kind=limiting.inter_node_kind,
                                inter_node_bandwidth_gb_per_s=profiles.cross_link(pool, pool, cluster).bandwidth_gb_per_s))
    pooled = {m for p in pools for m in pool_members(p)}
    order = {p: min(k for k, g in enumerate(cluster.groups) if g.device_type in pool_members(p)) for p in pools}
    rest = [(k, g) for k, g in enumerate(cluster.groups) if g.device_type not in pooled]
    merged = sorted(rest + [(order[p], g) for p, g in zip(pools, groups)], key=lambda kg: kg[0])
    return cluster.model_copy(update={"groups": tuple(g for _, g in merged)})


def pipeline_in_space(num_layers: int, pp: int, vpp: int) -> bool:
    """The space's own bound on (PP, VPP), not a Megatron rule: every pipeline rank holds a decoder
    layer (PP <= layers) and, with interleaving, every virtual chunk does too, except an embedding-only
    first chunk and a loss-only last chunk (PP * VPP <= layers + 2: NVIDIA's `E|(t|)*94L` on PP 32,
    VPP 3).  Megatron itself allows empty chunks."""
    return pp <= num_layers and (vpp == 1 or pp * vpp <= num_layers + 2)


def recompute_ladder(model: ModelSpec, allowed: tuple[Recompute, ...], training: TrainingSpec | None = None
                     ) -> list[Recompute]:
    """The recompute settings of `allowed` that Megatron accepts for this model and the run's flags
    (rules.recompute_allowed): a selective setting drops the modules the model cannot recompute (moe_act
    without a MoE model with grouped GEMM, mla_up_proj without MLA; moe_act and layernorm under FP8 with
    delayed scaling), and settings still refused (full recompute with the expert-parallel overlap or CUDA
    graphs, ...) are left out."""
    out = []
    for r in allowed:
        if r.granularity == "selective":
            drop = set()
            if not (model.is_moe and model.moe_grouped_gemm):
                drop.add("moe_act")
            if not model.multi_latent_attention:
                drop.add("mla_up_proj")
            if training is not None and training.precision == "fp8" and training.fp8_recipe == "delayed":
                drop |= {"moe_act", "layernorm"}
            kept = tuple(m for m in r.modules if m not in drop)
            if not kept:
                continue
            r = Recompute.selective(kept)
        if r not in out and rules.recompute_allowed(model, training, r):
            out.append(r)
    return out


def flagscale_modes(model: ModelSpec, space: SearchSpace, training: TrainingSpec | None = None
                    ) -> list[Recompute | None]:
    """flagscale recompute modes: None (each stage none or full on its own), then each selective
    setting shared by every stage."""
    shared = [r for r in space.selective] + [r for r in space.stage_recompute if r.granularity == "selective"]
    return [None] + recompute_ladder(model, tuple(shared), training)


def stage_ladder(model: ModelSpec, space: SearchSpace, training: TrainingSpec | None = None) -> list[Recompute]:
    """flagscale: the per-stage recompute choices (selective ones are shared modes instead)."""
    return [r for r in recompute_ladder(model, space.stage_recompute, training) if r.granularity != "selective"]


def expert_degrees(model: ModelSpec, space: SearchSpace, tp: int) -> list[tuple[int, int]]:
    """(EP, ETP) pairs the rules allow with this TP (folding is checked per stage size)."""
    if not model.is_moe:
        return [(1, tp)]
    eps = space.ep or tuple(e for e in range(1, model.num_experts + 1) if model.num_experts % e == 0)
    etps = space.etp or space.tp
    return [(ep, etp) for ep in eps if rules.ep_allowed(model, ep)
            for etp in etps if rules.etp_allowed(model, tp, etp)]


def _hosting_types(cluster: ClusterSpec, tp: int, domain_gpus: dict[str, int]) -> dict[str, int]:
    """GPUs per device type for the types a TP group fits in (one node: the GPUs sharing the intra-node link)."""
    return {h: n for h, n in cluster.gpus_by_type().items() if tp <= domain_gpus[h]}


@dataclass(frozen=True)
class Shape:
    """A set of global choices that differ only in PP, VPP and recompute: the degrees that fix the
    stage options' per-layer figures.  `base` is its first choice (first pipeline, first recompute),
    whose other degrees (runtime, TP, CP, EP, ETP, micro-batch, DP, first DP) are the shape's;
    `pipelines` are the (PP, VPP) pairs the rules allow with it, `recomputes` the recompute
    settings (megatron: the global one; flagscale: the modes)."""

    base: GlobalChoice
    pipelines: tuple[tuple[int, int], ...]
    recomputes: tuple[Recompute | None, ...]

    def choice(self, pp: int, vpp: int, recompute: Recompute | None) -> GlobalChoice:
        b = self.base
        return GlobalChoice(b.runtime, b.tp, b.cp, b.ep, b.etp, b.mbs, pp, vpp, b.dp0, recompute, first_dp=b.first_dp)

    @property
    def size(self) -> int:
        """The number of global choices this shape stands for."""
        return len(self.pipelines) * len(self.recomputes)

    def choices(self) -> Iterator[GlobalChoice]:
        for pp, vpp in self.pipelines:
            for rc in self.recomputes:
                yield self.choice(pp, vpp, rc)


def enumerate_shapes(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, space: SearchSpace, domain_gpus: dict[str, int]
) -> Iterator[Shape]:
    """Every shape of the space with at least one global choice that keeps the rules and has room
    for its stages."""
    gbs = training.global_batch_size
    n_layers = model.num_layers
    ladder = tuple(recompute_ladder(model, space.recompute, training))
    modes = tuple(flagscale_modes(model, space, training))
    flags_ok = rules.degree_flags_check(model, training)
    overlap_p2p = training.megatron.overlap_p2p_comm
    tied = rules.flagscale_tied_embeddings(model, training)
    for tp in space.tp:
        if not rules.tp_allowed(model, tp) or not rules.runtime_tp_ok(space.runtime, model, tp):
            continue
        hosts = _hosting_types(cluster, tp, domain_gpus)
        if not hosts:
            continue
        for cp in space.cp:
            if not rules.cp_allowed(model, cp) or not rules.runtime_degrees_ok(space.runtime, cp, 1):
                continue
            if not rules.sequence_split_ok(model, tp, cp):
                continue
            max_dp = max(n // (tp * cp) for n in hosts.values())
            if max_dp < 1:
                continue
            for ep, etp in expert_degrees(model, space, tp):
                if space.runtime_spec.per_stage_meshes:
                    yield from _flagscale_shapes(model, space, hosts, gbs, tp, cp, ep, etp, modes, tied, flags_ok)
                    continue
                for mbs in space.mbs:
                    for dp in batch_dps(gbs, mbs, max_dp):
                        if not rules.batch_ok(gbs, mbs, dp) or not rules.expert_folding_ok(tp, cp, dp, ep, etp):
                            continue
                        s = tp * cp * dp
                        max_stages = sum(n // s for n in hosts.values())
                        pipelines = tuple(
                            (pp, vpp) for pp in range(1, min(n_layers, max_stages, space.max_pp or 10**9) + 1)
                            for vpp in space.vpp
                            if rules.runtime_degrees_ok(space.runtime, cp, vpp)
                            and rules.interleave_ok(gbs, mbs, dp, pp, vpp, overlap_p2p)
                            and pipeline_in_space(n_layers, pp, vpp)
                            and (flags_ok is None or flags_ok(tp, cp, ep, etp, dp, pp, vpp)))
                        if pipelines:
                            base = GlobalChoice("megatron", tp, cp, ep, etp, mbs, *pipelines[0], dp,
                                                ladder[0] if ladder else None)
                            yield Shape(base, pipelines, ladder)


def enumerate_globals(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, space: SearchSpace, domain_gpus: dict[str, int]
) -> Iterator[GlobalChoice]:
    """Every global choice of the space that keeps the rules and has room for its stages (the
    choices of every shape).  Yields in no particular order; the driver orders them by a bound."""
    for shape in enumerate_shapes(model, training, cluster, space, domain_gpus):
        yield from shape.choices()


def batch_dps(gbs: int, mbs: int, max_dp: int) -> list[int]:
    """The DPs up to `max_dp` that a global batch allows with micro-batch `mbs` (GBS % (mbs*DP) == 0,
    rules.batch_ok): the divisors of GBS/mbs, found in O(sqrt(GBS)) steps, not max_dp (100,000 GPUs
    would make building the space outlast any --time-limit)."""
    if gbs % mbs:
        return []
    n = gbs // mbs
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({d for s in small for d in (s, n // s) if d <= max_dp})


@functools.lru_cache(maxsize=4096)
def fillable(sizes: tuple[int, ...], budget: int) -> int:
    """The most of `budget` that stages of the given sizes (any number of each) add up to: flagscale stages of
    32, 64 or 128 GPUs (every stage's DP divides the samples of a micro-batch, a power of two when GBS is)
    fill 320 of 344 GPUs.  No plan's stages of one device type use more of its GPUs, so this is the budget
    the bounds may take (planner/search/prices.py), and the reason the rest stays idle (planner/api.py)."""
    step = math.gcd(*sizes)
    units = budget // step
    reduced = sorted({s // step for s in sizes})
    if reduced[0] == 1:
        return units * step
    reach = bytearray(units + 1)
    reach[0] = 1
    for v in range(reduced[0], units + 1):
        reach[v] = any(reach[v - s] for s in reduced if s <= v)
    return max(v for v in range(units + 1) if reach[v]) * step


def _flagscale_dps(hosts: dict[str, int], space: SearchSpace, tp: int, cp: int, ep: int, etp: int, b: int
                   ) -> dict[str, list[int]]:
    """Per device type, the stage DPs that samples-per-micro-batch B allows: B % DP == 0, a rank's
    micro-batch B / DP in the menu, folding."""
    return {h: [dp for dp in sorted({b // m for m in space.mbs if b % m == 0})  # B / DP in the menu
                if dp <= n // (tp * cp) and rules.flagscale_stage_mbs_ok(b, dp)
                and rules.expert_folding_ok(tp, cp, dp, ep, etp)]
            for h, n in hosts.items()}


def flagscale_stage_gpus(space: SearchSpace, tp: int, cp: int, ep: int, etp: int, samples: int, budget: int
                         ) -> tuple[int, ...]:
    """The GPUs (TP x CP x DP) a flagscale stage may take on a device type of `budget` GPUs when a micro-batch
    holds `samples` samples: every stage splits them evenly over its DP, a micro-batch of the menu per GPU."""
    return tuple(tp * cp * dp for dp in _flagscale_dps({"": budget}, space, tp, cp, ep, etp, samples)[""])


def _flagscale_shapes(model, space, hosts, gbs, tp, cp, ep, etp, modes, tied, flags_ok=None) -> Iterator[Shape]:
    """flagscale shapes for one (TP, CP, EP, ETP): every B with a stage DP on some type."""
    bs = sorted({dp * m for h, n in hosts.items() for m in space.mbs for dp in batch_dps(gbs, m, n // (tp * cp))
                 if rules.expert_folding_ok(tp, cp, dp, ep, etp)})
    for b in bs:
        if not rules.batch_ok(gbs, b, 1):
            continue
        dps = _flagscale_dps(hosts, space, tp, cp, ep, etp, b)
        max_stages = sum(n // (tp * cp * min(d)) for h, n in hosts.items() if (d := dps[h]))
        if not max_stages:
            continue
        pipelines = tuple((pp, 1) for pp in range(1, min(model.num_layers, max_stages, space.max_pp or 10**9) + 1)
                          if flags_ok is None or flags_ok(tp, cp, ep, etp, None, pp, 1))
        if not pipelines:
            continue
        firsts = sorted({d for ds in dps.values() for d in ds}) if tied else [None]
        for first in firsts:
            base = GlobalChoice("flagscale", tp, cp, ep, etp, b, *pipelines[0], 1, modes[0], first_dp=first)
            yield Shape(base, pipelines, modes)


def stage_options(
    g: GlobalChoice, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, space: SearchSpace,
    domain_gpus: dict[str, int],
) -> list[StageOption]:
    """The options a stage may take under G (stage 0 and the last stage may be narrower: see
    StageTables.first_stage_ok / last_stage_ok)."""
    hosts = _hosting_types(cluster, g.tp, domain_gpus)
    out: list[StageOption] = []
    if not g.per_stage_meshes:
        return [StageOption(h, g.dp0, g.recompute) for h, n in hosts.items() if g.stage_gpus <= n]
    rcs = [g.recompute] if g.recompute is not None else stage_ladder(model, space, training)
    for h, dps in _flagscale_dps(hosts, space, g.tp, g.cp, g.ep, g.etp, g.samples_per_microbatch).items():
        for dp in dps:
            for rc in rcs:
                out.append(StageOption(h, dp, rc))
    return out
