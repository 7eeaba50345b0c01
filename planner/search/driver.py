"""The search driver: enumerates global choices, orders them by a lower bound
(planner/search/bounds.py), solves each with a backend over the shared integer tables, and keeps
the best plan.

Every choice gets the cheap bound; the tight one (integral layers, memory, GPU budgets) is computed
when a choice reaches the top of the queue.  Choices are visited in increasing bound; once the
bound reaches the best plan found, every remaining choice is bounded out.  When each choice is
either solved exactly (HS-DP or CP-SAT proving optimality, pruning off) or bounded out, the best
plan is a certificate of optimality under the cost model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from planner.cost.model import CostModel, PlanCost
from planner.errors import InfeasibleError, SearchTimeLimitError
from planner.schemas.plan import Plan, StagePlan
from planner.search.bounds import lower_bound_s, option_bound, stage_free_bytes
from planner.search.explain import explain_infeasible
from planner.search.space import (
    GlobalChoice, SearchSpace, StageOption, enumerate_globals, recompute_ladder, stage_options,
)
from solver_models.hsdp import has_fitting_layout
from solver_models.scaling import from_us
from solver_models.tables import StageTables, TableBuilder


@dataclass
class SearchSettings:
    backend: str = "cpsat"  # cpsat | hsdp | brute
    delta: float | None = 0.2  # load-balance tolerance; None = that pruning off
    memory_prune: bool = True  # the least recompute that fits (paper's pruning 2)
    time_limit_s: float = 60.0
    top_k: int = 1
    num_workers: int = 2
    cpsat_top_configs: int = 3  # CP-SAT proves the best few configurations (hinted with HS-DP)
    deadline: float | None = None  # time.perf_counter() value; set by `search` from time_limit_s
    warm_start: bool = True  # flagscale: start from the best uniform-DP plan (a fast megatron-space search)


@dataclass
class Candidate:
    g: GlobalChoice
    objective_s: float  # from the integer tables (v*T/v)
    plan: Plan
    backend: str
    status: str  # OPTIMAL | FEASIBLE
    bound_s: float  # lower bound on this G's optimum
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
    lower_bound_s: float
    certified_optimal: bool
    search_time_s: float
    backend: str
    status: str
    notes: list[str] = field(default_factory=list)


ProgressFn = Callable[[dict], None]


def _config_key(g: GlobalChoice) -> tuple:
    """A global choice without its recompute setting (the memory-pruning ladder runs over this)."""
    return (g.runtime, g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.pp, g.vpp)


def plan_from_solution(g: GlobalChoice, t: StageTables, stages: list[tuple[int, int, int]], gbs: int) -> Plan:
    samples = g.mbs * g.dp0  # per micro-batch, all DP ranks of a stage together
    mbs = samples // t.options[stages[0][0]].dp
    return Plan(
        runtime=g.runtime, tp=g.tp, cp=g.cp, ep=g.ep, etp=g.etp, vpp=g.vpp, mbs=mbs, gbs=gbs,
        sequence_parallel=g.tp > 1,
        stages=tuple(StagePlan(device_type=t.options[o].device_type, num_layers=n, dp=t.options[o].dp,
                               recompute=t.options[o].recompute) for o, _, n in stages),
    )


def search(cost: CostModel, space: SearchSpace, settings: SearchSettings, progress: ProgressFn | None = None
           ) -> SearchResult:
    """Find the best plan(s) for the cost model's model/training/cluster over `space`."""
    from solver_models import get_backend

    t0 = time.perf_counter()
    settings.deadline = t0 + settings.time_limit_s
    model, training, cluster = cost.model, cost.training, cost.cluster
    budget = cluster.gpus_by_type()
    gpn = {h: cost.gpus_per_node(h) for h in budget}
    builder = TableBuilder(cost)
    # cpsat: HS-DP screens every configuration, then CP-SAT proves the best few (hinted with the
    # DP's plan); CP-SAT on every configuration left many unproven on the prototype (issue 3)
    screening = "hsdp" if settings.backend == "cpsat" else settings.backend
    backend = get_backend(screening)
    notes: list[str] = []

    # 1. enumerate + bound
    ladder_rank = {r.label: k for k, r in enumerate(recompute_ladder(model, space.recompute))}
    entries = []
    layer_min: dict = {}
    options_by_key: dict = {}
    bound_cache: dict = {}
    kind_counts = {k: model.layer_is_moe.count(k) for k in (False, True)}
    # memory pruning (megatron runtime, recompute one global knob): per configuration only the least
    # recompute whose bound admits it enters the queue; the greater ones wait in `deferred` (in
    # ladder order) and enter only if that one turns out not to fit (see push_next)
    deferred: dict[tuple, list[GlobalChoice]] = {}

    def make_entry(g: GlobalChoice):
        """(cheap bound, recompute rank, G, options, bound inputs), or None when G has no stage option."""
        okey = (g.runtime, g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.recompute.label if g.recompute else None)
        options = options_by_key.get(okey)
        if options is None:  # the options do not depend on PP or VPP
            options = options_by_key[okey] = stage_options(g, model, training, cluster, space, gpn)
        if not options:
            return None
        gs = builder.shape(g)
        obs = {}
        for o in options:
            key = (g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, o)
            ob = layer_min.get(key)
            if ob is None:
                # a one-layer middle stage does not depend on PP or VPP: share the bound across them
                ob = layer_min[key] = option_bound(cost, replace(gs, vpp=1, pp=2), o)
            obs[o] = ob
        m = training.global_batch_size // (g.mbs * g.dp0)
        inflight = [cost.inflight_microbatches(gs, i) for i in range(g.pp)]
        lb = lower_bound_s(obs, g, options, budget, model.num_layers, m, inflight, tight=False,
                           cache=bound_cache, kind_counts=kind_counts)
        rank = ladder_rank.get(g.recompute.label, 0) if g.recompute is not None else 0
        return (lb, rank, g, options, (obs, m, inflight))

    n_enumerated = 0
    for g in enumerate_globals(model, training, cluster, space, gpn):
        ckey = _config_key(g)
        if settings.memory_prune and ckey in deferred:
            deferred[ckey].append(g)
            continue
        entry = make_entry(g)
        if entry is None:
            continue
        n_enumerated += 1
        if math.isfinite(entry[0]):
            entries.append(entry)
            deferred[ckey] = []
    import heapq

    total = len(entries)
    # a heap of (bound, recompute rank, tie, tightened?, entry): cheap bounds first, the tight
    # (assignment) bound computed only when an entry reaches the top
    heap = [(e[0], e[1], k, False, e) for k, e in enumerate(entries)]
    heapq.heapify(heap)

    # 2. solve in bound order
    cands: list[Candidate] = []
    if space.runtime == "flagscale" and settings.warm_start:
        cands += _flagscale_warm_start(cost, space, settings, progress)
    solved = bounded = infeasible = 0
    tie_counter = len(entries)

    def push_next(ckey: tuple) -> None:
        """The least recompute of this configuration that entered does not fit after all: let the
        next one on the ladder whose bound admits it enter (memory pruning keeps only the least
        recompute that fits)."""
        nonlocal total, tie_counter
        waiting = deferred.get(ckey) or []
        while waiting:
            e = make_entry(waiting.pop(0))
            if e is not None and math.isfinite(e[0]):
                tie_counter += 1
                total += 1
                heapq.heappush(heap, (e[0], e[1], tie_counter, False, e))
                return

    room_by_option: dict = {}  # per-position room of each stage option (tight bound)
    delta_fallbacks = 0
    all_exact = True
    last_report = 0.0
    idx = 0
    while heap:
        if time.perf_counter() > settings.deadline:
            notes.append(f"time limit {settings.time_limit_s:.0f} s reached after {idx} of {total} configurations")
            all_exact = False
            break
        lb, rank, tie, tightened, entry = heapq.heappop(heap)
        g, options, (obs, m_mb, inflight) = entry[2], entry[3], entry[4]
        kth = sorted(c.objective_s for c in cands)[settings.top_k - 1] if len(cands) >= settings.top_k else math.inf
        if lb >= kth:
            bounded += 1 + len(heap)
            break
        if not tightened:
            free_at = {}
            for o in options:
                key = (g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, o)
                if key not in room_by_option:
                    room_by_option[key] = stage_free_bytes(cost, replace(builder.shape(g), vpp=1, pp=2), o)
                free_at[o] = room_by_option[key]
            lb2 = lower_bound_s(obs, g, options, budget, model.num_layers, m_mb, inflight, tight=True,
                                beat_s=kth, cache=bound_cache, kind_counts=kind_counts, free_at=free_at)
            if not math.isfinite(lb2):
                infeasible += 1
                push_next(_config_key(g))
                continue
            heapq.heappush(heap, (max(lb, lb2), rank, tie, True, entry))
            continue
        idx += 1
        tables = builder.build(g, options)
        tables.memory_prune = settings.memory_prune and g.runtime == "flagscale"
        ub_us = int(kth * g.vpp / 1e-6) if math.isfinite(kth) else None
        sol = backend.solve(tables, delta=settings.delta, upper_bound_us=ub_us, settings=settings)
        solved += 1
        if sol is None and ub_us is None and settings.delta is not None and has_fitting_layout(tables):
            # load-balance pruning can rule out every layout that fits in memory: with no plan yet,
            # solve this configuration without it rather than report nothing
            sol = backend.solve(tables, delta=None, upper_bound_us=None, settings=settings)
            if sol is not None and sol.stages:
                delta_fallbacks += 1
                sol.exact = False
        if sol is None:
            infeasible += 1
            if deferred.get(_config_key(g)) and not has_fitting_layout(tables):
                push_next(_config_key(g))
            continue
        if not sol.stages:  # budget ran out before any plan: this choice stays unproven
            all_exact = False
            continue
        if not sol.exact:
            all_exact = False
        plan = plan_from_solution(g, tables, sol.stages, training.global_batch_size)
        cands.append(Candidate(g=g, objective_s=from_us(sol.objective_us) / g.vpp, plan=plan,
                               backend=screening, status=sol.status,
                               bound_s=from_us(sol.bound_us) / g.vpp, options=options, stages=sol.stages))
        cands.sort(key=lambda c: c.objective_s)
        del cands[settings.top_k * 4:]
        now = time.perf_counter()
        if progress and now - last_report > 0.2:
            last_report = now
            progress({"tried": idx, "total": total, "solved": solved, "best_s": cands[0].objective_s,
                      "bound_s": lb, "config": g.label()})  # lb: configurations are visited by increasing bound
    pruned_mem = sum(len(w) for w in deferred.values())
    if delta_fallbacks:
        notes.append(f"load-balance pruning (delta {settings.delta:g}) left no layout that fits in memory for "
                     f"{delta_fallbacks} configuration(s); those were solved without it")
    if progress:
        timed_out = any("time limit" in n for n in notes)
        progress({"tried": idx if timed_out else total, "total": total, "solved": solved,
                  "best_s": cands[0].objective_s if cands else None, "config": "done"})
    if not cands:
        if any("time limit" in n for n in notes):
            raise SearchTimeLimitError(
                f"no plan found within the {settings.time_limit_s:g} s time limit ({solved} of {total} "
                f"configurations solved after {time.perf_counter() - t0:.1f} s); raise --time-limit")
        raise explain_infeasible(cost, space, n_enumerated)

    pruning = settings.delta is not None or settings.memory_prune
    certified = all_exact and not pruning and not any("time limit" in n for n in notes)
    status = "OPTIMAL" if certified else "FEASIBLE"
    lower = cands[0].bound_s
    if settings.backend == "cpsat":
        status, lower = _prove_with_cpsat(builder, cands, settings, notes, training.global_batch_size)
        certified = certified and status == "OPTIMAL"
    best = cands[: settings.top_k]
    costs = [cost.evaluate(c.plan) for c in best]
    return SearchResult(
        best=best, costs=costs, configs_total=total, configs_solved=solved, configs_bounded=bounded,
        configs_infeasible=infeasible, configs_pruned_memory=pruned_mem, lower_bound_s=lower,
        certified_optimal=certified, search_time_s=time.perf_counter() - t0, backend=settings.backend,
        status=status, notes=notes,
    )


