"""Human and machine output: JSON payloads, tables on the terminal, summary.md.

Terminal output fits the terminal: the default stage table fits 100 columns (columns are dropped,
least important first, below that); `--wide` adds the communication and memory breakdown.  When
stdout is not a terminal the width is $COLUMNS, or 100.  Both backends' statuses read the same:
OPTIMAL only when the optimum is certified over the whole search space, FEASIBLE otherwise, with
the reason (pruning, time limit) spelled out.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from typing import Any, Iterable

from planner.cost.flops import parameter_totals
from planner.cost.mechanisms import BY_NAME
from planner.cost.model import PlanCost, ep_overlap_notes
from planner.cost.dispatch import fabric_notes
from planner.cost.layer import blackwell_eager_notes
from planner.inputs.assumed import as_planned, measured_imbalance_notes
from planner.inputs.cluster import describe_cluster, domain_notes
from planner.launcher.quoting import sh_quote
from planner.megatron.flags import unmodelled_notes
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan
from planner.search.pruning import Pruning
from planner.search.settings import OPTIMAL, status_reason
from planner.trials import TRIAL_ITERATIONS, TRIAL_LOG
from planner.uncertainty import shipped_uncertainty

DEFAULT_WIDTH = 100  # columns when stdout is not a terminal and $COLUMNS is unset
# `schema_version` of the --json objects of solve, estimate, compare and calibrate (and plan.json and
# calibration_report.json), described by
# docs/schema/*.json: raised when a key is removed or changes meaning; new keys may appear without it
SCHEMA_VERSION = 1
WIDE_MIN_WIDTH = 200  # --wide never squeezes its table below this
ASSUMED_MIN_REASON_COLUMNS = 50  # narrower, the assumptions' reasons print beneath each value, not in a column


# ------------------------------------------------------------------------------------------------
# JSON payloads


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan as JSON, with derived quantities spelled out for readers."""
    d = plan.model_dump(mode="json")
    d["pp"] = plan.pp
    d["dp"] = [s.dp for s in plan.stages]
    d["num_microbatches"] = plan.num_microbatches
    d["world_size"] = plan.world_size
    for s, st in zip(d["stages"], plan.stages):
        s["recompute_label"] = st.recompute.label
    return d


def assumed_json(run: MegatronRun) -> list[dict[str, Any]]:
    """The run's assumed values: [{name, value, flag, source}]."""
    return [a.model_dump(mode="json") for a in run.assumed]


def _overflow(cost: PlanCost) -> dict[str, Any] | None:
    if cost.fits:
        return None
    worst = max(cost.stages, key=lambda s: s.memory_bytes - s.capacity_bytes)
    return {
        "stage": worst.index,
        "device_type": worst.device_type,
        "memory_gib": worst.memory_gib,
        "capacity_gib": worst.device_memory_bytes / 2**30,
        "usable_gib": worst.capacity_bytes / 2**30,
        "memory_headroom": cost.memory_headroom,
        "short_gib": (worst.memory_bytes - worst.capacity_bytes) / 2**30,
        "fits_device": cost.fits_device,
    }


def range_json(cost: PlanCost, time_range) -> dict[str, Any]:
    """The range keys of estimate and solve: `iteration_time_range_s` [low, high] seconds and
    `tflops_per_gpu_range` [low, high] (planner/cost/ranges.py), where the range comes from, `evidence`
    ({extrapolated, unmeasured}: the mechanisms outside what the calibration runs measured) and
    `range_by_mechanism_s` (per mechanism, the seconds its uncertainty alone adds at the top of the range)."""
    if time_range is None:
        return {}
    flop = cost.model_flop_per_iteration / (1e12 * cost.world_size)
    unc = shipped_uncertainty()
    out = {
        "iteration_time_range_s": [time_range.low_s, time_range.high_s],
        "tflops_per_gpu_range": [flop / time_range.high_s, flop / time_range.low_s],
        "range_source": unc.method or unc.time_source,
    }
    if time_range.evidence is not None:
        out["evidence"] = time_range.evidence.to_json()
        out["range_by_mechanism_s"] = {BY_NAME[name].words: s for name, s in time_range.widening_s}
    return out


def parameters_json(model) -> dict[str, int]:
    """The model's parameter counts (planner/cost/flops.py `parameter_totals`): `parameters_total`,
    `parameters_active` (per token), and the parts published counts often leave out, `parameters_input_embedding`
    (in both) and `parameters_mtp` (in the total)."""
    p = parameter_totals(model)
    return {"parameters_total": p.total, "parameters_active": p.active,
            "parameters_input_embedding": p.input_embedding, "parameters_mtp": p.mtp}


def estimate_json(run: MegatronRun, cluster: ClusterSpec, plan: Plan, cost: PlanCost, notes: list[str],
                  time_range=None, *, profiles: ProfileSet) -> dict:
    out = {"schema_version": SCHEMA_VERSION, **cost.to_json()}
    out.update(range_json(cost, time_range))
    out["model"] = run.model.name
    out.update(parameters_json(run.model))
    out["cluster"] = describe_cluster(cluster, profiles)
    out["cluster_gpus"] = cluster.world_size
    out["plan"] = plan_json(plan)
    out["assumed"] = assumed_json(run)
    out["notes"] = list(cost.notes) + list(notes)
    overflow = _overflow(cost)
    if overflow is not None:
        out["overflow"] = overflow
    return out


def user_plan_json(user, ours: PlanCost) -> dict[str, Any]:
    """The `user_plan` block of solve's JSON (planner.user_plan.UserPlan against our cost)."""
    if user.cost is None:
        return {"source": user.source, "priced": False, "error": user.error}
    c = user.cost
    keep = {} if user.time_range is None else {
        "iteration_time_range_s": [user.time_range.low_s, user.time_range.high_s],
        "keep_yours": user.keep_yours, "keep_yours_why": user.keep_why,
        **({"evidence": user.time_range.evidence.to_json()} if user.time_range.evidence else {}),
    }
    return keep | {
        "source": user.source,
        "priced": True,
        "plan": plan_json(user.plan),
        "iteration_time_s": c.iteration_time_s,
        "tflops_per_gpu": c.tflops_per_gpu,
        "mfu": c.mfu,
        "max_memory_gib": c.max_memory_gib,
        "max_allocated_gib": c.max_allocated_gib,
        "max_reserved_gib": c.max_reserved_gib,
        "fits": c.fits,
        "fits_device": c.fits_device,
        "over_headroom": user.over_headroom,
        "overflow": _overflow(c),
        "violations": [{"rule": v.rule, "message": v.message, "hint": v.hint} for v in user.violations],
        "runs": user.runs,
        "cannot_run": user.cannot_run,
        "notes": list(user.notes),
        "speedup": c.iteration_time_s / ours.iteration_time_s if ours.iteration_time_s > 0 else None,
        "stages": c.to_json()["stages"],
    }


