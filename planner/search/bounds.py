"""Lower bounds on one global choice's iteration time, computed without solving it.

The driver visits global choices in increasing bound and stops once the bound reaches the best
plan found, so every choice bounded out here is a choice no backend has to solve.  The bounds
must never exceed a choice's exact optimum (tests/test_bounds.py checks them against brute force,
tests/test_search.py against HS-DP); they read per-layer figures of each stage option
(OptionBound, stage_free_bytes), never the tables.

For v x T = sum_i t_i + (m*v - 1) * max_i t_i + v * max sync_i:
  - sum_i t_i >= N * min_o tau_o, with tau_o the least per-layer time of option o (per layer
    kind on models that mix dense and MoE layers);
  - max_i t_i >= the fluid bound: N over the largest summed layer rate of PP stages whose GPUs
    stay within each device type's budget (a knapsack per type);
  - max_i t_i >= the least cap c for which PP stages, stage i on some option o holding at most
    min(floor((c - extra_o) / tau_o), layers of o that fit in memory at position i) layers, can
    hold all N layers while the GPUs each device type lends to its stages stay within its budget
    (extra_o: the per-stage recompute of full block recompute; the layers that fit: `_holds`, full
    block recompute sparing the activations of at most k x VPP of a stage's layers, and never of more
    layers than the stage holds).  That test is a small DP over
    positions with GPUs-used-per-type as state (numpy, one array per position); when the state
    space is too large it drops the budget and lets every position take its best option.  Each
    layer kind's layers are tested on their own too.

Before any of that, for a whole shape at once (every PP, VPP and recompute setting): no layout fits
where PP stages within the GPU budgets cannot hold the layers' weights, gradients and optimizer state
alone (`_static_held`, the relaxed bound's memory test: the same per-layer figures, no activations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce

import numpy as np

from planner.cost.model import CostModel
from planner.schemas.plan import Recompute
from planner.schemas.search import GlobalChoice, StageOption

# largest GPUs-used-per-type state space the budget test builds (cells of one numpy array)
MAX_BUDGET_STATES = 65_536
_UNREACHABLE = -(1 << 40)  # a budget-DP state no stage sequence reaches; stays negative when layers are added


@dataclass(frozen=True)
class OptionBound:
    """Per-option figures for the bounds: least per-layer time (s) and memory per layer over the
    model's layer kinds, and the same per kind (dense or MoE) in `kinds`."""

    layer_s: float
    layer_static_bytes: float
    layer_act_bytes: float
    free_bytes: float  # capacity minus the fixed overhead
    # (is_moe, layer_s, static bytes, activation bytes) per layer kind present in the model
    kinds: tuple[tuple[bool, float, float, float], ...] = ()
    # full block recompute of k layers per virtual chunk: a stage pays at least one layer's
    # recompute (`stage_extra_s`), its layers keep full activations (the figures above) except at
    # most k*VPP of them, each sparing at most `act_saved_bytes` per in-flight micro-batch
    block_layers: int = 0
    stage_extra_s: float = 0.0
    act_saved_bytes: float = 0.0


