"""Why nothing fits: the message a user gets when the search finds no plan that fits in memory.

It prices the most memory-friendly layout the rules allow, one stage per TP group of GPUs on every
device type (DP 1, so no weight or optimizer state is replicated), the largest TP and EP, full
recompute and micro-batch 1, with the roomiest device types first (stage 0 holds the most
micro-batches in flight).  Stages are filled in order, each with as many layers as fit; the last
stage takes what is left.  The message names the first stage that is short and by how much, from
the cost model's own memory figures, and says how many more GPUs would hold the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.model import CostModel, GlobalShape
from planner.errors import InfeasibleError, SearchTimeLimitError
from planner.inputs.cluster import describe_cluster
from planner.megatron.rules import tp_allowed
from planner.schemas.plan import Recompute
from planner.search.space import SearchSpace

GIB = 2**30


FULL_RECOMPUTE = Recompute.full("uniform", 1)


@dataclass(frozen=True)
class FriendlyLayout:
    """The most memory-friendly layout the rules allow on a cluster (the module's docstring says which)."""

    tp: int
    shape: GlobalShape
    slots: list[str]  # each stage's device type, the roomiest types first
    types: list[str]  # the cluster's device types, roomiest first
    text: str  # the layout in words


@dataclass(frozen=True)
class Overflow:
    """The first stage of the friendliest layout that does not fit: its index, type, layers and bytes."""

    stage: int
    device_type: str
    start: int
    layers: int
    need_bytes: float
    capacity_bytes: float


def explain_infeasible(cost: CostModel, space: SearchSpace, n_enumerated: int) -> InfeasibleError:
    model = cost.model
    cluster = describe_cluster(cost.cluster, cost.profiles)
    if not n_enumerated:
        return InfeasibleError(
            f"no parallel configuration of {model.name} satisfies Megatron's rules on {cluster}",
            [batch_hint(cost.training.global_batch_size, space.mbs), "use more GPUs"],
        )
    layout = friendliest_layout(cost, space)
    over = first_overflow(cost, layout)
    if over is not None:
        return InfeasibleError(overflow_text(cost, layout, over),
                               _hints(cost, layout.shape, layout.slots, layout.types, layout.tp, FULL_RECOMPUTE,
                                      model.num_layers - over.start, over.stage))
    return InfeasibleError(
        f"no plan for {model.name} on {cluster} fits: the most memory-friendly layout ({layout.text}) fits in "
        f"memory by itself, but no configuration passing the search space's rules does",
        ["widen the search space (--mbs, the allowed TP/EP, more pipeline stages)", "use more GPUs"],
    )


def batch_hint(gbs: int, mbs_menu: tuple[int, ...]) -> str:
    """What to check about the batch when no configuration passes the rules: the global batch must be a multiple
    of micro-batch x DP; micro-batches of the menu it is no multiple of are named with the flags that set them."""
    odd = [m for m in mbs_menu if gbs % m]
    if odd and len(odd) == len(mbs_menu):
        return (f"the global batch ({gbs}, --gbs) is no multiple of the micro-batch ({', '.join(map(str, odd))}, "
                "--mbs): give a global batch that micro-batch x DP divides, or another --mbs")
    return (f"check the global batch ({gbs}, --gbs): it must be a multiple of micro-batch x DP for a DP these GPUs "
            f"allow (micro-batch {', '.join(map(str, mbs_menu))})")


def fits_nowhere(cost: CostModel, space: SearchSpace) -> str | None:
    """Why the model fits nowhere on the cost model's cluster, cheaply (one layout priced, no search): the
    message explain_infeasible gives when the most memory-friendly layout overflows a stage; None where it fits
    (which does not promise that a plan passing every rule does)."""
    layout = friendliest_layout(cost, space)
    over = first_overflow(cost, layout)
    return None if over is None else overflow_text(cost, layout, over)


def time_limit_error(cost: CostModel, space: SearchSpace, what: str) -> SearchTimeLimitError:
    """The time limit ran out before any plan was found (`what`: the limit and how far the search got).  Where even
    the most memory-friendly layout overflows (fits_nowhere: one layout priced, no search) the likely cause is that
    none fits, which more time does not change: the message says so, with what would help, instead of only 'raise
    --time-limit' (DeepSeek-V3 on 128 H100: 60 s ran out, 229 s proved that nothing fits)."""
    layout = friendliest_layout(cost, space)
    over = first_overflow(cost, layout)
    if over is None:
        return SearchTimeLimitError(f"no plan found within {what}; raise --time-limit")
    hints = _hints(cost, layout.shape, layout.slots, layout.types, layout.tp, FULL_RECOMPUTE,
                   cost.model.num_layers - over.start, over.stage)
    return SearchTimeLimitError(f"no plan found within {what}, and likely none fits, so more time would not help: "
                                f"{overflow_text(cost, layout, over)}; what would: {'; '.join(hints)}")


def friendliest_layout(cost: CostModel, space: SearchSpace) -> FriendlyLayout:
    """The largest TP within a scale-up domain (of the space's), the largest EP dividing it, DP 1, micro-batch 1,
    one stage per TP group of GPUs (as many as there are layers), the roomiest device types first."""
    model, budget = cost.model, cost.cluster.gpus_by_type()
    gpn = min(cost.domain_gpus(h) for h in budget)
    tps = [t for t in space.tp if t <= gpn and tp_allowed(model, t) and any(n >= t for n in budget.values())]
    tp = max(tps) if tps else 1
    experts = model.num_experts or 1
    ep = max(e for e in range(1, tp + 1) if experts % e == 0 and tp % e == 0) if model.is_moe else 1
    types = sorted(budget, key=lambda h: -cost.device(h).memory_gib)
    slots = [h for h in types for _ in range(budget[h] // tp)]
    pp = min(len(slots), model.num_layers)
    slots = slots[:pp]
    gs = GlobalShape(tp=tp, cp=1, ep=ep, etp=1, vpp=1, mbs=1, gbs=cost.training.global_batch_size, dp0=1, pp=pp,
                     sequence_parallel=tp > 1)
    # GPUs, not stages, per device type: each stage is one TP group of `tp` GPUs
    text = (f"TP={tp}, EP={ep}, DP=1, full recompute, micro-batch 1, {pp} stage{'s' if pp != 1 else ''} "
            f"of {tp} GPU{'s' if tp != 1 else ''}: "
            + ", ".join(f"{slots.count(h) * tp} {h}" for h in types if h in slots))
    return FriendlyLayout(tp, gs, slots, types, text)


def first_overflow(cost: CostModel, layout: FriendlyLayout) -> Overflow | None:
    """Fill the layout's stages in order, each with as many layers as fit (leaving one for each later stage),
    the last with the rest: the first stage that is short, or None where every stage fits."""
    n_layers, pp = cost.model.num_layers, len(layout.slots)

    def need_bytes(i: int, start: int, end: int) -> tuple[float, float]:
        core = cost.stage_core(layout.shape, device_type=layout.slots[i], start=start, end=end, dp=1,
                               recompute=FULL_RECOMPUTE, is_first=i == 0, is_last=i == pp - 1)
        return core.held_static_bytes + cost.inflight_microbatches(layout.shape, i) * \
            core.held_act_per_microbatch_bytes, core.capacity_bytes

    start = 0
    for i, h in enumerate(layout.slots):
        end = n_layers if i == pp - 1 else start
        while i < pp - 1 and end < n_layers - (pp - 1 - i):
            need, cap = need_bytes(i, start, end + 1)
            if need > cap:
                break
            end += 1
        end = max(end, start + 1)
        need, cap = need_bytes(i, start, end)
        if need > cap:
            return Overflow(i, h, start, end - start, need, cap)
        start = end
    return None


def overflow_text(cost: CostModel, layout: FriendlyLayout, over: Overflow) -> str:
    held = over.layers
    return (f"{cost.model.name} fits nowhere on {describe_cluster(cost.cluster, cost.profiles)}: even the most "
            f"memory-friendly layout ({layout.text}) leaves stage {over.stage} ({over.device_type}) with {held} "
            f"layer{'s' if held != 1 else ''} needing {over.need_bytes / GIB:.1f} GiB of "
            f"{over.capacity_bytes / GIB:.1f} GiB usable ({(over.need_bytes - over.capacity_bytes) / GIB:.1f} GiB "
            f"short; --memory-headroom {100 * cost.memory_headroom:.0f}% kept free)")


def _hints(cost: CostModel, gs: GlobalShape, slots: list[str], types: list[str], tp: int, full: Recompute,
           layers_left: int, index: int) -> list[str]:
    """What would help, with the number of GPUs it takes where that can be counted."""
    hints = []
    # layers one more middle stage of the roomiest type holds (one micro-batch in flight at best)
    h = types[0]
    per_stage = 0
    while per_stage < layers_left:
        core = cost.stage_core(gs, device_type=h, start=0, end=per_stage + 1, dp=1, recompute=full,
                               is_first=False, is_last=False)
        if core.held_static_bytes + core.held_act_per_microbatch_bytes > core.capacity_bytes:
            break
        per_stage += 1
    remaining_stages = len(slots) - index
    if per_stage:
        extra = max(1, math.ceil(layers_left / per_stage) - remaining_stages)
        hints.append(f"more GPUs: about {extra * tp} more {h} ({extra} more pipeline stage(s) of TP={tp}, "
                     f"up to {per_stage} layers each)")
    else:
        hints.append(f"more memory per GPU: one layer does not fit on a {h} even with TP={tp}")
    hints += ["more tensor or expert parallelism, where the rules allow it",
              "a shorter sequence, or a smaller model"]
    return hints