def trials_json(trials, why: str) -> dict[str, Any]:
    """`trials` of `solve --json` (planner/trials.py): the plans to measure, each with where `--out DIR` writes
    its launcher and where that launcher writes its log, and `trials_why`."""
    return {"trials_why": why, "trials": [{
        "name": t.name, "role": t.role, "why": t.why, "plan": plan_json(t.plan),
        "iteration_time_s": t.cost.iteration_time_s,
        "iteration_time_range_s": [t.time_range.low_s, t.time_range.high_s],
        **({"evidence": t.time_range.evidence.to_json()} if t.time_range.evidence else {}),
        "launch": f"trials/{t.name}/launch.sh", "log": f"trials/{t.name}/{TRIAL_LOG}-<host>.log",
    } for t in trials]}


def search_json(result, settings) -> dict[str, Any]:
    """The `search` block of `solve --json`: what was searched, what was pruned, what is proven.

    status           OPTIMAL: certified over the whole space; FEASIBLE otherwise.
    whole_space      lower_bound_s valid for the whole space (None when not known).
    pruned_space     what the prunings left: its status (OPTIMAL when its search completed) and
                     optimum_s (the best plan's objective on the tables when it is proven), with a
                     lower bound valid for the pruned space.
    pruning          which prunings were on, and how many configurations each set aside.
    quantisation_s   most the best plan's float cost exceeds its integer-table objective.
    cpsat            --backend cpsat's statistics (planner/search/certify.py): variables and
                     constraints per family, status, objective_s, bound_s, wall_s, branches, how much
                     work each part did (master_solves: pipeline-block solves, stage_solves, cuts by
                     kind, shapes screened and blocked, configs_never_priced_one_by_one; seed_configs,
                     seed_s, seed_best_s: the seeding's, planner/search/seeds.py; self_check: the
                     configurations whose plans were checked against the bounds the search claims for
                     them, and the contradictions found, which withdraw OPTIMAL and the bound).
    time_split       a second search over a pooled view of the cluster (planner/search/pools.py): the
                     search's limit_s, the seconds each search took (separate_types_s, pooled_s) and
                     the pools; None when there was one search.
    """
    best = result.best[0]
    pruned_optimal = result.pruned_space_optimal
    return {
        "backend": result.backend,
        "status": result.status,
        "certified_optimal": result.certified_optimal,
        "time_limit_s": settings.time_limit_s,
        "timed_out": result.timed_out,
        "wall_s": result.search_time_s,
        "whole_space": {"lower_bound_s": result.lower_bound_s},
        "pruned_space": {
            "status": result.pruned_space_status,
            "optimum_s": best.objective_s if pruned_optimal else None,
            "lower_bound_s": result.pruned_lower_bound_s,
        },
        "pruning": {**result.pruning.to_json(), "on": result.pruning.restricts,
                    "configs_pruned_memory": result.configs_pruned_memory,
                    "configs_pruned_cp_min_seq": result.configs_pruned_cp},
        "configs": {"total": result.configs_total, "solved": result.configs_solved,
                    "bounded": result.configs_bounded, "infeasible": result.configs_infeasible,
                    "unsearched": result.configs_unsearched, "space_counted": result.space_counted},
        "quantisation_s": result.quantisation_s,
        "cpsat": result.cpsat,
        "time_split": result.time_split,
    }


def solve_json(outcome, settings, runtime: str, user=None) -> dict[str, Any]:
    """The `solve --json` object (also plan.json).  Public keys: status, iteration_time_s,
    tflops_per_gpu, mfu, search_time_s, lower_bound_s, gap, world_size, plan (with stages);
    also search (search_json), idle_gpus, assumed, and user_plan when the input's flags hold a plan
    of their own."""
    r = outcome.result
    best, cost = r.best[0], outcome.costs[0]
    it = cost.iteration_time_s
    lower = r.lower_bound_s
    objective_s = outcome.objective_s if outcome.ranges else it
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "status": r.status,
        "backend": r.backend,
        "runtime": runtime,
        "model": outcome.run.model.name,
        **parameters_json(outcome.run.model),
        "cluster": describe_cluster(outcome.cluster, outcome.profiles or ProfileSet.load()),
        "iteration_time_s": it,
        "tflops_per_gpu": cost.tflops_per_gpu,
        "mfu": cost.mfu,
        "max_memory_gib": cost.max_memory_gib,
        "max_allocated_gib": cost.max_allocated_gib,
        "max_reserved_gib": cost.max_reserved_gib,
        "fits": cost.fits,
        "world_size": outcome.plans[0].world_size,
        "cluster_gpus": outcome.cluster.world_size,
        "idle_gpus": {i.device_type: {"count": i.count, "why": i.why} for i in outcome.idle},
        "search_time_s": r.search_time_s,
        "objective": outcome.objective,
        "objective_s": objective_s,
        "lower_bound_s": lower,
        "gap": _gap(objective_s, lower),
        "searched_space_gap": _gap(objective_s, r.pruned_lower_bound_s),
        "memory_headroom": outcome.memory_headroom,
        "certified_optimal": r.certified_optimal,
        "configs_total": r.configs_total,
        "configs_solved": r.configs_solved,
        "configs_bounded": r.configs_bounded,
        "configs_unsearched": r.configs_unsearched,
        "configs_infeasible": r.configs_infeasible,
        "configs_pruned_memory": r.configs_pruned_memory,
        "pruning": settings.pruning.to_json(),
        "solver_objective_s": best.objective_s,
        "search": search_json(r, settings),
        "plan": plan_json(outcome.plans[0]),
        "stages": cost.to_json()["stages"],
        "num_microbatches": cost.num_microbatches,
        "pipeline_s": cost.pipeline_s,
        "bubble_s": cost.bubble_s,
        "sync_s": cost.sync_s,
        "assumed": assumed_json(outcome.run),
        "problems": outcome.problems[0],
        "notes": list(r.notes) + [f"{i.count} {i.device_type} GPUs stay idle: {i.why}" for i in outcome.idle]
        + unmodelled_notes(outcome.run.passthrough, outcome.run.training)
        + (fabric_notes(outcome.range_model.nominal, outcome.plans[0]) if outcome.range_model is not None else [])
        + blackwell_eager_notes(outcome.run.model, outcome.run.training, outcome.plans[0])
        + (ep_overlap_notes(outcome.range_model.nominal, outcome.plans[0], cost)
           if outcome.range_model is not None else [])
        + (measured_imbalance_notes(as_planned(outcome.run, outcome.plans[0]), outcome.cluster, outcome.profiles,
                                    "the pick's")
           + domain_notes(outcome.cluster, outcome.profiles) if outcome.profiles is not None else []),
    }
    if outcome.ranges:
        out.update(range_json(cost, outcome.ranges[0]))
    if getattr(outcome, "choice", None) is not None:
        out["runtime_choice"] = outcome.choice.as_json()
    if user is not None:
        out["user_plan"] = user_plan_json(user, cost)
    if len(outcome.plans) > 1:
        rngs = outcome.ranges[1:] if outcome.ranges else [None] * (len(outcome.plans) - 1)
        out["alternatives"] = [
            {"iteration_time_s": c.iteration_time_s, "tflops_per_gpu": c.tflops_per_gpu, "mfu": c.mfu,
             "max_memory_gib": c.max_memory_gib, "max_allocated_gib": c.max_allocated_gib,
             "max_reserved_gib": c.max_reserved_gib, "fits": c.fits, "plan": plan_json(p), **range_json(c, r)}
            for p, c, r in zip(outcome.plans[1:], outcome.costs[1:], rngs)
        ]
    return out


