"""The cost model's mechanisms, each with the conditions a plan puts it in.

A *mechanism* is a group of the cost model's named time parts (planner/cost/model.py TIME_PARTS) that one kind of
evidence prices: dense GEMMs, attention, expert GEMMs, memory-bound passes, expert dispatch, the TP/CP/DP
collectives, pipeline sends, the host's overheads and the recomputed forward.  Each also names the correction
kinds (planner/profile_tables.py) that scale its seconds: what `calibrate` fits when it reads trial logs.

A mechanism's *conditions* in one stage of a plan (`Conditions`) are the axes along which its evidence does or
does not carry over: categorical axes that must match a calibration run exactly, and numeric axes that must lie
near the range the runs cover (planner/uncertainty.py `Region`).  The axes, per mechanism:

    mechanism         categorical axes                                      numeric axes
    gemm              device family, precision recipe                       -
    attention         device family, kernel                                  sequence per CP rank
    attention_dropout device family, kernel                                  -
    expert_gemm       device family, precision recipe, routing               tokens per expert, local experts
    memory_bound      device family                                          -
    expert_dispatch   device, dispatcher/backend, EP inside/across nodes     GB/s between nodes (across nodes)
                      and over which link kind, routing (forced or real)
    collectives       device, TP and DP inside/across nodes, link kinds      GB/s between nodes (across nodes)
    pipeline_sends    devices of the two stages, inside/across nodes, link   GB/s between nodes (across nodes)
                      kind, schedule (1F1B or interleaved)
    host              device family                                          -
    recompute         recompute granularity                                  -
    pipeline_schedule 1F1B, or interleaved with equal or unequal chunks      -

Every mechanism but the pipeline's also has the categorical axis `unpriced`: the run's flags that change its time
without a price (planner/megatron/flags.py UNPRICED_IN: --deterministic-mode, attention sinks, a Mamba hybrid
pattern, ...).  It is matched flag by flag, not as a whole (planner/uncertainty.py `Region`): a plan is measured
there when every one of its unpriced flags was in some calibration run of that mechanism, whose fitted constants
then carry the flag's effect; one no run had leaves the mechanism unmeasured, and the output names the flag.

`pipeline_schedule` is the stall of Megatron's interleaved schedule on a rank whose virtual chunks hold unequal
layer counts (planner/cost/model.py `chunk_stall_layers`, from the schedule's simulation); no calibration run has
such chunks, so a plan that leans on it is extrapolated (planner/cost/ranges.py quotes the plan's own simulation).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.layer import gathers_qkv
from planner.megatron.flags import UNPRICED_IN
from planner.megatron.layout import plan_layout
from planner.profile_tables import TIME_CORRECTION_KINDS
from planner.schemas.cluster import pool_members
from planner.schemas.plan import Recompute

FP8_KINDS = ("fp8_tensorwise", "fp8_blockwise", "fp8_mxfp8")


@dataclass(frozen=True)
class Mechanism:
    """One mechanism: its name, how the output names it, the time parts it carries, the correction kinds that
    scale them, and how its conditions read (`conditions`: a format string over the conditions' axes)."""

    name: str
    words: str
    parts: tuple[str, ...]
    kinds: tuple[str, ...]
    conditions: str


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism("gemm", "dense GEMMs",
              ("attention_gemm", "mlp_gemm", "shared_expert_gemm", "embedding", "logits_loss", "mtp_proj"),
              ("gemm",) + FP8_KINDS, "dense GEMMs in {precision} on {device}"),
    Mechanism("attention", "attention", ("attention_core",), ("attention",),
              "{kernel} attention on {device} at {sequence_chunk} tokens per sequence chunk"),
    Mechanism("attention_dropout", "attention dropout", ("attention_dropout",), (),
              "{kernel} attention's dropout on {device}"),
    Mechanism("expert_gemm", "expert GEMMs", ("expert_gemm",), ("grouped_gemm",),
              "expert GEMMs in {precision} on {device} at {tokens_per_expert} tokens per expert and "
              "{local_experts} local experts, {routing}"),
    Mechanism("memory_bound", "memory-bound passes", ("router_permute", "fp8_cast", "elementwise", "optimizer"),
              ("memory_bound",), "memory-bound passes on {device}"),
    Mechanism("expert_dispatch", "expert dispatch", ("ep_comm",),
              ("dispatch_alltoall", "dispatch_flex", "dispatch_allgather"),
              "{dispatcher} dispatch with EP {ep} on {device}, {routing}"),
    Mechanism("collectives", "TP/CP/DP collectives", ("tp_comm", "cp_comm", "fsdp_comm", "dp_sync"),
              ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"),
              "TP/CP/DP collectives on {device}: TP {tp}, DP {dp}"),
    Mechanism("pipeline_sends", "pipeline sends", ("pp_comm",), ("p2p",),
              "{schedule} pipeline sends {link} between {devices}"),
    Mechanism("host", "host overhead", ("host_overhead", "iteration_overhead"),
              ("host_overhead", "iteration_overhead"), "host overhead on {device}"),
    Mechanism("recompute", "recomputed forward", ("recompute",), (), "recomputed forward ({recompute} recompute)"),
    Mechanism("pipeline_schedule", "pipeline schedule", ("chunk_stall",), (), "{schedule}"),
)
"""Every mechanism (a test checks that each time part and each time correction kind belongs to exactly one)."""
BY_NAME: dict[str, Mechanism] = {m.name: m for m in MECHANISMS}
MECHANISM_OF_PART: dict[str, str] = {p: m.name for m in MECHANISMS for p in m.parts}
MECHANISM_OF_KIND: dict[str, str] = {k: m.name for m in MECHANISMS for k in m.kinds if k in TIME_CORRECTION_KINDS}

