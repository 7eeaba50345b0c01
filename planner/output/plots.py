"""Pictures of a plan, each with the data behind it: placement, pipeline timeline, memory per stage.

Three plots, each written as NAME.png plus NAME.json (the numbers drawn, so tests and scripts can
read them without looking at pixels):

* placement: the cluster's nodes by device type, every GPU coloured by the pipeline stage it holds,
  with each stage's layers, TP, CP, DP and EP in the legend; each node captioned with its node rank as
  launch.sh numbers it (HAPMOE_NODE_RANK, the hostfile's order) and its hostfile name.  `placement_vs_yours` puts the plan the
  user's flags describe and the planner's plan in one picture.
* timeline: one iteration of the pipeline schedule (1F1B, or interleaved 1F1B with VPP > 1), simulated
  by planner/simulate.py from the cost model's per-stage forward and backward times.  Each box is one
  micro-batch's forward or backward; its darker end is the communication inside it (TP, CP, EP and
  the pipeline sends, as the cost model charges them); grey is idle time (the bubble on the busiest stage, load
  imbalance on the others; the title's "bubble" is the text's: the busiest stage's idle share); the green bar
  after the pipeline is the exposed DP gradient sync and the optimizer step.
* memory: per-GPU memory of each stage as stacked bars (weights, gradients, optimizer states,
  activations, other) against the device's capacity.

Everything is computed from the public PlanCost / StageCost fields; nothing here prices anything.
Drawing uses the Agg canvas directly, so the global matplotlib backend is left alone.
"""

from __future__ import annotations

import csv
import json
import re
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from planner.cost.model import PlanCost
from planner.errors import PlannerInputError
from planner.inputs.hosts import Host
from planner.launcher.common import node_names, place_agents, stage_rank_ranges
from planner.schemas.cluster import ClusterSpec
from planner.schemas.plan import Plan
from planner.simulate import simulate_pipeline

GIB = float(1 << 30)
MEMORY_PARTS = ("weights", "grads", "optimizer", "activations", "unitemised", "allocator_cache", "other")
_PART_LABELS = {"weights": "weights", "grads": "gradients", "optimizer": "optimizer states",
                "activations": "activations", "unitemised": "allocated, not itemised (workspaces, ...)",
                "allocator_cache": "allocator cache (reserved, not allocated)",
                "other": "other (context, communicator buffers)"}
_PART_COLOURS = {"weights": "#4C72B0", "grads": "#55A868", "optimizer": "#C44E52", "activations": "#DD8452",
                 "unitemised": "#B07AA1", "allocator_cache": "#E5AE38", "other": "#8C8C8C"}
_KIND_COLOURS = {"F": ("#4C72B0", "#8FAADC"), "B": ("#DD8452", "#F2B48A")}  # (even chunk, odd chunk)
_COMM_COLOURS = {"F": "#1F3A66", "B": "#8C4A1C"}  # the communication part of a forward / backward box
_SYNC_COLOUR = "#55A868"
_IDLE_COLOUR = "#E6E6E6"
_UNUSED_COLOUR = "#F2F2F2"
_MAX_TIMELINE_LABELS = 3000
_MAX_CELL_LABELS = 512  # stage numbers in GPU cells: above this many the colours and the legend say it
_MAX_NODE_CAPTIONS = 128  # "node k" captions: above this many nodes they are left out


def _stage_colours(n: int) -> list:
    from matplotlib import colormaps

    base = list(colormaps["tab20"].colors) + list(colormaps["tab20b"].colors)
    # tab20 pairs a strong and a light shade: take the strong ones first so neighbours differ
    order = base[0:20:2] + base[1:20:2] + base[20:]
    return [order[i % len(order)] for i in range(n)]


def _new_figure(width_in: float, height_in: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100)
    FigureCanvasAgg(fig)
    return fig


# ------------------------------------------------------------------------------------------------
# Placement