def option_bound(cost: CostModel, gs, o: StageOption, memory_only: bool = False) -> OptionBound:
    """Per-layer time and memory of option o from one-layer middle stages (no embedding/loss); the static
    bytes per layer are what each layer adds (`layer_static_split`), and the free bytes are less what any
    stage holds once beside them (Megatron-FSDP's unsharded layers in flight).
    Selective and full uniform recompute: every layer pays it and keeps the reduced activations.
    Full block recompute: layers are priced without recompute and with full activations, and the
    recompute enters as a per-stage time and a bounded memory saving (OptionBound.block_layers).
    `memory_only`: the memory figures alone, from the stages' memory (CostModel.stage_memory: the same numbers
    without pricing their time); the times (layer_s, the kinds' times, stage_extra_s) are then NaN."""

    kinds: dict[bool, int] = {}
    for j, k in enumerate(cost.layer_kinds):
        kinds.setdefault(k, j)
    block = o.recompute.granularity == "full" and o.recompute.method == "block"
    per_layer = Recompute.none() if block else o.recompute
    stage = cost.stage_memory if memory_only else cost.stage_core

    def core(j: int, rec: Recompute):
        return stage(gs, device_type=o.device_type, start=j, end=j + 1, dp=o.dp, recompute=rec,
                     is_first=False, is_last=False)

    def time_s(c) -> float:
        return math.nan if memory_only else c.time_s

    split = layer_static_split(cost, gs, o)
    held_once = min(once for _, once in split.values())
    per_kind, free, extra, saved = [], 0.0, [], []
    for kind, j in sorted(kinds.items()):
        c = core(j, per_layer)
        per_kind.append((kind, time_s(c), split[kind][0], c.held_act_per_microbatch_bytes))
        free = c.capacity_bytes - c.other_bytes - held_once
        if block:
            rec = core(j, Recompute.full("uniform", 1))
            extra.append(time_s(rec) - time_s(c))
            saved.append(c.held_act_per_microbatch_bytes - rec.held_act_per_microbatch_bytes)
    return OptionBound(layer_s=min(k[1] for k in per_kind), layer_static_bytes=min(k[2] for k in per_kind),
                       layer_act_bytes=min(k[3] for k in per_kind), free_bytes=free, kinds=tuple(per_kind),
                       block_layers=(o.recompute.num_layers or 0) if block else 0,
                       stage_extra_s=(math.nan if memory_only else max(0.0, min(extra))) if block else 0.0,
                       act_saved_bytes=max(0.0, max(saved)) if block else 0.0)


def stage_free_bytes(cost: CostModel, gs, o: StageOption) -> tuple[float, float, float, float]:
    """Bytes option o has for its layers' own weights, grads, optimizer state and activations at
    each position (middle, first, last, only stage), each layer counted at what it adds
    (`layer_static_split`): capacity minus everything a stage there holds besides its layers'
    (framework overhead, transient recompute buffers, what a stage holds once beside its layers, and
    the embedding on the first stage, the output layer and logits on the last).  The most over the
    layer kinds and over stages of one layer and of all the model's layers (with Megatron-FSDP the
    ends' unsharded copy in flight is spread over the stage's layers: the more layers, the less per
    stage), less the least that any stage holds once, so it never understates the room."""
    split = layer_static_split(cost, gs, o)
    held_once = min(once for _, once in split.values())
    sizes = sorted({1, cost.model.num_layers})
    out = []
    for first, last in ((False, False), (True, False), (False, True), (True, True)):
        room = -math.inf
        for kind, (per_layer, once) in split.items():
            for n in sizes:
                c = _one_kind_core(cost, gs, o, kind, n, first, last)
                room = max(room, c.capacity_bytes - (c.held_static_bytes - n * per_layer - once))
        out.append(room - held_once)
    return tuple(out)


def layer_static_split(cost: CostModel, gs, o: StageOption) -> dict[bool, tuple[float, float]]:
    """Per layer kind of the model (True: MoE): (the weights, gradients and optimizer state each layer of
    the kind adds to a middle stage on option o: a two-layer stage's less a one-layer stage's; the rest of
    the one-layer stage's, which a stage holds once whatever its layers).  The rest is 0 but with
    Megatron-FSDP sharding gradients or parameters, whose unsharded layers in flight (the average of the
    stage's layers: at least the least of the kinds') a stage of n layers holds once, not n times."""
    out = {}
    for kind in sorted(set(cost.layer_kinds)):
        one, two = (cost.stage_own_bytes(gs, kinds=(kind,) * n, dp=o.dp, is_first=False, is_last=False)
                    for n in (1, 2))
        once = max(0.0, 2 * one - two)
        out[kind] = (one - once, once)
    return out


def _one_kind_core(cost: CostModel, gs, o: StageOption, kind: bool, n: int, first: bool, last: bool):
    """A stage of n layers of one kind on option o at a position (first, last)."""
    return cost.stage_core_of_kinds(gs, device_type=o.device_type, kinds=(kind,) * n, dp=o.dp,
                                    recompute=o.recompute, is_first=first, is_last=last)


