"""The evaluation suite behind `cli.py bench` (paper section 5; DESIGN section 7).

Scenarios like the paper's: dense LLaMA-2 7B/13B on 2x8 A100 + 2x8 910B; Mixtral-S and Mixtral-L on
homogeneous H800, MI300X and 910B clusters (16 each), on each mix of two and on all three; and Mixtral-S
and Mixtral-L on mixed clusters one public runtime runs as one job (A100 + H800 and H800 + H20 on upstream
Megatron-LM, H800 + MI300X on FlagScale).  Every planner of planner.baselines runs on every scenario under
the same cost model; the global batch size scales with the cluster (GBS_PER_GPU x GPUs), sequence length
4096, micro-batch searched.

Two comparisons (SECTIONS), each over its own scenarios:
* runnable: the scenarios whose whole cluster one public runtime runs as one job (profiles/runtimes.yaml),
  every planner planning for that runtime;
* paper_assumption: the paper's scenarios.  No public runtime runs the Ascend 910B in one job with NVIDIA
  or AMD GPUs, so where no runtime runs the whole cluster every planner plans for runtimes.yaml's
  HYPOTHETICAL all-vendor runtime (PAPER_RUNTIME: FlagScale's meshes over NVIDIA + AMD + Huawei, priced by
  the same cost model and cross-vendor links as FlagScale's NVIDIA + AMD jobs); its plans get no launcher.

Metrics (all predicted by the cost model):
* throughput_tflops_per_gpu: model FLOPs per iteration / (iteration time x the cluster's GPUs), so a
  plan that leaves GPUs idle is charged for them (the paper's TFLOP/s/device of the cluster);
* mfu: model FLOPs per iteration / (iteration time x the summed peak of the cluster's GPUs);
* iteration_time_s, peak_memory_gib (the fullest GPU), search_time_s (wall time of the planner).
With a fixed GBS per scenario, throughput and MFU ratios between planners are the inverse of their
latency ratio.

Library code: no printing; progress goes to a callback taking one line of text.
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from planner import precision as precisions
from planner.api import load_inputs
from planner.baselines import BASELINE_NAMES, PLANNERS, PlannerResult, geomean, run_planner, solve_with_limit
from planner.bench_flagscale import TUNER, TUNER_LABEL, TunerOutcome, run_flagscale_tuner
from planner.cost.model import CostModel
from planner.inputs.cluster import describe_cluster, parse_cluster
from planner.profile_tables import ProfileSet
from planner.runtime import AUTO, FLAGSCALE, RuntimeChoice, choose_runtime
from planner.simulate import plot_timeline, simulate_pipeline

GBS_PER_GPU = 16
SEQ_LENGTH = 4096
PAPER_TABLE2 = {"mixtral-s": {"throughput": 1.67, "latency": 0.56}, "mixtral-l": {"throughput": 1.78, "latency": 0.58}}
SCALING_SIZES = (48, 96, 192, 384, 768, 1024)
SCALING_TYPES = ("H800", "A100", "H20")
"""Three device types one upstream Megatron-LM job can hold (all NVIDIA: profiles/runtimes.yaml); the paper's
H800 + MI300X + 910B spans three vendors, which no public runtime runs as one job."""
SCALING_MODEL = "mixtral-l"
PAPER_RUNTIME = "all-vendors"
"""runtimes.yaml's hypothetical runtime the paper's scenarios are planned for where no public runtime runs
their whole cluster (ProfileSet.assuming)."""
SECTIONS = {
    "runnable": ("Runnable today",
                 "the scenarios whose whole cluster one public runtime runs as one job (profiles/runtimes.yaml): "
                 "the homogeneous ones, A100 + H800 and H800 + H20 (upstream Megatron-LM) and H800 + MI300X "
                 "(FlagScale with FlagCX); the baselines plan for the runtime `--runtime auto` picks, HAPMoE "
                 "searches every runtime that runs the cluster"),
    "paper_assumption": ("As the paper assumes",
                         "the paper's scenarios; its mixed clusters with the Ascend 910B (which no public runtime "
                         "runs in one job with NVIDIA or AMD GPUs) are planned, by every planner, for a HYPOTHETICAL "
                         "runtime that runs one job across NVIDIA, AMD and Huawei devices (runtimes.yaml "
                         f"`hypothetical: {PAPER_RUNTIME}`: FlagScale's per-stage meshes, the 910B reached as FlagCX "
                         "reaches AMD), priced by the same cost model and the same cross-vendor links (host memory) "
                         "as FlagScale's NVIDIA + AMD jobs; no launcher is written for it"),
}
"""summary.json's sections: (title, what it assumes)."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Scenario:
    """One model on one cluster; `kind` is dense-hetero, moe-homo or moe-hetero; `paper`: one of the
    paper's scenarios (the others: mixed clusters a public runtime runs as one job)."""

    model: str
    cluster: str
    kind: str
    paper: bool = True

    @property
    def name(self) -> str:
        return f"{self.model}@{self.cluster}"


