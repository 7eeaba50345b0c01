"""The search driver: enumerates global choices, orders them by a cheap lower bound, solves each
with a backend over the shared integer tables, and keeps the best plan.

Lower bound of G (no solving): with tau_o the least per-layer time of option o,
sum_i t_i >= N * min_o tau_o and max_i t_i >= N / (sum of the PP fastest stage slots' layer rates),
so v*T >= N*min tau + (m*v - 1) * N / rate.  Choices are visited in increasing bound; once the
bound reaches the best plan found, every remaining choice is bounded out.  When each choice is
either solved exactly (HS-DP or CP-SAT proving optimality, pruning off) or bounded out, the best
plan is a certificate of optimality under the cost model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from planner.cost.model import CostModel, PlanCost
from planner.errors import InfeasibleError
from planner.schemas.plan import Plan, StagePlan
from planner.search.space import (
    GlobalChoice, SearchSpace, StageOption, enumerate_globals, recompute_ladder, stage_options,
)
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


@dataclass
class Candidate:
    g: GlobalChoice
    objective_s: float  # from the integer tables (v*T/v)
    plan: Plan
    backend: str
    status: str  # OPTIMAL | FEASIBLE
    bound_s: float  # lower bound on this G's optimum


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


def _lower_bound_s(t_min_layer: dict[StageOption, float], g: GlobalChoice, options: list[StageOption],
                   budget: dict[str, int], n_layers: int, m: int) -> float:
    taus = [t_min_layer[o] for o in options]
    if not taus:
        return math.inf
    sum_lb = n_layers * min(taus)
    # fastest pp stage slots: per type, as many stages as its GPUs allow, at its best option's rate
    slots: list[float] = []
    for h, n in budget.items():
        own = [o for o in options if o.device_type == h]
        if not own:
            continue
        best = min(own, key=lambda o: t_min_layer[o] * (g.tp * g.cp * o.dp))
        count = n // (g.tp * g.cp * best.dp)
        slots += [1.0 / t_min_layer[best]] * count
    slots.sort(reverse=True)
    if len(slots) < g.pp:
        return math.inf
    rate = sum(slots[: g.pp])
    v = g.vpp
    return (sum_lb + (m * v - 1) * n_layers / rate) / v


def plan_from_solution(g: GlobalChoice, t: StageTables, stages: list[tuple[int, int, int]], gbs: int) -> Plan:
    return Plan(
        runtime=g.runtime, tp=g.tp, cp=g.cp, ep=g.ep, etp=g.etp, vpp=g.vpp, mbs=g.mbs, gbs=gbs,
        sequence_parallel=g.tp > 1,
        stages=tuple(StagePlan(device_type=t.options[o].device_type, num_layers=n, dp=t.options[o].dp,
                               recompute=t.options[o].recompute) for o, _, n in stages),
    )


def search(cost: CostModel, space: SearchSpace, settings: SearchSettings, progress: ProgressFn | None = None
           ) -> SearchResult:
    """Find the best plan(s) for the cost model's model/training/cluster over `space`."""
    from solver_models import get_backend

    t0 = time.perf_counter()
    model, training, cluster = cost.model, cost.training, cost.cluster
    budget = cluster.gpus_by_type()
    gpn = {h: cost.gpus_per_node(h) for h in budget}
    builder = TableBuilder(cost)
    backend = get_backend(settings.backend)
    notes: list[str] = []

    # 1. enumerate + bound
    entries = []
    layer_min: dict = {}
    for g in enumerate_globals(model, training, cluster, space, gpn):
        options = stage_options(g, model, training, cluster, space, gpn)
        if not options:
            continue
        gs = builder.shape(g)
        for o in options:
            key = (g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.vpp, o.device_type, o.dp)
            if key not in layer_min:
                layer_min[key] = _min_layer_s(cost, gs, o)
        tmin = {o: layer_min[(g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.vpp, o.device_type, o.dp)] for o in options}
        m = training.global_batch_size // (g.mbs * g.dp0)
        lb = _lower_bound_s(tmin, g, options, budget, model.num_layers, m)
        if math.isfinite(lb):
            ladder = recompute_ladder(model, space.recompute)
            rank = ladder.index(g.recompute) if g.recompute in ladder else 0
            entries.append((lb, rank, g, options))
    entries.sort(key=lambda e: (e[0], e[1]))
    total = len(entries)

    # 2. solve in bound order
    cands: list[Candidate] = []
    solved = bounded = infeasible = pruned_mem = 0
    feasible_keys: set = set()
    all_exact = True
    last_report = 0.0
    for idx, (lb, rank, g, options) in enumerate(entries):
        kth = sorted(c.objective_s for c in cands)[settings.top_k - 1] if len(cands) >= settings.top_k else math.inf
        if lb >= kth:
            bounded += total - idx
            break
        key = (g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.pp, g.vpp)
        if settings.memory_prune and g.runtime == "megatron" and rank > 0 and key in feasible_keys:
            pruned_mem += 1
            continue
        tables = builder.build(g, options)
        ub_us = int(kth * g.vpp / 1e-6) if math.isfinite(kth) else None
        sol = backend.solve(tables, delta=settings.delta, upper_bound_us=ub_us, settings=settings)
        solved += 1
        if sol is None:
            infeasible += 1
            continue
        if not sol.exact:
            all_exact = False
        feasible_keys.add(key)
        plan = plan_from_solution(g, tables, sol.stages, training.global_batch_size)
        cands.append(Candidate(g=g, objective_s=from_us(sol.objective_us) / g.vpp, plan=plan,
                               backend=settings.backend, status=sol.status,
                               bound_s=from_us(sol.bound_us) / g.vpp))
        cands.sort(key=lambda c: c.objective_s)
        del cands[settings.top_k * 4:]
        now = time.perf_counter()
        if progress and now - last_report > 0.2:
            last_report = now
            progress({"tried": idx + 1, "total": total, "solved": solved, "best_s": cands[0].objective_s,
                      "config": g.label()})
        if now - t0 > settings.time_limit_s:
            notes.append(f"time limit {settings.time_limit_s:.0f} s reached after {idx + 1} of {total} configurations")
            all_exact = False
            break
    if progress:
        progress({"tried": total, "total": total, "solved": solved,
                  "best_s": cands[0].objective_s if cands else None, "config": "done"})
    if not cands:
        raise _infeasible(cost, space, entries)

    best = cands[: settings.top_k]
    costs = [cost.evaluate(c.plan) for c in best]
    pruning = settings.delta is not None or settings.memory_prune
    certified = all_exact and not pruning and not any("time limit" in n for n in notes)
    lower = min([best[0].bound_s] + [e[0] for e in entries[solved + bounded:]] if False else [best[0].bound_s])
    status = "OPTIMAL" if certified else "FEASIBLE"
    return SearchResult(
        best=best, costs=costs, configs_total=total, configs_solved=solved, configs_bounded=bounded,
        configs_infeasible=infeasible, configs_pruned_memory=pruned_mem, lower_bound_s=lower,
        certified_optimal=certified, search_time_s=time.perf_counter() - t0, backend=settings.backend,
        status=status, notes=notes,
    )