@dataclass(frozen=True)
class _LayerGroup:
    """Layers every plan must place, with per-option figures that bound each of them: all N
    layers with the least figures over kinds, or the layers of one kind with that kind's."""

    count: int
    tau_s: tuple[float, ...]  # per option: least time per layer
    static_bytes: tuple[float, ...]
    act_bytes: tuple[float, ...]


def _layer_groups(ob, options, n_layers: int, kind_counts: dict[bool, int] | None,
                  cache: dict | None) -> list[_LayerGroup]:
    if cache is None:
        return _make_layer_groups(ob, options, n_layers, kind_counts)
    key = ("groups", tuple(ob[o] for o in options), n_layers,
           tuple(sorted(kind_counts.items())) if kind_counts else ())
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = _make_layer_groups(ob, options, n_layers, kind_counts)
    return hit


def _make_layer_groups(ob, options, n_layers: int, kind_counts: dict[bool, int] | None) -> list[_LayerGroup]:
    groups = [_LayerGroup(n_layers, tuple(ob[o].layer_s for o in options),
                          tuple(ob[o].layer_static_bytes for o in options),
                          tuple(ob[o].layer_act_bytes for o in options))]
    if kind_counts and sum(1 for c in kind_counts.values() if c > 0) > 1:
        for kind, count in sorted(kind_counts.items()):
            if count <= 0:
                continue
            figs = [next(f for f in ob[o].kinds if f[0] == kind) for o in options]
            groups.append(_LayerGroup(count, tuple(f[1] for f in figs), tuple(f[2] for f in figs),
                                      tuple(f[3] for f in figs)))
    return groups


class ShapeBounds:
    """The cheap bound of every (PP, VPP) of one shape (the degrees but PP and VPP) with one set of
    stage options, from per-option figures computed once: the sum and fluid bounds, and with
    `memory` the memory test (lower_bound_s with tight=False, without its per-call overhead).

    With `memory=False` it is a valid bound for every recompute setting of the shape when built
    from the no-recompute options: recompute only adds time (it re-runs forward work), and only
    the memory test could tell the settings apart."""

    def __init__(self, ob: dict[StageOption, "OptionBound"], g: GlobalChoice, options: list[StageOption],
                 budget: dict[str, int], n_layers: int, m: int, kind_counts: dict[bool, int] | None,
                 cache: dict | None = None):
        self.ob, self.options, self.m, self.n_layers = ob, options, m, n_layers
        self.groups = _layer_groups(ob, options, n_layers, kind_counts, cache)
        groups = self.groups
        if len(groups) > 1:
            self.sum_lb = sum(grp.count * min(grp.tau_s) for grp in groups[1:])
        else:
            self.sum_lb = n_layers * min(groups[0].tau_s)
        self.rates = []
        for grp in groups:
            key = (tuple((o.device_type, g.tp * g.cp * o.dp, t) for o, t in zip(options, grp.tau_s)),
                   tuple(budget.items()))
            rates = cache.get(key) if cache is not None else None
            if rates is None:
                rates = _max_rates(g, options, grp.tau_s, budget, n_layers)
                if cache is not None:
                    cache[key] = rates
            self.rates.append(rates)
        self.held = [_static_held(g, ob, options, grp, budget, n_layers, cache) for grp in groups]
        self._room: dict = {}

    def pipeline_bounds(self, pipelines: tuple[tuple[int, int], ...]) -> np.ndarray:
        """The bound without the memory test for each (PP, VPP) of `pipelines`, at once; math.inf where
        PP stages cannot hold the layers' weights, gradients and optimizer state alone (`held`: no
        activations, so it holds for every recompute setting, VPP and in-flight load alike)."""
        pps = np.array([p for p, _ in pipelines], dtype=np.int64)
        vs = np.array([v for _, v in pipelines], dtype=float)
        fluid = np.zeros(len(pipelines))
        for grp, rates, held in zip(self.groups, self.rates, self.held):
            r = np.where(pps < len(rates), rates[np.minimum(pps, len(rates) - 1)], 0.0)
            fits = np.where(pps < len(held), held[np.minimum(pps, len(held) - 1)], -np.inf) >= grp.count
            with np.errstate(divide="ignore"):
                fluid = np.maximum(fluid, np.where((r > 0) & fits, grp.count / np.where(r > 0, r, 1.0), np.inf))
        with np.errstate(invalid="ignore"):  # one micro-batch (m * v - 1 = 0) times an infinite fluid bound: NaN
            out = (self.sum_lb + (self.m * vs - 1) * fluid) / vs
        return np.where(np.isinf(fluid), np.inf, out)  # no layout holds the layers: infinite, never NaN

    def bound(self, pp: int, vpp: int, inflight: list[float], memory: bool = True) -> float:
        """The cheap bound at (PP, VPP) with the in-flight micro-batches per position;
        math.inf when it cannot fit."""
        if memory:
            for k, grp in enumerate(self.groups):
                memo = self._room.setdefault((k, vpp), {})
                if _room(grp, self.ob, self.options, inflight, vpp, memo) < grp.count:
                    return math.inf
        fluid = 0.0
        for grp, rates in zip(self.groups, self.rates):
            if pp >= len(rates) or not rates[pp] > 0:
                return math.inf
            fluid = max(fluid, grp.count / rates[pp])
        return (self.sum_lb + (self.m * vpp - 1) * fluid) / vpp


