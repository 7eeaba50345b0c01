"""The CP-SAT pipeline block: for one choice of the shape degrees (TP, CP, EP, ETP, micro-batch or
samples per micro-batch, DP), the least iteration time any recompute setting, PP, VPP and
pipeline could give, as a relaxation of the stage problem (the level between the degree master,
master.py, and the exact stage model, model.py; planner/search/certify.py runs the levels).

    degrees     recompute (an index into the ladder; flagscale: the mode), PP, VPP (flagscale: the
                first stage's DP when the tied embeddings fix it), over the space's menus
    rules       every rule family that reads them, as a table over them with the shape degrees in
                place (planner/megatron/rules.py's predicates)
    pipeline    the first and the last stage each take a stage class (f_c, l_c; one stage when PP
                = 1), S_c middle stages take class c: sum_c S_c = PP - 2; per device type the stages
                stay within its budget (sum of weight x stages <= units)
    layers      per layer group g (all layers; then each layer kind when the model mixes kinds): the
                first stage holds nF_g, the last nL_g, a middle stage of class c at most K_cg layers
                and the S_c of them H_cg together (H_cg <= S_c * K_cg): nF_g + nL_g + sum_c H_cg >=
                layers of g.  Integral: a stage holds whole layers
    memory      every stage's layers within what one stage of its class holds under the recompute
                setting with the micro-batches its position keeps in flight: the first stage the
                most, every other stage at least the last stage's; H_cg within what the S_c least
                loaded middle positions hold together (switchable)
    bottleneck  T >= tau_cg[r] * K_cg + stage time (middle), tau * nF + the first stage's extra, ...
                with tau[r] the class's least time per layer under recompute setting r; under full
                block recompute the stage also pays min(n, c_v) re-runs of its n layers at the least
                time of one (c_v from the cost model's count per VPP value: see _extra)
    sync        the iteration's DP sync and optimizer step: at least that of the busiest middle stage of
                each class in use, an element of its layer count (Price.sync_us)
    objective   theta: v * theta >= W + (m*v - 1) * T + v * sync - (v - 1), W the layers at the least
                per-layer time of the classes in use plus the ends' extra time; microseconds, rounded down

Every price is a constant here, so the constraints are linear but for S_c * K_cg.  Cuts: settled
configurations are forbidden (no-good on the block's degrees); `cutoff_us` keeps only what could
beat the best plan.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from ortools.sat.python import cp_model

from solver_models.cpsat.master import MAX_RULE_TABLE, Price, RuleFamily, StageClass


@dataclass
class BlockSpec:
    """One pipeline block's data (module docstring)."""

    shape: dict[str, int]  # the shape degrees, fixed
    families: tuple[str, ...]  # the block's degree families, e.g. ("recompute", "pp", "vpp")
    domains: dict[str, tuple[int, ...]]
    rules: list[RuleFamily]
    classes: list[StageClass]
    groups: tuple[int, ...]
    microbatches: int
    prices: list[dict[int, Price]]  # per recompute index: {class: price}
    inflight: dict[tuple[int, int], tuple[float, float]]  # (PP, VPP) -> micro-batches in flight: first, last stage
    sync_group: int = 0  # the layer group Price.sync_us counts
    # per layer group g >= 1: [n] = layers of the group among the model's first n layers (the first
    # stage's), and among its last n (the last stage's); empty: one group
    prefix: tuple[tuple[int, ...], ...] = ()
    suffix: tuple[tuple[int, ...], ...] = ()
    vpp: str | None = "vpp"
    first_dp: str | None = None  # flagscale: the family fixing the first stage's weight (0: free)
    memory: bool = True


@dataclass
class BlockResult:
    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN | MODEL_INVALID
    degrees: dict[str, int] | None
    objective_us: int | None
    bound_us: int | None
    wall_s: float
    branches: int
    # the relaxation's pipeline: the first and last stage's class, middle stages per class
    first: int | None = None
    last: int | None = None
    middle: dict[int, int] | None = None