def objective_line(payload: dict) -> str:
    """What the search minimised and its value for the plan."""
    if payload.get("objective") == "pessimistic":
        return f"objective: pessimistic time (top of the range), {payload['objective_s']:.3f} s"
    return f"objective: the nominal time, {payload.get('objective_s', payload['iteration_time_s']):.3f} s"


def bound_text(payload: dict) -> str:
    """The lower bound and the gaps, both by `_gap` (the live progress shows the searched-space one)."""
    lb, gap, sgap = payload["lower_bound_s"], payload.get("gap"), payload.get("searched_space_gap")
    parts = [f"lower bound {lb:.3f} s (gap {gap * 100:.2f}%)" if lb is not None and gap is not None
             else "no whole-space lower bound"]
    if sgap is not None and sgap != gap:
        parts.append(f"gap {sgap * 100:.2f}% in the searched space")
    return "; ".join(parts)


def _gap(objective_s: float, bound_s: float | None) -> float | None:
    """The one gap definition (the live progress, its final line and the report): how far the searched
    objective's best value is above a lower bound on it, as a fraction of the best value."""
    if bound_s is None or objective_s <= 0:
        return None
    return max(0.0, (objective_s - min(objective_s, bound_s)) / objective_s)


# ------------------------------------------------------------------------------------------------
# Words shared by the terminal and summary.md


def runtime_line(choice: dict) -> str:
    """The runtime choice in one line: which runtime, how it runs the job, what it needs."""
    head = ("auto -> " if choice["requested"] == "auto" else "") + choice["how"]
    if choice.get("left_out"):
        head += f"; {', '.join(choice['left_out'])} left out (see the notes)"
    return head


def search_status(payload: dict) -> tuple[str, str, str]:
    """(status, why, hint) of a solve payload, in the search's own words
    (planner/search/settings.status_reason)."""
    p = payload["pruning"]
    sj = payload.get("search") or {}
    pruning = Pruning(delta=p["load_balance_delta"], memory=p["memory"], cp_min_seq_tokens=p.get("cp_min_seq_tokens"),
                      restrict=p.get("restrict", True))
    return status_reason(
        certified=payload["certified_optimal"], pruning=pruning,
        pruning_on=sj.get("pruning", {}).get("on", pruning.restricts),
        pruned_proven=sj.get("pruned_space", {}).get("status") == OPTIMAL,
        time_limit_hit=any("time limit" in n for n in payload.get("notes", [])))


def recompute_short(label: str) -> str:
    """A Recompute.label in the CLI's --recompute form, short enough for a table column."""
    if label.startswith("selective"):
        return "selective"
    return recompute_long(label)


def recompute_long(label: str) -> str:
    """A Recompute.label with its selective modules, full recompute in the CLI's --recompute form (as
    `recompute_short` writes it: every output spells full recompute one way)."""
    if label.startswith("full:"):
        _, method, k = label.split(":")
        return f"full-{method}:{k}"
    return label