def lower_bound_s(ob: dict[StageOption, OptionBound], g: GlobalChoice, options: list[StageOption],
                  budget: dict[str, int], n_layers: int, m: int, inflight: list[float], tight: bool = True,
                  beat_s: float = math.inf, cache: dict | None = None,
                  kind_counts: dict[bool, int] | None = None,
                  free_at: dict[StageOption, tuple[float, float, float, float]] | None = None) -> float:
    """A lower bound on this choice's iteration time, math.inf when it cannot fit.

    cheap (tight=False): sum and fluid bounds plus a memory test, plain Python, for every choice.
    tight: adds the integral cap bound with memory and GPU budgets.  With `beat_s` (the plan to
    beat) the cap search stops as soon as it proves the bound reaches beat_s, and then returns
    beat_s (a valid bound: the true one is at least that).  `cache`: any dict the caller
    keeps across calls (work shared across PP).  `kind_counts` (layers per kind, dense/MoE): each
    kind's layers are also bounded with that kind's own figures (tighter on mixed models).
    `free_at` (tight only; stage_free_bytes per option): the room per position, counting the
    embedding, output layer and transients; without it every position gets the middle one's."""
    if not options:
        return math.inf
    v = g.vpp
    groups = _layer_groups(ob, options, n_layers, kind_counts, cache)
    if not tight and any(_room(grp, ob, options, inflight, v,
                               cache.setdefault(("room", id(grp), v), {}) if cache is not None else None)
                         < grp.count for grp in groups):
        return math.inf  # checked first: most choices that fail, fail here
    if len(groups) > 1:
        sum_lb = sum(grp.count * min(grp.tau_s) for grp in groups[1:])
    else:
        sum_lb = n_layers * min(groups[0].tau_s)
    fluid = max(_fluid_tmax_s(g, options, grp.tau_s, budget, grp.count, n_layers, cache) for grp in groups)
    if not math.isfinite(fluid):
        return math.inf
    if not tight:
        return (sum_lb + (m * v - 1) * fluid) / v

    def value(tmax: float) -> float:
        return (sum_lb + (m * v - 1) * max(fluid, tmax)) / v

    # the largest cap a plan beating beat_s could have
    c_star = (beat_s * v - sum_lb) / (m * v - 1) if math.isfinite(beat_s) and m * v > 1 else math.inf
    if free_at is None:
        free = np.array([[ob[o].free_bytes for o in options]] * g.pp)
    else:
        slot = [3] if g.pp == 1 else [1] + [0] * (g.pp - 2) + [2]  # only, or first, middles, last
        free = np.array([[free_at[o][k] for o in options] for k in slot])  # [PP, O]
    offset_s = np.array([ob[o].stage_extra_s for o in options])  # [O] per-stage recompute time
    rerun = np.array([ob[o].block_layers * v for o in options])  # [O] most layers a stage re-runs (k x VPP)
    saved_bytes = np.array([ob[o].act_saved_bytes for o in options])  # [O] per re-run layer, per in-flight mb
    test = _budget_test(g, options, budget)
    tmax = 0.0
    for k, grp in enumerate(groups):
        cap, above = _least_cap(grp, free, inflight, test, c_star, every_stage_holds_one=k == 0,
                                offset_s=offset_s, rerun=rerun, saved_bytes=saved_bytes)
        if not math.isfinite(cap):
            return math.inf
        tmax = max(tmax, cap)
        if above:
            return max(beat_s, value(tmax))
    return value(tmax)