MOE_CLUSTERS_HOMO = ("h800-16", "mi300x-16", "910b-16")
MOE_CLUSTERS_HETERO = ("h800-mi300x", "h800-910b", "mi300x-910b", "h800-mi300x-910b")
RUNNABLE_CLUSTERS_HETERO = {"mixtral-s": ("a100-h800", "h800-h20"), "mixtral-l": ("a100-h800-32", "h800-h20-32")}
"""Mixed clusters besides the paper's that one public runtime runs as one job (upstream Megatron-LM: NVIDIA
only), per model (Mixtral-L on 2x8 + 2x8 of these 80-96 GB GPUs: no plan for MI's recipes, or none at all);
with the paper's h800-mi300x (FlagScale), the runnable section's mixed clusters."""

PAPER_SUITE: tuple[Scenario, ...] = (
    tuple(Scenario(m, "a100-910b", "dense-hetero") for m in ("llama2-7b", "llama2-13b"))
    + tuple(Scenario(m, c, "moe-homo") for m in ("mixtral-s", "mixtral-l") for c in MOE_CLUSTERS_HOMO)
    + tuple(Scenario(m, c, "moe-hetero") for m in ("mixtral-s", "mixtral-l") for c in MOE_CLUSTERS_HETERO)
)
SUITE: tuple[Scenario, ...] = PAPER_SUITE + tuple(
    Scenario(m, c, "moe-hetero", paper=False) for m, cs in RUNNABLE_CLUSTERS_HETERO.items() for c in cs)
QUICK_SUITE: tuple[Scenario, ...] = (
    Scenario("llama2-7b", "a100-910b", "dense-hetero"),
    Scenario("mixtral-s", "h800-16", "moe-homo"),
    Scenario("mixtral-s", "h800-mi300x", "moe-hetero"),  # NVIDIA + AMD: one FlagScale job (FlagCX)
)


@dataclass
class BenchSettings:
    """How much time the searches get; `quick` shrinks the suite for tests."""

    quick: bool = False
    time_limit_s: float = 60.0  # per HAPMoE / baseline search (hard limit for HAPMoE's child processes)
    flagscale_time_limit_s: float = 30.0  # HAPMoE's flagscale-runtime search (0: skip it)
    scaling_time_limit_s: float = 60.0
    scaling_sizes: tuple[int, ...] = SCALING_SIZES
    planners: tuple[str, ...] = (*PLANNERS, TUNER)
    scenario_filter: str | None = None
    tuner_time_limit_s: float = 120.0  # FlagScale's auto-tuner per scenario (0: skip it)

    @classmethod
    def for_quick(cls) -> "BenchSettings":
        return cls(quick=True, time_limit_s=15.0, flagscale_time_limit_s=0.0, scaling_time_limit_s=8.0,
                   scaling_sizes=(48, 96), tuner_time_limit_s=0.0)


@dataclass
class Row:
    """One planner on one scenario (a line of results.csv)."""

    scenario: str
    kind: str
    model: str
    cluster: str
    gpus: int
    gbs: int
    planner: str
    status: str  # ok | none
    throughput_tflops_per_gpu: float = float("nan")
    mfu: float = float("nan")
    iteration_time_s: float = float("nan")
    peak_memory_gib: float = float("nan")
    search_time_s: float = float("nan")
    gpus_used: int = 0
    plan: str = ""
    notes: str = ""
    runtime: str = ""  # the plan's runtime, or without a plan the scenario's (PlanningWorld.runtime)
    runnable: bool = True  # a public runtime runs the whole cluster as one job
    paper: bool = True  # one of the paper's scenarios
    found_by: str = ""  # HAPMoE: "search" (its whole space) or "search with <baseline>'s degrees"


def label(name: str) -> str:
    """A planner's name in the tables (FlagScale's auto-tuner is not one of planner.baselines)."""
    return TUNER_LABEL if name == TUNER else PLANNERS[name].label


def plan_summary(plan, runtime: str | None = None) -> str:
    """A one-line description of a plan: its runtime (`runtime`, default the plan's), degrees, then
    device:layers(dp,recompute) per stage."""
    head = (f"{runtime or plan.runtime} tp{plan.tp} cp{plan.cp} ep{plan.ep} etp{plan.etp} pp{plan.pp} vpp{plan.vpp} "
            f"mbs{plan.mbs}")
    stages = " ".join(f"{s.device_type}:{s.num_layers}(dp{s.dp},{s.recompute.label})" for s in plan.stages)
    return f"{head} | {stages}"


def resolve_scenario(sc: Scenario, profiles):
    """(run, cluster) of a scenario: GBS = GBS_PER_GPU x GPUs, seq SEQ_LENGTH."""
    return scaled_inputs(sc.model, sc.cluster, profiles)


def scaled_inputs(model: str, cluster_spec: str, profiles):
    """(run, cluster) read as the CLI reads them (planner.api.load_inputs), with the global batch
    scaled to the cluster (GBS_PER_GPU x GPUs) and sequence length SEQ_LENGTH."""
    cluster = parse_cluster(cluster_spec, profiles)
    inputs = load_inputs(model=model, cluster=cluster, profiles=profiles,
                         overrides={"gbs": GBS_PER_GPU * cluster.world_size, "seq": SEQ_LENGTH})
    return inputs.run, inputs.cluster