def stage_mbs(plan: dict) -> list[int]:
    """Samples per micro-batch on one DP rank of each stage (a plan_json): the plan's mbs on every stage under
    one DP; FlagScale's DP0 * mbs / DP_i where the stages' DP differ (Plan.stage_mbs)."""
    return [plan["mbs"] * plan["dp"][0] // d for d in plan["dp"]]


def mbs_text(plan: dict) -> str:
    """The micro-batch size, one number, or each stage's ("1/2/2") where the stages' micro-batches differ."""
    sizes = stage_mbs(plan)
    return str(sizes[0]) if len(set(sizes)) == 1 else "/".join(str(m) for m in sizes)


def degrees_line(plan: dict) -> str:
    dps = sorted(set(plan["dp"]))
    dp = str(dps[0]) if len(dps) == 1 else "/".join(str(d) for d in plan["dp"])
    mbs = mbs_text(plan)
    per_stage = " (per stage: samples per DP rank, DP0 x mbs / DP)" if "/" in mbs else ""
    return (f"TP={plan['tp']} PP={plan['pp']} CP={plan['cp']} EP={plan['ep']} ETP={plan['etp']} DP={dp} "
            f"VPP={plan['vpp']} mbs={mbs}{per_stage} gbs={plan['gbs']} runtime={plan['runtime']}")


def degrees_short(plan: dict) -> str:
    dps = sorted(set(plan["dp"]))
    dp = str(dps[0]) if len(dps) == 1 else "/".join(str(d) for d in plan["dp"])
    return (f"TP{plan['tp']} PP{plan['pp']} CP{plan['cp']} EP{plan['ep']} ETP{plan['etp']} DP{dp} "
            f"VPP{plan['vpp']} mbs{mbs_text(plan)} {_recompute_text(plan)}")


def _dp_text(plan: dict) -> str:
    return str(plan["dp"][0]) if len(set(plan["dp"])) == 1 else "/".join(str(d) for d in plan["dp"])


def _runs(values: Iterable[str]) -> list[tuple[int, str]]:
    """Equal neighbours counted, in order: [(4, "none"), (4, "full-uniform:1")]."""
    runs: list[list] = []
    for v in values:
        if runs and runs[-1][1] == v:
            runs[-1][0] += 1
        else:
            runs.append([1, v])
    return [(n, v) for n, v in runs]


def _recompute_text(plan: dict) -> str:
    """Each stage's recompute in stage order, a run of equal stages counted: "none", "none/full-uniform:1",
    "none x4/full-uniform:1 x4"."""
    runs = _runs(recompute_short(s["recompute_label"]) for s in plan["stages"])
    return runs[0][1] if len(runs) == 1 else "/".join(v if n == 1 else f"{v} x{n}" for n, v in runs)


def _devices_text(plan: dict) -> str:
    """The stages' device types in order, runs counted: "4 MI300X, 4 H800"."""
    return ", ".join(f"{n} {t}" for n, t in _runs(s["device_type"] for s in plan["stages"]))


def plan_difference(pick: dict, other: dict) -> str:
    """What `other` (a plan_json) changes against `pick`, in a few words: "TP 1->2, mbs 1->2, layers 16/16"."""
    parts = [f"{name} {pick[key]}->{other[key]}"
             for key, name in (("tp", "TP"), ("pp", "PP"), ("cp", "CP"), ("ep", "EP"), ("etp", "ETP"), ("vpp", "VPP"),
                               ("mbs", "mbs")) if pick[key] != other[key]]
    if _dp_text(pick) != _dp_text(other):
        parts.append(f"DP {_dp_text(pick)}->{_dp_text(other)}")
    if pick.get("sequence_parallel") != other.get("sequence_parallel"):
        parts.append("sequence parallel " + ("on" if other.get("sequence_parallel") else "off"))
    if _recompute_text(pick) != _recompute_text(other):
        parts.append(f"recompute {_recompute_text(pick)}->{_recompute_text(other)}")
    if _devices_text(pick) != _devices_text(other):
        parts.append(f"stages {_devices_text(other)}")
    layers = ["/".join(str(s["num_layers"]) for s in p["stages"]) for p in (pick, other)]
    if layers[0] != layers[1]:
        parts.append(f"layers {layers[0]}->{layers[1]}" if pick["pp"] == other["pp"] else f"layers {layers[1]}")
    return ", ".join(parts) or "the same degrees, stages and layers; another placement of the stages"


def alternative_rows(payload: dict) -> list[tuple[str, ...]]:
    """`solve --top K`: the plans after the pick (the payload's `alternatives`), each as (rank, iteration s,
    range s, peak memory GiB, degrees, what differs from the pick)."""
    rows = []
    for i, a in enumerate(payload.get("alternatives", [])):  # distinct plans (planner/api.py solve)
        rng = a.get("iteration_time_range_s")
        differs = plan_difference(payload["plan"], a["plan"])
        rows.append((str(i + 2), f"{a['iteration_time_s']:.3f}", f"{rng[0]:.3f}-{rng[1]:.3f}" if rng else "-",
                     f"{a['max_memory_gib']:.1f}", degrees_short(a["plan"]), differs))
    return rows


def objective_name(objective: str | None) -> str:
    return "pessimistic time (top of the range)" if objective == "pessimistic" else "nominal time"


def best_so_far_text(plan: Plan, objective_s: float, objective: str) -> str:
    """An interrupted search's best plan so far: its time by the search's objective and its degrees, as the
    --top table shows a plan (TP2 PP4 ... mbs1 full-block:1)."""
    return f"{degrees_short(plan_json(plan))}, {objective_name(objective)} {objective_s:.3f} s per iteration"


def alternatives_title(payload: dict, top_k: int) -> str:
    """The heading of the --top table: how many plans follow the pick, ranked by what."""
    n = len(payload.get("alternatives", []))
    by = objective_name(payload.get("objective"))
    title = f"--top {top_k}: the {n} plan{'s' if n != 1 else ''} after the pick, by the {by}"
    if n < top_k - 1:
        title += f" (the search kept {n} other plan{'s' if n != 1 else ''}, not {top_k - 1})"
    return title


def _figure(x: float, decimals: int) -> str:
    """`x` with `decimals` decimals, or two significant digits where those would show fewer (a CPU profile's
    0.0043 TFLOP/s/GPU printed as 0.0)."""
    return f"{x:.{decimals}f}" if x == 0 or abs(x) >= 10.0 ** (1 - decimals) else f"{x:.2g}"


def headline(payload: dict) -> str:
    """Time, throughput (each with its range) and MFU; memory has its own line (`memory_line`)."""
    rng = payload.get("iteration_time_range_s")
    t_rng = f" (range {_figure(rng[0], 2)}-{_figure(rng[1], 2)})" if rng else ""
    f_rng = payload.get("tflops_per_gpu_range")
    f_txt = f" ({_figure(f_rng[0], 0)}-{_figure(f_rng[1], 0)})" if f_rng else ""
    return (f"iteration {_figure(payload['iteration_time_s'], 3)} s{t_rng} | {_figure(payload['tflops_per_gpu'], 1)}"
            f"{f_txt} TFLOP/s/GPU | MFU {payload['mfu'] * 100:.1f}%")


def evidence_line(payload: dict) -> str | None:
    """Whether the prediction rests on measured mechanisms, and what widens its range most (None without one)."""
    ev = payload.get("evidence")
    if ev is None:
        return None
    widest = list(payload.get("range_by_mechanism_s", {}).items())[:2]
    wide = ("; range widest for " + ", ".join(f"{m} (+{s:.2f} s)" for m, s in widest)) if widest else ""
    if not ev["extrapolated"]:
        return "evidence: every mechanism within what the calibration runs measured" + wide
    what = [u.split(" (")[0] for u in ev["unmeasured"]]
    return (f"evidence: EXTRAPOLATED, {len(what)} mechanism(s) outside what the calibration runs measured: "
            + "; ".join(what) + wide)


def _count_text(n: int) -> str:
    """A parameter count in B (three significant digits, one decimal from 100 B) or M."""
    if n >= 1e11:
        return f"{n / 1e9:.1f} B"
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M"


def parameters_line(payload: dict) -> str | None:
    """The model's parameters, total and active per token, with the parts published counts often leave out (None in
    a payload without them: a plan.json of an earlier version)."""
    if "parameters_total" not in payload:
        return None
    total, active = payload["parameters_total"], payload["parameters_active"]
    embedding = _count_text(payload["parameters_input_embedding"])
    mtp = payload.get("parameters_mtp", 0)
    if active == total:
        return f"model: {_count_text(total)} parameters, all active per token ({embedding} of them the input embedding)"
    also = f" and the MTP layers, {_count_text(mtp)} of the total" if mtp else ""
    return (f"model: {_count_text(total)} parameters, {_count_text(active)} active per token (both count the "
            f"{embedding} input embedding{also})")


def memory_line(payload: dict) -> str:
    """Peak memory, the headroom the plan keeps free, and the stages near what they may use."""
    fits = ("fits" if payload["fits"] else "over the headroom, within the device" if payload.get("fits_device")
            else "DOES NOT FIT")
    h = payload.get("memory_headroom", 0.0)
    line = f"peak memory {payload['max_memory_gib']:.1f} GiB ({fits}); headroom {100 * h:.0f}% of each device kept free"
    if "max_allocated_gib" in payload:
        line += (f"; allocator peaks: {payload['max_allocated_gib']:.1f} GiB allocated, "
                 f"{payload['max_reserved_gib']:.1f} GiB reserved")
        recorded = payload.get("max_reserved_recorded_gib", 0.0)
        if recorded > payload["max_reserved_gib"] + 0.05:  # expert buffers change size: the cache keeps growing
            line += f" (a long run may record up to {recorded:.1f} GiB reserved: cache freed on demand)"
    near = [str(s["index"]) for s in payload["stages"] if s.get("near_capacity")]
    if near:
        line += f"; stage {', '.join(near)} at 97-100% of usable memory"
    return line


def shape_line(payload: dict) -> str:
    """GPUs, micro-batches, and how the iteration splits into pipeline (with its bubble) and sync."""
    used = f"{payload['world_size']} of {payload['cluster_gpus']} GPUs" if "cluster_gpus" in payload \
        else f"{payload['world_size']} GPUs"
    line = f"{used}, {payload['num_microbatches']} micro-batches"
    if "pipeline_s" in payload:
        pipe = payload["pipeline_s"]
        bubble = payload["bubble_s"] / pipe * 100 if pipe > 0 else 0.0
        line += f"; pipeline {pipe:.3f} s (bubble {bubble:.1f}%) + DP sync/optimizer {payload['sync_s']:.3f} s"
    return line


def _assumed_rows(payload: dict) -> list[tuple[str, str, str, str]]:
    return [(a["name"], str(a["value"]), a["source"], a["flag"]) for a in payload.get("assumed", [])]


# ------------------------------------------------------------------------------------------------
# Terminal


def terminal_width(wide: bool = False) -> int:
    """The width to render for: the terminal's, else $COLUMNS, else DEFAULT_WIDTH; --wide at least
    WIDE_MIN_WIDTH."""
    width = 0
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        width = int(env)
    elif sys.stdout.isatty():
        width = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    width = width or DEFAULT_WIDTH
    return max(width, WIDE_MIN_WIDTH) if wide else width


def _console(wide: bool = False):
    from rich.console import Console

    return Console(file=sys.stdout, width=terminal_width(wide), highlight=False, soft_wrap=False)


def _say(console, text: str, style: str | None = None) -> None:
    """Plain text (no markup), wrapped at the console width."""
    console.print(text, markup=False, highlight=False, style=style)


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def _gib(x: float) -> str:
    return f"{x:.1f}"


# (header, cell function, left-aligned?) per column; the default table's columns in the order they
# are dropped when the terminal is too narrow, least important first
_DROP_ORDER = ("alloc\nGiB", "compute\nms", "DP sync\nms/iter", "comm\nms", "layers")


def _field(key: str, fmt):
    return lambda s: fmt(s[key])


# --wide: (header, stage key, format), after the time per micro-batch and compute
_WIDE_COLUMNS = (
    ("recomp\nms", "recompute_s", _ms), ("TP\nms", "tp_comm_s", _ms), ("CP\nms", "cp_comm_s", _ms),
    ("EP\nms", "ep_comm_s", _ms), ("PP\nms", "pp_comm_s", _ms), ("DP sync\nms/iter", "dp_comm_s", _ms),
    ("optim\nms/iter", "optimizer_s", _ms), ("host\nms/iter", "iteration_overhead_s", _ms),
    ("weights\nGiB", "weights_gib", _gib), ("grads\nGiB", "grads_gib", _gib),
    ("optim\nGiB", "optimizer_gib", _gib), ("activ\nGiB", "activations_gib", _gib), ("other\nGiB", "other_gib", _gib),
    ("in-flight\nmb", "inflight_microbatches", lambda x: f"{x:.1f}"),
    ("reserv\nGiB", "peak_reserved_gib", _gib),
)


def _per_stage_mbs(stages: list[dict]) -> bool:
    """The stages run micro-batches of different sizes (FlagScale's per-stage DP): the tables show each one's."""
    return len({s.get("micro_batch_size") for s in stages}) > 1


def _columns(wide: bool, per_stage_mbs: bool = False) -> list[tuple[str, Any, bool]]:
    def fits(s: dict) -> str:
        if not s["fits"]:
            return "NO"
        return f"{100 * s['capacity_used_fraction']:.0f}%!" if s.get("near_capacity") else "yes"

    cols: list[tuple[str, Any, bool]] = [
        ("stage", lambda s: str(s["index"]), False),
        ("device", lambda s: s["device_type"], True),
        ("layers", lambda s: str(s["num_layers"]), False),
        ("DP", lambda s: str(s["dp"]), False),
        *([("mbs", lambda s: str(s["micro_batch_size"]), False)] if per_stage_mbs else []),
        ("recompute", (lambda s: recompute_long(s["recompute"])) if wide else (lambda s: recompute_short(s["recompute"])),
         True),
        ("t/mb\nms", lambda s: _ms(s["time_s"]), False),
        ("compute\nms", lambda s: _ms(s["compute_s"]), False),
    ]
    if wide:
        cols += [(header, _field(key, fmt), False) for header, key, fmt in _WIDE_COLUMNS]
    else:
        cols += [
            ("comm\nms", lambda s: _ms(s["time_s"] - s["compute_s"]), False),
            ("DP sync\nms/iter", lambda s: _ms(s["dp_comm_s"] + s["optimizer_s"] + s["iteration_overhead_s"]), False),
        ]
    if not wide:
        cols.append(("alloc\nGiB", lambda s: _gib(s.get("peak_allocated_gib", s["memory_gib"])), False))
    cols += [
        ("memory\nGiB", lambda s: _gib(s["memory_gib"]), False),
        ("usable\nGiB", lambda s: _gib(s.get("usable_gib", s["capacity_gib"])), False),
        ("fits", fits, False),
    ]
    return cols


def stage_table(stages: list[dict], *, wide: bool, width: int, title: str = "per stage"):
    """The per-stage rich Table, no wider than `width` unless that would drop every optional column."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    cols = _columns(wide, _per_stage_mbs(stages))
    measure = Console(width=10_000, file=open(os.devnull, "w"))

    def build(columns):
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False,
                  show_edge=False)
        for header, _, left in columns:
            t.add_column(header, justify="left" if left else "right", no_wrap=True)
        for s in stages:
            cells = [fn(s) for _, fn, _ in columns]
            t.add_row(*cells, style=None if s["fits"] else "bold red")
        return t

    table = build(cols)
    if not wide:
        for name in _DROP_ORDER:
            if measure.measure(table).maximum <= width:
                break
            cols = [c for c in cols if c[0] != name]
            table = build(cols)
    return table


def _render_stage_table(console, payload: dict, wide: bool) -> None:
    console.print(stage_table(payload["stages"], wide=wide, width=console.width))
    legend = ["t/mb: forward + backward per micro-batch (compute includes recompute; comm: TP/CP/EP/PP)",
              "DP sync: exposed gradient sync + optimizer step + fixed host time, per iteration (--wide: each "
              "part); memory per GPU (--wide: by part)",
              "alloc: torch's allocated peak; memory: what the allocator reserves (alloc + its cache) + context and "
              "communicator buffers",
              "usable: device memory less the memory headroom; N%!: fits at 97-100% of usable"]
    if wide:
        legend = ["t/mb: forward + backward per micro-batch; compute includes recomp; TP/CP/EP/PP: communication "
                  "per micro-batch; DP sync (exposed gradient sync), optim (optimizer step) and host (fixed host "
                  "time): per iteration; their sum is the default table's DP sync",
                  "memory per GPU; in-flight mb: micro-batches whose activations a stage holds at its peak; reserv: "
                  "the allocator's reserved peak (weights to activations + allocated workspaces + its cache); "
                  "memory: reserv + other"]
    if _per_stage_mbs(payload["stages"]):
        legend.insert(0, "mbs: each stage's own micro-batch, samples per DP rank (DP0 x mbs / DP of the stage); "
                         "t/mb is the time of that micro-batch, so stages with another mbs do not compare 1:1")
    for line in legend:
        _say(console, line, style="dim")


def _render_assumed(console, payload: dict) -> None:
    """The assumptions as a table where the terminal leaves the reasons room (ASSUMED_MIN_REASON_COLUMNS), else
    as a list: one line per value, its reason wrapped beneath it."""
    rows = _assumed_rows(payload)
    if not rows:
        return
    from rich import box
    from rich.table import Table

    title = "assumed (the input does not state these)"
    lead = sum(max(len(row[i]) for row in rows) for i in (0, 1, 3)) + 6  # three columns and their gaps
    if console.width - lead < ASSUMED_MIN_REASON_COLUMNS:
        _say(console, title)
        for name, value, source, flag in rows:
            _say(console, f"  {name}: {value} (set with {flag})")
            _say(console, textwrap.fill(source, width=max(console.width, 20), initial_indent="    ",
                                        subsequent_indent="    ", break_on_hyphens=False), style="dim")
        return
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD,
              collapse_padding=True, pad_edge=False, show_edge=False, show_header=False)
    t.add_column("what", no_wrap=True)
    t.add_column("value", no_wrap=True, justify="right")
    t.add_column("set with", no_wrap=True)
    t.add_column("because", overflow="fold", style="dim")
    for name, value, source, flag in rows:
        t.add_row(name, value, flag, source)
    console.print(t)


def _render_overflow(console, o: dict) -> None:
    within = o.get("fits_device", False)
    _say(console, f"stage {o['stage']} ({o['device_type']}) needs {o['memory_gib']:.1f} GiB of "
         f"{o.get('usable_gib', o['capacity_gib']):.1f} GiB usable ({o['capacity_gib']:.1f} GiB less "
         f"{100 * o.get('memory_headroom', 0.0):.0f}% headroom): {o['short_gib']:.1f} GiB short"
         + (", within the device: it may run or run out of memory (the headroom is the memory model's error on "
            "measured peaks)" if within else ""), style="bold" if within else "bold red")


def _say_evidence(console, payload: dict) -> None:
    line = evidence_line(payload)
    if line is not None:
        _say(console, line, style="bold" if payload["evidence"]["extrapolated"] else None)


def _say_parameters(console, payload: dict) -> None:
    line = parameters_line(payload)
    if line is not None:
        _say(console, line)


def render_estimate(payload: dict, wide: bool = False) -> None:
    console = _console(wide)
    _say(console, f"{payload['model']} on {payload['cluster']}: {degrees_line(payload['plan'])}")
    _say_parameters(console, payload)
    _render_stage_table(console, payload, wide)
    _say(console, headline(payload))
    _say_evidence(console, payload)
    _say(console, shape_line(payload))
    _say(console, memory_line(payload))
    if not payload["fits"]:
        _render_overflow(console, payload["overflow"])
    _render_assumed(console, payload)
    for n in payload.get("notes", []):
        _say(console, f"note: {n}")


def _over_headroom_text(o: dict) -> str:
    """Your plan above the usable memory but within the device (`user_plan.over_headroom`), from its overflow."""
    return (f"your plan is over the memory headroom: stage {o['stage']} ({o['device_type']}) needs "
            f"{o['memory_gib']:.1f} of {o['usable_gib']:.1f} GiB usable, within the {o['capacity_gib']:.1f} GiB "
            f"device, so it may run or run out of memory")


def _render_user_plan(console, payload: dict) -> None:
    u = payload.get("user_plan")
    if not u:
        return
    if not u["priced"]:
        _say(console, f"your plan ({u['source']}) cannot run on this cluster: {u['error']}", style="bold")
        return
    from rich import box
    from rich.table import Table

    def fit(d: dict) -> str:
        return f"{d['max_memory_gib']:.1f} GiB " + (
            "(fits)" if d["fits"] else "(over the headroom)" if d.get("over_headroom") else "(DOES NOT FIT)")

    t = Table(title=f"your plan ({u['source']}) against the planner's, same cluster and batch", title_justify="left",
              box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    t.add_column("")
    t.add_column("yours", overflow="fold")
    t.add_column("planner", overflow="fold")
    t.add_row("plan", degrees_short(u["plan"]), degrees_short(payload["plan"]))
    t.add_row("layers/stage", ", ".join(f"{s['num_layers']} {s['device_type']}" for s in u["plan"]["stages"]),
              ", ".join(f"{s['num_layers']} {s['device_type']}" for s in payload["plan"]["stages"]))
    t.add_row("iteration", f"{u['iteration_time_s']:.3f} s", f"{payload['iteration_time_s']:.3f} s")
    if u.get("iteration_time_range_s") and payload.get("iteration_time_range_s"):
        t.add_row("range", "{:.3f}-{:.3f} s".format(*u["iteration_time_range_s"]),
                  "{:.3f}-{:.3f} s".format(*payload["iteration_time_range_s"]))
    t.add_row("TFLOP/s/GPU", f"{u['tflops_per_gpu']:.1f}", f"{payload['tflops_per_gpu']:.1f}")
    t.add_row("MFU", f"{u['mfu'] * 100:.1f}%", f"{payload['mfu'] * 100:.1f}%")
    t.add_row("peak memory", fit(u), fit(payload))
    t.add_row("rules", "ok" if not u["violations"] else f"breaks {len(u['violations'])}", "ok")
    console.print(t)
    speed = u["speedup"]
    verdict = f"speed-up: {speed:.2f}x (the planner's plan against yours, per iteration)"
    if u.get("over_headroom"):
        verdict += "; " + _over_headroom_text(u["overflow"])
    elif not u["runs"]:
        why = []
        if not u["fits"]:
            o = u["overflow"]
            why.append(f"does not fit: stage {o['stage']} ({o['device_type']}) needs {o['memory_gib']:.1f} of "
                       f"{o.get('usable_gib', o['capacity_gib']):.1f} GiB usable")
        if u["violations"]:
            why.append(f"breaks {len(u['violations'])} rule(s) Megatron checks")
        if u.get("cannot_run"):
            why.append(f"spans vendors ({u['cannot_run']})")
        verdict += "; your plan " + " and ".join(why) + ", so it would not run as is"
    _say(console, verdict, style="bold")
    if "keep_yours" in u:
        _say(console, ("keep yours: " if u["keep_yours"] else "switch: ") + u["keep_yours_why"], style="bold")
    for v in u["violations"]:
        _say(console, f"  your plan, rule {v['rule']}: {v['message']} ({v['hint']})")
    for n in u["notes"]:
        _say(console, f"  your plan: {n}")


def trial_lines(payload: dict, where: str | None) -> list[str]:
    """What the trials are and how to run and read them (empty without trials); `where`: the --out directory
    they were written to (None: not written)."""
    trials = payload.get("trials") or []
    if not trials:
        return []
    lines = [f"trials: {payload['trials_why']}; measure these for {TRIAL_ITERATIONS} iterations each"
             + ("" if where else " (--out DIR writes their launchers)") + ":"]
    pick = payload.get("plan")
    for t in trials:
        rng = t["iteration_time_range_s"]
        at = f": {where}/{t['launch']}, log {where}/{t['log']}" if where else ""
        differs = "" if pick is None or t["plan"] == pick else f" [{plan_difference(pick, t['plan'])}]"
        lines.append(f"  {t['name']:12s} {degrees_short(t['plan'])}{differs}, predicted {t['iteration_time_s']:.3f} s "
                     f"({rng[0]:.3f}-{rng[1]:.3f}){at}")
    args = ((payload.get("inputs") or {}).get("script") or {}).get("args") or []
    if where and args:  # each trial's launch.sh is the user's script: it takes the script's own arguments
        lines.append("run each with the script's arguments: bash " + sh_quote(f"{where}/{trials[0]['launch']}") + " "
                     + " ".join(sh_quote(str(a)) for a in args))
    if where:
        lines.append(f"then: cli.py calibrate --trials {where} --out CALIB, and solve again with --profiles CALIB")
    return lines


def _render_trials(console, payload: dict, out_dir: str | None) -> None:
    for i, line in enumerate(trial_lines(payload, out_dir)):
        _say(console, line, style="bold" if i == 0 else None)


def _render_alternatives(console, payload: dict, top_k: int) -> None:
    """--top K: the other plans in a compact table (nothing with --top 1)."""
    if top_k <= 1:
        return
    rows = alternative_rows(payload)
    if not rows:
        _say(console, alternatives_title(payload, top_k))
        return
    from rich import box
    from rich.table import Table

    t = Table(title=alternatives_title(payload, top_k), title_justify="left", box=box.SIMPLE_HEAD,
              collapse_padding=True, pad_edge=False, show_edge=False)
    for header, fold in (("#", False), ("iteration\ns", False), ("range\ns", False), ("memory\nGiB", False),
                         ("plan", True), ("differs from the pick", True)):
        t.add_column(header, justify="left" if fold else "right", overflow="fold", no_wrap=not fold)
    for row in rows:
        t.add_row(*row)
    console.print(t)


def render_solve(payload: dict, wide: bool = False, out_dir: str | None = None, top_k: int = 1) -> None:
    """The solve's terminal output; `top_k`: the --top table."""
    console = _console(wide)
    _say(console, f"{payload['model']} on {payload['cluster']} ({payload['runtime']} runtime, backend "
         f"{payload['backend']})")
    _say_parameters(console, payload)
    if payload.get("runtime_choice"):
        _say(console, "runtime: " + runtime_line(payload["runtime_choice"]))
    _say(console, "plan: " + degrees_line(payload["plan"]))
    _render_stage_table(console, payload, wide)
    _say(console, headline(payload))
    _say_evidence(console, payload)
    _say(console, shape_line(payload))
    _say(console, memory_line(payload))
    status, why, hint = search_status(payload)
    _say(console, f"search: {status}, {why}")
    _say(console, "  " + objective_line(payload))
    _say(console, f"  {bound_text(payload)}; searched for {payload['search_time_s']:.1f} s")
    counted = payload.get("search", {}).get("configs", {}).get("space_counted", True)
    total = (f"{payload['configs_total']} in all" if counted else
             f"{payload['configs_total']} enumerated before the time limit (the space holds more)")
    _say(console, f"  configurations: {total}, {payload['configs_solved']} solved, "
         f"{payload['configs_bounded']} bounded out, {payload['configs_infeasible']} infeasible, "
         f"{payload['configs_pruned_memory']} memory-pruned"
         + (f", {payload['configs_unsearched']} not searched (time limit)" if payload.get("configs_unsearched")
            else ""))
    sj = payload.get("search", {})
    cs = sj.get("cpsat")
    if cs:
        bound = f"{cs['bound_s']:.3f} s" if cs.get("bound_s") is not None else "none"
        never = cs.get("configs_never_priced_one_by_one")
        never_txt = f", {never} configurations never priced one by one" if never is not None else ""
        _say(console, f"  cp-sat: {cs['status']} over the {cs['space']} space, bound {bound}, "
             f"{cs['master_solves']} pipeline-block solve(s), {cs['subproblems']} stage solve(s){never_txt}, "
             f"{cs['wall_s']:.2f} s in CP-SAT")
    if hint:
        _say(console, f"  {hint}")
    _render_alternatives(console, payload, top_k)
    _render_user_plan(console, payload)
    _render_trials(console, payload, out_dir)
    _render_assumed(console, payload)
    for prob in payload["problems"]:
        _say(console, f"PROBLEM: {prob}", style="bold red")
    for n in payload["notes"]:
        _say(console, f"note: {n}")
    if payload.get("plots_dir"):
        _say(console, f"plots: {payload['plots_dir']}")


# ------------------------------------------------------------------------------------------------
# summary.md


MD_MEMORY_PARTS = (("weights", "weights_gib"), ("grads", "grads_gib"), ("optimizer", "optimizer_gib"),
                   ("activations", "activations_gib"), ("allocated, not itemised", "unitemised_gib"),
                   ("allocator cache", "allocator_cache_gib"), ("other", "other_gib"))
"""summary.md's memory parts, in memory.png's order: together they are the stage's memory (GiB)."""


def _md_stage_table(stages: list[dict]) -> list[str]:
    """The stages in markdown; the memory parts (MD_MEMORY_PARTS) add up to the memory column, and a column of each
    stage's micro-batch appears where the stages' micro-batches differ (FlagScale's per-stage DP)."""
    per_stage = _per_stage_mbs(stages)
    heads = (["stage", "device", "layers", "DP"] + (["micro-batch (samples per DP rank)"] if per_stage else [])
             + ["recompute", "time/micro-batch (ms)", "of which comm (ms)", "memory (GiB)"]
             + [name for name, _ in MD_MEMORY_PARTS]
             + ["allocated peak", "reserved peak", "capacity (GiB)", "usable (GiB)"])
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for s in stages:
        mem = f"{s['memory_gib']:.1f}" if s["fits"] else f"**{s['memory_gib']:.1f} (over)**"
        if s.get("near_capacity"):
            mem = f"**{s['memory_gib']:.1f} ({100 * s['capacity_used_fraction']:.0f}% of usable)**"
        cells = ([s["index"], s["device_type"], s["num_layers"], s["dp"]]
                 + ([s["micro_batch_size"]] if per_stage else [])
                 + [recompute_long(s["recompute"]), f"{s['time_s'] * 1e3:.1f}", f"{(s['time_s'] - s['compute_s']) * 1e3:.1f}", mem]
                 + [f"{s.get(key, 0.0):.1f}" for _, key in MD_MEMORY_PARTS]
                 + [f"{s.get('peak_allocated_gib', 0.0):.1f}", f"{s.get('peak_reserved_gib', 0.0):.1f}",
                    f"{s['capacity_gib']:.1f}", f"{s.get('usable_gib', s['capacity_gib']):.1f}"])
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "Memory per GPU: weights to other add up to the memory column (allocated, not itemised: workspaces "
              "and buffers torch allocates beyond the itemised terms; allocator cache: reserved, not allocated; other: "
              "context and communicator buffers); allocated peak and reserved peak are the allocator's peaks."]
    if per_stage:
        lines.append("Each stage runs micro-batches of its own size (DP0 x mbs / DP of the stage), so its time per "
                     "micro-batch is for that many samples per DP rank.")
    return lines