def placement_data(plan: Plan, cluster: ClusterSpec, *, rank_order: bool = False,
                   hosts: Sequence[Host] | None = None) -> dict[str, Any]:
    """Which stage every GPU of the cluster holds, and each node's number as the job numbers it.

    rank_order=False: the planner's launcher (planner/launcher: place_agents, with the --hosts file's nodes as
    `hosts`): each stage takes the next free GPUs of its own device type; a node's `node_ranks` are the node
    ranks launch.sh gives its torchrun agents (HAPMOE_NODE_RANK, the hostfile's order) and `host` its hostfile
    name; the nodes are listed in that order, unused ones last.  rank_order=True: Megatron's default rank order
    on the nodes as the cluster lists them (rank r on the r-th GPU, node k the k-th node), which is how a user's
    own script runs; a stage may then straddle two device types (`mixed_types` in its entry).  `node` stays each
    node's number within its device type.
    """
    nodes: list[dict[str, Any]] = []
    for g in cluster.groups:
        k = sum(1 for n in nodes if n["device_type"] == g.device_type)
        for j in range(g.num_nodes):
            nodes.append({"device_type": g.device_type, "node": k + j, "gpus": [None] * g.gpus_per_node,
                          "host": None, "node_ranks": []})
    stage_gpus = [plan.tp * plan.cp * s.dp for s in plan.stages]
    if rank_order:
        numbering = "rank order"
        _fill_in_rank_order(nodes, stage_gpus)
        for k, n in enumerate(nodes):
            n["node_ranks"] = [k] if any(x is not None for x in n["gpus"]) else []
    else:
        numbering = "launcher" if _fill_as_launched(nodes, plan, cluster, hosts) else "per type"
        if numbering == "per type":  # the launcher cannot place it (a type short of nodes): each type in order
            _fill_by_type(nodes, plan, stage_gpus)
        last = len(nodes)  # (the list reads as empty while it sorts)
        nodes.sort(key=lambda n: min(n["node_ranks"], default=last))  # stable: unused ones keep their order
    placed = [0] * plan.pp
    types_of: list[set[str]] = [set() for _ in plan.stages]
    for n in nodes:
        for owner in n["gpus"]:
            if owner is not None:
                placed[owner] += 1
                types_of[owner].add(n["device_type"])
    stages = []
    for s, ((start, end), st) in enumerate(zip(plan.layer_ranges(), plan.stages)):
        stages.append({
            "index": s, "device_type": st.device_type, "first_layer": start, "last_layer": end - 1,
            "num_layers": st.num_layers, "tp": plan.tp, "cp": plan.cp, "dp": st.dp, "ep": plan.ep, "etp": plan.etp,
            "recompute": st.recompute.label, "gpus": stage_gpus[s], "gpus_placed": placed[s],
            "mixed_types": sorted(types_of[s]) if len(types_of[s]) > 1 else [],
        })
    return {
        "order": "rank" if rank_order else "launcher",
        "node_numbering": numbering,
        "vpp": plan.vpp,
        "nodes": nodes,
        "stages": stages,
        "unused_gpus": sum(1 for n in nodes for x in n["gpus"] if x is None),
    }


def _fill_in_rank_order(nodes: list[dict[str, Any]], stage_gpus: list[int]) -> None:
    slots = [(n, i) for n in nodes for i in range(len(n["gpus"]))]
    pos = 0
    for s, count in enumerate(stage_gpus):
        for n, i in slots[pos:pos + count]:
            n["gpus"][i] = s
        pos += count


def _fill_by_type(nodes: list[dict[str, Any]], plan: Plan, stage_gpus: list[int]) -> None:
    free: dict[str, list[tuple[dict, int]]] = {}
    for n in nodes:
        free.setdefault(n["device_type"], []).extend((n, i) for i in range(len(n["gpus"])))
    for s, (stage, count) in enumerate(zip(plan.stages, stage_gpus)):
        queue = free.get(stage.device_type, [])
        for n, i in queue[:count]:
            n["gpus"][i] = s
        del queue[:count]


def _fill_as_launched(nodes: list[dict[str, Any]], plan: Plan, cluster: ClusterSpec,
                      hosts: Sequence[Host] | None) -> bool:
    """Name the nodes and place the stages' ranks on their GPUs as launch.sh does (place_agents); False, with the
    nodes untouched, where the launcher would refuse the plan on this cluster."""
    try:
        agents = place_agents(plan, cluster, hosts)
    except PlannerInputError:
        return False
    names = node_names(cluster, hosts)
    by_host: dict[str, dict[str, Any]] = {}
    for n in nodes:
        listed = names.get(n["device_type"], [])
        if n["node"] < len(listed):
            by_host[listed[n["node"]]] = n
    if any(a.host not in by_host for a in agents):
        return False
    ranges = stage_rank_ranges(plan)
    for n in nodes:
        n["host"] = next((h for h, m in by_host.items() if m is n), None)
    for a in agents:
        n = by_host[a.host]
        n["node_ranks"].append(a.node_rank)
        for j, gpu in enumerate(a.gpu_ids):
            rank = a.first_rank + j
            n["gpus"][gpu] = next(i for i, (lo, hi) in enumerate(ranges) if lo <= rank < hi)
    return True


def node_caption(n: dict[str, Any]) -> str:
    """A node's caption in the placement picture: its number as launch.sh and the hostfile give it, and its host
    name ("node 2 (h800-node0)"; an unused node: "h800-node3, unused"); without the launcher's numbering, its
    number within its device type."""
    ranks = n.get("node_ranks") or []
    number = "node " + "+".join(str(r) for r in ranks) if ranks else ""
    host = n.get("host")
    if host:
        return f"{number} ({host})" if number else f"{host}, unused"
    return number or f"node {n['node']}"