@dataclass(frozen=True)
class PlanningWorld:
    """What every planner of a scenario plans for: the profiles (the shipped ones, or with the
    hypothetical PAPER_RUNTIME in place of the row it extends) and the runtime choice over the whole
    cluster."""

    profiles: ProfileSet
    choice: RuntimeChoice
    hypothetical: bool

    @property
    def runtime(self) -> str:
        """The runtime's name in results.csv and the tables."""
        return f"{PAPER_RUNTIME}(HYPOTHETICAL)" if self.hypothetical else self.choice.runtime.name


def planning_world(cluster, profiles, precision: str = "bf16") -> PlanningWorld:
    """The runtime `--runtime auto` picks when one public runtime runs the whole cluster as one job;
    otherwise (a mix no public runtime runs in one job: the 910B with NVIDIA or AMD GPUs) the paper's
    assumption, the hypothetical PAPER_RUNTIME over the whole cluster.  Either way a device type without the
    run's precision stays idle (choose_runtime), and a public runtime that runs all the others is no hypothesis."""
    choice = choose_runtime(AUTO, cluster, profiles, precision)
    if set(choice.left_out) <= set(choice.lacks_precision):  # a type without the precision stays idle either way
        return PlanningWorld(profiles, choice, hypothetical=False)
    world = profiles.assuming(PAPER_RUNTIME)
    extends = profiles.hypothetical_runtimes()[PAPER_RUNTIME].extends
    return PlanningWorld(world, choose_runtime(extends, cluster, world, precision), hypothetical=True)


def make_row(sc: Scenario, run, cluster, profiles, res: PlannerResult, world: PlanningWorld | None = None) -> Row:
    """Price a planner's result on the scenario's whole cluster."""
    row = Row(scenario=sc.name, kind=sc.kind, model=sc.model, cluster=sc.cluster, gpus=cluster.world_size,
              gbs=run.training.global_batch_size, planner=res.name, status="none", search_time_s=res.search_time_s,
              notes="; ".join(res.notes), runtime=world.runtime if world else "",
              runnable=not (world and world.hypothetical), paper=sc.paper)
    if res.priced is None:
        return row
    pc = res.priced.cost
    peak_total = precisions.peak_flop_per_s(cluster, profiles, run.training.precision)  # a type without it: none
    row.status = "ok"
    row.iteration_time_s = pc.iteration_time_s
    row.throughput_tflops_per_gpu = pc.model_flop_per_iteration / (pc.iteration_time_s * 1e12 * cluster.world_size)
    row.mfu = pc.model_flop_per_iteration / (pc.iteration_time_s * peak_total)
    row.peak_memory_gib = pc.max_memory_gib
    row.gpus_used = res.priced.plan.world_size
    hypothetical = world.runtime if world and world.hypothetical else None
    row.runtime = hypothetical or res.priced.plan.runtime
    row.plan = plan_summary(res.priced.plan, hypothetical)
    return row


def run_scenario(sc: Scenario, profiles, settings: BenchSettings, progress: Progress | None = None,
                 plans_out: dict | None = None, tuners_out: dict | None = None) -> list[Row]:
    """Every selected planner on one scenario: the baselines, then HAPMoE (also searching the part of its
    space with each baseline plan's degrees: planner/baselines/hapmoe.py), then the ablation (which
    re-splits HAPMoE's plan).

    Every planner plans for the same runtime over the whole cluster (planning_world): the one `--runtime
    auto` picks when a public runtime runs the cluster as one job (a baseline's plan, one DP and recompute
    for every stage, runs on upstream Megatron-LM for one vendor, on FlagScale across NVIDIA + AMD);
    otherwise the hypothetical PAPER_RUNTIME, every row saying so."""
    run, cluster = resolve_scenario(sc, profiles)
    world = planning_world(cluster, profiles, run.training.precision)
    choice = world.choice
    target = choice.runtime.name
    names = [n for n in (*BASELINE_NAMES, "hapmoe", "ablation") if n in settings.planners]
    rows: list[Row] = []
    hapmoe_plan = None
    incumbents: dict = {}
    for name in names:
        opts: dict = {"time_limit_s": settings.time_limit_s, "runtime": target}
        runs: list = []
        if name == "hapmoe":
            opts = {"time_limit_s": settings.time_limit_s, "flagscale_time_limit_s": settings.flagscale_time_limit_s,
                    "runs_out": runs, "incumbents": incumbents}
        if name == "ablation":
            opts["hapmoe_plan"] = hapmoe_plan
        res = run_planner(name, run, choice.cluster, world.profiles, **opts)
        if name in BASELINE_NAMES and res.priced is not None:
            incumbents[PLANNERS[name].label] = res.priced.plan
        if name == "hapmoe":
            hapmoe_plan = next((r.plan for r in runs if r.runtime == target), None)
        if world.hypothetical:
            res.notes.insert(0, f"{choice.check.reason}; no public runtime runs this job")  # says HYPOTHETICAL
        row = make_row(sc, run, cluster, profiles, res, world)
        if name == "hapmoe" and res.priced is not None:
            row.found_by = next((f"search with {r.seeded_from}'s degrees" if r.seeded_from else "search"
                                 for r in runs if r.plan == res.priced.plan), "")
        rows.append(row)
        if plans_out is not None and res.priced is not None:
            plans_out[(sc.name, name)] = res.priced
        if progress:
            what = (f"{row.throughput_tflops_per_gpu:.1f} TFLOP/s/GPU, {row.iteration_time_s:.2f} s/iter"
                    if row.status == "ok" else "no plan")
            progress(f"  {PLANNERS[name].label:28s} {what} ({row.search_time_s:.1f} s)")
    if TUNER in settings.planners:
        rows.append(tuner_row(sc, run, cluster, world, profiles, settings, progress, plans_out, tuners_out))
    return rows