DEVICE_FAMILIES: dict[str, str] = {
    **{d: "H100/H800/H200/H20" for d in ("H100", "H800", "H200", "H20")},
    **{d: "A100/A800" for d in ("A100", "A100-40GB", "A800")},
}
"""Parts that run the same kernels (the calibration fit's device groups); any other device is its own family."""


def device_family(device_type: str) -> str:
    """The family of a device type; a pooled type's ("H100+H200") when its members share one."""
    families = {DEVICE_FAMILIES.get(m, m) for m in pool_members(device_type)}
    return families.pop() if len(families) == 1 else device_type


@dataclass(frozen=True)
class Conditions:
    """One mechanism's conditions in one place of a plan: categorical axes (`key`, matched exactly) and numeric
    axes (`numbers`, matched within a slack of the calibration runs' range)."""

    mechanism: str
    key: tuple[tuple[str, str], ...]
    numbers: tuple[tuple[str, float], ...] = ()

    def words(self) -> str:
        """The conditions as a user reads them: "DeepEP dispatch with EP across nodes (infiniband) on H100, real
        routing, 50 GB/s between nodes"."""
        return conditions_words(self.mechanism, dict(self.key), {n: f"{v:.0f}" for n, v in self.numbers})


UNPRICED = "unpriced"
"""The categorical axis of the run's unpriced flags that change a mechanism's time: their names, ", "-joined, sorted;
absent when there are none."""
UNPRICED_SEP = ", "


def unpriced_axis(training, mechanism: str) -> tuple[tuple[str, str], ...]:
    """The `unpriced` axis of `mechanism` for a run with TrainingSpec `training` (none when no flag of the run
    changes its time unpriced)."""
    flags = [f for f in training.unpriced_flags if mechanism in UNPRICED_IN.get(f, ())]
    return ((UNPRICED, UNPRICED_SEP.join(flags)),) if flags else ()


def unpriced_of(key) -> frozenset[str]:
    """The flags a conditions key's `unpriced` axis names."""
    value = dict(key).get(UNPRICED, "")
    return frozenset(value.split(UNPRICED_SEP)) if value else frozenset()


BETWEEN_NODES = "GB/s between nodes"
"""The numeric axis of communication across nodes: the inter-node link's bandwidth (a cluster file may set it)."""


class _Blank(dict):
    """Format arguments where an axis the conditions lack (a cell written before the axis existed) reads as
    nothing."""

    def __missing__(self, name: str) -> str:
        return ""


def conditions_words(mechanism: str, key: dict[str, str], numbers: dict[str, str]) -> str:
    """A mechanism's conditions in words, numeric axes given as text (a value, or a range of values); those its
    format does not name follow it."""
    template = BY_NAME[mechanism].conditions
    text = " ".join(template.format_map(_Blank({**key, **numbers})).split()).replace(" 1 local experts", " 1 local expert")
    extra = [f"{v} {n}" for n, v in numbers.items() if "{" + n + "}" not in template]
    if key.get(UNPRICED):
        extra.append(f"with {key[UNPRICED]} (not priced)")
    return ", ".join([text] + extra)


def _node_links(cost, device_type: str):
    """(intra-node, inter-node) link of a device type's nodes on the cluster (its overrides applied); a pooled
    type's limiting member's."""
    try:
        return cost.profiles.group_links(cost.cluster.group_of(device_type))
    except KeyError:
        dev = cost.device(device_type)
        return dev.intra_node, dev.inter_node


