"""The search driver: which configuration to solve next, and when the answer is proven.

    search() = enumerate (space.py) -> bound (bounds.py) -> best-first screening (this module, any
               backend of solver_models over the integer tables) -> certificate (certify.py: the
               CP-SAT master over the degrees, for --backend cpsat).

Screening visits global choices G in increasing lower bound: the cheap bound for all of them, the
tight one (integral layers, memory, GPU budgets) when a choice reaches the top of the queue.  Once
the bound reaches the best plan found, every remaining choice is bounded out.

What a result claims (SearchResult):
  - `status` OPTIMAL: certified over the whole space (no pruning, every configuration solved
    exactly or bounded out, within the time limit); FEASIBLE otherwise.
  - `pruned_space_optimal`: the same statement for the pruned space (what the prunings left).
  - `lower_bound_s`: a bound valid for the whole space, or None when it is not known; never above
    the optimum (the tables round down, so table bounds bound the evaluator's costs).

Progress: `search(..., progress=fn)` calls fn(SearchProgress) at most every 0.2 s and once at the
end (phase "done").
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from planner.cost.model import CostModel, PlanCost
from planner.errors import InfeasibleError, SearchTimeLimitError
from planner.schemas.plan import Plan, Recompute, StagePlan
from planner.schemas.search import GlobalChoice, StageOption
from planner.search.bounds import ShapeBounds, lower_bound_s, option_bound, stage_free_bytes
from planner.search.explain import explain_infeasible
from planner.search.pruning import Pruning
from planner.search.space import SearchSpace, enumerate_globals, recompute_ladder, stage_options
from planner.search.tables import TableBuilder
from solver_models import get_backend
from solver_models.hsdp import has_fitting_layout
from solver_models.scaling import bound_s, from_us
from solver_models.tables import StageTables

# share of the time limit the enumeration may take before the search solves what it has
ENUMERATION_SHARE = 0.5
PROGRESS_EVERY_S = 0.2


@dataclass
class SearchSettings:
    backend: str = "cpsat"  # cpsat | hsdp | brute
    delta: float | None = 0.2  # load-balance pruning tolerance; None = off
    memory_prune: bool = True  # the least recompute that fits (paper's pruning 2)
    cp_min_seq_tokens: int | None = 2048  # CP only with this many tokens per CP rank; None = off
    time_limit_s: float = 60.0
    top_k: int = 1
    num_workers: int = 2
    warm_start: bool = True  # flagscale: start from the best uniform-DP plan (a fast megatron-space search)
    deadline: float | None = None  # time.perf_counter() value; search() sets it on its own copy

    @property
    def pruning(self) -> Pruning:
        return Pruning(delta=self.delta, memory=self.memory_prune, cp_min_seq_tokens=self.cp_min_seq_tokens)

    def without_pruning(self) -> "SearchSettings":
        return replace(self, delta=None, memory_prune=False, cp_min_seq_tokens=None)


@dataclass(frozen=True)
class SearchProgress(Mapping):
    """What a progress callback gets: configurations done of the total (both grow while the
    memory pruning lets greater recompute settings in), seconds since the start, the best plan's
    objective so far and the least lower bound of the configurations not yet done (seconds,
    None before any).  Also readable as a mapping (the keys of as_dict)."""

    done: int
    total: int
    solved: int
    elapsed_s: float
    best_s: float | None
    bound_s: float | None
    phase: str  # enumerating | screening | certifying | done
    config: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"done": self.done, "tried": self.done, "total": self.total, "solved": self.solved,
                "elapsed_s": self.elapsed_s, "best_s": self.best_s, "bound_s": self.bound_s,
                "phase": self.phase, "config": "done" if self.phase == "done" else self.config}

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


ProgressFn = Callable[[SearchProgress], None]


@dataclass
class Candidate:
    g: GlobalChoice
    objective_s: float  # from the integer tables (rounded down: at most the plan's float cost)
    plan: Plan
    backend: str
    status: str  # OPTIMAL | FEASIBLE (for this configuration's tables)
    bound_s: float  # lower bound on this G's optimum under its tables
    options: list = field(default_factory=list)
    stages: list = field(default_factory=list)  # solver's (option, start, n)


@dataclass
class SearchResult:
    best: list[Candidate]
    costs: list[PlanCost]  # float evaluator, same order as best
    configs_total: int
    configs_solved: int
    configs_bounded: int
    configs_infeasible: int
    configs_pruned_memory: int
    lower_bound_s: float | None  # valid for the whole space; None when not known
    certified_optimal: bool
    search_time_s: float
    backend: str
    status: str  # OPTIMAL (whole space, certified) | FEASIBLE
    notes: list[str] = field(default_factory=list)
    pruning: Pruning = field(default_factory=Pruning)
    pruned_space_optimal: bool = False
    pruned_lower_bound_s: float | None = None  # valid for the pruned space
    configs_pruned_cp: int = 0
    timed_out: bool = False
    quantisation_s: float = 0.0  # most the best plan's float cost exceeds its table objective
    cpsat: dict | None = None  # the CP-SAT master's statistics (--backend cpsat)


@dataclass(order=True)
class QueueEntry:
    """One configuration in the screening queue, ordered by (bound, recompute rank, arrival).

    Its bound is refined in levels as it reaches the top: 0, relaxed (the shape's no-recompute
    per-layer times, no memory test; valid for every recompute setting); 1, cheap (its own stage
    options, with the memory test); 2, tight (integral layers, memory per position, GPU budgets)."""

    bound_s: float
    rank: int  # position of G's recompute on the ladder: less recompute first on ties
    seq: int
    level: int = field(compare=False)
    g: GlobalChoice = field(compare=False)
    options: list[StageOption] = field(compare=False, default_factory=list)
    obs: dict = field(compare=False, default_factory=dict)  # OptionBound per option (level >= 1)


@dataclass
class ConfigRecord:
    """What screening learned about one configuration, for the certificate: a lower bound on its
    optimum in the space being searched (pruned or whole), whether that bound is the optimum
    itself, and its best plan."""

    g: GlobalChoice
    options: list[StageOption]
    bound_s: float  # valid lower bound (bounds.py, or the solved optimum)
    whole_bound_s: float  # valid for the whole space (pruning aside)
    solved: bool = False  # bound_s is the configuration's optimum under its (pruned) tables
    feasible: bool = True
    stages: list = field(default_factory=list)


def config_key(g: GlobalChoice) -> tuple:
    """A global choice without its recompute setting (the memory-pruning ladder runs over this)."""
    return (g.runtime, g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.pp, g.vpp, g.first_dp)


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
    """The configurations of one search: enumeration, stage options and the lower bounds, with
    the work shared across configurations cached here."""

    def __init__(self, cost: CostModel, space: SearchSpace, builder: TableBuilder):
        self.cost, self.space, self.builder = cost, space, builder
        model = cost.model
        self.budget = cost.cluster.gpus_by_type()
        self.gpn = {h: cost.gpus_per_node(h) for h in self.budget}
        self.kind_counts = {k: model.layer_is_moe.count(k) for k in (False, True)}
        self.ladder_rank = {r.label: k for k, r in enumerate(recompute_ladder(model, space.recompute))}
        self._options: dict = {}
        self._option_bounds: dict = {}
        self._shape_bounds: dict = {}
        self._inflight: dict = {}
        self._room: dict = {}
        self._bound_cache: dict = {}

    def each(self) -> Iterator[GlobalChoice]:
        c = self.cost
        return enumerate_globals(c.model, c.training, c.cluster, self.space, self.gpn)

    @staticmethod
    def shape_key(g: GlobalChoice) -> tuple:
        """G without PP, VPP and recompute: what stage options and per-layer figures depend on."""
        return (g.runtime, g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.first_dp)

    def options(self, g: GlobalChoice) -> list[StageOption]:
        key = (self.shape_key(g), g.recompute.label if g.recompute else None)
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
            key = (self.shape_key(g), o)
            ob = self._option_bounds.get(key)
            if ob is None:
                # a one-layer middle stage does not depend on PP or VPP: share the bound across them
                gs = gs or replace(self.builder.shape(g), vpp=1, pp=2)
                ob = self._option_bounds[key] = option_bound(self.cost, gs, o)
            out[o] = ob
        return out

    def _bounds(self, g: GlobalChoice, relaxed: bool) -> tuple[ShapeBounds, list[StageOption], dict] | None:
        """The shape's bounds: relaxed, over its options without recompute (valid for every
        recompute setting), or over G's own options."""
        label = None if relaxed else (g.recompute.label if g.recompute else "per-stage")
        key = (self.shape_key(g), label)
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

    def rank(self, g: GlobalChoice) -> int:
        return self.ladder_rank.get(g.recompute.label, 0) if g.recompute is not None else 0

    def relaxed_entry(self, g: GlobalChoice, seq: int) -> QueueEntry | None:
        """G at level 0, or None when G has no stage option."""
        hit = self._bounds(g, relaxed=True)
        if hit is None:
            return None
        lb = hit[0].bound(g.pp, g.vpp, self.inflight(g), memory=False)
        return QueueEntry(lb, self.rank(g), seq, 0, g)

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
        g = e.g
        free_at = {}
        for o in e.options:
            key = (self.shape_key(g), o)
            if key not in self._room:
                self._room[key] = stage_free_bytes(self.cost, replace(self.builder.shape(g), vpp=1, pp=2), o)
            free_at[o] = self._room[key]
        lb = lower_bound_s(e.obs, g, e.options, self.budget, self.cost.model.num_layers,
                           self.num_microbatches(g), self.inflight(g), tight=True, beat_s=beat_s,
                           cache=self._bound_cache, kind_counts=self.kind_counts, free_at=free_at)
        return replace(e, bound_s=max(e.bound_s, lb), level=2)