def tuner_row(sc: Scenario, run, cluster, world: PlanningWorld, profiles, settings: BenchSettings,
              progress: Progress | None, plans_out: dict | None, tuners_out: dict | None = None) -> Row:
    """FlagScale's own auto-tuner on the cluster, where FlagScale runs it (the shipped `profiles`, not a
    hypothetical runtime's: planner/bench_flagscale.py); skipped, with the reason, elsewhere."""
    choice = world.choice
    runs = FLAGSCALE.can_run(choice.cluster, profiles)
    if settings.tuner_time_limit_s <= 0:
        out = TunerOutcome("skipped", "--flagscale-tuner-time-limit 0")
    elif not runs.ok:
        out = TunerOutcome("skipped", runs.reason)
    else:
        out = run_flagscale_tuner(run, choice.cluster, profiles, time_limit_s=settings.tuner_time_limit_s)
    res = PlannerResult(name=TUNER, priced=out.best, search_time_s=out.search_time_s, notes=out.notes())
    row = make_row(sc, run, cluster, profiles, res, world)
    if plans_out is not None and out.best is not None:
        plans_out[(sc.name, TUNER)] = out.best
    if tuners_out is not None:
        tuners_out[sc.name] = (out, describe_cluster(choice.cluster, profiles))
    if progress:
        what = (f"{row.throughput_tflops_per_gpu:.1f} TFLOP/s/GPU, {row.iteration_time_s:.2f} s/iter"
                if row.status == "ok" else f"no plan ({out.status}: {out.why})")
        took = "not run" if math.isnan(out.search_time_s) else f"{out.search_time_s:.1f} s"
        progress(f"  {TUNER_LABEL:28s} {what} ({took})")
    return row


def run_suite(profiles, settings: BenchSettings, progress: Progress | None = None,
              plans_out: dict | None = None, tuners_out: dict | None = None) -> list[Row]:
    """Every scenario of the (quick) suite."""
    suite = QUICK_SUITE if settings.quick else SUITE
    if settings.scenario_filter:
        suite = tuple(s for s in suite if settings.scenario_filter in s.name)
    rows: list[Row] = []
    for i, sc in enumerate(suite, 1):
        if progress:
            progress(f"[{i}/{len(suite)}] {sc.name} ({sc.kind})")
        rows += run_scenario(sc, profiles, settings, progress, plans_out, tuners_out)
    return rows


# --------------------------------------------------------------------------------------------
# summaries and tables
# --------------------------------------------------------------------------------------------


def _by(rows: list[Row]) -> dict[str, dict[str, Row]]:
    out: dict[str, dict[str, Row]] = {}
    for r in rows:
        out.setdefault(r.scenario, {})[r.planner] = r
    return out


def _ok(r: Row | None) -> bool:
    return r is not None and r.status == "ok"


def section_rows(rows: list[Row], section: str) -> list[Row]:
    """The rows of a summary section (SECTIONS): the scenarios a public runtime runs as one job
    (`runnable`), or the paper's scenarios (`paper_assumption`)."""
    if section == "runnable":
        return [r for r in rows if r.runnable]
    if section == "paper_assumption":
        return [r for r in rows if r.paper]
    raise ValueError(f"unknown section {section!r}; known: {', '.join(SECTIONS)}")


def summarize(rows: list[Row]) -> dict:
    """summary.json: the comparison over every scenario of the run (the keys of `compare_planners`),
    then the same comparison per section (SECTIONS: `runnable`, `paper_assumption`), each saying what it
    assumes and which scenarios it holds."""
    out = compare_planners(rows)
    out["paper_table2_throughput_vs_mi"] = {m: v["throughput"] for m, v in PAPER_TABLE2.items()}
    out["no_plan"] = sorted(f"{r.scenario}:{r.planner}" for r in rows if r.status != "ok")
    out["metrics"] = "throughput and MFU over all GPUs of the cluster; predicted by the cost model"
    for section, (title, assumes) in SECTIONS.items():
        part = section_rows(rows, section)
        out[section] = {"title": title, "assumes": assumes, "scenarios": list(_by(part)),
                        "hypothetical_scenarios": list(_by([r for r in part if not r.runnable])),
                        **compare_planners(part)}
    return out


