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


def cost_json(cost: PlanCost) -> dict[str, Any]:
    return cost.to_json()


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