class Screening:
    """Best-first search over the configurations with one backend (module docstring)."""

    def __init__(self, cost: CostModel, space: SearchSpace, settings: SearchSettings, t0: float,
                 progress: ProgressFn | None):
        self.cost, self.space, self.settings, self.t0, self.progress = cost, space, settings, t0, progress
        self.pruning = settings.pruning
        self.builder = TableBuilder(cost, contiguous_types=space.contiguous)
        self.configs = Configurations(cost, space, self.builder)
        self.backend_name = "hsdp" if settings.backend == "cpsat" else settings.backend
        self.backend = get_backend(self.backend_name)
        self.heap: list[QueueEntry] = []
        self.deferred: dict[tuple, list[GlobalChoice]] = {}  # memory pruning: greater recompute, waiting
        self.relaxed_bound: dict[tuple, float] = {}  # level-0 bound per configuration key (any recompute)
        self.cp_pruned: list[GlobalChoice] = []
        self.records: dict[GlobalChoice, ConfigRecord] = {}
        self.cands: list[Candidate] = []
        self.notes: list[str] = []
        self.total = self.solved = self.bounded = self.infeasible = self.done = 0
        self.enumerated = 0  # configurations with at least one stage option
        self.seq = 0
        self.complete = True  # every configuration that entered was resolved (solved or bounded)
        self.enumeration_complete = True
        self.delta_fallbacks = 0
        self.timed_out = False
        self.pruned_memory = 0  # configurations the memory pruning left waiting for good
        self._last_report = 0.0

    # ---- enumeration ----
    def enumerate(self) -> None:
        """Every configuration of the space with its cheap bound into the queue; memory pruning
        keeps greater recompute settings waiting, cp_min_seq sets some aside."""
        s = self.settings
        stop_at = self.t0 + ENUMERATION_SHARE * s.time_limit_s
        model = self.cost.model
        for k, g in enumerate(self.configs.each()):
            if k % 256 == 0 and time.perf_counter() > stop_at:
                self.enumeration_complete = False
                self.notes.append(f"time limit: enumeration stopped after {k} configurations (it may take "
                                  f"{ENUMERATION_SHARE:.0%} of --time-limit); the rest were not searched")
                break
            if self.pruning.cp_pruned(model, g):
                self.cp_pruned.append(g)
                continue
            ckey = config_key(g)
            if self.pruning.memory and g.runtime == "megatron" and ckey in self.deferred:
                self.deferred[ckey].append(g)
                continue
            e = self._push(g)
            if e is not None:
                self.deferred[ckey] = []
                self.relaxed_bound[ckey] = e.bound_s
            self._report("enumerating", "")

    def _push(self, g: GlobalChoice) -> QueueEntry | None:
        """G into the queue at level 0; None when it has no stage option or cannot fit."""
        e = self.configs.relaxed_entry(g, self.seq)
        self.seq += 1
        if e is None:
            return None
        self.enumerated += 1
        if not math.isfinite(e.bound_s):
            return None
        self.total += 1
        heapq.heappush(self.heap, e)
        return e

    def push_next(self, g: GlobalChoice) -> None:
        """The least recompute of G's configuration that entered does not fit after all: let the
        next one on the ladder in (memory pruning keeps only the least recompute that fits)."""
        waiting = self.deferred.get(config_key(g)) or []
        while waiting:
            if self._push(waiting.pop(0)) is not None:
                return

    # ---- solving ----
    def kth_best(self) -> float:
        k = self.settings.top_k
        if len(self.cands) < k:
            return math.inf
        return sorted(c.objective_s for c in self.cands)[k - 1]

    def run(self) -> None:
        """Pop, tighten, solve, until the queue is empty, bounded out, or the deadline passes."""
        s = self.settings
        while self.heap:
            if time.perf_counter() > s.deadline:
                self.timed_out = True
                self.complete = False
                self.notes.append(f"time limit {s.time_limit_s:g} s reached after {self.done} of {self.total} "
                                  "configurations")
                break
            kth = self.kth_best()
            e = self.heap[0]
            if e.bound_s >= kth:
                self.bounded += len(self.heap)
                break
            heapq.heappop(self.heap)
            if e.level < 2:
                e = self.configs.cheap_entry(e) if e.level == 0 else self.configs.tight_entry(e, kth)
                if not math.isfinite(e.bound_s):
                    self.infeasible += 1
                    self.done += 1
                    self._record(e, math.inf, math.inf, solved=True, feasible=False)
                    self.push_next(e.g)
                    continue
                heapq.heappush(self.heap, e)
                continue
            self._solve(e, kth)
            self._report("screening", e.g.label())

    def _record(self, e: QueueEntry, bound: float, whole: float, *, solved: bool, feasible: bool = True,
                stages: list | None = None) -> None:
        self.records[e.g] = ConfigRecord(e.g, e.options, bound, whole, solved=solved, feasible=feasible,
                                         stages=stages or [])

    def tables(self, g: GlobalChoice, options: list[StageOption]) -> StageTables:
        t = self.builder.build(g, options)
        return t.pruned(delta=self.pruning.delta, memory=self.pruning.memory and g.runtime == "flagscale")

    def _solve(self, e: QueueEntry, kth: float) -> None:
        s, g = self.settings, e.g
        self.done += 1
        tables = self.tables(g, e.options)
        ub_us = int(kth * g.vpp / 1e-6) + 1 if math.isfinite(kth) else None
        sol = self.backend.solve(tables, upper_bound_us=ub_us, settings=s)
        self.solved += 1
        if sol is None and ub_us is None and tables.windows is not None and has_fitting_layout(tables):
            # load-balance pruning can rule out every layout that fits in memory: with no plan yet,
            # solve this configuration without it rather than report nothing
            tables = tables.pruned(delta=None, memory=tables.memory_prune)
            sol = self.backend.solve(tables, upper_bound_us=None, settings=s)
            if sol is not None and sol.stages:
                self.delta_fallbacks += 1
                sol.exact = False
        if sol is None:
            # nothing under these tables (or nothing better than the k-th best): resolved
            self.infeasible += ub_us is None
            value = kth if ub_us is not None else math.inf
            self._record(e, value, value if tables.exact else e.bound_s, solved=True, feasible=ub_us is not None)
            if self.deferred.get(config_key(g)) and not has_fitting_layout(tables):
                self.push_next(g)
            return
        if not sol.stages:  # the time ran out before any plan: this choice stays unproven
            self.complete = False
            self._record(e, e.bound_s, e.bound_s, solved=False)
            return
        complete = sol.status == "OPTIMAL"
        if not complete:
            self.complete = False
        obj = from_us(sol.objective_us) / g.vpp
        plan_bound = bound_s(sol.bound_us, g.vpp) if complete else e.bound_s
        self._record(e, obj if complete else e.bound_s, obj if sol.exact else e.bound_s, solved=complete,
                     stages=sol.stages)
        plan = plan_from_solution(g, tables, sol.stages, self.cost.training.global_batch_size)
        self.cands.append(Candidate(g=g, objective_s=obj, plan=plan, backend=self.backend_name, status=sol.status,
                                    bound_s=plan_bound, options=e.options, stages=sol.stages))
        self.cands.sort(key=lambda c: c.objective_s)
        del self.cands[s.top_k * 4:]

    def _report(self, phase: str, config: str, force: bool = False) -> None:
        if not self.progress:
            return
        now = time.perf_counter()
        if not force and now - self._last_report < PROGRESS_EVERY_S:
            return
        self._last_report = now
        self.progress(SearchProgress(
            done=self.done, total=self.total, solved=self.solved, elapsed_s=now - self.t0,
            best_s=self.cands[0].objective_s if self.cands else None,
            bound_s=self.heap[0].bound_s if self.heap else None, phase=phase, config=config))

    # ---- what was proven ----
    def pruned_space_bound(self) -> float:
        """A lower bound on the pruned space's optimum: the least over configurations of what each
        is known to cost at least (the queue's top for those not reached)."""
        parts = [r.bound_s for r in self.records.values()]
        parts += [e.bound_s for e in self.heap]
        return min(parts, default=math.inf)

    def whole_space_bound(self) -> float | None:
        """A lower bound valid for the whole space, or None.  With pruning, the configurations it
        set aside are bounded too (cheap bounds; None if the deadline passes first)."""
        if not self.enumeration_complete:
            return None
        parts = [r.whole_bound_s for r in self.records.values()] + [e.bound_s for e in self.heap]
        # the relaxed bound does not depend on the recompute setting: the one the key entered with
        # holds for those waiting behind it
        parts += [self.relaxed_bound[k] for k, waiting in self.deferred.items() if waiting]
        aside = self.cp_pruned
        deadline = self.settings.deadline
        for k, g in enumerate(aside):
            if k % 64 == 0 and time.perf_counter() > deadline:
                self.notes.append("no whole-space lower bound: the time limit passed while bounding the "
                                  "configurations the pruning set aside")
                return None
            e = self.configs.relaxed_entry(g, -1)
            if e is not None:
                parts.append(e.bound_s)
        return min(parts, default=math.inf)