def _md_assumed(payload: dict) -> list[str]:
    rows = _assumed_rows(payload)
    if not rows:
        return []
    lines = ["", "## Assumed values", "", "The input does not state these; the planner assumed them.", "",
             "| value | assumed | why | set with |", "|---|---|---|---|"]
    lines += [f"| {n} | {v} | {s} | `{f}` |" for n, v, s, f in rows]
    return lines


_PLOT_CAPTIONS = {
    "placement": "Placement: every GPU coloured by the pipeline stage it holds",
    "timeline": "One iteration of the pipeline schedule (simulated from the cost model's stage times)",
    "memory": "Memory per GPU by stage against the device's capacity",
    "placement_vs_yours": "Your plan's placement and the planner's",
}


def _md_images(images: dict[str, str]) -> list[str]:
    lines = []
    for name, rel in images.items():
        lines += ["", f"### {_PLOT_CAPTIONS.get(name, name)}", "", f"![{name}]({rel})"]
    return lines


def _md_user_plan(payload: dict) -> list[str]:
    u = payload.get("user_plan")
    if not u:
        return []
    lines = ["", "## Your plan against the planner's", ""]
    if not u["priced"]:
        return lines + [f"Your plan ({u['source']}) cannot run on this cluster: {u['error']}"]
    rules = "ok" if not u["violations"] else f"breaks {len(u['violations'])}"
    lines += [
        f"Your plan is what {u['source']} runs, priced on the same cluster and batch with the same cost model.", "",
        "| | yours | planner |", "|---|---|---|",
        f"| plan | {degrees_short(u['plan'])} | {degrees_short(payload['plan'])} |",
        f"| iteration (s) | {u['iteration_time_s']:.3f} | {payload['iteration_time_s']:.3f} |",
        *([("| range (s) | {:.3f}-{:.3f} | {:.3f}-{:.3f} |").format(*u["iteration_time_range_s"],
                                                                  *payload["iteration_time_range_s"])]
          if u.get("iteration_time_range_s") and payload.get("iteration_time_range_s") else []),
        f"| TFLOP/s/GPU | {u['tflops_per_gpu']:.1f} | {payload['tflops_per_gpu']:.1f} |",
        f"| MFU | {u['mfu'] * 100:.1f}% | {payload['mfu'] * 100:.1f}% |",
        f"| peak memory (GiB) | {u['max_memory_gib']:.1f}"
        f"{'' if u['fits'] else ' (over the headroom)' if u.get('over_headroom') else ' (does not fit)'} | "
        f"{payload['max_memory_gib']:.1f} |",
        f"| rules | {rules} | ok |",
        "",
        f"Speed-up: **{u['speedup']:.2f}x** per iteration.",
    ]
    if "keep_yours" in u:
        lines.append(("**Keep yours**: " if u["keep_yours"] else "**Switch**: ") + u["keep_yours_why"] + ".")
    if u.get("over_headroom"):
        text = _over_headroom_text(u["overflow"])
        lines.append(text[0].upper() + text[1:] + ".")
    elif not u["fits"]:
        o = u["overflow"]
        lines.append(f"Your plan does not fit: stage {o['stage']} ({o['device_type']}) needs {o['memory_gib']:.1f} GiB "
                     f"of {o.get('usable_gib', o['capacity_gib']):.1f} GiB usable.")
    for v in u["violations"]:
        lines.append(f"- rule `{v['rule']}`: {v['message']} ({v['hint']})")
    for n in u["notes"]:
        lines.append(f"- note: {n}")
    return lines