def _min_layer_s(cost: CostModel, gs, o: StageOption) -> float:
    from planner.schemas.plan import Recompute

    kinds = {}
    for j, k in enumerate(cost.model.layer_is_moe):
        kinds.setdefault(k, j)
    return min(cost.stage_core(gs, device_type=o.device_type, start=j, end=j + 1, dp=o.dp,
                               recompute=Recompute.none(), is_first=False, is_last=False).time_s
               for j in kinds.values())


def _infeasible(cost: CostModel, space: SearchSpace, entries) -> InfeasibleError:
    """Explain why nothing fits: the least memory any stage needs under the most recompute."""
    from planner.schemas.plan import Recompute

    model = cost.model
    budget = cost.cluster.gpus_by_type()
    if not entries:
        return InfeasibleError(
            f"no parallel configuration of {model.name} satisfies Megatron's rules on {cost.cluster.describe()}",
            ["check the global batch size (it must be divisible by micro-batch x DP)", "use more GPUs"],
        )
    # the most memory-friendly shape: max TP, max EP, most stages, full recompute, mbs 1
    worst_short = None
    for h, n in budget.items():
        dev = cost.device(h)
        gpn = cost.gpus_per_node(h)
        tp = max(t for t in space.tp if t <= gpn and model.num_attention_heads % t == 0)
        ep = max(e for e in (space.ep or (1, 2, 4, 8, 16, 32, 64)) if (model.num_experts or 1) % e == 0)
        from planner.cost.model import GlobalShape

        pp = max(1, min(model.num_layers, sum(budget.values()) // tp))
        gs = GlobalShape(tp=tp, cp=1, ep=min(ep, tp), etp=1, vpp=1, mbs=1, gbs=cost.training.global_batch_size,
                         dp0=1, pp=pp, sequence_parallel=tp > 1)
        per_stage = max(1, math.ceil(model.num_layers / pp))
        core = cost.stage_core(gs, device_type=h, start=0, end=per_stage, dp=1, recompute=Recompute.full("uniform", 1),
                               is_first=True, is_last=False)
        need = core.static_bytes + cost.inflight_microbatches(gs, 0) * core.act_per_microbatch_bytes
        short = (need - core.capacity_bytes) / 2**30
        if worst_short is None or short < worst_short[1]:
            worst_short = (h, short, need / 2**30, core.capacity_bytes / 2**30, tp, pp, per_stage)
    h, short, need, cap, tp, pp, per_stage = worst_short
    return InfeasibleError(
        f"{model.name} fits nowhere on {cost.cluster.describe()}: even stage 0 on {h} with TP={tp}, "
        f"{per_stage} layers, full recompute and micro-batch 1 needs {need:.1f} GiB of {cap:.0f} GiB "
        f"({max(short, 0):.1f} GiB short)",
        ["more GPUs (more pipeline stages or a larger DP for the distributed optimizer)",
         "more pipeline stages / expert parallelism to spread the weights",
         "full recompute and a smaller micro-batch", "a smaller global batch or sequence length"],
    )