def _least_cap(grp: _LayerGroup, free: np.ndarray, inflight: list[float], test, c_star: float,
               every_stage_holds_one: bool, offset_s: np.ndarray, rerun: np.ndarray,
               saved_bytes: np.ndarray) -> tuple[float, bool]:
    """(cap, above): the least cap c on stage time for which PP stages, each on an option holding at
    most min(floor(c / tau_o), layers that fit in memory) of the group's layers, can hold them all
    (math.inf: not even with unbounded time); above=True when that cap is proven to exceed c_star
    (then `cap` is only a lower bound on it).  Every stage holds at least one layer, but not
    necessarily one of a given kind: without `every_stage_holds_one` a stage may hold none of
    the group's layers."""
    count = grp.count
    if not every_stage_holds_one and test is not None:
        # the budget test wants >= 1 layer per stage: give every stage one free slot and ask for
        # PP more layers (holds N + PP with the extra slot iff it holds N without)
        inner, pp = test, len(inflight)

        def test(cell, n, inner=inner, pp=pp):
            return inner(cell + 1, n + pp)
    tau = np.array(grp.tau_s)
    load = np.asarray(inflight)[:, None]
    # [PP, O] the group's layers option o holds in memory at position i
    nmem = _holds_each(free, load, np.array(grp.static_bytes)[None, :], np.array(grp.act_bytes)[None, :],
                       rerun[None, :], saved_bytes[None, :], count)
    if nmem.max(axis=1).sum() < count:
        return math.inf, False  # cannot fit even with every stage on its roomiest option
    # every cap that matters: n layers plus the option's per-stage time
    cands = np.unique((np.arange(1, count + 1)[:, None] * tau[None, :] + offset_s[None, :]).ravel())
    cap_layers = np.maximum(np.floor((cands[:, None] - offset_s[None, :]) / tau[None, :] * (1 + 1e-12)), 0)  # [C, O]
    per_cell = np.minimum(cap_layers[:, None, :], nmem[None, :, :]).astype(np.int64)  # [C, PP, O]
    # budget-free: each position takes its best option
    ok = np.nonzero(per_cell.max(axis=2).sum(axis=1) >= count)[0]
    if ok.size == 0:
        return math.inf, False
    lo, hi = int(ok[0]), len(cands) - 1
    if cands[lo] > c_star:
        return float(cands[lo]), True
    if test is None:
        return float(cands[lo]), False
    if math.isfinite(c_star):
        hi_beat = int(np.searchsorted(cands, c_star, side="right")) - 1
        if not test(per_cell[hi_beat], count):
            return float(cands[lo]), True
        hi = hi_beat
    elif not test(per_cell[hi], count):
        return math.inf, False
    while lo < hi:
        mid = (lo + hi) // 2
        if test(per_cell[mid], count):
            hi = mid
        else:
            lo = mid + 1
    return float(cands[lo]), False