def _md_alternatives(payload: dict, top_k: int) -> list[str]:
    if top_k <= 1:
        return []
    lines = ["", "## Other plans", "", alternatives_title(payload, top_k) + "."]
    rows = alternative_rows(payload)
    if rows:
        lines += ["", "| # | iteration (s) | range (s) | peak memory (GiB) | plan | differs from the pick |",
                  "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def summary_markdown(payload: dict, images: dict[str, str] | None = None, top_k: int = 1) -> str:
    """summary.md of a solve: the plan, the search status, the other plans of --top K, assumed values, your plan
    against ours, and the pictures (`images`: plot name -> path relative to summary.md)."""
    status, why, hint = search_status(payload)
    gap = payload.get("gap")
    lines = [
        f"# Plan: {payload['model']} on {payload['cluster']}",
        "",
        f"- runtime: {payload['runtime']}; backend: {payload['backend']}"
        + (f" ({runtime_line(payload['runtime_choice'])})" if payload.get("runtime_choice") else ""),
        f"- search status: **{status}**, {why}" + (f" ({hint})" if hint else ""),
        *([f"- {parameters_line(payload)}"] if parameters_line(payload) else []),
        f"- degrees: {degrees_line(payload['plan'])}",
        f"- predicted: {headline(payload)}",
        *([f"- {evidence_line(payload)}"] if evidence_line(payload) else []),
        f"- {memory_line(payload)}",
        f"- GPUs used: {payload['world_size']} of {payload['cluster_gpus']}; {payload['num_microbatches']} "
        "micro-batches per iteration",
        f"- search: {payload['search_time_s']:.1f} s, lower bound "
        + (f"{payload['lower_bound_s']:.3f} s" if payload["lower_bound_s"] is not None else "unknown")
        + (f" (gap {gap * 100:.2f}%)" if gap is not None else "")
        + f", {payload['configs_solved']} solved / {payload['configs_bounded']} bounded / "
        + (f"{payload['configs_unsearched']} not searched (time limit) / " if payload.get("configs_unsearched")
           else "")
        + f"{payload['configs_total']} total",
        "",
        "## Stages",
        "",
        *_md_stage_table(payload["stages"]),
        "",
        "Times come from the float cost model (planner/cost), not from the solver's scaled objective.",
    ]
    lines += _md_alternatives(payload, top_k)
    lines += _md_user_plan(payload)
    if payload.get("trials"):
        lines += ["", "## Trials", ""] + [line.strip() for line in trial_lines(payload, ".")]
    lines += _md_assumed(payload)
    if images:
        lines += ["", "## Pictures"] + _md_images(images)
    notes = list(payload.get("notes", [])) + [f"PROBLEM: {p}" for p in payload.get("problems", [])]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def estimate_summary_markdown(payload: dict, images: dict[str, str] | None = None) -> str:
    """summary.md of an estimate (written next to its plots)."""
    lines = [
        f"# Estimate: {payload['model']} on {payload['cluster']}",
        "",
        *([f"- {parameters_line(payload)}"] if parameters_line(payload) else []),
        f"- degrees: {degrees_line(payload['plan'])}",
        f"- predicted: {headline(payload)}",
        *([f"- {evidence_line(payload)}"] if evidence_line(payload) else []),
        f"- {memory_line(payload)}",
        "",
        "## Stages",
        "",
        *_md_stage_table(payload["stages"]),
    ]
    lines += _md_assumed(payload)
    if images:
        lines += ["", "## Pictures"] + _md_images(images)
    if payload.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in payload["notes"]]
    return "\n".join(lines) + "\n"
