"""Screening: best-first search over the configurations of the space with one backend of
solver_models (HS-DP, or brute force), the search of --backend hsdp.  The driver (driver.py) runs
it; --backend cpsat searches with a CP-SAT master instead (certify.py).

The queue holds entries ordered by a lower bound, refined in levels as an entry reaches the top:

  shape   a set of global choices differing only in PP, VPP and recompute (space.Shape), with
          the least relaxed bound over its pipelines; at the top it is expanded into its choices
  0       a global choice G with the relaxed bound (its shape's no-recompute per-layer times, and
          math.inf where its stages cannot hold the layers' weights, gradients and optimizer state
          alone; valid for every recompute setting, planner/search/bounds.ShapeBounds)
  1       the cheap bound (G's own stage options, with the memory test)
  2       the tight bound (integral layers, memory per position, GPU budgets)
  then    G's stage problem is solved by the backend over the integer tables.

Once the top's bound reaches the k-th best plan, everything left is bounded out.  The memory
pruning lets a configuration's greater recompute settings in only when the lesser one has no
layout that fits; cp_min_seq sets shapes aside (planner/search/pruning.py).  Every bound is
valid for the whole space, so what is left in the queue, set aside or pruned still yields a
whole-space lower bound (Screening.whole_space_bound).

First plan: bounding every shape takes most of a large space's time before the queue's best-first
order can start (13,000 configurations and a few seconds).  With no plan yet, each shape the
enumeration bounds (up to FIRST_PLAN_SHAPES) has a few of its configurations solved at once, in the
queue's order (Screening.first_plan), so an anytime search holds a plan within milliseconds.  Those plans
are kept apart (`early`) and change nothing the best-first search does (its bounds, its order, its
upper bounds): they join its plans only when it is cut short or found none (adopt_first_plans), so a
search that runs to its end returns exactly what it returned without them.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Iterator

from planner.cost.model import CostModel
from planner.schemas.plan import Plan, Recompute, StagePlan
from planner.schemas.search import GlobalChoice, StageOption
from planner.search.bounds import ShapeBounds, lower_bound_s, option_bound, stage_free_bytes
from planner.search.settings import Candidate, ProgressClock, ProgressEvent, ProgressFn, SearchSettings
from planner.search.space import SearchSpace, Shape, enumerate_shapes, recompute_ladder, stage_options
from planner.search.tables import TableBuilder
from solver_models.backends import get_backend
from solver_models.base import Solution
from solver_models.fitting import has_fitting_layout
from solver_models.scaling import bound_s, from_us
from solver_models.tables import DeadlinePassed, StageTables

# share of the time limit the enumeration may take before the search solves what it has
ENUMERATION_SHARE = 0.5
PROGRESS_EVERY_S = 0.2
# with no plan after this share of the time limit (0: from the start), screening solves the next
# configuration whose tight bound is finite instead of waiting for it to reach the top of the queue
DIVE_AFTER = 0.0
SHAPE = -1  # QueueEntry.level of a shape entry
# with no plan yet: the enumeration tries this many shapes at most at once (Screening.first_plan) ...
FIRST_PLAN_SHAPES = 32
# ... and of each, this many configurations whose bounds show a layout that fits, at most
FIRST_PLAN_TRIES = 2


@dataclass(order=True)
class QueueEntry:
    """One queue entry, ordered by (bound, recompute rank, arrival); see the module docstring."""

    bound_s: float
    rank: int  # position of G's recompute on the ladder: less recompute first on ties
    seq: int
    level: int = field(compare=False)  # SHAPE, 0, 1 or 2
    g: GlobalChoice | None = field(compare=False, default=None)
    shape: Shape | None = field(compare=False, default=None)
    options: list[StageOption] = field(compare=False, default_factory=list)
    obs: dict = field(compare=False, default_factory=dict)  # OptionBound per option (level >= 1)


@dataclass
class ConfigRecord:
    """What screening learned about one configuration, for the certificate."""

    g: GlobalChoice
    options: list[StageOption]
    bound_s: float  # valid lower bound on its optimum in the searched (pruned) space
    whole_bound_s: float  # valid for the whole space
    solved: bool = False  # bound_s is the configuration's optimum under its (pruned) tables
    feasible: bool = True
    stages: list = field(default_factory=list)


def config_key(g: GlobalChoice) -> tuple:
    """A global choice without its recompute setting (the memory-pruning ladder runs over this)."""
    return (g.runtime, g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.pp, g.vpp, g.first_dp)


def shape_key(g: GlobalChoice) -> tuple:
    """G without PP, VPP and recompute: what stage options and per-layer figures depend on."""
    return (g.runtime, g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.first_dp)


def plan_from_solution(g: GlobalChoice, t: StageTables, stages: list[tuple[int, int, int]], gbs: int) -> Plan:
    samples = g.samples_per_microbatch  # per micro-batch, all DP ranks of a stage together
    mbs = samples // t.options[stages[0][0]].dp
    return Plan(
        runtime=g.runtime, tp=g.tp, cp=g.cp, ep=g.ep, etp=g.etp, vpp=g.vpp, mbs=mbs, gbs=gbs,
        sequence_parallel=g.tp > 1,
        stages=tuple(StagePlan(device_type=t.options[o].device_type, num_layers=n, dp=t.options[o].dp,
                               recompute=t.options[o].recompute) for o, _, n in stages),
    )


class Configurations:
    """The configurations of one search: shapes, stage options and the lower bounds, with the
    work shared across configurations cached here."""

    def __init__(self, cost: CostModel, space: SearchSpace, builder: TableBuilder):
        self.cost, self.space, self.builder = cost, space, builder
        model = cost.model
        self.budget = cost.cluster.gpus_by_type()
        self.gpn = {h: cost.domain_gpus(h) for h in self.budget}
        self.kind_counts = {k: model.layer_is_moe.count(k) for k in (False, True)}
        self.ladder_rank = {r.label: k for k, r in enumerate(recompute_ladder(model, space.recompute, cost.training))}
        self._options: dict = {}
        self._option_bounds: dict = {}
        self._shape_bounds: dict = {}
        self._pipeline_bounds: dict = {}  # shape key -> {(pp, vpp): relaxed bound}
        self._inflight: dict = {}
        self._room: dict = {}
        self._bound_cache: dict = {}

    def shapes(self) -> Iterator[Shape]:
        c = self.cost
        return enumerate_shapes(c.model, c.training, c.cluster, self.space, self.gpn)

    def options(self, g: GlobalChoice) -> list[StageOption]:
        key = (shape_key(g), g.recompute.label if g.recompute else None)
        hit = self._options.get(key)
        if hit is None:  # the options do not depend on PP or VPP
            c = self.cost
            hit = self._options[key] = stage_options(g, c.model, c.training, c.cluster, self.space, self.gpn)
        return hit

    def num_microbatches(self, g: GlobalChoice) -> int:
        return self.cost.training.global_batch_size // (g.mbs * g.dp0)

    def inflight(self, g: GlobalChoice) -> list[float]:
        key = (self.num_microbatches(g), g.pp, g.vpp)
        hit = self._inflight.get(key)
        if hit is None:
            gs = self.builder.shape(g)
            hit = self._inflight[key] = [self.cost.inflight_microbatches(gs, i) for i in range(g.pp)]
        return hit

    def option_bounds(self, g: GlobalChoice, options: list[StageOption]) -> dict:
        gs = None
        out = {}
        for o in options:
            key = (shape_key(g), o)
            ob = self._option_bounds.get(key)
            if ob is None:
                # a one-layer middle stage does not depend on PP or VPP: share the bound across them
                gs = gs or replace(self.builder.shape(g), vpp=1, pp=2)
                ob = self._option_bounds[key] = option_bound(self.cost, gs, o)
            out[o] = ob
        return out

    def _bounds(self, g: GlobalChoice, relaxed: bool) -> tuple[ShapeBounds, list[StageOption], dict] | None:
        """The shape's bounds: relaxed, over its options without recompute (valid for every
        recompute setting), or over G's own options; None when G has no stage option."""
        label = None if relaxed else (g.recompute.label if g.recompute else "per-stage")
        key = (shape_key(g), label)
        hit = self._shape_bounds.get(key, False)
        if hit is False:
            options = self.options(g)
            if relaxed:
                options = list(dict.fromkeys(StageOption(o.device_type, o.dp, Recompute.none()) for o in options))
            if not options:
                hit = None
            else:
                obs = self.option_bounds(g, options)
                sb = ShapeBounds(obs, g, options, self.budget, self.cost.model.num_layers,
                                 self.num_microbatches(g), self.kind_counts, self._bound_cache)
                hit = (sb, options, obs)
            self._shape_bounds[key] = hit
        return hit

    def shape_bounds(self, shape: Shape) -> dict[tuple[int, int], float] | None:
        """The relaxed bound of each (PP, VPP) of the shape (None: no stage option)."""
        key = shape_key(shape.base)
        hit = self._pipeline_bounds.get(key)
        if hit is None:
            pp, vpp = shape.pipelines[0]
            found = self._bounds(shape.choice(pp, vpp, shape.recomputes[0]), relaxed=True)
            if found is None:
                return None
            values = found[0].pipeline_bounds(shape.pipelines)
            hit = self._pipeline_bounds[key] = dict(zip(shape.pipelines, values.tolist()))
        return hit

    def rank(self, g: GlobalChoice) -> int:
        return self.ladder_rank.get(g.recompute.label, 0) if g.recompute is not None else 0

    def relaxed_bound(self, g: GlobalChoice) -> float:
        """G's level-0 bound (its shape's, computed when the shape was first bounded)."""
        return self._pipeline_bounds[shape_key(g)][(g.pp, g.vpp)]

    def cheap_entry(self, e: QueueEntry) -> QueueEntry:
        """Level 1: G's own options with the memory test (bound math.inf: cannot fit)."""
        hit = self._bounds(e.g, relaxed=False)
        if hit is None:
            return replace(e, bound_s=math.inf, level=1)
        sb, options, obs = hit
        lb = sb.bound(e.g.pp, e.g.vpp, self.inflight(e.g), memory=True)
        return replace(e, bound_s=max(e.bound_s, lb), level=1, options=options, obs=obs)

    def tight_entry(self, e: QueueEntry, beat_s: float) -> QueueEntry:
        """Level 2 (bound math.inf: no layout fits); the bound computation stops early at beat_s."""
        return replace(e, bound_s=max(e.bound_s, self.tight_bound_s(e.g, beat_s)), level=2)

    def tight_bound_s(self, g: GlobalChoice, beat_s: float = math.inf) -> float:
        """G's tight bound (bounds.lower_bound_s: integral layers, memory per position, GPU budgets) on its
        float cost; math.inf when no layout fits; once it reaches beat_s, beat_s.  --backend cpsat reads it
        too (planner/search/certify.py)."""
        options = self.options(g)
        if not options:
            return math.inf
        free_at = {}
        pp = min(g.pp, 2)  # the only stage of a pipeline (PP 1) has no pipeline buffers, every other stage has
        for o in options:
            key = (shape_key(g), o, pp)
            if key not in self._room:
                self._room[key] = stage_free_bytes(self.cost, replace(self.builder.shape(g), vpp=1, pp=pp), o)
            free_at[o] = self._room[key]
        return lower_bound_s(self.option_bounds(g, options), g, options, self.budget, self.cost.model.num_layers,
                             self.num_microbatches(g), self.inflight(g), tight=True, beat_s=beat_s,
                             cache=self._bound_cache, kind_counts=self.kind_counts, free_at=free_at)


