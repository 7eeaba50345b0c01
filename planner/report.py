"""Human and machine output: JSON payloads, rich tables on the terminal, summary.md."""

from __future__ import annotations

import sys
from typing import Any

from planner.cost.model import PlanCost
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan


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


def estimate_json(run: MegatronRun, cluster: ClusterSpec, plan: Plan, cost: PlanCost, notes: list[str]) -> dict:
    out = cost.to_json()
    out["model"] = run.model.name
    out["cluster"] = cluster.describe()
    out["plan"] = plan_json(plan)
    out["notes"] = list(cost.notes) + list(notes)
    if not cost.fits:
        worst = max(cost.stages, key=lambda s: s.memory_bytes - s.capacity_bytes)
        out["overflow"] = {
            "stage": worst.index,
            "device_type": worst.device_type,
            "memory_gib": worst.memory_gib,
            "capacity_gib": worst.capacity_bytes / 2**30,
            "short_gib": (worst.memory_bytes - worst.capacity_bytes) / 2**30,
        }
    return out


def _fmt_ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def render_stage_table(payload: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout, width=160)
    t = Table(title=title, title_justify="left")
    for col in ["stage", "device", "layers", "dp", "recompute", "t/mb ms", "compute", "TP", "CP", "EP", "PP",
                "DP/iter", "mem GiB", "weights", "grads", "optim", "activ", "other", "cap GiB"]:
        t.add_column(col, justify="right")
    for s in payload["stages"]:
        mem_style = "" if s["fits"] else "bold red"
        t.add_row(
            str(s["index"]), s["device_type"], str(s["num_layers"]), str(s["dp"]), s["recompute"],
            _fmt_ms(s["time_s"]), _fmt_ms(s["compute_s"]), _fmt_ms(s["tp_comm_s"]), _fmt_ms(s["cp_comm_s"]),
            _fmt_ms(s["ep_comm_s"]), _fmt_ms(s["pp_comm_s"]), _fmt_ms(s["dp_comm_s"]),
            f"[{mem_style}]{s['memory_gib']:.1f}[/]" if mem_style else f"{s['memory_gib']:.1f}",
            f"{s['weights_gib']:.1f}", f"{s['grads_gib']:.1f}", f"{s['optimizer_gib']:.1f}",
            f"{s['activations_gib']:.1f}", f"{s['other_gib']:.1f}", f"{s['capacity_gib']:.0f}",
        )
    console.print(t)
    console.print("times per micro-batch in ms (compute includes recompute); DP/iter is the exposed gradient "
                  "sync per iteration; memory per GPU in GiB")


def headline(payload: dict) -> str:
    fits = "fits" if payload["fits"] else "DOES NOT FIT"
    return (
        f"iteration {payload['iteration_time_s']:.3f} s | {payload['tflops_per_gpu']:.1f} TFLOP/s/GPU | "
        f"MFU {payload['mfu'] * 100:.1f}% | max memory {payload['max_memory_gib']:.1f} GiB ({fits}) | "
        f"{payload['world_size']} GPUs, {payload['num_microbatches']} micro-batches"
    )


def degrees_line(plan: dict) -> str:
    dps = sorted(set(plan["dp"]))
    dp = str(dps[0]) if len(dps) == 1 else "/".join(str(d) for d in plan["dp"])
    return (f"TP={plan['tp']} PP={plan['pp']} CP={plan['cp']} EP={plan['ep']} ETP={plan['etp']} DP={dp} "
            f"VPP={plan['vpp']} mbs={plan['mbs']} gbs={plan['gbs']} runtime={plan['runtime']}")


def render_estimate(payload: dict) -> None:
    print(f"{payload['model']} on {payload['cluster']}: {degrees_line(payload['plan'])}")
    render_stage_table(payload, "per stage")
    print(headline(payload))
    if not payload["fits"]:
        o = payload["overflow"]
        print(f"stage {o['stage']} ({o['device_type']}) needs {o['memory_gib']:.1f} GiB of {o['capacity_gib']:.0f} GiB: "
              f"{o['short_gib']:.1f} GiB short")
    for n in payload.get("notes", []):
        print(f"note: {n}")