def _stage_caption(s: dict[str, Any], vpp: int) -> str:
    layers = (f"layers {s['first_layer']}-{s['last_layer']}" if s["num_layers"] and vpp == 1
              else f"{s['num_layers']} layers" + (f" in {vpp} chunks" if vpp > 1 else ""))
    where = (f"{'+'.join(s['mixed_types'])}, priced as {s['device_type']}" if s["mixed_types"]
             else s["device_type"])
    return (f"S{s['index']} {where}: {layers}, TP{s['tp']} CP{s['cp']} DP{s['dp']} "
            f"EP{s['ep']}" + (f" ETP{s['etp']}" if s["etp"] != 1 else ""))


_LABEL_IN = 1.7  # inches left of the nodes for the device-type label
_ROW_CELLS = 1.9  # a row of nodes: 1 cell of GPUs, its "node k" caption and a gap


def _placement_layout(data: dict[str, Any], min_group_cells: float = 0.0) -> dict[str, Any]:
    """Nodes per row, rows per device type and the size in GPU cells of one placement panel; each
    device type's block is at least `min_group_cells` tall (room for its two-line label)."""
    nodes = data["nodes"]
    gpn = max(len(n["gpus"]) for n in nodes)
    count: dict[str, int] = {}
    for n in nodes:
        count[n["device_type"]] = count.get(n["device_type"], 0) + 1
    limit = max(1, 64 // gpn) if len(nodes) <= 32 else max(1, 100 // (gpn + 1))
    per_row = max(1, min(limit, max(count.values())))
    rows = {t: (c + per_row - 1) // per_row for t, c in count.items()}
    group_h = {t: max(r * _ROW_CELLS, min_group_cells) for t, r in rows.items()}
    width = per_row * (gpn + 1.0)
    height = sum(group_h.values()) + 0.6 * len(rows)
    n_leg = len(data["stages"]) + (1 if data["unused_gpus"] else 0)
    ncol = 1 if n_leg <= 4 else 2 if n_leg <= 16 else 3
    return {"gpn": gpn, "per_row": per_row, "rows": rows, "group_h": group_h, "width": width, "height": height,
            "legend_rows": (n_leg + ncol - 1) // ncol, "legend_cols": ncol}


def _draw_placement_panel(ax, data: dict[str, Any], lay: dict[str, Any], label_w: float, cell_px: float,
                          title: str, colours: list) -> None:
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Patch, Rectangle

    nodes = data["nodes"]
    gpn, per_row = lay["gpn"], lay["per_row"]
    cell_rects, cell_cols, frames, texts = [], [], [], []
    by_type: dict[str, list[dict]] = {}
    for n in nodes:
        by_type.setdefault(n["device_type"], []).append(n)
    y = 0.0
    for dtype, group in by_type.items():
        ax.text(0.0, -(y + lay["group_h"][dtype] / 2) + 0.3, f"{dtype}\n{len(group)} node{'s' if len(group) > 1 else ''}"
                f" x {len(group[0]['gpus'])} GPUs", ha="left", va="center", fontsize=9, fontweight="bold")
        for k, n in enumerate(group):
            r, c = divmod(k, per_row)
            x0 = label_w + c * (gpn + 1.0)
            y0 = -(y + r * _ROW_CELLS) - 1.0
            frames.append(Rectangle((x0 - 0.12, y0 - 0.12), len(n["gpus"]) + 0.24, 1.24))
            for i, owner in enumerate(n["gpus"]):
                cell_rects.append(Rectangle((x0 + i + 0.06, y0 + 0.06), 0.88, 0.88))
                cell_cols.append(colours[owner] if owner is not None else _UNUSED_COLOUR)
                if owner is not None:
                    texts.append((x0 + i + 0.5, y0 + 0.5, str(owner)))
            if cell_px >= 14 and len(nodes) <= _MAX_NODE_CAPTIONS:  # room for the caption between rows
                ax.text(x0 + len(n["gpus"]) / 2, y0 + 1.2, node_caption(n), ha="center", va="bottom",
                        fontsize=6, color="#555555")
        y += lay["group_h"][dtype] + 0.6
    ax.add_collection(PatchCollection(frames, facecolor="white", edgecolor="#999999", linewidth=0.8))
    ax.add_collection(PatchCollection(cell_rects, facecolor=cell_cols, edgecolor="none"))
    ax.set_xlim(0, label_w + lay["width"])
    ax.set_ylim(-y, 0.4)
    ax.axis("off")
    if cell_px >= 11 and len(texts) <= _MAX_CELL_LABELS:  # stage numbers inside cells large enough to hold them
        for x, yy, t in texts:
            ax.text(x, yy, t, ha="center", va="center", fontsize=min(8.0, cell_px * 0.4), color="white")
    ax.set_title(_panel_title(title, data), fontsize=10, loc="left")
    handles = [Patch(color=colours[s["index"]], label=_stage_caption(s, data["vpp"])) for s in data["stages"]]
    if data["unused_gpus"]:
        handles.append(Patch(facecolor=_UNUSED_COLOUR, edgecolor="#999999", label=f"unused ({data['unused_gpus']} GPUs)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.01), ncol=lay["legend_cols"], fontsize=8,
              frameon=False, borderaxespad=0.0)


_NUMBERING_NOTES = {
    "launcher": "node k: launch.sh's node rank (HAPMOE_NODE_RANK; the hostfile's order), its host in brackets",
    "rank order": "node k: the k-th node as the cluster lists them (Megatron's default rank order)",
}


def _panel_title(title: str, data: dict[str, Any]) -> str:
    """The panel's title, and under it what the node numbers are (where the picture numbers nodes as a job does)."""
    note = _NUMBERING_NOTES.get(data.get("node_numbering", ""))
    return f"{title}\n{note}" if note else title


def draw_placement(panels: list[tuple[str, dict[str, Any]]], path: Path) -> Path:
    """One panel per (title, placement_data), stacked vertically; returns `path`."""
    cells_w = max(_placement_layout(d)["width"] for _, d in panels)
    cell_in = min(0.3, (14.0 - _LABEL_IN - 0.2) / cells_w)
    lays = [_placement_layout(d, min_group_cells=0.5 / cell_in) for _, d in panels]
    width_in = cells_w * cell_in + _LABEL_IN + 0.2
    label_w = _LABEL_IN / cell_in
    title_ins = [0.45 + 0.17 * _panel_title(title, d).count("\n") for title, d in panels]
    legend_row_in = 0.19
    heights = [t_in + lay["height"] * cell_in + lay["legend_rows"] * legend_row_in + 0.25
               for t_in, lay in zip(title_ins, lays)]
    total_in = sum(heights)
    fig = _new_figure(width_in, total_in)
    colours = _stage_colours(max(len(d["stages"]) for _, d in panels))
    top_in = total_in
    for (title, data), lay, h, title_in in zip(panels, lays, heights, title_ins):
        body_in = lay["height"] * cell_in
        bottom_in = top_in - title_in - body_in
        ax = fig.add_axes((0.1 / width_in, bottom_in / total_in, (label_w + lay["width"]) * cell_in / width_in,
                           body_in / total_in))
        _draw_placement_panel(ax, data, lay, label_w, cell_in * fig.dpi, title, colours)
        top_in -= h
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", bbox_inches="tight", pad_inches=0.15)
    return path


# ------------------------------------------------------------------------------------------------
# Timeline


TIMELINE_MAX_MICROBATCHES = 1024
"""Micro-batches the timeline simulates at most: an iteration of more (GBS 2^24 gives millions, whose events
would take minutes and gigabytes to simulate and write) is shown by its first ones, a multiple of PP."""


def timeline_data(plan: Plan, cost: PlanCost) -> dict[str, Any]:
    """One simulated iteration: per-stage busy, communication, idle and sync seconds, and every
    forward/backward event.  Stage times are the cost model's (pipeline sends included, as the cost
    model charges them), so the simulated pipeline matches PlanCost.pipeline_s up to the formula's
    approximation for non-uniform stages.  Beyond TIMELINE_MAX_MICROBATCHES only the first ones are
    simulated (`simulated_microbatches`; the simulated times are theirs, the model's the iteration's)."""

    schedule = "interleaved" if plan.vpp > 1 else "1f1b"
    m = cost.num_microbatches
    shown = m if m <= TIMELINE_MAX_MICROBATCHES else max(plan.pp, TIMELINE_MAX_MICROBATCHES // plan.pp * plan.pp)
    sim = simulate_pipeline([s.forward_s for s in cost.stages], [s.backward_s for s in cost.stages],
                            shown, schedule=schedule, vpp=plan.vpp)
    makespan = sim.iteration_time_s
    stages = []
    for st, busy in zip(cost.stages, sim.busy_s):
        comm_share = max(0.0, st.time_s - st.compute_s) / st.time_s if st.time_s > 0 else 0.0
        sync = st.sync_s
        stages.append({
            "index": st.index, "device_type": st.device_type, "forward_s": st.forward_s,
            "backward_s": st.backward_s, "comm_share": comm_share, "busy_s": busy, "compute_s": busy * (1 - comm_share),
            "comm_s": busy * comm_share, "bubble_s": makespan - busy,
            "bubble_fraction": (makespan - busy) / makespan if makespan > 0 else 0.0, "sync_s": sync,
        })
    return {
        "schedule": schedule, "num_stages": plan.pp, "num_microbatches": m, "simulated_microbatches": shown,
        "vpp": plan.vpp,
        "simulated_pipeline_s": makespan, "model_pipeline_s": cost.pipeline_s, "sync_s": cost.sync_s,
        "iteration_time_s": cost.iteration_time_s,
        # one bubble, the text's: the busiest stage's idle share of the pipeline (PlanCost.bubble_s / pipeline_s)
        "bubble_fraction": cost.bubble_s / cost.pipeline_s if cost.pipeline_s > 0 else 0.0,
        # every rank's idle time together (bubble plus the other stages' load imbalance), simulated
        "mean_bubble_fraction": sim.mean_bubble_fraction, "idle_fraction_all_ranks": sim.mean_bubble_fraction,
        "stages": stages,
        "event_fields": ["stage", "kind", "microbatch", "chunk", "start_s", "end_s"],
        "events": [[e.stage, e.kind, e.microbatch, e.chunk, e.start_s, e.end_s] for e in sim.events],
    }


_TIMELINE_AXES_PX = 14.0 * 100 * 0.82  # drawing width of the timeline axes, in pixels


def _timeline_zoom_end_s(data: dict[str, Any]) -> float:
    """End of the zoomed view: the last stage's backward of micro-batch 2*PP (warm-up and a few
    steady-state micro-batches on every stage)."""
    n, m = data["num_stages"], data["simulated_microbatches"]
    k = min(m - 1, 2 * n)
    ends = [e[5] for e in data["events"] if e[0] == n - 1 and e[1] == "B" and e[2] == k]
    return max(ends) if ends else data["simulated_pipeline_s"]


def _draw_timeline_axes(ax, data: dict[str, Any], x_end_s: float, *, full: bool) -> None:
    """Stage rows from 0 to x_end_s: idle background, boxes, their communication ends, sync, labels."""
    n = data["num_stages"]
    makespan = data["simulated_pipeline_s"]
    bar_h = 0.76
    for s in data["stages"]:
        ax.broken_barh([(0.0, makespan)], (s["index"] - bar_h / 2, bar_h), facecolors=_IDLE_COLOUR)
        if s["sync_s"] > 0:
            ax.broken_barh([(makespan, s["sync_s"])], (s["index"] - bar_h / 2, bar_h), facecolors=_SYNC_COLOUR)
    share = [s["comm_share"] for s in data["stages"]]
    shown = [e for e in data["events"] if e[4] < x_end_s]
    boxes: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
    comm: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for stage, kind, _mb, chunk, start, end in shown:
        boxes.setdefault((stage, kind, chunk % 2), []).append((start, end - start))
        c = (end - start) * share[stage]
        if c > 0:
            comm.setdefault((stage, kind), []).append((end - c, c))
    px_per_s = _TIMELINE_AXES_PX / x_end_s if x_end_s > 0 else 0.0
    narrowest_px = min(((e[5] - e[4]) * px_per_s for e in shown), default=0.0)
    sparse = narrowest_px >= 5  # white separators and anti-aliasing only where boxes are wide enough
    for (stage, kind, shade), bxs in boxes.items():
        ax.broken_barh(bxs, (stage - bar_h / 2, bar_h), facecolors=_KIND_COLOURS[kind][shade],
                       edgecolors="white", linewidth=0.4 if sparse else 0.0, antialiased=sparse)
    for (stage, kind), bxs in comm.items():
        ax.broken_barh(bxs, (stage - bar_h / 2 + 0.06, bar_h - 0.12), facecolors=_COMM_COLOURS[kind],
                       edgecolors="none", linewidth=0, antialiased=sparse)
    if len(shown) <= _MAX_TIMELINE_LABELS:  # micro-batch numbers in boxes wide enough to hold them
        for stage, _kind, mb, _chunk, start, end in shown:
            text = str(mb)
            if (min(end, x_end_s) - start) * px_per_s >= 6.5 * len(text) + 4:
                ax.text((start + min(end, x_end_s)) / 2, stage, text, ha="center", va="center", fontsize=7,
                        color="white", clip_on=True)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"S{s['index']} {s['device_type']}" for s in data["stages"]], fontsize=9 if n <= 16 else 7)
    ax.set_xlim(0, x_end_s * (1.005 if full else 1.0))


def draw_timeline(data: dict[str, Any], path: Path, title: str = "") -> Path:
    """Gantt chart of one iteration: forward/backward boxes with their communication darker, idle
    time grey, DP sync + optimizer green.  When the whole iteration is too dense to read single
    micro-batches, a second panel zooms into its start (warm-up and early steady state).  Returns
    `path`."""
    from matplotlib.patches import Patch, Rectangle

    n = data["num_stages"]
    makespan = data["simulated_pipeline_s"]
    end_s = makespan + max((s["sync_s"] for s in data["stages"]), default=0.0)
    if end_s <= 0:
        end_s = 1.0
    events_px = [(e[5] - e[4]) / end_s * _TIMELINE_AXES_PX for e in data["events"]]
    zoom_s = _timeline_zoom_end_s(data)
    zoom = bool(events_px) and sorted(events_px)[len(events_px) // 2] < 12 and zoom_s < 0.6 * makespan
    row_in = max(0.28, min(0.5, 6.0 / n))
    panel_in = max(1.4, row_in * n + 0.3)
    gap_in, top_in, bottom_in = 0.85, 0.75, 0.6  # between panels (x label), title, last x label
    height_in = (2 * panel_in + gap_in if zoom else panel_in) + top_in + bottom_in
    fig = _new_figure(14.0, height_in)
    axes = fig.subplots(2, 1) if zoom else [fig.add_subplot(1, 1, 1)]
    fig.subplots_adjust(left=1.3 / 14.0, right=1 - 0.1 / 14.0, top=1 - top_in / height_in, bottom=bottom_in / height_in,
                        hspace=gap_in / panel_in)
    _draw_timeline_axes(axes[0], data, end_s, full=True)
    axes[0].set_xlabel("time in one iteration (s)")
    if zoom:
        _draw_timeline_axes(axes[1], data, zoom_s, full=False)
        axes[1].set_xlabel("time (s): the start of the iteration (dashed box above), zoomed")
        axes[0].add_patch(Rectangle((0, -0.5), zoom_s, n, fill=False, edgecolor="black", linewidth=1.0,
                                    linestyle="--"))
    sched = "interleaved 1F1B" if data["schedule"] == "interleaved" else "1F1B"
    shown, m = data["simulated_microbatches"], data["num_microbatches"]
    default = (f"{sched}, PP={n}, {shown if shown == m else f'the first {shown} of {m}'} micro-batches"
               + (f", VPP={data['vpp']}" if data["vpp"] > 1 else "")
               + f": pipeline {makespan:.3g} s simulated ({data['model_pipeline_s']:.3g} s cost model), "
               f"bubble {data.get('bubble_fraction', data['mean_bubble_fraction']):.1%} (busiest stage), all ranks "
               f"idle {data['mean_bubble_fraction']:.1%}, + sync {data['sync_s']:.3g} s")
    axes[0].set_title(title + ("\n" if title else "") + default, fontsize=10, loc="left")
    handles = [Patch(color=_KIND_COLOURS["F"][0], label="forward"), Patch(color=_KIND_COLOURS["B"][0], label="backward")]
    if data["vpp"] > 1:
        handles += [Patch(color=_KIND_COLOURS["F"][1], label="forward, odd chunk"),
                    Patch(color=_KIND_COLOURS["B"][1], label="backward, odd chunk")]
    handles += [Patch(color=_COMM_COLOURS["F"], label="forward: communication"),
                Patch(color=_COMM_COLOURS["B"], label="backward: communication (TP/CP/EP/PP)"),
                Patch(color=_IDLE_COLOUR, label="idle (bubble, imbalance)"),
                Patch(color=_SYNC_COLOUR, label="DP sync + optimizer")]
    last = axes[-1]
    axes_h_in = last.get_position().height * fig.get_figheight()
    last.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.5 / axes_h_in),
                ncol=len(handles) if len(handles) <= 6 else 4, fontsize=8, frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", bbox_inches="tight", pad_inches=0.15)
    return path


# ------------------------------------------------------------------------------------------------
# Memory


def memory_data(cost: PlanCost) -> dict[str, Any]:
    """Per-GPU memory of every stage, by part, the device's capacity and what the plan may use of it (the
    capacity less the memory headroom), in GiB."""
    stages = []
    for st in cost.stages:
        parts = {"weights": st.weights_bytes, "grads": st.grads_bytes, "optimizer": st.optimizer_bytes,
                 "activations": st.activations_bytes, "unitemised": st.unitemised_bytes,
                 "allocator_cache": st.reserved_bytes - st.allocated_bytes,
                 "other": st.other_bytes}
        stages.append({"index": st.index, "device_type": st.device_type,
                       **{f"{k}_gib": v / GIB for k, v in parts.items()},
                       "total_gib": st.memory_bytes / GIB, "capacity_gib": st.device_memory_bytes / GIB,
                       "usable_gib": st.capacity_bytes / GIB, "fits": st.fits, "fits_device": st.fits_device,
                       "near_capacity": st.near_capacity})
    return {"parts": list(MEMORY_PARTS), "stages": stages}


_MEMORY_LABEL_PT = 7.0  # the labels' font size
_MEMORY_PAD = 0.01  # the gap between a label and a bar or line, a fraction of the axis' top value


def memory_label_bottom(total: float, lines: Sequence[float], label_h: float, pad: float) -> float:
    """Where a stage's label of height `label_h` (GiB on the axis) starts: just above the bar (`total`), or, where
    it would cross one of the `lines` drawn over the bar (usable, capacity), just above that line, and so on until
    no line passes through it (each line it crosses lifts it above)."""
    y = total + pad
    for _ in range(len(lines) + 1):
        crossed = [c for c in lines if y - pad <= c <= y + label_h + pad]
        if not crossed:
            return y
        y = max(crossed) + pad
    return y


def draw_memory(data: dict[str, Any], path: Path, title: str = "") -> Path:
    """Stacked bars per stage against the device's capacity; returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _memory_figure(data, title).savefig(path, format="png")
    return path


def _memory_figure(data: dict[str, Any], title: str = ""):
    """The memory figure, laid out (labels placed clear of the capacity and usable lines)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    stages = data["stages"]
    n = len(stages)
    fig = _new_figure(max(7.0, min(18.0, 3.0 + 1.0 * n)), 5.2)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(n))
    bottom = [0.0] * n
    for part in MEMORY_PARTS:
        vals = [s[f"{part}_gib"] for s in stages]
        ax.bar(xs, vals, 0.6, bottom=bottom, color=_PART_COLOURS[part], label=_PART_LABELS[part])
        bottom = [b + v for b, v in zip(bottom, vals)]
    top = max(max(s["total_gib"], s["capacity_gib"]) for s in stages) if stages else 1.0
    for x, s in zip(xs, stages):
        ax.hlines(s["capacity_gib"], x - 0.42, x + 0.42, colors="black", linewidth=2.0)
        ax.hlines(s.get("usable_gib", s["capacity_gib"]), x - 0.42, x + 0.42, colors="black", linewidth=1.0,
                  linestyles="dashed")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"S{s['index']}\n{s['device_type']}" for s in stages], fontsize=8 if n <= 16 else 6)
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_ylim(0, top * 1.18)
    ax.set_xlim(-0.6, n - 0.4)
    fits = all(s["fits"] for s in stages)
    verdict = ("fits" if fits else "over the headroom, within the device (red)"
               if all(s.get("fits_device", False) for s in stages) else "DOES NOT FIT (red)")
    ax.set_title((title + "\n" if title else "") + f"memory per GPU by stage: {verdict}", fontsize=10, loc="left")
    handles = [Patch(color=_PART_COLOURS[p], label=_PART_LABELS[p]) for p in MEMORY_PARTS]
    handles.append(Line2D([0], [0], color="black", linewidth=2.0, label="device capacity"))
    handles.append(Line2D([0], [0], color="black", linewidth=1.0, linestyle="dashed",
                          label="usable (capacity less headroom); red label: 97-100% of it"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="y", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    fig.tight_layout()
    _memory_labels(ax, stages, top)
    return fig


def _memory_labels(ax, stages: list[dict[str, Any]], top: float) -> None:
    """Each stage's total and share of its usable memory over its bar, clear of its capacity and usable lines
    (memory_label_bottom), red at 97-100% of usable or over it; placed after the layout, whose axis height
    turns the labels' height in points into GiB."""
    n = len(stages)
    lines_n = 2 if n <= 14 else 1
    axis_px = ax.get_window_extent().height
    gib_per_px = (ax.get_ylim()[1] - ax.get_ylim()[0]) / axis_px if axis_px > 0 else 0.0
    label_h = lines_n * _MEMORY_LABEL_PT * 1.25 * ax.figure.dpi / 72.0 * gib_per_px
    for x, s in enumerate(stages):
        cap, total = s.get("usable_gib", s["capacity_gib"]), s["total_gib"]
        colour = "black" if s["fits"] and not s.get("near_capacity") else "#C00000"
        pct = total / cap * 100 if cap else 0.0
        label = f"{total:.1f} GiB\n{pct:.0f}% of {cap:.1f}" if lines_n == 2 else f"{pct:.0f}%"
        y = memory_label_bottom(total, (cap, s["capacity_gib"]), label_h, _MEMORY_PAD * top)
        ax.text(x, y, label, ha="center", va="bottom", fontsize=_MEMORY_LABEL_PT, color=colour,
                fontweight="normal" if s["fits"] else "bold")


# ------------------------------------------------------------------------------------------------
# All plots of a plan


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=None if len(data.get("events", ())) > 2000 else 1))