def _fluid_tmax_s(g: GlobalChoice, options, tau_s: tuple[float, ...], budget: dict[str, int], count: int,
                  max_stages: int, cache: dict | None = None) -> float:
    """`count` layers over the largest summed layer rate PP stages can have with each device type's
    GPUs within budget (a stage on option o runs 1 / tau_o layers per second and takes TP*CP*DP_o
    GPUs); math.inf when no PP stages fit the budget.  The rates per stage count do not depend on
    PP: `cache` keeps them across PP."""
    key = (tuple((o.device_type, g.tp * g.cp * o.dp, t) for o, t in zip(options, tau_s)), tuple(budget.items()))
    rates = cache.get(key) if cache is not None else None
    if rates is None:
        rates = _max_rates(g, options, tau_s, budget, max_stages)
        if cache is not None:
            cache[key] = rates
    if g.pp >= len(rates) or not rates[g.pp] > 0:
        return math.inf
    return count / rates[g.pp]


def _static_held(g: GlobalChoice, ob, options, grp: _LayerGroup, budget: dict[str, int], max_stages: int,
                 cache: dict | None) -> np.ndarray:
    """[k] = the most of the group's layers k stages within the GPU budgets hold by their weights, gradients
    and optimizer state alone (-inf where k stages do not fit): a stage on option o holds at most
    floor(free_o / static_o) of them, whatever its recompute, VPP or micro-batches in flight (activations only
    add; `_holds` is never above it)."""
    held = tuple(float(min(grp.count, math.floor(max(ob[o].free_bytes, 0.0) / s))) if s > 0 else float(grp.count)
                 for o, s in zip(options, grp.static_bytes))
    key = ("held", tuple((o.device_type, g.tp * g.cp * o.dp, h) for o, h in zip(options, held)),
           tuple(budget.items()), max_stages)
    hit = cache.get(key) if cache is not None else None
    if hit is None:
        hit = _max_sums(g, options, held, budget, max_stages)
        if cache is not None:
            cache[key] = hit
    return hit


def _max_rates(g: GlobalChoice, options, tau_s, budget: dict[str, int], max_stages: int) -> np.ndarray:
    """rates[k] = the largest summed layer rate of exactly k stages within the GPU budgets
    (-inf where k stages do not fit), by a knapsack per device type and a max-plus merge."""
    return _max_sums(g, options, [1.0 / tau for tau in tau_s], budget, max_stages)