def compare_planners(rows: list[Row]) -> dict:
    """HAPMoE over MI (geometric mean over the heterogeneous MoE scenarios, overall and per model),
    HAPMoE over the best baseline (per scenario and the worst), and every scenario where HAPMoE loses."""
    by = _by(rows)
    hetero = [s for s, d in by.items() if next(iter(d.values())).kind == "moe-hetero"]
    speed = {s: by[s]["hapmoe"].throughput_tflops_per_gpu / by[s]["mi"].throughput_tflops_per_gpu
             for s in hetero if _ok(by[s].get("hapmoe")) and _ok(by[s].get("mi"))}
    per_model: dict[str, float] = {}
    for model in sorted({by[s]["hapmoe"].model for s in speed}):
        per_model[model] = geomean([v for s, v in speed.items() if by[s]["hapmoe"].model == model])
    ratios: dict[str, dict] = {}
    losses = []
    for s, d in by.items():
        h = d.get("hapmoe")
        base = [d[n] for n in BASELINE_NAMES if _ok(d.get(n))]
        if not _ok(h) or not base:
            continue
        best = max(base, key=lambda r: r.throughput_tflops_per_gpu)
        ratio = h.throughput_tflops_per_gpu / best.throughput_tflops_per_gpu
        ratios[s] = {"ratio": ratio, "best_baseline": best.planner}
        if ratio < 1 - 1e-9:
            losses.append({"scenario": s, "ratio": ratio, "baseline": best.planner, "baseline_plan": best.plan,
                           "hapmoe_plan": h.plan, "why": explain_loss(h, best)})
    worst = min(ratios.items(), key=lambda kv: kv[1]["ratio"]) if ratios else None
    return {
        "geomean_speedup_vs_mi": geomean(list(speed.values())) if speed else None,
        "geomean_speedup_vs_mi_by_model": per_model,
        "speedup_vs_mi_by_scenario": speed,
        "min_ratio_vs_best_baseline": worst[1]["ratio"] if worst else None,
        "min_ratio_scenario": worst[0] if worst else None,
        "ratio_vs_best_baseline_by_scenario": ratios,
        "hapmoe_slower_than_a_baseline": losses,
        "hapmoe_plan_from_a_seeded_search": {s: d["hapmoe"].found_by for s, d in by.items()
                                             if _ok(d.get("hapmoe")) and d["hapmoe"].found_by not in ("", "search")},
    }


def explain_loss(h: Row, b: Row) -> str:
    """Why HAPMoE's plan can be slower than a baseline's (both predicted by the one cost model)."""
    reasons = []
    if "mixed" in b.notes or "span several device types" in b.notes:
        reasons.append("the baseline's plan has stages spanning device types (outside HAPMoE's space; "
                       "priced as the slowest member, which may be optimistic)")
    if "time limit" in h.notes or "timeout" in h.notes:
        reasons.append("HAPMoE's search hit its time limit")
    reasons.append("HAPMoE prunes with the load-balance window (delta=0.2) and the least-recompute rule, "
                   "so plans outside the window (e.g. near-even splits) are not searched")
    return "; ".join(reasons)


TABLE2_PLANNERS = ("mi", "alpa", "metis", "hetermoe", "deepspeed", TUNER, "hapmoe")


def table2_markdown(rows: list[Row]) -> str:
    """Paper Table 2, once per section (SECTIONS, runnable first): geometric means over the section's
    heterogeneous MoE scenarios normalised to MI, then each scenario's HAPMoE ratios."""
    lines = ["# Table 2: geometric mean on heterogeneous MoE clusters, normalised to MI", "",
             "Higher is better for throughput and MFU, lower for latency. Predicted by the cost model; "
             "throughput/MFU over all GPUs of the cluster. n = scenarios where both MI and the planner have a plan.",
             ""]
    for section, (title, assumes) in SECTIONS.items():
        lines += [f"## {title}", "", f"Assumes: {assumes}.", ""]
        lines += _table2_section(section_rows(rows, section), paper=section == "paper_assumption")
    return "\n".join(lines) + "\n"


def _table2_section(rows: list[Row], paper: bool) -> list[str]:
    by = _by(rows)
    head = "| model | metric | " + " | ".join(label(p) for p in TABLE2_PLANNERS) + (" | paper HAPMoE |" if paper else " |")
    lines = [head, "|---|---|" + "---|" * (len(TABLE2_PLANNERS) + paper)]
    models = sorted({r.model for r in rows if r.kind == "moe-hetero"})
    for model in models:
        scen = [s for s, d in by.items() if any(r.kind == "moe-hetero" and r.model == model for r in d.values())]
        for metric, attr, paper_key in (("throughput", "throughput_tflops_per_gpu", "throughput"),
                                        ("MFU", "mfu", None), ("latency", "iteration_time_s", "latency")):
            cells = []
            for p in TABLE2_PLANNERS:
                vals = [getattr(by[s][p], attr) / getattr(by[s]["mi"], attr)
                        for s in scen if _ok(by[s].get(p)) and _ok(by[s].get("mi"))]
                cells.append(f"{geomean(vals):.2f}x (n={len(vals)})" if vals else "n/a")
            ref = PAPER_TABLE2.get(model, {}).get(paper_key) if paper_key else None
            lines.append(f"| {model} | {metric} | " + " | ".join(cells) + (f" | {ref or '-'} |" if paper else " |"))
    if not models:
        lines.append("| (no heterogeneous MoE scenario in this run) |")
    comp = compare_planners(rows)
    lines += ["", "Every scenario of the section (the means above: its heterogeneous MoE ones):", "",
              "| scenario | runtime | HAPMoE / MI (throughput) | HAPMoE / best baseline | best baseline |",
              "|---|---|---|---|---|"]
    for s, d in by.items():
        h, mi = d.get("hapmoe"), d.get("mi")
        speed = h.throughput_tflops_per_gpu / mi.throughput_tflops_per_gpu if _ok(h) and _ok(mi) else None
        best = comp["ratio_vs_best_baseline_by_scenario"].get(s)
        runtime = next((r.runtime for r in d.values() if r.planner == "mi"), "-")
        if _ok(h) and h.runtime != runtime:
            runtime += f" (HAPMoE's plan: {h.runtime})"
        ratio, who = (f"{best['ratio']:.3f}", label(best["best_baseline"])) if best else ("n/a", "-")
        vs_mi = f"{speed:.2f}x" if speed else "no plan" if not _ok(h) else "n/a (MI: no plan)"
        lines.append(f"| {s} | {runtime} | {vs_mi} | {ratio} | {who} |")
    lines.append("")
    return lines