FIGURE_S = 0.6  # drawing and saving one figure on a 2-core machine (measured: ~0.5 s; 3,072 GPUs: ~0.5 s each)
MATPLOTLIB_IMPORT_S = 1.0  # importing matplotlib the first time


def _drawing_cost_s(gpus: int) -> float:
    """What the next figure is expected to take: one figure (longer for thousands of GPU cells), plus
    matplotlib's import if it has not happened yet."""
    import sys

    return FIGURE_S * (1.0 + gpus / 8192) + (0.0 if "matplotlib.figure" in sys.modules else MATPLOTLIB_IMPORT_S)


class _Drawing:
    """Draws a figure only while the time limit leaves room for it (`time_left`: seconds left, or None
    for no limit); a figure left out is named in the notes, its data JSON is written regardless.  The
    expected cost is the larger of the estimate and what the last figure took (a loaded machine)."""

    def __init__(self, time_left: Callable[[], float] | None, gpus: int, notes: list[str]):
        self.time_left, self.gpus, self.notes = time_left, gpus, notes
        self.last_s = 0.0
        self._started: float | None = None

    def allowed(self, name: str) -> bool:
        now = time.perf_counter()
        if self._started is not None:
            self.last_s = now - self._started
        self._started = now
        if self.time_left is None:
            return True
        need, left = max(_drawing_cost_s(self.gpus), self.last_s), self.time_left()
        if left >= need:
            return True
        self._started = None
        self.notes.append(f"{name}.png not drawn: --time-limit left {max(left, 0.0):.1f} s and drawing takes about "
                          f"{need:.1f} s (its data is in {name}.json); raise --time-limit for the picture")
        return False