def node_words(cost, device_type: str) -> tuple[str, str]:
    """What the words call a node for a device type: ("a node", "nodes") for one host, ("an NVLink domain",
    "NVLink domains") where the intra-node link spans hosts (GB200/GB300 NVL72 trays).  An EP group across four
    trays of one rack is not an 8-GPU host, and no calibration run measured one, so its conditions read apart."""
    try:
        host = cost.cluster.group_of(device_type).gpus_per_node
    except KeyError:
        return "a node", "nodes"
    return ("an NVLink domain", "NVLink domains") if cost.domain_gpus(device_type) > host else ("a node", "nodes")


def _placement(link, node: tuple[str, str] = ("a node", "nodes")) -> str:
    return f"inside {node[0]} ({link.intra.kind})" if link.inter is None else f"across {node[1]} ({link.inter.kind})"


def _tp_words(model, tp: int, link, node: tuple[str, str]) -> str:
    """TP's placement, and the QKV all-gather that fewer KV groups than TP ranks add (a mechanism of its own: no
    calibration run had it, so such plans read it as unmeasured)."""
    if tp <= 1:
        return "none"
    return _placement(link, node) + (", with the QKV all-gather of fewer KV groups than TP ranks"
                                     if gathers_qkv(model, tp) else "")


def _between_nodes(*links) -> tuple[tuple[str, float], ...]:
    """The bandwidth axis when some of `links` (LinkChoice) cross nodes."""
    crossing = [link.inter.bandwidth_gb_per_s for link in links if link.inter is not None]
    return ((BETWEEN_NODES, min(crossing)),) if crossing else ()


def precision_recipe(training) -> str:
    return f"fp8-{training.fp8_recipe}" if training.precision == "fp8" else training.precision


ROUTING_WORDS = {
    "forced": "forced balance", "dense": "forced balance", "capacity-padded": "experts padded to capacity",
    "capacity": "real routing, tokens dropped above capacity", "dropless": "real routing, dropless",
    "given": "real routing, a stated imbalance",
}
"""The routing regime (planner/cost/dispatch.py `Routing.regime`) as the evidence records it: forced balance
(`--moe-router-force-load-balancing`), every expert padded to its capacity, or the real router's loads, dropless
or clipped at a capacity factor (which drops tokens and moves the busiest rank's load: xtuner's capacity table)."""


def attention_kernel(training) -> str:
    """The attention kernel `--attention-backend` runs: Transformer Engine's choice (auto, fused: cuDNN's fused
    kernel on the GPUs the calibration measured), the FlashAttention package (flash), or explicit score GEMMs and a
    softmax (unfused, local)."""
    if training.unfused_attention:
        return "unfused"
    return "flash" if training.attention_backend == "flash" else "fused"


UNMEASURED_BALANCING_WORDS = {"none": ", no load balancing", "sinkhorn": ", Sinkhorn balancing"}
"""Added to real routing's words where the router's balancing is one no calibration run trained with (dispatch.py
`Routing.unmeasured_balancing`): nothing balancing it (its imbalance extrapolated at dispatch.py AUX_LOSS_MAX_PULL), or
Sinkhorn (priced as fully balanced, an assumption: dispatch.py SINKHORN_SOURCE).  The expert mechanisms' conditions
then read apart from the measured real routing, and the plan as extrapolated where they carry its time."""


def routing_words(cost) -> str:
    """The plan's routing regime in words (ROUTING_WORDS, and UNMEASURED_BALANCING_WORDS for real routing under a
    balancing no calibration run measured)."""
    r = cost.routing
    extra = r.unmeasured_balancing if r.regime in ("dropless", "capacity") else None
    return ROUTING_WORDS[r.regime] + (UNMEASURED_BALANCING_WORDS[extra] if extra else "")


def dispatcher_words(model) -> str:
    d = model.moe_token_dispatcher_type
    if d == "flex":
        return {"deepep": "DeepEP", "hybridep": "HybridEP"}.get(model.moe_flex_dispatcher_backend,
                                                                  model.moe_flex_dispatcher_backend)
    return d