class Screening:
    """Best-first search over the configurations with one backend (module docstring)."""

    def __init__(self, cost: CostModel, space: SearchSpace, settings: SearchSettings, t0: float,
                 progress: ProgressFn | None, stop_at: float | None = None, budget_s: float | None = None,
                 configs: Configurations | None = None):
        """`configs`: the configurations (and their table builder) of an earlier screening of the same cost
        model and space, whose cached bounds and tables hold whatever the pruning (the driver's second pass)."""
        self.cost, self.space, self.settings, self.t0, self.progress = cost, space, settings, t0, progress
        self.solver_settings = settings.solver_settings()  # what each backend solve gets
        self.stop_at = stop_at if stop_at is not None else settings.deadline  # screening's own deadline
        self.budget_s = budget_s if budget_s is not None else settings.time_limit_s
        self.pruning = settings.pruning
        if configs is None:
            configs = Configurations(cost, space, TableBuilder(cost, contiguous_types=space.contiguous))
        elif configs.cost is not cost or configs.space != space:
            raise ValueError("the configurations of another cost model or space")
        self.builder, self.configs = configs.builder, configs
        self.backend_name = settings.backend
        self.backend = get_backend(self.backend_name)
        self.heap: list[QueueEntry] = []
        self.deferred: dict[tuple, list[GlobalChoice]] = {}  # memory pruning: greater recompute, waiting
        self.cp_pruned: list[Shape] = []
        self.records: dict[GlobalChoice, ConfigRecord] = {}
        self.cands: list[Candidate] = []
        self.early: list[Candidate] = []  # plans the enumeration found at once (first_plan), kept apart
        self.first_plan_shapes = 0  # shapes first_plan tried
        self.notes: list[str] = []
        self.total = self.solved = self.bounded = self.infeasible = self.done = 0
        self.tables_built = 0  # configurations whose integer tables were built (the bounds settled the rest)
        self.enumerated = 0  # configurations with at least one stage option
        self.seq = 0
        self.complete = True  # every configuration solved was solved to optimality (no budget cut)
        self.enumeration_complete = True
        self._shapes: Iterator[Shape] | None = None  # the space's shapes, as far as enumerate() took them
        self._shapes_seen = 0
        self._stopped_note = ""
        self.delta_fallbacks = 0
        self.timed_out = False
        self.clock = ProgressClock(PROGRESS_EVERY_S)

    # ---- filling the queue ----
    def enumerate(self, until: float | None = None) -> None:
        """Every shape of the space into the queue with its least relaxed bound (cp_min_seq sets
        some aside).  Stops at ENUMERATION_SHARE of the time limit (or at `until`); a later call goes on
        from the shape it stopped at."""
        stop_at = self.t0 + ENUMERATION_SHARE * self.budget_s if until is None else until
        if self._shapes is None:
            self._shapes = iter(self.configs.shapes())
        elif self.enumeration_complete:
            return
        if self._stopped_note in self.notes:
            self.notes.remove(self._stopped_note)
        self.enumeration_complete = True
        model = self.cost.model
        # the run's flags fix CP (--hierarchical-context-parallel-sizes): cp_min_seq would leave no CP
        cp_fixed = self.cost.training.megatron.hierarchical_context_parallel_sizes is not None
        for shape in self._shapes:
            k, self._shapes_seen = self._shapes_seen, self._shapes_seen + 1
            if k % 64 == 0 and time.perf_counter() > stop_at:
                self.enumeration_complete = False
                self._shapes, self._shapes_seen = itertools.chain([shape], self._shapes), k  # resumed from here
                self._stopped_note = (f"time limit: enumeration stopped after {k} shapes (it may take "
                                      f"{ENUMERATION_SHARE:.0%} of --time-limit); the rest were not searched")
                self.notes.append(self._stopped_note)
                break
            if self.pruning.cp_pruned(model, shape.base) and not cp_fixed:
                self.cp_pruned.append(shape)
                continue
            bounds = self.configs.shape_bounds(shape)
            if bounds is None:
                continue
            self.enumerated += shape.size
            least = min(bounds.values())
            if not math.isfinite(least):  # no layout fits, whatever its PP, VPP and recompute: settled here
                self.infeasible += shape.size
                self.total += shape.size
                self.done += shape.size
                continue
            self.total += shape.size
            heapq.heappush(self.heap, QueueEntry(least, 0, self._next_seq(), SHAPE, shape=shape))
            if not self.cands and not self.early and self.first_plan_shapes < FIRST_PLAN_SHAPES:
                self.first_plan(shape, bounds)
            self.report_progress("enumerating", "")

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def expand(self, shape: Shape) -> None:
        """A shape's global choices into the queue at level 0; with memory pruning (megatron) only
        the least recompute of each (PP, VPP), the greater ones waiting in `deferred`."""
        bounds = self.configs.shape_bounds(shape)
        wait = self.pruning.memory and not shape.base.per_stage_recompute
        for pipe in shape.pipelines:
            lb = bounds[pipe]
            if not math.isfinite(lb):
                self.infeasible += len(shape.recomputes)
                continue
            for k, rc in enumerate(shape.recomputes):
                g = shape.choice(pipe[0], pipe[1], rc)
                if wait and k > 0:
                    self.deferred.setdefault(config_key(g), []).append(g)
                    continue
                heapq.heappush(self.heap, QueueEntry(lb, self.configs.rank(g), self._next_seq(), 0, g=g))

    def push_next(self, g: GlobalChoice) -> None:
        """The least recompute of G's configuration that entered does not fit after all: let the
        next one on the ladder in (memory pruning keeps only the least recompute that fits)."""
        waiting = self.deferred.get(config_key(g))
        if waiting:
            nxt = waiting.pop(0)
            heapq.heappush(self.heap, QueueEntry(self.configs.relaxed_bound(nxt), self.configs.rank(nxt),
                                                 self._next_seq(), 0, g=nxt))

    # ---- a first plan, while the space is bounded ----
    def first_plan(self, shape: Shape, bounds: dict[tuple[int, int], float]) -> None:
        """No plan yet: solve some of this newly bounded shape's configurations at once, in the queue's order
        (least relaxed bound, then least recompute), the first FIRST_PLAN_TRIES whose tight bound is finite
        (their stages hold a layout), until one gives a plan.  The plan goes to `early`, apart from the
        best-first search (module docstring); the configurations stay in the queue as they were."""
        self.first_plan_shapes += 1
        order = sorted((b, self.configs.rank(g), k, g) for k, g in enumerate(shape.choices())
                       if math.isfinite(b := bounds[(g.pp, g.vpp)]))
        tries = 0
        for b, rank, _, g in order:
            if tries >= FIRST_PLAN_TRIES or time.perf_counter() > self.stop_at:
                return
            e = self.configs.cheap_entry(QueueEntry(b, rank, 0, 0, g=g))
            if math.isfinite(e.bound_s):
                e = self.configs.tight_entry(e, math.inf)
            if not math.isfinite(e.bound_s):
                continue
            tries += 1
            try:
                found = self._first_solution(e)
            except DeadlinePassed:
                return
            if found is not None:
                self.early.append(found)
                self.report_progress("enumerating", g.label(), force=True)
                return

    def _first_solution(self, e: QueueEntry) -> Candidate | None:
        """e's configuration solved with no upper bound (the load-balance pruning dropped when it leaves no
        layout that fits), or None."""
        tables = self.tables(e.g, e.options)
        if not has_fitting_layout(tables):
            return None
        sol = self.backend.solve(tables, upper_bound_us=None, settings=self.solver_settings)
        if sol is None and tables.windows is not None:
            tables = tables.pruned(delta=None, memory=tables.memory_prune)
            sol = self.backend.solve(tables, upper_bound_us=None, settings=self.solver_settings)
        if sol is None or not sol.stages:
            return None
        return self._candidate(e, tables, sol)

    def adopt_first_plans(self) -> None:
        """At the end of a screening cut short (or one that found no plan of its own), the plans first_plan
        found join its plans (after them on ties); a screening that ran to its end keeps its own alone."""
        if not self.early or (self.cands and not self.timed_out and self.enumeration_complete):
            return
        have = {c.g for c in self.cands}
        self.cands = sorted(self.cands + [c for c in self.early if c.g not in have], key=lambda c: c.objective_s)
        del self.cands[self.settings.top_k * 4:]

    def best_known(self) -> Candidate | None:
        """The best plan found so far, the search's or first_plan's (the search's on a tie)."""
        return min(self.cands[:1] + self.early, key=lambda c: c.objective_s, default=None)

    # ---- solving ----
    def kth_best(self) -> float:
        k = self.settings.top_k
        if len(self.cands) < k:
            return math.inf
        return sorted(c.objective_s for c in self.cands)[k - 1]

    def run(self) -> None:
        """Pop, refine, solve, until the queue is empty, bounded out, or `stop_at` passes
        (timed_out; run() may be called again with a later stop_at)."""
        self.timed_out = False
        dive_after = self.t0 + DIVE_AFTER * self.budget_s
        while self.heap:
            if time.perf_counter() > self.stop_at:
                self.timed_out = True
                break
            kth = self.kth_best()
            e = self.heap[0]
            if e.bound_s >= kth:
                self.bounded += sum(x.shape.size if x.level == SHAPE else 1 for x in self.heap)
                break
            heapq.heappop(self.heap)
            if e.level == SHAPE:
                self.expand(e.shape)
                continue
            if e.level < 2:
                e = self.configs.cheap_entry(e) if e.level == 0 else self.configs.tight_entry(e, kth)
                if not math.isfinite(e.bound_s):
                    self.infeasible += 1
                    self.done += 1
                    self.record(e, math.inf, math.inf, solved=True, feasible=False)
                    self.push_next(e.g)
                    continue
                if e.level < 2 or self.cands or time.perf_counter() < dive_after:
                    heapq.heappush(self.heap, e)
                    continue
                # no plan yet (after DIVE_AFTER of the time): solve the first configuration whose
                # tight bound is finite at once, for a plan to bound the others with
            first = self.best_known() is None
            self._solve(e, kth)
            self.report_progress("screening", e.g.label(), force=first and bool(self.cands))
            if self.timed_out:  # the deadline passed inside the solve
                break

    def record(self, e: QueueEntry, bound: float, whole: float, *, solved: bool, feasible: bool = True,
               stages: list | None = None) -> None:
        """What screening (or the certificate) learned about e's configuration: a bound valid for
        the searched space, one valid for the whole space, and whether it is solved."""
        self.records[e.g] = ConfigRecord(e.g, e.options, bound, whole, solved=solved, feasible=feasible,
                                         stages=stages or [])

    def tables(self, g: GlobalChoice, options: list[StageOption]) -> StageTables:
        self.tables_built += 1
        t = self.builder.build(g, options, deadline=self.settings.deadline)
        return t.pruned(delta=self.pruning.delta, memory=self.pruning.memory and g.per_stage_recompute)

    def _solve(self, e: QueueEntry, kth: float) -> None:
        self.done += 1
        try:
            self._solve_entry(e, kth)
        except DeadlinePassed:  # the time limit passed while its tables were built or read
            self.complete = False
            self.timed_out = True
            self.record(e, e.bound_s, e.bound_s, solved=False)

    def _solve_entry(self, e: QueueEntry, kth: float) -> None:
        s, g = self.settings, e.g
        tables = self.tables(g, e.options)
        ub_us = int(kth * g.vpp / 1e-6) + 1 if math.isfinite(kth) else None
        if not self.cands and not has_fitting_layout(tables):
            # no plan yet, and none fits here (a quick test before the solve the dive asks for)
            self.infeasible += 1
            self.record(e, math.inf, math.inf if tables.exact or not tables.memory_prune else e.bound_s,
                        solved=True, feasible=False)
            self.push_next(g)
            return
        sol = self.backend.solve(tables, upper_bound_us=ub_us, settings=self.solver_settings)
        self.solved += 1
        if sol is None and ub_us is None and tables.windows is not None and has_fitting_layout(tables):
            # load-balance pruning can rule out every layout that fits in memory: with no plan yet,
            # solve this configuration without it rather than report nothing
            tables = tables.pruned(delta=None, memory=tables.memory_prune)
            sol = self.backend.solve(tables, upper_bound_us=None, settings=self.solver_settings)
            if sol is not None and sol.stages:
                self.delta_fallbacks += 1
                sol.exact = False
        if sol is None:
            # nothing under these tables (or nothing better than the k-th best): resolved
            self.infeasible += ub_us is None
            value = kth if ub_us is not None else math.inf
            self.record(e, value, value if tables.exact else e.bound_s, solved=True, feasible=ub_us is not None)
            if self.deferred.get(config_key(g)) and not has_fitting_layout(tables):
                self.push_next(g)
            return
        if not sol.stages:  # the time ran out before any plan: this choice stays unproven
            self.complete = False
            self.record(e, e.bound_s, e.bound_s, solved=False)
            return
        complete = sol.status == "OPTIMAL"
        if not complete:
            self.complete = False
        cand = self._candidate(e, tables, sol)
        self.record(e, cand.objective_s if complete else e.bound_s, cand.objective_s if sol.exact else e.bound_s,
                    solved=complete, stages=sol.stages)
        self.cands.append(cand)
        self.cands.sort(key=lambda c: c.objective_s)
        del self.cands[s.top_k * 4:]

    def _candidate(self, e: QueueEntry, tables: StageTables, sol: Solution) -> Candidate:
        """The plan of a backend's solution for e's configuration."""
        g = e.g
        plan = plan_from_solution(g, tables, sol.stages, self.cost.training.global_batch_size)
        return Candidate(g=g, objective_s=from_us(sol.objective_us) / g.vpp, plan=plan, backend=self.backend_name,
                         status=sol.status, bound_s=bound_s(sol.bound_us, g.vpp) if sol.status == "OPTIMAL"
                         else e.bound_s, options=e.options, stages=sol.stages)

    def report_progress(self, phase: str, config: str, force: bool = False) -> None:
        """Call the progress callback (at most every PROGRESS_EVERY_S unless forced).  At the end
        (phase "done") of a search that was not cut short every configuration counts as done."""
        if not self.progress or not self.clock.due(force):
            return
        now = time.perf_counter()
        finished = phase == "done" and not self.timed_out and self.enumeration_complete
        best = self.best_known()
        # the searched space's lower bound so far, the one the final report's searched-space gap uses (no higher
        # than the best plan: first_plan's may lie outside a pruned space)
        bound = min(self.pruned_space_bound(), best.objective_s if best else math.inf) \
            if (self.heap or self.records) else None
        self.progress(ProgressEvent(
            done=self.total if finished else self.done, total=self.total, solved=self.solved, elapsed_s=now - self.t0,
            best_s=best.objective_s if best else None, bound_s=bound, phase=phase, config=config,
            best_plan=best.plan if best else None))

    # ---- what was proven ----
    @property
    def pruned_memory(self) -> int:
        return sum(len(w) for w in self.deferred.values())

    @property
    def pruned_cp(self) -> int:
        return sum(s.size for s in self.cp_pruned)

    def pruned_space_bound(self) -> float:
        """A lower bound on the pruned space's optimum: the least over configurations of what each
        is known to cost at least (the queue's entries for those not reached)."""
        parts = [r.bound_s for r in self.records.values()] + [e.bound_s for e in self.heap]
        return min(parts, default=math.inf)

    def whole_space_bound(self) -> float | None:
        """A lower bound valid for the whole space, or None.  With pruning, the configurations it
        set aside are bounded too (relaxed bounds; None if the deadline passes first)."""
        if not self.enumeration_complete:
            return None
        parts = [r.whole_bound_s for r in self.records.values()] + [e.bound_s for e in self.heap]
        # the relaxed bound does not depend on the recompute setting: it holds for those waiting
        parts += [self.configs.relaxed_bound(w[0]) for w in self.deferred.values() if w]
        for k, shape in enumerate(self.cp_pruned):
            if k % 64 == 0 and time.perf_counter() > self.settings.deadline:
                self.notes.append("no whole-space lower bound: the time limit passed while bounding the "
                                  "configurations the pruning set aside")
                return None
            bounds = self.configs.shape_bounds(shape)
            if bounds:
                parts.append(min(bounds.values()))
        return min(parts, default=math.inf)
