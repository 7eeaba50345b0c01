"""HAPMoE itself (the planner's own search) and its ablation with non-uniform PP/DP switched off.

HAPMoE: planner.api_search.solve with the HS-DP backend on the megatron runtime (per-stage device type and
layer count) and on the flagscale runtime (per-stage DP and recompute too: the paper's non-uniform
PP/DP); the faster plan wins.  Each search runs in a child process under a hard wall-clock limit, since
a search's own time limit is only checked between configurations.  Given other planners' plans
(`incumbents`, the bench's baselines), HAPMoE also searches, to the end, the part of its space with
each one's degrees (TP, CP, EP, ETP, micro-batch, VPP; layers, device types, DP, PP and recompute still
free): a plan of its space is in that part, so HAPMoE is never behind it for want of search time, and
a plan outside its space (a stage spanning device types) is not copied.

Ablation ("non-uniform PP/DP disabled"): megatron runtime and every stage holding the same number of
layers.  The search cannot be told "uniform layers", so without touching planner/search the ablation
is the better of
  (a) HAPMoE's megatron configuration with its layers re-split evenly (same degrees and device types,
      the least recompute that then fits), and
  (b) every configuration the search space enumerates (planner.search.space.enumerate_globals) whose
      layers divide evenly over PP x VPP, evaluated with an even split, stage slots filled fastest
      device type first, the least recompute that fits per configuration.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass

from planner.api import make_space, uniform_space_for
from planner.api_search import solve
from planner.baselines.common import (
    PricedPlan, better, build_plan, cost_model, even_split, least_recompute, rule_problems, types_by_speed,
)
from planner.errors import InfeasibleError, SearchTimeLimitError
from planner.runtime import FLAGSCALE, RUNTIME_NAMES, runtime_of
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan
from planner.search.settings import SearchSettings
from planner.search.space import SearchSpace, enumerate_globals

HAPMOE_RUNTIMES = RUNTIME_NAMES


@dataclass(frozen=True)
class SearchRun:
    """One HAPMoE search: its plan (None: infeasible or out of time), wall time and why."""

    runtime: str
    plan: Plan | None
    search_time_s: float
    status: str  # ok | infeasible | timeout | error
    detail: str = ""
    seeded_from: str = ""  # the incumbent whose degrees narrowed the space ("": HAPMoE's whole space)


def _child(conn, run, cluster, profiles, runtime: str, backend: str, time_limit_s: float, narrow: dict) -> None:
    """Child-process body: run the search and send back (plan, detail)."""
    try:
        out = solve(run, cluster, profiles, settings=SearchSettings(backend=backend, time_limit_s=time_limit_s),
                    space=make_space(run, runtime).with_(**narrow), objective="nominal")
        conn.send(("ok", out.plans[0], "; ".join(out.result.notes)))
    except InfeasibleError as exc:
        conn.send(("infeasible", None, str(exc)))
    except SearchTimeLimitError as exc:
        conn.send(("timeout", None, str(exc)))
    except Exception as exc:  # reported, never hidden
        conn.send(("error", None, f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def solve_with_limit(run: MegatronRun, cluster: ClusterSpec, profiles, *, runtime: str, backend: str = "hsdp",
                     hard_limit_s: float = 60.0, narrow: dict | None = None, seeded_from: str = "") -> SearchRun:
    """planner.api_search.solve in a forked child, killed after `hard_limit_s` seconds of wall time (the
    search's own soft limit is set a little lower); `narrow`: SearchSpace menus (make_space)."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    t0 = time.perf_counter()
    soft = max(0.5, 0.8 * hard_limit_s)
    proc = ctx.Process(target=_child, args=(child, run, cluster, profiles, runtime, backend, soft, narrow or {}),
                       daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(hard_limit_s):
            status, plan, detail = parent.recv()
        else:
            status, plan, detail = "timeout", None, f"no plan within {hard_limit_s:.0f} s"
    except EOFError:
        status, plan, detail = "error", None, "search process ended without a result"
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        parent.close()
    return SearchRun(runtime=runtime, plan=plan, search_time_s=time.perf_counter() - t0, status=status,
                     detail=detail, seeded_from=seeded_from)


def search_hapmoe(run: MegatronRun, cluster: ClusterSpec, profiles, *, notes: list[str] | None = None,
                  time_limit_s: float = 60.0, flagscale_time_limit_s: float | None = None,
                  runtimes: tuple[str, ...] = HAPMOE_RUNTIMES, runs_out: list[SearchRun] | None = None,
                  incumbents: dict[str, Plan] | None = None, **_ignored) -> PricedPlan | None:
    """The faster of HAPMoE's megatron- and flagscale-runtime plans, each search under its own hard
    limit (`time_limit_s`; the flagscale one `flagscale_time_limit_s` if given, 0 skips it).  A runtime
    that cannot hold the cluster's vendors in one job (profiles/runtimes.yaml) is not searched.
    `incumbents` ({who: plan}): each one's degrees narrow a further search (seeded_searches)."""
    cost = cost_model(run, cluster, profiles)
    best: PricedPlan | None = None
    runnable = [rt for rt in runtimes if runtime_of(rt).can_run(cluster, profiles).ok]
    for rt in runtimes:
        runs = runtime_of(rt).can_run(cluster, profiles)
        if not runs.ok:
            if notes is not None:
                notes.append(f"HAPMoE {rt}: not searched ({runs.reason})")
            continue
        limit = flagscale_time_limit_s if (rt == FLAGSCALE.name and flagscale_time_limit_s is not None) else time_limit_s
        if limit <= 0 and runnable == [rt]:
            limit = time_limit_s  # the only runtime that runs this cluster (FlagScale across vendors) is searched
        if limit <= 0:
            if notes is not None:
                notes.append(f"HAPMoE {rt}: not searched (time limit 0)")
            continue
        sr = solve_with_limit(run, cluster, profiles, runtime=rt, hard_limit_s=limit)
        if runs_out is not None:
            runs_out.append(sr)
        if notes is not None:
            notes.append(f"HAPMoE {rt}: {sr.status} in {sr.search_time_s:.1f} s" + (f" ({sr.detail})" if sr.detail else ""))
        if sr.plan is not None:
            pc = cost.evaluate(sr.plan)
            if pc.fits:
                best = better(best, PricedPlan(plan=sr.plan, cost=pc))
    for who, rt, narrow in seeded_searches(incumbents or {}, [rt for rt in runtimes if rt in runnable]):
        sr = solve_with_limit(run, cluster, profiles, runtime=rt, hard_limit_s=time_limit_s, narrow=narrow,
                              seeded_from=who)
        if runs_out is not None:
            runs_out.append(sr)
        found = cost.evaluate(sr.plan) if sr.plan is not None else None
        if notes is not None:
            notes.append(f"HAPMoE {rt} with {who}'s degrees ({', '.join(f'{k} {v[0]}' for k, v in narrow.items())}): "
                         f"{sr.status} in {sr.search_time_s:.1f} s" + (f", {found.iteration_time_s:.3f} s/iter"
                                                                        if found is not None else ""))
        if found is not None and found.fits:
            best = better(best, PricedPlan(plan=sr.plan, cost=found))
    return best


SEED_DEGREES = ("tp", "cp", "ep", "etp", "mbs", "vpp")
"""The degrees an incumbent fixes in a seeded search (planner.search.space.SearchSpace menus)."""


def seeded_searches(incumbents: dict[str, Plan], runtimes: list[str]) -> list[tuple[str, str, dict]]:
    """(who, runtime, narrowed menus) per distinct degree tuple among the incumbents planned for a
    runtime HAPMoE searches (the first planner to give each tuple names it)."""
    out: dict[tuple, tuple[str, str, dict]] = {}
    for who, plan in incumbents.items():
        if plan.runtime not in runtimes:
            continue
        narrow = {k: (getattr(plan, k),) for k in SEED_DEGREES}
        out.setdefault((plan.runtime, *(v for v, in narrow.values())), (who, plan.runtime, narrow))
    return list(out.values())


def plan_hapmoe(run: MegatronRun, cluster: ClusterSpec, profiles, **kw) -> Plan | None:
    """HAPMoE's plan (best of both runtimes), or None."""
    priced = search_hapmoe(run, cluster, profiles, **kw)
    return priced.plan if priced else None


# --------------------------------------------------------------------------------------------
# the ablation
# --------------------------------------------------------------------------------------------


def uniform_resplit(run: MegatronRun, cluster: ClusterSpec, profiles, plan: Plan,
                    runtime: str = "megatron") -> PricedPlan | None:
    """(a) `plan`'s degrees and stage device types with an even layer split (Megatron's first/last
    flags when PP does not divide the layers) and the least recompute that fits; one DP and recompute
    for every stage, on `runtime`."""
    cost = cost_model(run, cluster, profiles)
    layers = even_split(run.model.num_layers, plan.pp)
    if layers is None:
        return None
    dp = plan.dp0  # a flagscale plan keeps stage 0's DP everywhere (uniform DP)
    types = [s.device_type for s in plan.stages]
    have = cluster.gpus_by_type()
    use: dict[str, int] = {}
    for h in types:
        use[h] = use.get(h, 0) + plan.tp * plan.cp * dp
    if any(n > have.get(h, 0) for h, n in use.items()):
        return None
    return least_recompute(cost, run, lambda rc: build_plan(tp=plan.tp, cp=plan.cp, ep=plan.ep, etp=plan.etp,
                                                            mbs=plan.mbs, gbs=plan.gbs, dp=dp, types=types,
                                                            layers=layers, recompute=rc, vpp=plan.vpp,
                                                            runtime=runtime),
                           [(h,) for h in types])


def uniform_enumeration(run: MegatronRun, cluster: ClusterSpec, profiles, runtime: str = "megatron"
                        ) -> PricedPlan | None:
    """(b) the best even-split plan over every global configuration of the search space (narrowed to
    what `runtime` expresses), one DP and recompute for every stage."""
    cost = cost_model(run, cluster, profiles)
    model, training = run.model, run.training
    budget = cluster.gpus_by_type()
    gpn = {h: cost.domain_gpus(h) for h in budget}
    order = types_by_speed(cost)
    best: PricedPlan | None = None
    fitted: set = set()
    space = uniform_space_for(SearchSpace(runtime="megatron"), runtime)
    for g in enumerate_globals(model, training, cluster, space, gpn):
        key = (g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.pp, g.vpp)
        if key in fitted or model.num_layers % (g.pp * g.vpp):
            continue
        s = g.stage_gpus
        types: list[str] = []
        for h in order:
            if g.tp <= gpn[h]:
                types += [h] * (budget[h] // s)
        if len(types) < g.pp:
            continue
        types = types[: g.pp]
        plan = build_plan(tp=g.tp, cp=g.cp, ep=g.ep, etp=g.etp, mbs=g.mbs, gbs=training.global_batch_size, dp=g.dp0,
                          types=types, layers=[model.num_layers // g.pp] * g.pp, recompute=g.recompute, vpp=g.vpp,
                          runtime=runtime)
        if rule_problems(model, plan, run):
            fitted.add(key)
            continue
        if cost.fits(plan):  # the memory alone (most configurations do not fit): only those that fit are priced
            fitted.add(key)  # more recompute of this configuration only costs time
            best = better(best, PricedPlan(plan=plan, cost=cost.evaluate(plan)))
    return best


def search_ablation(run: MegatronRun, cluster: ClusterSpec, profiles, *, notes: list[str] | None = None,
                    hapmoe_plan: Plan | None = None, time_limit_s: float = 60.0, runtime: str = "megatron",
                    **_ignored) -> PricedPlan | None:
    """HAPMoE with non-uniform PP/DP off: best of (a) the re-split HAPMoE plan (its megatron plan when
    the megatron runtime runs the cluster) and (b) the even-split enumeration (module docstring), on
    `runtime`."""
    if hapmoe_plan is None or hapmoe_plan.runtime != runtime:
        sr = solve_with_limit(run, cluster, profiles, runtime=runtime, hard_limit_s=time_limit_s)
        hapmoe_plan = sr.plan
    a = uniform_resplit(run, cluster, profiles, hapmoe_plan, runtime) if hapmoe_plan is not None else None
    b = uniform_enumeration(run, cluster, profiles, runtime)
    best = better(a, b)
    if notes is not None:
        which = "none fits" if best is None else ("re-split of HAPMoE's megatron plan" if best is a else
                                                 "even-split enumeration of the search space")
        notes.append(f"ablation (uniform PP/DP): best of re-split and enumeration: {which}")
    return best


def plan_ablation(run: MegatronRun, cluster: ClusterSpec, profiles, **kw) -> Plan | None:
    """HAPMoE with non-uniform PP/DP disabled (megatron runtime, even layer split), or None."""
    priced = search_ablation(run, cluster, profiles, **kw)
    return priced.plan if priced else None