def stage_conditions(cost, g, device_type: str, dp: int, recompute: Recompute) -> dict[str, Conditions]:
    """The conditions of every mechanism but the pipeline sends in one stage (`cost` a CostModel, `g` its
    GlobalShape).  They read of the stage its device type, DP, TP/CP/EP/ETP, sequence parallelism, samples per
    micro-batch (stage_mbs) and recompute granularity: planner/cost/ranges.py `part_factors` is memoised by these
    (a new reading here widens its key)."""
    model, tr = cost.model, cost.training
    fam = ("device", device_family(device_type))
    dev = ("device", device_type)
    links = cost.group_links(device_type, tp=g.tp, cp=g.cp, dp=dp, ep=g.ep, etp=g.etp)
    node = node_words(cost, device_type)
    precision = ("precision", precision_recipe(tr))
    routed = ("routing", routing_words(cost))
    sp = g.tp if g.sequence_parallel and g.tp > 1 else 1
    local_tokens = cost.stage_mbs(g, dp) * model.seq_length / g.cp / sp
    experts = max(1, (model.num_experts or 1) // g.ep)
    per_expert = local_tokens * g.etp * max(1, model.moe_router_topk or 1) / experts
    out = [
        Conditions("gemm", (fam, precision)),
        Conditions("attention", (fam, ("kernel", attention_kernel(tr))), (("sequence_chunk", model.seq_length / g.cp),)),
        Conditions("attention_dropout", (fam, ("kernel", attention_kernel(tr)))),
        Conditions("expert_gemm", (fam, precision, routed),
                   (("tokens_per_expert", per_expert), ("local_experts", float(experts)))),
        Conditions("memory_bound", (fam,)),
        Conditions("expert_dispatch", (("dispatcher", dispatcher_words(model)), ("ep", _placement(links.ep, node)), dev,
                                       routed), _between_nodes(links.ep)),
        Conditions("collectives", (("tp", _tp_words(model, g.tp, links.tp, node)),
                                   ("dp", _placement(links.dp, node) if g.cp * dp > 1 else "none"), dev),
                   _between_nodes(*([links.tp] if g.tp > 1 else []), *([links.dp] if g.cp * dp > 1 else []))),
        Conditions("host", (fam,)),
        Conditions("recompute", (("recompute", recompute.granularity),)),
    ]
    return {c.mechanism: Conditions(c.mechanism, c.key + unpriced_axis(tr, c.mechanism), c.numbers) for c in out}


def send_conditions(cost, g, a_type: str, a_dp: int, b_type: str) -> Conditions:
    """The conditions of the pipeline sends between a stage of `a_type` (DP `a_dp`) and the next.  A stage owns
    TP x CP x DP consecutive ranks (Megatron's order), so a send stays inside a node only when the whole
    pipeline fits in one node."""
    schedule = ("schedule", "interleaved" if g.vpp > 1 else "1F1B")
    if a_type != b_type:
        link = cost.cross_link(a_type, b_type)
        return Conditions("pipeline_sends", (("devices", f"{a_type} and {b_type}"), ("link", f"across nodes "
                          f"({link.kind})"), schedule), ((BETWEEN_NODES, link.bandwidth_gb_per_s),))
    intra, inter = _node_links(cost, a_type)
    inside, across = node_words(cost, a_type)
    if g.pp * g.tp * g.cp * a_dp <= cost.domain_gpus(a_type):
        return Conditions("pipeline_sends", (("devices", a_type), ("link", f"inside {inside} ({intra.kind})"), schedule))
    return Conditions("pipeline_sends", (("devices", a_type), ("link", f"across {across} ({inter.kind})"), schedule),
                      ((BETWEEN_NODES, inter.bandwidth_gb_per_s),))


def chunk_pattern(plan) -> tuple[int, ...]:
    """The decoder layers per virtual chunk of the plan's fullest pipeline rank (one chunk under 1F1B), from its
    layout (planner/megatron/layout.py `plan_layout`: its own, else the planner's split, virtual stage i on rank
    i % PP)."""
    counts = [stage.count("t") for stage in plan_layout(plan)]
    pp, v = plan.pp, plan.vpp
    ranks = [[counts[c * pp + r] for c in range(v)] for r in range(pp)]
    return tuple(max(ranks, key=sum))


def schedule_conditions(g, num_layers: int) -> Conditions:
    """The conditions of a stage's pipeline schedule (the `pipeline_schedule` mechanism) with `num_layers` decoder
    layers: 1F1B, or interleaved with equal or unequal virtual chunks (GlobalShape `g`)."""
    if g.vpp == 1:
        words = "1F1B pipeline schedule"
    elif num_layers % g.vpp == 0:
        words = "interleaved pipeline schedule with equal virtual chunks"
    else:
        words = "interleaved pipeline schedule with unequal virtual chunks"
    return Conditions("pipeline_schedule", (("schedule", words),))