def search(cost: CostModel, space: SearchSpace, settings: SearchSettings, progress: ProgressFn | None = None
           ) -> SearchResult:
    """Find the best plan(s) for the cost model's model/training/cluster over `space`."""
    t0 = time.perf_counter()
    settings = replace(settings, deadline=t0 + settings.time_limit_s if settings.deadline is None
                       else min(settings.deadline, t0 + settings.time_limit_s))
    scr = Screening(cost, space, settings, t0, progress)
    scr.enumerate()
    if space.runtime == "flagscale" and settings.warm_start:
        scr.cands += _flagscale_warm_start(cost, space, settings)
    scr.run()
    scr.pruned_memory = sum(len(w) for w in scr.deferred.values())
    if scr.delta_fallbacks:
        scr.notes.append(f"load-balance pruning (delta {settings.delta:g}) left no layout that fits in memory "
                         f"for {scr.delta_fallbacks} configuration(s); those were solved without it")
    if not scr.cands:
        scr._report("done", "", force=True)
        if scr.timed_out or not scr.enumeration_complete:
            raise SearchTimeLimitError(
                f"no plan found within the {settings.time_limit_s:g} s time limit ({scr.solved} of {scr.total} "
                f"configurations solved after {time.perf_counter() - t0:.1f} s); raise --time-limit")
        raise explain_infeasible(cost, space, scr.enumerated)

    cpsat_stats = None
    if settings.backend == "cpsat":
        from planner.search.certify import certify_with_cpsat

        cpsat_stats = certify_with_cpsat(scr)
    pruned_optimal = scr.complete and scr.enumeration_complete and not scr.timed_out
    if cpsat_stats is not None:
        pruned_optimal = cpsat_stats["status"] == "OPTIMAL" and scr.enumeration_complete
    certified = pruned_optimal and not scr.pruning.any
    pruned_lb = scr.pruned_space_bound() if scr.enumeration_complete else None
    if cpsat_stats is not None and cpsat_stats.get("bound_s") is not None:
        pruned_lb = cpsat_stats["bound_s"] if scr.enumeration_complete else None
    whole_lb = pruned_lb if not scr.pruning.any else scr.whole_space_bound()
    best = scr.cands[: settings.top_k]
    if pruned_lb is not None:
        pruned_lb = min(pruned_lb, best[0].objective_s)
    if whole_lb is not None:
        whole_lb = min(whole_lb, best[0].objective_s)
    costs = [cost.evaluate(c.plan) for c in best]
    quant_s = max(0.0, costs[0].iteration_time_s - best[0].objective_s)
    scr._report("done", "", force=True)
    return SearchResult(
        best=best, costs=costs, configs_total=scr.total, configs_solved=scr.solved, configs_bounded=scr.bounded,
        configs_infeasible=scr.infeasible, configs_pruned_memory=scr.pruned_memory, lower_bound_s=whole_lb,
        certified_optimal=certified, search_time_s=time.perf_counter() - t0, backend=settings.backend,
        status="OPTIMAL" if certified else "FEASIBLE", notes=scr.notes, pruning=scr.pruning,
        pruned_space_optimal=pruned_optimal, pruned_lower_bound_s=pruned_lb, configs_pruned_cp=len(scr.cp_pruned),
        timed_out=scr.timed_out or not scr.enumeration_complete, quantisation_s=quant_s, cpsat=cpsat_stats,
    )