def tuner_markdown(rows: list[Row], tuners: dict) -> str:
    """FlagScale's auto-tuner beside HAPMoE, per scenario: search time, candidates, plan quality."""
    by = _by(rows)
    lines = [f"# {TUNER_LABEL} beside HAPMoE", "",
             "FlagScale 0.8.0's heterogeneous auto-tuner, run standalone (tools/flagscale_autotune.py; no job "
             "launched). It has no cost model: it would start its candidates one by one on the cluster and time "
             "them, the first one first. Its candidates that use every GPU and that a plan can say (one TP, EP) "
             "are priced by the planner's cost model: `best` is the fastest that fits (what timing every one could "
             "find, were the cost model the cluster). Same model, batch, cluster part and cost model as HAPMoE. "
             "Search times are wall seconds on this machine.", "",
             "| scenario | planned on | tuner search (s) | candidates: all / every GPU / a plan / fit | tuner best "
             "(s/iter) | HAPMoE (s/iter) | HAPMoE speed-up | HAPMoE search (s) | FlagScale's validator | tuner's "
             "first candidate |", "|---|---|---|---|---|---|---|---|---|---|"]
    for scenario, (out, part) in tuners.items():
        h, t = by.get(scenario, {}).get("hapmoe"), by.get(scenario, {}).get(TUNER)
        c = out.counts
        counts = (f"{c.get('candidates')} / {c.get('full')} / {c.get('expressible', 0)} / {c.get('fits', 0)}"
                  if out.status == "ok" else f"{out.status}: {out.why}")
        tuner_it = f"{t.iteration_time_s:.2f}" if _ok(t) else "none"
        ours = f"{h.iteration_time_s:.2f}" if _ok(h) else "none"
        speed = f"{t.iteration_time_s / h.iteration_time_s:.2f}x" if _ok(h) and _ok(t) else "n/a"
        hs = f"{h.search_time_s:.1f}" if h is not None else "-"
        took = "-" if math.isnan(out.search_time_s) else f"{out.search_time_s:.1f}"
        lines.append(f"| {scenario} | {part} | {took} | {counts} | {tuner_it} | {ours} | {speed} | "
                     f"{hs} | {out.validated or '-'} | {out.first or '-'} |")
    if not tuners:
        lines.append("| (the tuner did not run: --flagscale-tuner-time-limit 0, --quick, or no FlagScale environment) |")
    return "\n".join(lines) + "\n"