def _flagscale_warm_start(cost: CostModel, space: SearchSpace, settings: SearchSettings,
                          progress: ProgressFn | None) -> list[Candidate]:
    """An incumbent for the flagscale search: the best plan with one DP and one recompute for
    every stage (the megatron space without CP and interleaving, recompute from the per-stage
    ladder), which FlagScale can run as-is.  Every flagscale configuration whose bound cannot beat
    it is then bounded out without solving."""
    from dataclasses import replace as dc_replace

    uniform = space.with_(runtime="megatron", cp=(1,), vpp=(1,), recompute=space.stage_recompute)
    sub = dc_replace(settings, backend="hsdp", warm_start=False, top_k=1,
                     time_limit_s=max(1.0, settings.time_limit_s / 4))
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


def _prove_with_cpsat(builder: TableBuilder, cands: list[Candidate], settings: SearchSettings, notes: list[str],
                      gbs: int) -> tuple[str, float]:
    """CP-SAT on the best few configurations, hinted with HS-DP's plans.  Updates the candidates in
    place (CP-SAT may improve a plan when HS-DP ran out of budget) and returns (status of the best
    configuration, lower bound): the bound is the least of CP-SAT's best bounds on the proven
    configurations and the screened objectives of the others (each exact for its configuration)."""
    from solver_models.cpsat import solve_cpsat

    seen: set = set()
    proven: list[Candidate] = []
    for c in list(cands):
        if len(proven) >= settings.cpsat_top_configs:
            break
        if c.g in seen:
            continue
        seen.add(c.g)
        tables = builder.build(c.g, c.options)
        tables.memory_prune = settings.memory_prune and c.g.runtime == "flagscale"
        remaining = (settings.deadline or math.inf) - time.perf_counter()
        if remaining <= 0.5:
            notes.append("no time left for CP-SAT; reporting HS-DP's result")
            break
        sol = solve_cpsat(tables, delta=settings.delta, upper_bound_us=None, settings=settings,
                          hint_stages=c.stages)
        if sol is None or not sol.stages:
            continue
        obj_s = from_us(sol.objective_us) / c.g.vpp
        c.bound_s = from_us(sol.bound_us) / c.g.vpp
        c.status = sol.status
        c.backend = "cpsat"
        if obj_s < c.objective_s - 1e-9:
            c.objective_s = obj_s
            c.stages = sol.stages
            c.plan = plan_from_solution(c.g, tables, sol.stages, gbs)
        proven.append(c)
    cands.sort(key=lambda c: c.objective_s)
    if not proven:
        return "FEASIBLE", cands[0].bound_s
    best = cands[0]
    lower = min([p.bound_s for p in proven] + [c.objective_s for c in cands if c not in proven])
    return (best.status if best in proven else "FEASIBLE"), lower
