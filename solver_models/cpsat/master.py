"""The master of --backend cpsat's logic-based Benders decomposition: its vocabulary (rule
families, stage classes, prices) and its first level, the shape screen.

The decomposition (planner/search/certify.py runs it):

    shape screen     (here) for every shape (TP, CP, EP, ETP, micro-batch or samples per
                     micro-batch, DP) and recompute setting, a lower bound from the price tables
                     alone: the deepest pipeline the type budgets allow, every stage at its class's
                     least time per layer and within what it holds in memory
                     (`pipeline_floor_us`), and the bubble the shape's micro-batches make
                     (`shape_bound_us`).  Closed form, evaluated for every shape at once: shapes
                     and settings that cannot beat the best plan are never priced one by one
    pipeline block   (pipeline.py) a CP-SAT model per shape: recompute, PP, VPP, stages and
                     layers per stage class as decision variables, Megatron's rules as
                     constraints, the relaxation of the stage problem; its answer is the
                     configuration that earns an exact stage solve
    stage model      (model.py) the exact stage problem of one configuration; its outcome is a
                     Benders cut on the block (no-good)

Prices (Price): per stage class (a device type; flagscale: a type and a DP), per shape and
recompute setting, figures from the cost model rounded to the optimistic side
(planner/search/prices.py builds them).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

# largest product of domains a rule family's table is built over (else: checked on the answers)
MAX_RULE_TABLE = 200_000


@dataclass(frozen=True)
class RuleFamily:
    """One rule as a constraint: the degree families it reads and its predicate over them."""

    name: str
    scope: tuple[str, ...]
    allowed: Callable[..., bool]


@dataclass(frozen=True)
class StageClass:
    """What a pipeline stage may run as: a device type (`type_index`) and its weight, the units
    of the type's stage budget one stage takes (flagscale: the stage's DP, units of TP x CP GPUs;
    megatron: 1, units of TP x CP x DP GPUs)."""

    name: str
    type_index: int
    weight: int = 1


@dataclass(frozen=True)
class Room:
    """What one stage of a class holds in memory: n layers of group g fit with a micro-batches in
    flight when n * (static[g] + a * act[g]) <= free + a * saved x (layers re-run), less the first
    stage's (embedding) or the last stage's (output layer, logits, MTP) own bytes at the ends of the
    pipeline.  A stage that is both (PP = 1) has `single_bytes` more: no pipeline communication
    buffers (the other figures are priced for PP > 1).  Full block recompute of k layers per virtual
    chunk re-runs at most min(n, k x VPP) of a stage's n layers (of group 0, all layers; a layer kind's
    group counts k x VPP, as its stage may hold other layers too)."""

    free_bytes: float  # capacity less the framework's overhead
    static_bytes: tuple[float, ...]  # per layer group: weights, gradients and optimizer state of one layer
    act_bytes: tuple[float, ...]  # per layer group: one layer's activations per micro-batch in flight
    saved_bytes: float = 0.0  # activations one layer full block recompute re-runs spares, per micro-batch in flight
    transient_bytes: float = 0.0  # buffers any stage keeps once (its layers' recompute and work buffers)
    first_static_bytes: float = 0.0
    first_act_bytes: float = 0.0
    last_static_bytes: float = 0.0
    last_act_bytes: float = 0.0
    block_layers: int = 0  # k: layers re-run per virtual chunk
    single_bytes: float = 0.0  # more room for the only stage of a pipeline (PP = 1)

    def holds(self, inflight: float, limit: int, group: int = 0, first: bool = False, last: bool = False,
              vpp: int = 1) -> int:
        """Most layers of the group one stage holds with `inflight` micro-batches in flight and `vpp`
        virtual chunks (at most `limit`)."""
        per = self.static_bytes[group] + inflight * self.act_bytes[group]  # holds_each, one value (hot path)
        room = self.free_bytes - self.transient_bytes
        if first:
            room -= self.first_static_bytes + inflight * self.first_act_bytes
        if last:
            room -= self.last_static_bytes + inflight * self.last_act_bytes
        if first and last:
            room += self.single_bytes
        if room < 0:
            return 0
        cap = self.block_layers * vpp
        if group == 0 and cap:
            upto = _fit_one(room, per - inflight * self.saved_bytes, limit)
            if upto <= cap:
                return min(upto, limit)
        return min(_fit_one(room + inflight * cap * self.saved_bytes, per, limit), limit)

    def holds_each(self, inflight: np.ndarray, limit: int, group: int = 0, first: bool = False, last: bool = False,
                   vpp: int = 1) -> np.ndarray:
        """`holds` for each of an array of micro-batches in flight."""
        a = np.asarray(inflight, dtype=float)
        per = self.static_bytes[group] + a * self.act_bytes[group]
        room = np.full_like(a, self.free_bytes - self.transient_bytes)
        if first:
            room = room - (self.first_static_bytes + a * self.first_act_bytes)
        if last:
            room = room - (self.last_static_bytes + a * self.last_act_bytes)
        if first and last:
            room = room + self.single_bytes
        short = room < 0
        room = np.maximum(room, 0.0)
        cap = self.block_layers * vpp
        beyond = _fit(room + a * cap * self.saved_bytes, per, limit)  # every layer past the cap keeps its activations
        if group == 0 and cap:  # up to the cap, each layer spares what its re-run saves
            upto = _fit(room, per - a * self.saved_bytes, limit)
            beyond = np.where(upto <= cap, upto, beyond)
        return np.where(short, 0, np.minimum(beyond, limit)).astype(np.int64)


def _fit_one(room: float, per: float, limit: int) -> int:
    """floor(room / per), `limit` where per <= 0 (room >= 0 here)."""
    return math.floor(room / per * (1 + 1e-12)) if per > 0 else limit


def _fit(room: np.ndarray, per: np.ndarray, limit: int) -> np.ndarray:
    """floor(room / per), `limit` where per <= 0 (room >= 0 here)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(per > 0, np.floor(room / np.where(per > 0, per, 1.0) * (1 + 1e-12)), limit)