def table3_markdown(rows: list[Row]) -> str:
    """Paper Table 3: change ratios when non-uniform PP/DP is disabled (ablation / HAPMoE)."""
    by = _by(rows)
    lines = ["# Table 3: performance change ratio by disabling non-uniform PP/DP", "",
             "Ablation (one DP and recompute for every stage, every stage the same number of layers, on the scenario's "
             "runtime) over HAPMoE. "
             "Throughput/MFU < 1 and latency > 1 mean the ablation is worse.", "",
             "| scenario | kind | throughput | MFU | latency | HAPMoE plan | ablation plan |", "|---|---|---|---|---|---|---|"]
    for s, d in by.items():
        h, a = d.get("hapmoe"), d.get("ablation")
        if not (_ok(h) and _ok(a)):
            if h is not None and a is not None:
                lines.append(f"| {s} | {h.kind} | n/a | n/a | n/a | {h.plan or 'none'} | {a.plan or 'none'} |")
            continue
        lines.append(f"| {s} | {h.kind} | {a.throughput_tflops_per_gpu / h.throughput_tflops_per_gpu:.2f} | "
                     f"{a.mfu / h.mfu:.2f} | {a.iteration_time_s / h.iteration_time_s:.2f} | {h.plan} | {a.plan} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# search time against cluster size
# --------------------------------------------------------------------------------------------


@dataclass
class ScalingRow:
    gpus: int
    cluster: str
    status: str
    search_time_s: float
    iteration_time_s: float = float("nan")
    throughput_tflops_per_gpu: float = float("nan")
    detail: str = ""


def three_type_cluster(total: int, types: tuple[str, ...] = SCALING_TYPES, node: int = 8) -> str:
    """TYPE:COUNT shorthand splitting `total` GPUs over `types` in whole nodes, as evenly as possible."""
    nodes = total // node
    base, extra = divmod(nodes, len(types))
    counts = [(base + (1 if i < extra else 0)) * node for i in range(len(types))]
    return ",".join(f"{t}:{c}" for t, c in zip(types, counts) if c)


def scaling_study(profiles, settings: BenchSettings, progress: Progress | None = None) -> list[ScalingRow]:
    """HAPMoE (HS-DP, megatron runtime) search time on Mixtral-L over growing three-type clusters."""
    out = []
    for n in settings.scaling_sizes:
        spec = three_type_cluster(n)
        run, cluster = scaled_inputs(SCALING_MODEL, spec, profiles)
        sr = solve_with_limit(run, cluster, profiles, runtime="megatron", hard_limit_s=settings.scaling_time_limit_s)
        row = ScalingRow(gpus=cluster.world_size, cluster=spec, status=sr.status, search_time_s=sr.search_time_s,
                         detail=sr.detail)
        if sr.plan is not None:
            pc = CostModel(run.model, run.training, cluster, profiles).evaluate(sr.plan)
            row.iteration_time_s = pc.iteration_time_s
            row.throughput_tflops_per_gpu = pc.model_flop_per_iteration / (
                pc.iteration_time_s * 1e12 * cluster.world_size)
        out.append(row)
        if progress:
            progress(f"  scaling {cluster.world_size:5d} GPUs ({spec}): {row.status} in {row.search_time_s:.1f} s")
    return out


def scaling_markdown(rows: list[ScalingRow], limit_s: float) -> str:
    lines = [f"# Search time against cluster size ({SCALING_MODEL}, HS-DP, megatron runtime, "
             f"{' + '.join(SCALING_TYPES)}, limit {limit_s:.0f} s per run)", "",
             "| GPUs | cluster | status | search time (s) | iteration (s) | TFLOP/s/GPU | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.gpus} | {r.cluster} | {r.status} | {r.search_time_s:.1f} | {r.iteration_time_s:.2f} | "
                     f"{r.throughput_tflops_per_gpu:.1f} | {r.detail} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------------------------


RESULTS_CSV = "results.csv"
SCALING_CSV = "scaling.csv"
SUMMARY_JSON = "summary.json"
TABLE2_MD = "table2.md"
TABLE3_MD = "table3.md"
SEARCH_TIME_MD = "search_time.md"
TUNER_MD = "flagscale_tuner.md"
BENCH_FILES = (RESULTS_CSV, SCALING_CSV, SUMMARY_JSON, TABLE2_MD, TABLE3_MD, SEARCH_TIME_MD, TUNER_MD)
"""What `write_outputs` writes besides its PNG plots (`bench --out`'s help lists them; planner/output/run_dir.py
BENCH_OUTPUT checks them before the bench starts)."""


def write_csv(rows: list, path: Path) -> None:
    """Dataclass rows -> CSV with a header."""
    if not rows:
        path.write_text("")
        return
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(asdict(rows[0])))
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


def json_clean(x):
    """Replace non-finite floats (nan, inf) by None, recursively, so the JSON is standard."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    return x


def plot_throughput(rows: list[Row], path: Path) -> None:
    """Grouped bars: each planner's throughput over MI's, per scenario."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by = _by(rows)
    scen = [s for s in by if _ok(by[s].get("mi"))]
    planners = [p for p in TABLE2_PLANNERS if any(_ok(by[s].get(p)) for s in scen)]
    fig = Figure(figsize=(max(8, 1.1 * len(scen)), 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(len(planners), 1)
    for k, p in enumerate(planners):
        vals = [(by[s][p].throughput_tflops_per_gpu / by[s]["mi"].throughput_tflops_per_gpu)
                if _ok(by[s].get(p)) else 0.0 for s in scen]
        ax.bar([i + k * width for i in range(len(scen))], vals, width, label=label(p))
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(scen))])
    hypothetical = {r.scenario for r in rows if not r.runnable}
    ax.set_xticklabels([f"{s} (hypothetical)" if s in hypothetical else s for s in scen], rotation=35, ha="right",
                       fontsize=8)
    ax.set_ylabel("throughput / MI (predicted)")
    ax.set_title("Throughput normalised to MI (0 = no plan)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, format="png")


def plot_ablation(rows: list[Row], path: Path) -> None:
    """Bars: ablation latency over HAPMoE's, per scenario."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by = _by(rows)
    scen = [s for s, d in by.items() if _ok(d.get("hapmoe")) and _ok(d.get("ablation"))]
    fig = Figure(figsize=(max(6, 0.9 * len(scen)), 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(range(len(scen)), [by[s]["ablation"].iteration_time_s / by[s]["hapmoe"].iteration_time_s for s in scen],
           color="#C44E52")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(scen)))
    ax.set_xticklabels(scen, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("latency, uniform PP/DP / HAPMoE")
    ax.set_title("Disabling non-uniform PP/DP (Table 3)")
    fig.tight_layout()
    fig.savefig(path, format="png")


def plot_scaling(rows: list[ScalingRow], path: Path) -> None:
    """Search time against cluster size (log-log); timeouts drawn as crosses at the limit."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ok = [r for r in rows if r.status == "ok"]
    bad = [r for r in rows if r.status != "ok"]
    ax.plot([r.gpus for r in ok], [r.search_time_s for r in ok], "o-", label="plan found")
    if bad:
        ax.plot([r.gpus for r in bad], [r.search_time_s for r in bad], "x", color="red", label="timeout / none")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"GPUs ({' + '.join(SCALING_TYPES)})")
    ax.set_ylabel("search time (s)")
    ax.set_title(f"HAPMoE search time, {SCALING_MODEL}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")