def _max_sums(g: GlobalChoice, options, amounts, budget: dict[str, int], max_stages: int) -> np.ndarray:
    """sums[k] = the largest summed amount of exactly k stages within the GPU budgets, a stage on option o
    adding amounts[o] (-inf where k stages do not fit), by a knapsack per device type and a max-plus merge."""
    total = np.array([0.0])
    for h, n in budget.items():
        # per GPU count, the largest amount of an option of this type
        items: dict[int, float] = {}
        for o, amount in zip(options, amounts):
            if o.device_type == h:
                gpus = g.tp * g.cp * o.dp
                items[gpus] = max(items.get(gpus, 0.0), amount)
        if not items:
            continue
        if len(items) == 1:  # one GPU count (the megatron runtime): k stages at the best rate
            (gpus, rate), = items.items()
            own = rate * np.arange(min(n // gpus, max_stages) + 1)
        else:
            own = _knapsack_rates(items, n, max_stages)
        merged = np.full(len(total) + len(own) - 1, -np.inf)
        for k, r in enumerate(own):
            np.maximum(merged[k:k + len(total)], total + r, out=merged[k:k + len(total)])
        total = merged
    return total


def _knapsack_rates(items: dict[int, float], n: int, max_stages: int) -> np.ndarray:
    """[k] = the largest summed rate of k stages of one type (item: GPUs -> rate) within n GPUs."""
    best = np.full(n + 1, -np.inf)  # best[c]: largest rate of k stages using exactly c GPUs
    best[0] = 0.0
    per_k = [0.0]
    while len(per_k) <= max_stages:
        nxt = np.full(n + 1, -np.inf)
        for gpus, rate in items.items():
            if gpus <= n:
                np.maximum(nxt[gpus:], best[: n + 1 - gpus] + rate, out=nxt[gpus:])
        if not np.isfinite(nxt).any():
            break
        per_k.append(float(nxt.max()))
        best = nxt
    return np.array(per_k)


def _room(grp: _LayerGroup, ob, options, inflight: list[float], vpp: int,
          per_load: dict | None = None) -> int:
    """The group's layers the stages can hold in memory at best (each position on its roomiest
    option).  `per_load` memoises the layers one position holds per in-flight load (loads repeat
    across PP)."""
    room = 0
    for load in inflight:
        best_n = per_load.get(load) if per_load is not None else None
        if best_n is None:
            best_n = 0
            for j, o in enumerate(options):
                b = ob[o]
                best_n = max(best_n, _holds(b.free_bytes, load, grp.static_bytes[j], grp.act_bytes[j],
                                            b.block_layers * vpp, b.act_saved_bytes, grp.count))
            if per_load is not None:
                per_load[load] = best_n
        room += best_n
        if room >= grp.count:
            break
    return room


def _holds(room: float, load: float, static: float, act: float, rerun: int, saved: float, count: int) -> int:
    """Most layers (at most `count`) a stage holds in `room` bytes with `load` micro-batches in flight, each
    layer taking `static` + load x `act` bytes and at most `rerun` of them (full block recompute: k x VPP)
    sparing `saved` bytes per micro-batch in flight (never more than its activations): the greatest n with
    n x (static + load x act) - load x min(n, rerun) x min(saved, act) <= room.  That grows with n, so up to
    `rerun` layers each takes its re-run size, and every layer past them its full one (`_holds_each`: the
    same over arrays)."""
    if room < 0:
        return 0
    per = static + load * act
    spare = load * min(saved, act)
    if rerun > 0:
        upto = int(room // (per - spare)) if per - spare > 0 else count
        if upto <= rerun:
            return min(upto, count)
    return min(int((room + rerun * spare) // per) if per > 0 else count, count)


def _holds_each(room: np.ndarray, load: np.ndarray, static: np.ndarray, act: np.ndarray, rerun: np.ndarray,
                saved: np.ndarray, count: int) -> np.ndarray:
    """`_holds` over broadcast arrays (floats holding whole numbers)."""
    room = np.asarray(room, dtype=float)
    free = np.maximum(room, 0.0)
    per = static + load * act
    spare = load * np.minimum(saved, act)
    rest = per - spare
    with np.errstate(divide="ignore", invalid="ignore"):
        beyond = np.where(per > 0, np.floor((free + rerun * spare) / np.where(per > 0, per, 1.0)), count)
        upto = np.where(rest > 0, np.floor(free / np.where(rest > 0, rest, 1.0)), count)
    n = np.where((rerun > 0) & (upto <= rerun), upto, beyond)
    return np.where(room < 0, 0, np.minimum(n, count))


def _budget_test(g: GlobalChoice, options: list[StageOption], budget: dict[str, int]):
    """A function (layers [PP, O] per position and option, N) -> bool: can PP stages, each on an
    option holding at most its cell's layers (and at least one), hold N layers with every device
    type's GPUs within budget?  None when the state space exceeds MAX_BUDGET_STATES."""
    types = sorted({o.device_type for o in options})
    gpus = [g.tp * g.cp * o.dp for o in options]
    unit = reduce(math.gcd, gpus)
    dims = tuple(budget[h] // unit + 1 for h in types)
    if math.prod(dims) > MAX_BUDGET_STATES:
        return None
    # options sharing (type, GPUs) shift the state alike: one move each, taking the most layers
    moves: dict[tuple[int, int], list[int]] = {}
    for j, o in enumerate(options):
        moves.setdefault((types.index(o.device_type), gpus[j] // unit), []).append(j)
    moves_list = [(ti, k, np.array(cols)) for (ti, k), cols in moves.items() if k < dims[ti]]

    if all(k == 1 for _, k, _ in moves_list) and len(moves_list) == len(dims):
        return _stage_count_test(moves_list, dims)
    step = [max((k for ti2, k, _ in moves_list if ti2 == ti), default=0) for ti in range(len(dims))]
    cols_list = [cols for _, _, cols in moves_list]

    def test(cell: np.ndarray, n_layers: int) -> bool:
        # best[u] = most layers placed so far with GPUs used u (< 0: unreachable); the array grows
        # with the states reachable after i stages instead of spanning the budget from the start
        best = np.zeros((1,) * len(dims), dtype=np.int64)
        for i in range(cell.shape[0]):
            row = cell[i]
            shape = tuple(min(d, s + k) for d, s, k in zip(dims, best.shape, step))
            nxt = np.full(shape, _UNREACHABLE, dtype=np.int64)
            for (ti, k, _), cols in zip(moves_list, cols_list):
                layers = int(row[cols].max())
                if layers <= 0:
                    continue
                width = min(best.shape[ti], shape[ti] - k)
                if width <= 0:
                    continue
                src = [slice(None)] * len(dims)
                dst = [slice(0, s) for s in best.shape]
                src[ti] = slice(0, width)
                dst[ti] = slice(k, k + width)
                prev = best[tuple(src)]
                view = nxt[tuple(dst)]
                np.maximum(view, prev + layers, out=view)
            best = nxt
            if best.max() < 0:
                return False
        return bool(best.max() >= n_layers)

    return test


def _stage_count_test(moves_list, dims: tuple[int, ...]):
    """The budget test when every option of a type uses the same GPUs (the megatron runtime): the
    state is the stages per type, and after i stages the last type's count is i minus the others,
    so the DP runs over one dimension fewer."""
    order = sorted(moves_list, key=lambda x: x[0])
    cols_by_type = [cols for _, _, cols in order]
    caps = [d - 1 for d in dims]  # stages each type can host
    explicit = len(dims) - 1
    # stages placed on the explicit types, per state (for the implicit type's count)
    idx_sum = sum(np.indices(tuple(c + 1 for c in caps[:explicit]))) if explicit else None

    def test(cell: np.ndarray, n_layers: int) -> bool:
        pp = cell.shape[0]
        if pp > sum(caps):
            return False
        per_type = np.stack([cell[:, cols].max(axis=1) for cols in cols_by_type], axis=1)  # [PP, T]
        if explicit == 0:
            return bool((per_type[:, 0] >= 1).all() and per_type[:, 0].sum() >= n_layers)
        if _greedy_holds(per_type.tolist(), caps, n_layers):
            return True  # a valid assignment already holds them: no need for the DP
        best = np.zeros((1,) * explicit, dtype=np.int64)
        for i in range(pp):
            row = per_type[i].tolist()
            shape = tuple(min(caps[t] + 1, best.shape[t] + 1) for t in range(explicit))
            nxt = np.full(shape, _UNREACHABLE, dtype=np.int64)
            here = tuple(slice(0, s) for s in best.shape)
            for t in range(len(dims)):
                layers = row[t]
                if layers <= 0:
                    continue
                if t < explicit:  # an explicit type: its count (index) grows by one
                    width = min(best.shape[t], shape[t] - 1)
                    if width <= 0:
                        continue
                    src = [slice(None)] * explicit
                    dst = list(here)
                    src[t] = slice(0, width)
                    dst[t] = slice(1, 1 + width)
                    gain = best[tuple(src)] + layers
                    view = nxt[tuple(dst)]
                else:  # the implicit type: its count i + 1 - (explicit stages) must stay within cap
                    gain = np.where(idx_sum[here] >= i + 1 - caps[t], best + layers, _UNREACHABLE)
                    view = nxt[here]
                np.maximum(view, gain, out=view)
            best = nxt
            if best.max() < 0:
                return False
        return bool(best.max() >= n_layers)

    return test


def _greedy_holds(rows: list[list[int]], caps: list[int], n_layers: int) -> bool:
    """A quick sufficient test: positions take, in order, the type holding the most layers among
    those with stages left (a valid assignment, so a yes is exact; a no proves nothing)."""
    left = list(caps)
    total = 0
    for row in rows:
        best_t, best = -1, 0
        for t, layers in enumerate(row):
            if left[t] > 0 and layers > best:
                best_t, best = t, layers
        if best_t < 0:
            return False
        left[best_t] -= 1
        total += best
    return total >= n_layers