def write_plots(out_dir: Path, plan: Plan, cost: PlanCost, cluster: ClusterSpec, *, title: str,
                user: tuple[Plan, PlanCost, str] | None = None, rank_order: bool = False,
                time_left: Callable[[], float] | None = None,
                hosts: Sequence[Host] | None = None) -> tuple[dict[str, str], list[str]]:
    """write_plots_unguarded, with matplotlib's warnings about glyphs its font lacks (a model named in CJK) kept
    off stderr (--quiet means quiet) and said once as a note."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", message=r"Glyph \d+ .*missing from", category=UserWarning)
        images, notes = write_plots_unguarded(out_dir, plan, cost, cluster, title=title, user=user,
                                              rank_order=rank_order, time_left=time_left, hosts=hosts)
    glyphs = [w for w in caught if GLYPH_WARNING.search(str(w.message))]
    for w in caught:
        if w not in glyphs:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if glyphs:
        notes.append("the plots' font has no glyph for some characters of the title (the model's name): they are "
                     "drawn as boxes")
    return images, notes


GLYPH_WARNING = re.compile(r"Glyph \d+ .*missing from")
"""matplotlib's warning for a character its font cannot draw."""


def write_plots_unguarded(out_dir: Path, plan: Plan, cost: PlanCost, cluster: ClusterSpec, *, title: str,
                          user: tuple[Plan, PlanCost, str] | None = None, rank_order: bool = False,
                          time_left: Callable[[], float] | None = None,
                          hosts: Sequence[Host] | None = None) -> tuple[dict[str, str], list[str]]:
    """Write placement, timeline and memory (PNG + JSON; the timeline's events also as CSV) into
    `out_dir`; with `user` = (plan, cost, label) also placement_vs_yours.  `rank_order`: place the
    plan as Megatron's default rank order would (see placement_data).  `time_left`: seconds the time
    limit leaves; a PNG that would not fit in them is left out (see _Drawing).  `hosts`: the --hosts file's
    nodes, named in the placement as the launcher names them.  Returns ({plot name: PNG
    file name}, notes on plots that could not be drawn)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    images: dict[str, str] = {}
    notes: list[str] = []
    drawing = _Drawing(time_left, cluster.world_size, notes)

    place = placement_data(plan, cluster, rank_order=rank_order, hosts=hosts)
    _write_json(out_dir / "placement.json", place)
    if drawing.allowed("placement"):
        draw_placement([(f"{title}: placement", place)], out_dir / "placement.png")
        images["placement"] = "placement.png"

    try:
        tl = timeline_data(plan, cost)
    except ValueError as exc:  # e.g. interleaving with a micro-batch count Megatron refuses
        notes.append(f"no timeline: {exc}")
    else:
        if tl["simulated_microbatches"] < tl["num_microbatches"]:
            shown, m = tl["simulated_microbatches"], tl["num_microbatches"]
            notes.append(f"timeline: the first {shown} of {m} micro-batches simulated and drawn (the rest repeat the "
                         "steady state); the iteration time is the cost model's")
        _write_json(out_dir / "timeline.json", tl)
        with open(out_dir / "timeline.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(tl["event_fields"])
            w.writerows(tl["events"])
        if drawing.allowed("timeline"):
            draw_timeline(tl, out_dir / "timeline.png", title=title)
            images["timeline"] = "timeline.png"

    mem = memory_data(cost)
    _write_json(out_dir / "memory.json", mem)
    if drawing.allowed("memory"):
        draw_memory(mem, out_dir / "memory.png", title=title)
        images["memory"] = "memory.png"

    if user is not None:
        _write_yours(out_dir, user, place, cost, cluster, drawing, images)
    return images, notes


def _write_yours(out_dir: Path, user: tuple[Plan, PlanCost, str], place: dict[str, Any], cost: PlanCost,
                 cluster: ClusterSpec, drawing: _Drawing, images: dict[str, str]) -> None:
    u_plan, u_cost, u_label = user
    u_place = placement_data(u_plan, cluster, rank_order=True)
    both = {"yours": u_place, "planner": place}
    _write_json(out_dir / "placement_vs_yours.json", both)
    if not drawing.allowed("placement_vs_yours"):
        return
    speed = u_cost.iteration_time_s / cost.iteration_time_s if cost.iteration_time_s > 0 else float("nan")
    fit = "" if u_cost.fits else ", over the headroom" if u_cost.fits_device else ", DOES NOT FIT"
    draw_placement([
        (f"your plan ({u_label}): {u_cost.iteration_time_s:.3f} s per iteration{fit}", u_place),
        (f"planner's plan: {cost.iteration_time_s:.3f} s per iteration, {speed:.2f}x the speed of yours", place),
    ], out_dir / "placement_vs_yours.png")
    images["placement_vs_yours"] = "placement_vs_yours.png"