def pipeline_inputs(pc) -> tuple[list[float], list[float], list[float]]:
    """Per-stage forward/backward seconds without pipeline sends (the cost model charges stage i the sends it
    pays on both its links as pp_comm_s, half to forward, half to backward), and per-boundary seconds of one
    message (StageCost.send_out_s, before any overlap) from a PlanCost."""
    p2p = [st.send_out_s for st in pc.stages[:-1]]
    fwd = [st.forward_s - st.pp_comm_s / 2 for st in pc.stages]
    bwd = [st.backward_s - st.pp_comm_s / 2 for st in pc.stages]
    return fwd, bwd, p2p


def plot_best_timeline(rows: list[Row], plans: dict, out_dir: Path) -> Path | None:
    """Simulate HAPMoE's plan on the last heterogeneous MoE scenario (1F1B plans only) and draw the
    pipeline timeline, titled with the simulated and the formula's pipeline time."""

    cands = [r.scenario for r in rows if r.planner == "hapmoe" and r.kind == "moe-hetero"
             and (r.scenario, "hapmoe") in plans and plans[(r.scenario, "hapmoe")].plan.vpp == 1]
    if not cands:
        return None
    s = cands[-1]
    pc = plans[(s, "hapmoe")].cost
    fwd, bwd, p2p = pipeline_inputs(pc)
    sim = simulate_pipeline(fwd, bwd, pc.num_microbatches, p2p_s=p2p)
    return plot_timeline(sim, out_dir / "timeline_hapmoe.png",
                         title=f"HAPMoE on {s}: simulated {sim.iteration_time_s:.2f} s, formula {pc.pipeline_s:.2f} s")


def write_outputs(out_dir: Path, rows: list[Row], scaling: list[ScalingRow], settings: BenchSettings,
                  profiles=None, wall_s: float = 0.0, tuners: dict | None = None) -> dict:
    """BENCH_FILES and PNG plots."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out_dir / RESULTS_CSV)
    write_csv(scaling, out_dir / SCALING_CSV)
    summary = summarize(rows)
    summary["search_time_by_gpus"] = {str(r.gpus): {"status": r.status, "search_time_s": r.search_time_s}
                                      for r in scaling}
    summary["settings"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(settings).items()}
    summary["gbs_per_gpu"] = GBS_PER_GPU
    summary["seq_length"] = SEQ_LENGTH
    summary["bench_wall_s"] = wall_s
    summary["flagscale_tuner"] = {s: {"status": o.status, "why": o.why, "search_time_s": o.search_time_s,
                                      "counts": o.counts, "validated": o.validated, "planned_on": part,
                                      "first_candidate": o.first}
                                  for s, (o, part) in (tuners or {}).items()}
    (out_dir / TUNER_MD).write_text(tuner_markdown(rows, tuners or {}))
    t2, t3 = table2_markdown(rows), table3_markdown(rows)
    ts = scaling_markdown(scaling, settings.scaling_time_limit_s)
    (out_dir / TABLE2_MD).write_text(t2)
    (out_dir / TABLE3_MD).write_text(t3)
    (out_dir / SEARCH_TIME_MD).write_text(ts)
    (out_dir / SUMMARY_JSON).write_text(json.dumps(json_clean(summary), indent=2, default=str))
    plot_throughput(rows, out_dir / "throughput_vs_mi.png")
    plot_ablation(rows, out_dir / "ablation.png")
    if scaling:
        plot_scaling(scaling, out_dir / "search_time.png")
    return summary


@dataclass
class BenchReport:
    rows: list[Row]
    scaling: list[ScalingRow]
    summary: dict
    out_dir: Path
    files: list[str] = field(default_factory=list)


def run_bench(out_dir: Path, profiles, settings: BenchSettings, progress: Progress | None = None,
              scaling: bool = True, timeline: bool = True) -> BenchReport:
    """The whole bench: suite, scaling study, outputs."""
    t0 = time.perf_counter()
    plans: dict = {}
    tuners: dict = {}
    rows = run_suite(profiles, settings, progress, plans, tuners)
    scal: list[ScalingRow] = []
    if scaling and settings.scaling_sizes:
        if progress:
            progress("search time against cluster size")
        scal = scaling_study(profiles, settings, progress)
    summary = write_outputs(out_dir, rows, scal, settings, profiles, wall_s=time.perf_counter() - t0, tuners=tuners)
    if timeline:
        plot_best_timeline(rows, plans, Path(out_dir))
    files = sorted(p.name for p in Path(out_dir).iterdir() if p.is_file())
    return BenchReport(rows=rows, scaling=scal, summary=summary, out_dir=Path(out_dir), files=files)