def _flagscale_warm_start(cost: CostModel, space: SearchSpace, settings: SearchSettings) -> list[Candidate]:
    """An incumbent for the flagscale search: the best plan with one DP and one recompute for
    every stage, types contiguous (the megatron space without CP and interleaving), which FlagScale
    can run as-is.  Every flagscale configuration whose bound cannot beat it is then bounded out
    without solving.  Takes at most a quarter of the time limit."""
    shared = tuple(space.stage_recompute) + tuple(space.selective)
    uniform = space.with_(runtime="megatron", cp=(1,), vpp=(1,), recompute=shared, contiguous_types=True)
    sub = replace(settings, backend="hsdp", warm_start=False, top_k=1, deadline=None,
                  time_limit_s=max(0.5, min(settings.time_limit_s / 4,
                                            (settings.deadline or math.inf) - time.perf_counter())))
    try:
        res = search(cost, uniform, sub, progress=None)
    except (InfeasibleError, SearchTimeLimitError):
        return []
    out = []
    for c in res.best:
        plan = c.plan.model_copy(update={"runtime": "flagscale"})
        out.append(Candidate(g=c.g, objective_s=c.objective_s, plan=plan, backend="hsdp",
                             status="FEASIBLE", bound_s=c.bound_s, options=c.options, stages=c.stages))
    return out