class PipelineBlock:
    """The pipeline block of one shape (module docstring)."""

    def __init__(self, spec: BlockSpec):
        self.spec = spec
        self.model = m = cp_model.CpModel()
        self.constraints: dict[str, int] = {}
        self.x = {f: m.new_int_var_from_domain(cp_model.Domain.from_values(spec.domains[f]), f)
                  for f in spec.families}
        self._lits: dict[tuple[str, int], cp_model.IntVar] = {}
        self._reruns: dict[tuple, cp_model.IntVar] = {}  # (k, group, stage) -> layers block recompute re-runs
        # VPP value -> its optimum under the cuts so far (None: no configuration), kept until a cut or
        # an allow() touches that value (solve, below)
        self._by_vpp: dict[int, BlockResult | None] = {}
        self.tau_top = max([1] + [max(p.tau_us) for row in spec.prices for p in row.values()])
        self.extra_top = max([1] + [max(p.stage_us * (spec.groups[0] if p.block_layers else 1), p.first_us,
                                        p.last_us, p.link_in_us + p.link_out_us,
                                        *(i + o for _, i, o in p.links_by_vpp))
                                    for row in spec.prices for p in row.values()]) * max(spec.domains.get("vpp", (1,)))
        self._family("rules", self._add_rules)
        self._family("pipeline", self._add_pipeline)
        self._family("layers", self._add_layers)
        self._family("memory", self._add_memory)
        self._family("bottleneck", self._add_bottleneck)
        self._family("objective", self._add_objective)
        self.model.minimize(self.theta)

    def _family(self, name: str, add: Callable[[], None]) -> None:
        before = len(self.model.proto.constraints)
        add()
        self.constraints[name] = self.constraints.get(name, 0) + len(self.model.proto.constraints) - before

    def literal(self, family: str, value: int) -> cp_model.IntVar:
        """A Boolean that holds exactly when the family takes `value` (cached)."""
        key = (family, value)
        lit = self._lits.get(key)
        if lit is None:
            lit = self._lits[key] = self.model.new_bool_var(f"{family}={value}")
            self.model.add(self.x[family] == value).only_enforce_if(lit)
            self.model.add(self.x[family] != value).only_enforce_if(~lit)
        return lit

    def _add_rules(self) -> None:
        """Every rule reading the block's degrees, with the shape degrees in place."""
        s = self.spec
        for rule in s.rules:
            inner = [f for f in rule.scope if f in s.families]
            if not inner:
                continue
            if math.prod(len(s.domains[f]) for f in inner) > MAX_RULE_TABLE:
                continue
            allowed = []
            for values in itertools.product(*(s.domains[f] for f in inner)):
                given = dict(zip(inner, values))
                if rule.allowed(*(given[f] if f in given else s.shape[f] for f in rule.scope)):
                    allowed.append(values)
            self.model.add_allowed_assignments([self.x[f] for f in inner], allowed)

    def _add_pipeline(self) -> None:
        """First and last stage one class each (the same stage when PP = 1), S_c middle stages,
        the type budgets, flagscale's first-stage DP, classes only where the recompute setting
        prices them."""
        s, m = self.spec, self.model
        top = max(0, max(s.domains["pp"]) - 2)
        pp = self.x["pp"]
        self.single = m.new_bool_var("single_stage")
        m.add(pp == 1).only_enforce_if(self.single)
        m.add(pp >= 2).only_enforce_if(~self.single)
        self.f = [m.new_bool_var(f"first_{c.name}") for c in s.classes]
        self.l = [m.new_bool_var(f"last_{c.name}") for c in s.classes]
        self.S = [m.new_int_var(0, top, f"middle_{c.name}") for c in s.classes]
        self.mid = [m.new_bool_var(f"has_middle_{c.name}") for c in s.classes]
        m.add_exactly_one(self.f)
        m.add(sum(self.l) + self.single == 1)
        m.add(sum(self.S) == pp - 2 + self.single)
        for c in range(len(s.classes)):
            m.add(self.S[c] <= top * self.mid[c])
            m.add(self.S[c] >= self.mid[c])
            for r, row in enumerate(s.prices):
                if c not in row:
                    for b in (self.f[c], self.l[c], self.mid[c]):
                        m.add(b == 0).only_enforce_if(self.literal("recompute", r))
        units = {}
        for c, row in ((c, row) for row in s.prices for c in row):
            units[s.classes[c].type_index] = row[c].units
        for ty, cap in units.items():
            members = [k for k, c in enumerate(s.classes) if c.type_index == ty]
            m.add(sum(s.classes[k].weight * (self.S[k] + self.f[k] + self.l[k]) for k in members) <= cap)
        if s.first_dp is not None:
            for value in s.domains[s.first_dp]:
                for k, c in enumerate(s.classes):
                    if value and c.weight != value:
                        m.add(self.f[k] == 0).only_enforce_if(self.literal(s.first_dp, value))

    def _add_layers(self) -> None:
        """Per layer group: nF + nL + sum_c H_cg >= the group's layers, H_cg the S_c middle stages'
        total (K_cg <= H_cg <= S_c * K_cg); a stage holds a layer."""
        s, m = self.spec, self.model
        top = max(1, max(s.domains["pp"]))
        self.nF, self.nL, self.K, self.Q = [], [], [], []
        for g, count in enumerate(s.groups):
            nF = m.new_int_var(0, count, f"first_layers_{g}")
            nL = m.new_int_var(0, count, f"last_layers_{g}")
            m.add(nL == 0).only_enforce_if(self.single)
            ks, qs, cover = [], [], nF + nL
            for c, cls in enumerate(s.classes):
                k = m.new_int_var(0, count, f"middle_layers_{cls.name}_{g}")
                m.add(k == 0).only_enforce_if(~self.mid[c])
                # the middle stages' total: at most S_c x K_cg (each holds at most K_cg) and, in
                # _add_memory, at most what their positions hold together; not S_c x K_cg itself, as
                # memory-bound middle stages may hold unequal counts (the one nearest the end the most)
                most = m.new_int_var(0, count * top, f"middle_most_{cls.name}_{g}")
                m.add_multiplication_equality(most, [self.S[c], k])
                q = m.new_int_var(0, count * top, f"middle_total_{cls.name}_{g}")
                m.add(q <= most)
                m.add(q >= k)  # the busiest middle stage is one of them
                if g == 0:
                    m.add(k >= 1).only_enforce_if(self.mid[c])
                    m.add(q >= self.S[c])  # every stage holds a layer
                else:
                    m.add(k <= self.K[0][c])
                ks.append(k)
                qs.append(q)
                cover = cover + q
            if g == 0:
                m.add(nF >= 1)
                m.add(nL >= 1).only_enforce_if(~self.single)
            elif s.prefix:  # the first stage holds the model's first layers, the last its last ones
                m.add_element(self.nF[0], list(s.prefix[g - 1]), nF)
                m.add_element(self.nL[0], list(s.suffix[g - 1]), nL)
            else:
                m.add(nF <= self.nF[0])
                m.add(nL <= self.nL[0])
            m.add(cover >= count)
            self.nF.append(nF)
            self.nL.append(nL)
            self.K.append(ks)
            self.Q.append(qs)

    def _add_memory(self) -> None:
        """Every stage's layers (per layer group) within what one stage of its class holds with its
        micro-batches in flight: a table per class and group from (recompute, PP, VPP) to what a
        stage holds at the first position (the most in flight, and the embedding), at the last (the
        output layer) and in between (at least the last stage's in flight); and the middle stages
        of a class together at most what their own positions hold (switchable)."""
        s, m = self.spec, self.model
        if not s.memory:
            return
        n = s.groups[0]
        cols = [self.x["recompute"], self.x["pp"]] + ([self.x[s.vpp]] if s.vpp else [])
        vpps = s.domains[s.vpp] if s.vpp else (1,)
        pipelines = list(itertools.product(s.domains["pp"], vpps))
        loads = [s.inflight.get(pv, (1.0, 1.0)) for pv in pipelines]
        firsts, lasts = np.array([f for f, _ in loads], dtype=float), np.array([x for _, x in loads], dtype=float)
        vs = np.array([v for _, v in pipelines])
        only = np.array([pp == 1 for pp, _ in pipelines])
        for c, cls in enumerate(s.classes):
            for g in range(len(s.groups)):
                rows = []
                for r, row in enumerate(s.prices):
                    held = self._held(row.get(c), n, g, firsts, lasts, vs, only)
                    rows.extend((r, pp) + ((v,) if s.vpp else ()) + h for (pp, v), h in zip(pipelines, held))
                mid, first, last = (m.new_int_var(0, n, f"{w}_holds_{cls.name}_{g}")
                                    for w in ("middle", "first", "last"))
                m.add_allowed_assignments(cols + [mid, first, last], rows)
                m.add(self.K[g][c] <= mid)
                m.add(self.nL[g] <= last).only_enforce_if(self.l[c])
                m.add(self.nF[g] <= first).only_enforce_if(self.f[c])
                m.add(self.Q[g][c] <= self._middle_room(c, g))

    @staticmethod
    def _held(p: Price | None, n: int, g: int, firsts: np.ndarray, lasts: np.ndarray, vs: np.ndarray,
              only: np.ndarray) -> list[tuple[int, int, int]]:
        """Per pipeline (PP, VPP), the layers of group g one stage of price p holds in the middle, at the first
        position (the only stage where PP = 1) and at the last, with the pipeline's micro-batches in flight at the
        first and the last position (Price.holds; (0, 0, 0) without a price)."""
        if p is None:
            return [(0, 0, 0)] * len(vs)
        mid, first, last = (np.zeros(len(vs), dtype=np.int64) for _ in range(3))
        for v in np.unique(vs).tolist():
            at = vs == v
            mid[at] = p.holds_each(lasts[at], n, g, vpp=v)
            last[at] = p.holds_each(lasts[at], n, g, last=True, vpp=v)
            for alone in (False, True):
                sel = at & (only == alone)
                if sel.any():
                    first[sel] = p.holds_each(firsts[sel], n, g, first=True, last=alone, vpp=v)
        return list(zip(mid.tolist(), first.tolist(), last.tolist()))

    def _middle_room(self, c: int, g: int) -> cp_model.IntVar:
        """Most layers of group g the S_c middle stages of class c hold together: each at its own
        position, at best the S_c least loaded middle ones (the j-th from the end keeps at least
        min(j + 1, m) micro-batches in flight; interleaved, (2j + (v - 1)(S + 2) + 1) / v, as
        PP >= S + 2) -- a table from (recompute, VPP, S_c)."""
        s, m = self.spec, self.model
        n = s.groups[0]
        vpps = s.domains[s.vpp] if s.vpp else (1,)
        top = max(0, max(s.domains["pp"]) - 2)
        rows = []
        for r, row in enumerate(s.prices):
            p = row.get(c)
            for v in vpps:
                # the next middle stage's position from the end: j = count + 1
                loads = [min(count + 2, s.microbatches) if v == 1 else
                         min((2 * (count + 1) + (v - 1) * (count + 3) + 1) / v, s.microbatches)
                         for count in range(top + 1)]
                held = p.holds_each(np.array(loads, dtype=float), n, g, vpp=v) if p is not None else \
                    np.zeros(top + 1, dtype=np.int64)
                totals = np.concatenate(([0], np.cumsum(held)[:-1]))  # before each count's next stage
                rows.extend((r,) + ((v,) if s.vpp else ()) + (count, min(int(total), n * top))
                            for count, total in enumerate(totals.tolist()))
        room = m.new_int_var(0, n * top, f"middle_room_{s.classes[c].name}_{g}")
        cols = [self.x["recompute"]] + ([self.x[s.vpp]] if s.vpp else [])
        m.add_allowed_assignments(cols + [self.S[c], room], rows)
        return room

    def _add_bottleneck(self) -> None:
        """T at least every stage's layers at its class's least time per layer under the recompute
        setting, plus its per-stage time, the ends' extra time and its least pipeline links."""
        s, m = self.spec, self.model
        self.t_top = self.tau_top * s.groups[0] + 3 * self.extra_top
        self.T = m.new_int_var(0, self.t_top, "bottleneck_us")
        for r, row in enumerate(s.prices):
            z = self.literal("recompute", r)
            for c, p in row.items():
                link_in, link_out = self._links(p, f"{r}_{c}")
                for g in range(len(s.groups)):
                    tau = p.tau_us[g]
                    m.add(self.T >= tau * self.K[g][c] + self._extra(p, g, ("middle", c)) + link_in + link_out
                          ).only_enforce_if([z, self.mid[c]])
                    first = tau * self.nF[g] + self._extra(p, g, ("first",)) + p.first_us
                    m.add(self.T >= first + link_out).only_enforce_if([z, self.f[c], ~self.single])
                    m.add(self.T >= first + p.last_us).only_enforce_if([z, self.f[c], self.single])
                    last = tau * self.nL[g] + self._extra(p, g, ("last",)) + p.last_us + link_in
                    m.add(self.T >= last).only_enforce_if([z, self.l[c]])

    def _extra(self, p: Price, g: int, where: tuple):
        """A stage's time beyond its layers' own.  Full block recompute re-runs R_v(n) of a stage's n
        layers with v virtual chunks (the cost model's count, Price.rerun_by_vpp), at least stage_us
        each: the block charges min(n, c_v) re-runs, c_v the least count of any stage that does not
        re-run all its layers, so that R_v(n) >= min(n, c_v) for every n (and for a layer kind's group,
        g >= 1, whatever other layers the stage holds).  Two linear pieces per VPP value, chosen by a
        literal: a table of the exact count made CP-SAT's search stall (one block solve, VPP 3 at 768
        GPUs, ran 120 s where the piecewise form takes under a second)."""
        if not p.block_layers or not p.rerun_by_vpp:
            return p.stage_us  # one re-run (no count known), or no block recompute
        s, m = self.spec, self.model
        key = (p.block_layers, g) + where
        count = self._reruns.get(key)
        if count is None:
            n_var = {"middle": lambda: self.K[g][where[1]], "first": lambda: self.nF[g],
                     "last": lambda: self.nL[g]}[where[0]]()
            name = "_".join(map(str, key))
            count = self._reruns[key] = m.new_int_var(0, s.groups[0], f"reruns_{name}")
            for v, reruns in p.rerun_by_vpp:
                if (s.vpp and v not in s.domains[s.vpp]) or (not s.vpp and v != 1):
                    continue
                floor = min([r for n, r in enumerate(reruns) if r < n], default=len(reruns))
                when = [self.literal(s.vpp, v)] if s.vpp else []
                beyond = m.new_bool_var(f"reruns_beyond_{name}_{v}")
                m.add(n_var >= floor).only_enforce_if(when + [beyond])
                m.add(n_var <= floor - 1).only_enforce_if(when + [~beyond])
                m.add(count >= floor).only_enforce_if(when + [beyond])
                m.add(count >= n_var).only_enforce_if(when + [~beyond])
        return p.stage_us * count

    def _links(self, p: Price, name: str):
        """A stage's least links in and out per micro-batch (all its virtual chunks): a table of the VPP
        when the price has one per VPP value, else the least links."""
        s, m = self.spec, self.model
        rows = [row for row in p.links_by_vpp if s.vpp and row[0] in s.domains[s.vpp]]
        if not rows:
            return p.link_in_us, p.link_out_us
        top = max(max(r[1], r[2]) for r in rows)
        link_in = m.new_int_var(0, top, f"link_in_{name}")
        link_out = m.new_int_var(0, top, f"link_out_{name}")
        m.add_allowed_assignments([self.x[s.vpp], link_in, link_out], [list(r) for r in rows])
        return link_in, link_out

    def _work(self) -> cp_model.LinearExpr:
        """W, a lower bound on the sum of the stage times: each layer group (each kind when the model
        mixes them) at the least time per layer of the classes in use, plus the ends."""
        s, m = self.spec, self.model
        big = self.tau_top + 1
        used = []
        for c in range(len(s.classes)):
            u = m.new_bool_var(f"used_{c}")
            m.add_bool_or([self.mid[c], self.f[c], self.l[c]]).only_enforce_if(u)
            for b in (self.mid[c], self.f[c], self.l[c]):
                m.add_implication(b, u)
            used.append(u)
        work = 0
        for g in (range(1, len(s.groups)) if len(s.groups) > 1 else range(1)):
            options = []
            for c in range(len(s.classes)):
                t = m.new_int_var(0, big, f"tau_if_used_{c}_{g}")
                m.add(t == big).only_enforce_if(~used[c])
                for r, row in enumerate(s.prices):
                    value = row[c].tau_us[g] if c in row else big
                    m.add(t == value).only_enforce_if([used[c], self.literal("recompute", r)])
                options.append(t)
            least = m.new_int_var(0, big, f"least_tau_{g}")
            m.add_min_equality(least, options)
            work = work + s.groups[g] * least
        first = m.new_int_var(0, self.extra_top, "first_extra")
        last = m.new_int_var(0, self.extra_top, "last_extra")
        for r, row in enumerate(s.prices):
            z = self.literal("recompute", r)
            for c, p in row.items():
                m.add(first == p.first_us).only_enforce_if([z, self.f[c]])
                m.add(last == p.last_us).only_enforce_if([z, self.f[c], self.single])
                m.add(last == p.last_us).only_enforce_if([z, self.l[c]])
        return work + first + last

    def _add_objective(self) -> None:
        """v * theta >= W + (m*v - 1) * T - (v - 1), per VPP value (m is the shape's)."""
        s, m = self.spec, self.model
        work = self._work()
        sync = self._sync()
        vpps = s.domains[s.vpp] if s.vpp else (1,)
        mb = s.microbatches
        top = s.groups[0] * (self.tau_top + 1) * 2 + 2 * self.extra_top + mb * max(vpps) * self.t_top + \
            self.sync_top
        self.theta = m.new_int_var(0, top, "theta_us")
        if s.vpp is None:
            m.add(self.theta >= work + (mb - 1) * self.T + sync)
            return
        for v in vpps:
            m.add(v * self.theta >= work + (mb * v - 1) * self.T + v * sync - (v - 1)).only_enforce_if(
                self.literal(s.vpp, v))

    def _sync(self) -> cp_model.IntVar:
        """The iteration's DP sync and optimizer step: at least the busiest middle stage's of each
        class in use (by its layers of the sync group)."""
        s, m = self.spec, self.model
        g = s.sync_group
        top = self.sync_top = max([0] + [max(p.sync_us) for row in s.prices for p in row.values() if p.sync_us])
        sync = m.new_int_var(0, top, "sync_us")
        for r, row in enumerate(s.prices):
            z = self.literal("recompute", r)
            for c, p in row.items():
                if len(p.sync_us) != s.groups[g] + 1:
                    continue
                busiest = m.new_int_var(0, top, f"sync_{s.classes[c].name}_{r}")
                m.add_element(self.K[g][c], list(p.sync_us), busiest)
                m.add(sync >= busiest).only_enforce_if([z, self.mid[c]])
        return sync

    # ---- cuts and solving ----
    def allow(self, family: str, values: Sequence[int]) -> None:
        """Only these values of a family (the shape screen's verdict; it only narrows)."""
        self.model.add_allowed_assignments([self.x[family]], [(v,) for v in values])
        self._by_vpp.clear()

    def forbid(self, configs: Sequence[dict[str, int]]) -> None:
        """No-good cuts: these configurations of the shape are settled."""
        if configs:
            self.model.add_forbidden_assignments([self.x[f] for f in self.spec.families],
                                                 [tuple(c[f] for f in self.spec.families) for c in configs])
            for c in configs:  # the other VPP values' optima stand
                self._by_vpp.pop(c.get(self.spec.vpp) if self.spec.vpp else None, None)

    def solve(self, *, time_limit_s: float, num_workers: int, cutoff_us: int | None = None,
              floor_us: float | None = None) -> BlockResult:
        """The least relaxation value over the configurations left; with `cutoff_us` only below it
        (the cutoff stays: the best plan only improves); `floor_us` a known lower bound (the last
        solve's value: cuts only remove configurations).

        With several VPP values the block is solved once per value, under an assumption that fixes it:
        one model with VPP free proves its optimum slowly, because the bubble's v x theta constraint holds
        under a different literal for each value; fixed, each solve is a few thousand branches.  A value's
        optimum is kept until a cut (forbid) or allow() touches it, or the cutoff passes it.  The result
        is the least value over the VPP values, and its bound the least of their bounds."""
        m = self.model
        if cutoff_us is not None:
            m.add(self.theta <= cutoff_us - 1)
        if floor_us is not None:
            m.add(self.theta >= int(floor_us))
        vpps = self.spec.domains[self.spec.vpp] if self.spec.vpp else ()
        if len(vpps) <= 1:
            return self._solve_once([], time_limit_s, num_workers)
        end = time.perf_counter() + time_limit_s
        results: list[BlockResult] = []
        bounds: list[int] = []
        wall, branches, complete = 0.0, 0, True
        for v in vpps:
            known = self._by_vpp.get(v, False)
            stale = known is not None and known is not False and (
                (cutoff_us is not None and known.objective_us >= cutoff_us) or
                (floor_us is not None and known.objective_us < int(floor_us)))
            if known is False or stale:
                res = self._solve_once([self.literal(self.spec.vpp, v)], max(0.01, end - time.perf_counter()),
                                       num_workers)
                wall, branches = wall + res.wall_s, branches + res.branches
                if res.status == "OPTIMAL":
                    self._by_vpp[v] = known = res
                elif res.status == "INFEASIBLE":
                    self._by_vpp[v] = known = None
                else:
                    complete = False
                    known = res if res.status == "FEASIBLE" else None
                    if res.bound_us is not None:
                        bounds.append(res.bound_us)
            if known is not None:
                results.append(known)
        if not results:
            status = "INFEASIBLE" if complete else "UNKNOWN"
            return BlockResult(status=status, degrees=None, objective_us=None,
                               bound_us=min(bounds) if bounds else None, wall_s=wall, branches=branches)
        best = min(results, key=lambda r: r.objective_us)
        out = BlockResult(status="OPTIMAL" if complete else "FEASIBLE", degrees=dict(best.degrees),
                          objective_us=best.objective_us,
                          bound_us=best.objective_us if complete else min([best.objective_us] + bounds),
                          wall_s=wall, branches=branches, first=best.first, last=best.last,
                          middle=dict(best.middle or {}))
        return out

    def _solve_once(self, assumptions: list, time_limit_s: float, num_workers: int) -> BlockResult:
        m = self.model
        m.clear_assumptions()
        if assumptions:
            m.add_assumptions(assumptions)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, float(time_limit_s))
        # Ctrl-C is the planner's (planner/signals.py): CP-SAT would take it as 'stop this solve' and the search
        # would go on
        solver.parameters.catch_sigint_signal = False
        solver.parameters.num_workers = int(num_workers)
        # restarts: with the default single-worker search one block solve in a few hundred stalled (768 GPUs:
        # VPP 6, 26 million branches in 120 s, where a restarting portfolio proves it in 0.2 s)
        solver.parameters.search_branching = cp_model.PORTFOLIO_WITH_QUICK_RESTART_SEARCH
        status = solver.solve(m)
        m.clear_assumptions()
        found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        bound = None
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
            bound = int(math.floor(solver.best_objective_bound + 1e-6))
        res = BlockResult(status=solver.status_name(status),
                          degrees={f: int(solver.value(v)) for f, v in self.x.items()} if found else None,
                          objective_us=int(round(solver.objective_value)) if found else None, bound_us=bound,
                          wall_s=solver.wall_time, branches=solver.num_branches)
        if found:
            res.first = next(c for c, b in enumerate(self.f) if solver.boolean_value(b))
            res.last = next((c for c, b in enumerate(self.l) if solver.boolean_value(b)), None)
            res.middle = {c: int(solver.value(v)) for c, v in enumerate(self.S) if solver.value(v)}
        return res