@dataclass(frozen=True)
class Price:
    """A stage class's figures under one choice of the shape degrees and one recompute setting,
    integer microseconds rounded down and bytes to the roomy side, so that they bound the cost
    model from below (the screen's prices hold for every recompute setting: least time, most room)."""

    tau_us: tuple[int, ...]  # per layer group (all layers, then each layer kind): least time per layer
    stage_us: int  # full block recompute: least time to re-run one layer (the stage pays it per layer re-run)
    first_us: int  # extra time of the first stage (embedding)
    last_us: int  # extra time of the last stage (output layer, loss, MTP)
    max_layers: int  # most layers one stage of the class holds in memory (one micro-batch in flight)
    units: int  # stage budget of the class's type: sum over its classes of weight x stages <= units
    link_in_us: int = 0  # least time of the pipeline link into a stage of the class (from any class)
    link_out_us: int = 0  # least time of the link out of it
    room: Room | None = None  # memory per layer and at the ends (None: only max_layers)
    # [k]: least exposed DP sync + optimizer step (us per iteration) of a middle stage holding k
    # layers of the block's sync group (empty: not priced)
    sync_us: tuple[int, ...] = ()
    # (v, link in, link out) per VPP value v: the links per micro-batch with all v chunks (empty: the
    # least links above, whatever the VPP)
    links_by_vpp: tuple[tuple[int, int, int], ...] = ()
    # full block recompute of k layers per virtual chunk (0: the stage pays stage_us once): the stage's
    # layers re-run, (v, [n] for n = 0..layers) per VPP value v (empty: at least min(k, n))
    block_layers: int = 0
    rerun_by_vpp: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def extra_us(self, n: int | np.ndarray) -> int | np.ndarray:
        """Least per-stage time not in the layers' own times of a stage holding n layers (of any
        group), whatever the VPP: block recompute re-runs min(k, n) layers with one chunk, and at
        least as many with more (a chunk of k or more layers re-runs k, a smaller one all of its)."""
        if not self.block_layers:
            return self.stage_us
        return self.stage_us * np.minimum(self.block_layers, n)

    def layers_within(self, t_us: int, tau_us: int) -> int:
        """Most layers (at tau_us each) a stage runs within t_us, with extra_us."""
        k, s = self.block_layers, self.stage_us
        if not k:
            return max(0, (int(t_us) - s) // tau_us)
        beyond = (int(t_us) - s * k) // tau_us
        return int(beyond) if beyond >= k else max(0, int(t_us) // (tau_us + s))

    def holds(self, inflight: float, limit: int, group: int = 0, first: bool = False, last: bool = False,
              vpp: int = 1) -> int:
        """Most layers of a group one stage holds with `inflight` micro-batches in flight."""
        cap = min(limit, self.max_layers)
        if self.room is None:
            return cap
        return min(cap, self.room.holds(inflight, limit, group, first, last, vpp))

    def holds_each(self, inflight: np.ndarray, limit: int, group: int = 0, first: bool = False, last: bool = False,
                   vpp: int = 1) -> np.ndarray:
        """`holds` for each of an array of micro-batches in flight (Room.holds_each: the same numbers)."""
        cap = min(limit, self.max_layers)
        a = np.asarray(inflight, dtype=float)
        if self.room is None:
            return np.full(a.shape, cap, dtype=np.int64)
        return np.minimum(cap, self.room.holds_each(a, limit, group, first, last, vpp))


def reduced_domains(rules: Sequence[RuleFamily], domains: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The families' domains, each narrowed to the values some allowed tuple of every rule family
    over it uses (repeated until nothing changes; families too large to enumerate are skipped)."""
    out = {f: tuple(sorted(v)) for f, v in domains.items()}
    changed = True
    while changed:
        changed = False
        for rule in sorted(rules, key=lambda r: math.prod(len(out[f]) for f in r.scope)):
            if math.prod(len(out[f]) for f in rule.scope) > MAX_RULE_TABLE:
                continue
            allowed = [c for c in itertools.product(*(out[f] for f in rule.scope)) if rule.allowed(*c)]
            for k, f in enumerate(rule.scope):
                used = tuple(sorted({c[k] for c in allowed}))
                if used != out[f]:
                    out[f] = used
                    changed = True
    return out


def rule_tables(rules: Sequence[RuleFamily], domains: dict[str, tuple[int, ...]], families: set[str]
                ) -> list[tuple[str, tuple[str, ...], list[tuple[int, ...]] | None]]:
    """Per rule family: its scope within `families` and the allowed tuples there (the projection
    of the rule onto them; None when the product is too large to enumerate)."""
    out = []
    for rule in rules:
        inner = tuple(f for f in rule.scope if f in families)
        if not inner:
            continue
        if math.prod(len(domains[f]) for f in rule.scope) > MAX_RULE_TABLE:
            out.append((rule.name, inner, None))
            continue
        idx = [rule.scope.index(f) for f in inner]
        allowed = sorted({tuple(c[i] for i in idx) for c in itertools.product(*(domains[f] for f in rule.scope))
                          if rule.allowed(*c)})
        out.append((rule.name, inner, allowed))
    return out


def pipeline_floor_us(row: dict[int, Price], classes: Sequence[StageClass], groups: Sequence[int],
                      microbatches: int, vpp: int = 1) -> int | None:
    """The least bottleneck stage time (us) any pipeline of this shape and recompute setting can
    have, or None when its layers fit in no pipeline: the deepest pipeline the type budgets allow
    (at most one stage per layer), a stage of class c holding at most the layers it runs within T
    (Price.layers_within) and what it holds in memory with the micro-batches its position keeps in
    flight (the j-th stage from the end at least min(j + 1, m) of them, whatever the interleaving).  Per layer
    group (each kind's layers on their own too)."""
    floor = 0
    n_layers = groups[0]
    for g, count in enumerate(groups):
        stages = _stage_rooms(row, classes, g, n_layers, microbatches, vpp)
        steps = np.unique(np.concatenate([np.arange(1, count + 1) * max(1, p.tau_us[g]) +
                                          p.extra_us(np.arange(1, count + 1)) for p in row.values()]))
        if not steps.size or _capacity(stages, steps[-1], n_layers) < count:
            return None
        lo, hi = 0, steps.size - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if _capacity(stages, steps[mid], n_layers) >= count:
                hi = mid
            else:
                lo = mid + 1
        floor = max(floor, int(steps[lo]))
    return floor


def _stage_rooms(row: dict[int, Price], classes: Sequence[StageClass], g: int, n_layers: int, microbatches: int,
                 vpp: int) -> list[tuple[int, int, int, Price, np.ndarray, int]]:
    """Per class: (type, weight, tau, its price (the per-stage time), layers of group g its j-th stage
    from the end holds in memory (with min(j + 1, m) micro-batches in flight), the type's budget units)."""
    out = []
    for c, p in row.items():
        w = classes[c].weight
        count = min(p.units // w, n_layers)
        loads = np.minimum(np.arange(1, count + 1), microbatches).astype(float)
        holds = np.minimum(p.room.holds_each(loads, n_layers, g, vpp=vpp), p.max_layers) if p.room is not None \
            else np.full(count, min(n_layers, p.max_layers), dtype=np.int64)
        out.append((classes[c].type_index, w, max(1, p.tau_us[g]), p, holds, p.units))
    return out


def _capacity(stages: list[tuple[int, int, int, Price, np.ndarray, int]], t_us: int, n_layers: int) -> float:
    """Most layers of a group the stages hold with every stage time at most t_us.  Each class's
    stages take their own least-loaded positions; per device type, its budget goes to the stages
    with the most layers per unit (the fractional knapsack's optimum, no less than any integral
    choice); with one unit per stage (megatron) no more stages than layers."""
    if all(st[1] == 1 for st in stages):  # one unit a stage: the n_layers stages that hold the most
        held = np.concatenate([np.minimum(h, p.layers_within(t_us, tau)) for _, _, tau, p, h, _ in stages])
        return float(np.sort(held)[::-1][:n_layers].sum())
    per_type: dict[int, list[tuple[float, float, int]]] = {}
    units: dict[int, int] = {}
    for ty, w, tau, p, holds, budget in stages:
        held = np.minimum(holds, p.layers_within(t_us, tau))
        held = held[held > 0]
        units[ty] = budget
        per_type.setdefault(ty, []).extend((x / w, float(x), w) for x in held.tolist())
    total = 0.0
    for ty, items in per_type.items():
        left = units[ty]
        for _, held, w in sorted(items, reverse=True):
            if left <= 0:
                break
            total += min(1.0, left / w) * held
            left -= w
    return total


def shape_bound_us(row: dict[int, Price], classes: Sequence[StageClass], groups: Sequence[int], microbatches: int,
                   vpps: Sequence[int]) -> int | None:
    """A lower bound (us) on the iteration time of every configuration of a shape under one
    recompute setting (None: none fits): v x T >= W + (m*v - 1) * Tmin, Tmin the pipeline floor,
    W the layers at their least time per layer plus the ends' least extra time."""
    t_min = pipeline_floor_us(row, classes, groups, microbatches, max(vpps))
    if t_min is None:
        return None
    kinds = range(1, len(groups)) if len(groups) > 1 else range(1)
    work = sum(groups[g] * min(p.tau_us[g] for p in row.values()) for g in kinds)
    work += min(p.first_us for p in row.values()) + min(p.last_us for p in row.values())
    return min((work + (microbatches * v - 1) * t_min) // v for v in vpps)