def search_json(result, settings) -> dict[str, Any]:
    """The `search` block of `solve --json`: what was searched, what was pruned, what is proven.

    status           OPTIMAL: certified over the whole space; FEASIBLE otherwise.
    whole_space      lower_bound_s valid for the whole space (None when not known).
    pruned_space     what the prunings left: its status (OPTIMAL when its search completed) and
                     optimum_s (the best plan's objective on the tables when it is proven), with a
                     lower bound valid for the pruned space.
    pruning          which prunings were on, and how many configurations each set aside.
    quantisation_s   most the best plan's float cost exceeds its integer-table objective.
    cpsat            the CP-SAT master's statistics (--backend cpsat): variables and constraints
                     per family, status, objective_s, bound_s, wall_s, branches.
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
            "status": "OPTIMAL" if pruned_optimal else "FEASIBLE",
            "optimum_s": best.objective_s if pruned_optimal else None,
            "lower_bound_s": result.pruned_lower_bound_s,
        },
        "pruning": {**result.pruning.to_json(), "on": result.pruning.any,
                    "configs_pruned_memory": result.configs_pruned_memory,
                    "configs_pruned_cp_min_seq": result.configs_pruned_cp},
        "configs": {"total": result.configs_total, "solved": result.configs_solved,
                    "bounded": result.configs_bounded, "infeasible": result.configs_infeasible},
        "quantisation_s": result.quantisation_s,
        "cpsat": result.cpsat,
    }


def solve_json(outcome, settings, runtime: str) -> dict[str, Any]:
    """The `solve --json` object (also plan.json).  Public keys: status, iteration_time_s,
    tflops_per_gpu, mfu, search_time_s, lower_bound_s, gap, world_size, plan (with stages),
    search (search_json), idle_gpus."""
    r = outcome.result
    best, cost = r.best[0], outcome.costs[0]
    it = cost.iteration_time_s
    lower = r.lower_bound_s
    out: dict[str, Any] = {
        "status": r.status,
        "backend": r.backend,
        "runtime": runtime,
        "model": outcome.run.model.name,
        "cluster": outcome.cluster.describe(),
        "iteration_time_s": it,
        "tflops_per_gpu": cost.tflops_per_gpu,
        "mfu": cost.mfu,
        "max_memory_gib": cost.max_memory_gib,
        "fits": cost.fits,
        "world_size": outcome.plans[0].world_size,
        "cluster_gpus": outcome.cluster.world_size,
        "idle_gpus": {i.device_type: {"count": i.count, "why": i.why} for i in outcome.idle},
        "search_time_s": r.search_time_s,
        "lower_bound_s": lower,
        "gap": max(0.0, (it - lower) / it) if lower is not None else None,
        "certified_optimal": r.certified_optimal,
        "configs_total": r.configs_total,
        "configs_solved": r.configs_solved,
        "configs_bounded": r.configs_bounded,
        "configs_infeasible": r.configs_infeasible,
        "configs_pruned_memory": r.configs_pruned_memory,
        "pruning": {"load_balance_delta": settings.delta, "memory": settings.memory_prune,
                    "cp_min_seq_tokens": settings.cp_min_seq_tokens},
        "solver_objective_s": best.objective_s,
        "search": search_json(r, settings),
        "plan": plan_json(outcome.plans[0]),
        "stages": cost.to_json()["stages"],
        "num_microbatches": cost.num_microbatches,
        "problems": outcome.problems[0],
        "notes": list(r.notes) + [f"{i.count} {i.device_type} GPUs stay idle: {i.why}" for i in outcome.idle],
    }
    if len(outcome.plans) > 1:
        out["alternatives"] = [
            {"iteration_time_s": c.iteration_time_s, "tflops_per_gpu": c.tflops_per_gpu, "mfu": c.mfu,
             "plan": plan_json(p)}
            for p, c in zip(outcome.plans[1:], outcome.costs[1:])
        ]
    return out


def render_solve(payload: dict) -> None:
    print(f"{payload['model']} on {payload['cluster']} ({payload['runtime']} runtime, backend {payload['backend']})")
    print("plan: " + degrees_line(payload["plan"]))
    render_stage_table(payload, "per stage")
    print(headline(payload))
    gap = payload.get("gap")
    gap_txt = f", gap {gap * 100:.2f}%" if gap is not None else ""
    lb = payload["lower_bound_s"]
    lb_txt = f"lower bound {lb:.3f} s" if lb is not None else "no whole-space lower bound"
    print(f"search: {payload['status']}{gap_txt}, {lb_txt}, "
          f"{payload['search_time_s']:.1f} s; {payload['configs_solved']} configurations solved, "
          f"{payload['configs_bounded']} bounded out, {payload['configs_infeasible']} infeasible, "
          f"{payload['configs_pruned_memory']} pruned by memory"
          + (" (certified optimal)" if payload["certified_optimal"] else ""))
    sj = payload.get("search", {})
    p = sj.get("pruning", payload["pruning"])
    if sj.get("pruning", {}).get("on"):
        ps = sj["pruned_space"]
        print(f"pruning on (load balance delta={p['load_balance_delta']}, memory={p['memory']}, CP only with >= "
              f"{p['cp_min_seq_tokens']} tokens per rank): the plan is the best of the pruned space "
              f"({ps['status']}); --no-prune searches the whole space and certifies the optimum")
    cs = sj.get("cpsat")
    if cs:
        bound = f"{cs['bound_s']:.3f} s" if cs.get("bound_s") is not None else "none"
        print(f"cp-sat master: {cs['status']} over the {cs['space']} space, bound {bound}, {cs['rows']} rows, "
              f"{cs['master_solves']} master solve(s), {cs['subproblems']} stage subproblem(s), "
              f"{cs['wall_s']:.2f} s in CP-SAT")
    for prob in payload["problems"]:
        print(f"PROBLEM: {prob}")
    for n in payload["notes"]:
        print(f"note: {n}")


def summary_markdown(payload: dict) -> str:
    lines = [
        f"# Plan: {payload['model']} on {payload['cluster']}",
        "",
        f"- runtime: {payload['runtime']}; backend: {payload['backend']}; status: {payload['status']}"
        + (" (certified optimal)" if payload["certified_optimal"] else ""),
        f"- degrees: {degrees_line(payload['plan'])}",
        f"- predicted iteration time: {payload['iteration_time_s']:.3f} s; {payload['tflops_per_gpu']:.1f} "
        f"TFLOP/s/GPU; MFU {payload['mfu'] * 100:.1f}%",
        f"- peak memory: {payload['max_memory_gib']:.1f} GiB per GPU ({'fits' if payload['fits'] else 'DOES NOT FIT'})",
        f"- GPUs used: {payload['world_size']} of {payload['cluster_gpus']}",
        f"- search: {payload['search_time_s']:.1f} s, lower bound "
        + (f"{payload['lower_bound_s']:.3f} s, " if payload["lower_bound_s"] is not None else "unknown, ") +
        f"{payload['configs_solved']} solved / {payload['configs_bounded']} bounded / {payload['configs_total']} total",
        "",
        "| stage | device | layers | DP | recompute | time/micro-batch (ms) | memory (GiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in payload["stages"]:
        lines.append(f"| {s['index']} | {s['device_type']} | {s['num_layers']} | {s['dp']} | {s['recompute']} | "
                     f"{s['time_s'] * 1e3:.1f} | {s['memory_gib']:.1f} |")
    lines += ["", "Times come from the float cost model (planner/cost), not from the solver's scaled objective."]
    for n in payload.get("notes", []):
        lines.append(f"- note: {n}")
    return "\n".join(lines) + "\n"
