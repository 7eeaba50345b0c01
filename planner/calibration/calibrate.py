"""Compare what a run measured with the cost model's prediction and derive corrections.

Method (documented in the report):
1. Per device type, when the log has per-rank compute timers (`--timing-log-level 2
   --timing-log-option all`: forward-compute + backward-compute), the ratio measured / predicted
   per-iteration stage compute (m x (fwd+bwd - pipeline sends) per micro-batch) averaged over that
   device's stages becomes a device factor on every time kind of that device.
2. The iteration time left unexplained after step 1 (measured / re-predicted) is a global
   factor on every time kind of every device in the run.  With only iteration lines, step 1 is
   skipped and this single factor carries everything: it reproduces this run exactly and
   transfers to other runs to the extent the mismatch is proportional in every kernel kind.
3. Memory: per stage, the largest `max reserved` among its ranks (rank -> stage by Megatron's
   default order, stage = rank // (TP*CP*DP)) against the predicted memory; the mean excess per
   device becomes `memory_overhead_gib` (added; never negative, so calibration cannot make the
   planner optimistic about memory; a negative difference is reported only).  An excess beyond
   MEMORY_EXCESS_RATIO x the prediction *and* MEMORY_EXCESS_DEVICE_SHARE of the device's memory is
   refused (--allow-memory-excess writes it, with a warning): that is another run, not an allocator overhead.
4. Router statistics give the MoE imbalance factor (max/mean tokens per expert, mean over layers).
Existing corrections (from --profiles) are composed: new factor = old factor x fitted ratio.

Before any of this the run's own start-up lines (world size, TP, PP, CP, EP, micro and global batch,
sequence length, layers: whichever the log prints) are compared with the run priced; a difference is
refused (`check_stated_config`): corrections fitted to another configuration would be wrong everywhere.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from planner.calibration.megatron_log import ParsedLog, parse_megatron_log
from planner.calibration.router_stats import RouterStats, load_router_stats
from planner.cli_common import json_text
from planner.cost.estimate import plan_from_run
from planner.cost.model import CostModel
from planner.cost.ranges import EVIDENCE_MIN_SHARE, RangeModel
from planner.errors import PlannerInputError
from planner.inputs.cluster import describe_cluster
from planner.inputs.files import load_document, parse_json, path_kind, read_text
from planner.output.run_dir import CALIBRATE_OUTPUT, write_files
from planner.profile_tables import (
    CORRECTION_KINDS, IMBALANCE_KIND, TIME_CORRECTION_KINDS, TIME_FACTOR_RANGE, ProfileSet,
)
from planner.sanity import check_prediction
from planner.schemas.device import Provenance
from planner.uncertainty import EVIDENCE_YAML, Region, cell_of, cells_of_docs, user_region
from planner.units import GIB_BYTES

TIME_KINDS = TIME_CORRECTION_KINDS
MEMORY_KIND = "memory_overhead_gib"
GLOBAL_FIT_ITERATIONS = 8
# A fitted time factor beyond 10x either way means the log is not from the run the flags describe
# (wrong model, cluster or batch), not that the cost model is off by that much; the loader refuses
# such factors too (planner/profile_tables.py), so calibrate never writes a file --profiles refuses.
FACTOR_RANGE = TIME_FACTOR_RANGE
# A measured peak more than 1.5x the predicted one, by more than a tenth of the device's memory, is no
# allocator overhead (the memory model's worst error on the measured published peaks is a few per cent:
# README's accuracy section, `python -m planner.calibration.report`; its target is 10%, planner/calibration/
# memory.py): the run holds something the planner did not price (other flags, another model, another
# allocator setting).  Both must hold, so that small runs (a few GiB predicted, CUDA context and
# allocator cache dominating) keep their small corrections.
MEMORY_EXCESS_RATIO = 1.5
MEMORY_EXCESS_DEVICE_SHARE = 0.10
# What the log states (ParsedLog.stated_config keys) against the run priced: the option that sets it.
STATED_OPTIONS = {
    "world_size": "--cluster (world size)", "tp": "--tp (--tensor-model-parallel-size)",
    "pp": "--pp (--pipeline-model-parallel-size)", "cp": "--cp (--context-parallel-size)",
    "ep": "--ep (--expert-model-parallel-size)", "mbs": "--mbs (--micro-batch-size)",
    "gbs": "--gbs (--global-batch-size)", "seq_length": "--seq (--seq-length)",
    "num_layers": "--model (num_layers; --num-layers)",
    "ranks": "--cluster (world size, counted from the ranks its memory or timer lines name)",
}


@dataclass
class Measurement:
    """What a real run measured (seconds, bytes)."""

    source: str
    date: str
    iteration_time_s: float
    per_rank_compute_s: dict[int, float] = field(default_factory=dict)  # fwd+bwd compute per iteration
    per_rank_peak_bytes: dict[int, float] = field(default_factory=dict)  # max reserved (or allocated)
    forward_backward_s: float | None = None
    throughput_tflops: float | None = None
    steady_iterations: int = 0
    problems: int = 0
    global_batch_size: int | None = None
    stated: dict[str, int] = field(default_factory=dict)  # the run's configuration as its log states it
    memory_option: str = "--megatron-log"  # where per_rank_peak_bytes came from
    skipped_lines: int = 0  # log lines after the warm-up whose interval skipped optimizer steps (fp16 overflow, NaN)
    skipped_timed: bool = False  # every such line: the median had to time them


def choose_run(log: ParsedLog, run: int | None) -> int | None:
    """The run of the log to calibrate on (0-based; None: the log holds one run).  A log of several runs
    (a restart, two logs concatenated) is refused unless one is chosen: blending them would fit
    corrections to no run at all."""
    if run is not None:
        if not 1 <= run <= log.run_count:
            raise PlannerInputError("--log-run", f"{log.source} holds {log.run_count} run(s); got {run}")
        if run > len(log.runs):
            raise PlannerInputError("--log-run", f"{log.source} holds {log.run_count} runs; the first "
                                                 f"{len(log.runs)} can be chosen")
        return run - 1
    if log.run_count <= 1:
        return None
    second = log.runs[1]
    before = log.it_number[second.index - 1]
    total = log.runs[0].train_iters
    why = (f"iteration {second.iteration} after {before}" if second.train_iters == total else
           f"the total changes from {total} to {second.train_iters}")
    raise PlannerInputError(
        "--megatron-log", f"{log.source} holds {log.run_count} runs (the second starts at line {second.line_no}: "
                          f"{why}); blending them would fit no run: calibrate on one with --log-run N "
                          f"(1..{min(log.run_count, len(log.runs))}), or cut the log")


def measurement_from_log(log: ParsedLog, skip: int = 2, run: int | None = None) -> Measurement:
    """Median steady iteration time, per-rank compute timers (option all) and per-rank peaks, over
    one run of the log (`run`, 0-based; None: the whole log)."""
    t = log.median_iteration_time_s(skip, run)
    if t is None:
        first = next((p for p in log.problems if p.kind == "iteration"), None)
        example = f"; line {first.line_no}: {first.reason}" if first is not None else ""
        raise PlannerInputError(
            "--megatron-log",
            f"{log.source}: no iteration line with an elapsed time after skipping {skip} "
            f"({len(log.it_number)} iteration lines, {log.problem_count} unreadable{example})",
        )
    fwd = log.median_timer_by_rank_ms("forward-compute", skip, run)
    bwd = log.median_timer_by_rank_ms("backward-compute", skip, run)
    compute = {r: (fwd[r] + bwd[r]) / 1e3 for r in fwd if r in bwd}
    peaks = {r: rec.max_reserved_bytes for r, rec in log.peak_memory_by_rank(run).items()}
    fb = log.median_timer_ms("forward-backward", skip, run)
    date = (log.first_timestamp or "").split(" ")[0] or "undated"
    return Measurement(
        source=log.source, date=date, iteration_time_s=t, per_rank_compute_s=compute, per_rank_peak_bytes=peaks,
        forward_backward_s=fb / 1e3 if fb is not None else None,
        throughput_tflops=log.median_throughput_tflops(skip, run),
        steady_iterations=log.steady_iteration_count(skip, run), problems=log.problem_count,
        global_batch_size=log.global_batch_size(skip, run), stated=log.stated_config(run),
        skipped_lines=log.skipped_lines(skip, run),
        skipped_timed=0 < log.skipped_lines(skip, run) == len(log.after_warmup(skip, run)),
    )


def skipped_step_warnings(measurement: Measurement) -> list[str]:
    """What the log's skipped optimizer steps did to the measurement (Megatron's `number of skipped iterations`
    and `number of nan iterations`: an fp16 loss-scale overflow or a NaN loss skips the step, so the line's
    time is short)."""
    n = measurement.skipped_lines
    if not n:
        return []
    what = (f"{n} log line(s) after the warm-up report iterations that skipped their optimizer step (number of "
            "skipped or nan iterations above 0: an fp16 loss-scale overflow, a NaN loss)")
    if measurement.skipped_timed:
        return [f"{what}, every one of them: the median times them and is shorter than a training step; measure "
                "a longer run, past the loss scale's first overflows, or fix the NaN loss"]
    return [f"{what}: left out of the median"]


def measurement_from_instrument(directory: str | Path) -> Measurement:
    """Iteration time (median over recorded iterations of the slowest rank) and per-rank peak
    memory from `planner.instrument` output (instrument_rank*.json).  The steady iterations are the
    distinct iterations recorded (the instrumentation skips its warm-up ones itself); the date is the
    one the files record (`recorded_utc`), else "unknown"; `world_size` is what the run states."""
    d = Path(directory)
    files = sorted(d.glob("instrument_rank*.json"))
    if not files:
        raise PlannerInputError("--instrument-dir", f"{d}: no instrument_rank*.json files")
    per_rank_time: dict[int, float] = {}
    peaks: dict[int, float] = {}
    iterations: set[int] = set()
    counts: list[int] = []
    dates: set[str] = set()
    worlds: set[int] = set()
    for f in files:
        text = read_text(f, "--instrument-dir", max_bytes=64 << 20)
        try:
            data = json.loads(text)
            rank = int(data["rank"])
            times = [float(r["time_s"]) for r in data["iterations"]]
            peak = data.get("max_memory_reserved_bytes") or data.get("max_memory_allocated_bytes")
            peak = float(peak) if peak else None
            numbers = {int(r["iteration"]) for r in data["iterations"] if "iteration" in r}
            recorded = data.get("recorded_utc")
            world = data.get("world_size")
            world = int(world) if world is not None else None
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError) as exc:
            raise PlannerInputError("--instrument-dir", f"{f.name}: unreadable ({exc})") from None
        bad = [t for t in times if not (math.isfinite(t) and t > 0)]
        if bad or (peak is not None and not (math.isfinite(peak) and peak >= 0)) or rank < 0:
            raise PlannerInputError("--instrument-dir", f"{f.name}: times must be finite and > 0, memory finite and "
                                                        f"rank >= 0 (got {bad[:3] or peak or rank})")
        if times:
            per_rank_time[rank] = statistics.median(times)
            counts.append(len(times))
            iterations |= numbers
        if peak:
            peaks[rank] = peak
        if isinstance(recorded, str) and _is_date(recorded[:10]):
            dates.add(recorded[:10])
        if world is not None and world > 0:
            worlds.add(world)
    if not per_rank_time:
        raise PlannerInputError("--instrument-dir", f"{d}: no recorded iterations")
    if len(worlds) > 1:
        raise PlannerInputError("--instrument-dir", f"{d}: its files state world sizes {', '.join(map(str, sorted(worlds)))}"
                                                    ": files of more than one run; keep one run's files in it")
    return Measurement(source=d.name, date=min(dates) if dates else "unknown",
                       iteration_time_s=max(per_rank_time.values()), per_rank_peak_bytes=peaks,
                       steady_iterations=max(len(iterations), max(counts)),
                       stated={"world_size": worlds.pop()} if len(worlds) == 1 else {},
                       memory_option="--instrument-dir")


def _is_date(text: str) -> bool:
    try:
        _dt.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def read_measurement(megatron_log: str | Path | None, instrument_dir: str | Path | None,
                     skip_iterations: int, log_run: int | None = None) -> tuple[Measurement, ParsedLog | None]:
    """What the run measured: from its log (memory per rank from the instrumentation when the log
    has none), else from the instrumentation alone.  `log_run`: which run of a log that holds several
    (1-based).  The parsed log comes back too, for its unreadable lines."""
    if megatron_log is None:
        return measurement_from_instrument(instrument_dir), None
    parsed = parse_megatron_log(megatron_log)
    measurement = measurement_from_log(parsed, skip_iterations, choose_run(parsed, log_run))
    if instrument_dir is not None:  # memory per rank from the instrumentation when the log has none
        extra = measurement_from_instrument(instrument_dir)
        if not measurement.per_rank_peak_bytes:
            measurement.per_rank_peak_bytes = extra.per_rank_peak_bytes
            measurement.memory_option = extra.memory_option
        if "world_size" in extra.stated:
            logged = measurement.stated.setdefault("world_size", extra.stated["world_size"])
            if logged != extra.stated["world_size"]:
                raise PlannerInputError("--instrument-dir", f"{instrument_dir}: its files state world size "
                                        f"{extra.stated['world_size']}, {parsed.source} states {logged}: they are of "
                                        "different runs; give the instrumentation of the logged run")
    return measurement, parsed


def read_router_stats(router_stats: str | Path | None, instrument_dir: str | Path | None,
                      num_experts: int | None) -> RouterStats | None:
    """Router statistics from --router-stats, else from the instrumentation when it recorded them."""
    if router_stats is not None:
        return load_router_stats(router_stats, num_experts=num_experts)
    if instrument_dir is not None:
        try:
            return load_router_stats(instrument_dir, num_experts=num_experts)
        except PlannerInputError:
            return None
    return None


@dataclass
class CalibrationResult:
    corrections: list[dict[str, Any]]
    report: dict[str, Any]
    evidence: list[dict[str, Any]] = field(default_factory=list)  # cells of the measured run(s), evidence.yaml
    measured_plans: list[dict[str, Any]] = field(default_factory=list)  # trials' plans and times, measured_plans.json


def evidence_cells(run: Any, cluster: Any, plan: Any, profiles: Any, run_id: str) -> list[dict[str, Any]]:
    """The conditions a measured run puts each mechanism in (those carrying at least EVIDENCE_MIN_SHARE of its
    time), as evidence.yaml cells: what `--profiles DIR` then counts as measured (planner/uncertainty.py)."""
    rm = RangeModel(run.model, run.training, cluster, profiles)
    return [cell_of(c, run_id).to_doc() for c, share in rm.shares(plan).items() if share >= EVIDENCE_MIN_SHARE]


def stage_of_rank(rank: int, ranks_per_stage: int, num_stages: int) -> int | None:
    """Megatron's default order (tp-cp-ep-dp-pp): stage s owns ranks [s*TP*CP*DP, (s+1)*TP*CP*DP)."""
    stage = rank // ranks_per_stage
    return stage if 0 <= stage < num_stages else None


def _evaluate(run: Any, cluster: Any, profiles: Any) -> tuple[Any, Any]:
    plan, _notes = plan_from_run(run, cluster, profiles)
    return plan, CostModel(run.model, run.training, cluster, profiles).evaluate(plan)


def _overlay(base: ProfileSet, device_factors: dict[str, float], global_factor: float = 1.0,
             imbalance: float | None = None) -> ProfileSet:
    """`base` with every time kind of each device multiplied by its factor and by `global_factor`, and the
    router statistics' imbalance in place (so time factors are fitted under it)."""
    factors: dict[tuple[str, str], float] = {}
    for name in base.names():
        ratio = device_factors.get(name, 1.0) * global_factor
        if ratio != 1.0:
            factors.update({(name, kind): base.correction(name, kind) * ratio for kind in TIME_KINDS})
    if imbalance is not None:
        factors[("*", IMBALANCE_KIND)] = imbalance
    return base.with_corrections(factors, Provenance(kind="calibrated", source="cli.py calibrate (fitting)"))


def stated_differences(measurement: Measurement, priced: dict[str, int]) -> list[tuple[str, int, int]]:
    """(key, what the log states, what was priced) for each STATED_OPTIONS key the log states otherwise; the
    global batch the iteration lines print (what the measured iterations ran) comes before the arguments' one
    (which --rampup-batch-size can precede)."""
    stated = dict(measurement.stated)
    if measurement.global_batch_size is not None:
        stated["gbs"] = measurement.global_batch_size
    ranks = [*measurement.per_rank_compute_s, *measurement.per_rank_peak_bytes]
    if ranks and "world_size" in priced and max(ranks) >= stated.get("world_size", priced["world_size"]):
        stated["ranks"], priced = max(ranks) + 1, {**priced, "ranks": priced["world_size"]}  # a rank not priced
    return [(key, stated[key], priced[key]) for key in STATED_OPTIONS
            if key in stated and key in priced and stated[key] != priced[key]]


def check_stated_config(measurement: Measurement, run: Any, cluster: Any) -> None:
    """Refuse a run priced with another configuration than the one its log states (world size, TP, PP,
    CP, EP, micro and global batch, sequence length, layers; a value the log does not state is not
    compared), naming each option to fix with both values (`stated_differences`)."""
    priced = {"world_size": cluster.world_size, "tp": run.parallel.tp, "pp": run.parallel.pp, "cp": run.parallel.cp,
              "ep": run.parallel.ep, "mbs": run.training.micro_batch_size, "gbs": run.training.global_batch_size,
              "seq_length": run.model.seq_length, "num_layers": run.model.num_layers}
    wrong = stated_differences(measurement, priced)
    if wrong:
        what = "; ".join(f"{STATED_OPTIONS[k]}: the log states {s}, the run priced has {p}" for k, s, p in wrong)
        raise PlannerInputError(
            STATED_OPTIONS[wrong[0][0]].split()[0],
            f"{measurement.source} was run with another configuration than the one given ({what}); corrections "
            "fitted to it would be wrong for every later estimate: pass the flags the logged run used; nothing "
            "was written")


def calibrate(
    measurement: Measurement, run: Any, cluster: Any, profiles: Any, router: RouterStats | None = None,
    *, allow_memory_excess: bool = False,
) -> CalibrationResult:
    """Fit corrections so that the cost model reproduces `measurement` (see the module docstring).
    `allow_memory_excess` (--allow-memory-excess) writes a memory correction beyond the bound (MEMORY_EXCESS_RATIO)
    with a warning instead of refusing it."""
    check_stated_config(measurement, run, cluster)
    imbalance = router.imbalance_factor() if router is not None else None
    if imbalance is not None:  # fit the time factors with the measured imbalance already in place
        profiles = _overlay(profiles, {}, 1.0, imbalance)
    plan, before = _evaluate(run, cluster, profiles)
    check_prediction(before, "the logged configuration", getattr(profiles, "user_files", ()))
    _check_measured_mfu(measurement, before, run)
    _check_ratio(measurement, before)
    ranks_per_stage = plan.tp * plan.cp * plan.stages[0].dp
    devices = sorted({s.device_type for s in before.stages})
    canonical = {d: profiles.canonical_name(d) for d in devices}
    stage_rows, device_factors = _device_factors(measurement, before, ranks_per_stage, canonical)  # 1.
    global_factor = _global_factor(measurement, run, cluster, profiles, device_factors, imbalance)  # 2.
    _check_factors(measurement, device_factors, global_factor)
    fitted = _overlay(profiles, device_factors, global_factor, imbalance)
    _check_within_peak(measurement, fitted, canonical.values())
    _, after = _evaluate(run, cluster, fitted)
    mem_diff = _memory_differences(measurement, before, stage_rows, ranks_per_stage, canonical)  # 3.
    memory_warnings = _check_memory_excess(measurement, profiles, stage_rows, canonical, allow_memory_excess)
    corrections = _corrections(measurement, run, cluster, profiles, [canonical[d] for d in devices], device_factors,
                               global_factor, mem_diff)
    _check_written(measurement, corrections)
    if router is not None and imbalance is not None:  # 4.
        corrections.append({"device": "*", "kind": IMBALANCE_KIND, "factor": round(imbalance, 6),
                            "provenance": {"kind": "calibrated",
                                           "source": f"router statistics {router.source}: max/mean tokens per "
                                                     f"expert, mean over {len(router.layer_imbalance())} "
                                                     "(iteration, layer) samples"}})
    fitted = {"device_factors": device_factors, "global_factor": global_factor, "moe_imbalance_factor": imbalance}
    report = _report(measurement, run, before, after, stage_rows, mem_diff, fitted, corrections)
    report["warnings"] += memory_warnings
    evidence = evidence_cells(run, cluster, plan, profiles, f"{measurement.source} ({measurement.date})")
    return CalibrationResult(corrections=corrections, report=report, evidence=evidence)


def _stage_ranks(per_rank: dict[int, float], stage: int, ranks_per_stage: int, num_stages: int) -> list[int]:
    return [r for r in per_rank if stage_of_rank(r, ranks_per_stage, num_stages) == stage]


def _device_factors(measurement: Measurement, before: Any, ranks_per_stage: int,
                    canonical: dict[str, str]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Step 1: per stage, the measured compute (median over its ranks' timers) against the predicted
    one; per device, the mean ratio.  Returns the report's stage rows and the device factors."""
    m = before.num_microbatches
    stage_rows = []
    device_ratios: dict[str, list[float]] = {}
    for st in before.stages:
        ranks = _stage_ranks(measurement.per_rank_compute_s, st.index, ranks_per_stage, len(before.stages))
        predicted_compute_s = m * (st.time_s - st.pp_comm_s)
        row: dict[str, Any] = {"stage": st.index, "device": st.device_type, "layers": st.num_layers,
                               "predicted_compute_s_per_iteration": predicted_compute_s}
        if ranks and predicted_compute_s > 0:
            measured = statistics.median(measurement.per_rank_compute_s[r] for r in ranks)
            row["measured_compute_s_per_iteration"] = measured
            row["compute_ratio"] = measured / predicted_compute_s
            device_ratios.setdefault(canonical[st.device_type], []).append(measured / predicted_compute_s)
        stage_rows.append(row)
    return stage_rows, {d: statistics.fmean(v) for d, v in device_ratios.items()}


def _global_factor(measurement: Measurement, run: Any, cluster: Any, profiles: Any, device_factors: dict[str, float],
                   imbalance: float | None) -> float:
    """Step 2: the global residual on iteration time.  Some parts of the iteration are under no
    correction kind, so T(g) = a*g + c: solve T(g) = measured by the secant method (T is increasing
    in g)."""
    target = measurement.iteration_time_s

    def predicted(g: float) -> float:
        return _evaluate(run, cluster, _overlay(profiles, device_factors, g, imbalance))[1].iteration_time_s

    g0, t0 = 1.0, predicted(1.0)
    g1 = target / t0
    t1 = predicted(g1)
    for _ in range(GLOBAL_FIT_ITERATIONS):
        if abs(t1 / target - 1.0) < 1e-6 or t1 == t0:
            break
        g2 = g1 + (target - t1) * (g1 - g0) / (t1 - t0)
        if g2 <= 0:
            g2 = g1 * target / t1
        g0, t0, g1, t1 = g1, t1, g2, predicted(g2)
    return g1


def _memory_differences(measurement: Measurement, before: Any, stage_rows: list[dict[str, Any]],
                        ranks_per_stage: int, canonical: dict[str, str]) -> dict[str, list[float]]:
    """Step 3: per stage, the largest max reserved among its ranks against the predicted memory
    (added to the stage rows); returns the differences per device."""
    mem_diff: dict[str, list[float]] = {}
    for st, row in zip(before.stages, stage_rows):
        row["predicted_memory_gib"] = st.memory_gib
        ranks = _stage_ranks(measurement.per_rank_peak_bytes, st.index, ranks_per_stage, len(before.stages))
        if ranks:
            measured_gib = max(measurement.per_rank_peak_bytes[r] for r in ranks) / GIB_BYTES
            row["measured_max_reserved_gib"] = measured_gib
            row["memory_difference_gib"] = measured_gib - st.memory_gib
            mem_diff.setdefault(canonical[st.device_type], []).append(measured_gib - st.memory_gib)
    return mem_diff


def _check_memory_excess(measurement: Measurement, profiles: Any, stage_rows: list[dict[str, Any]],
                         canonical: dict[str, str], allow: bool) -> list[str]:
    """Refuse a memory correction beyond the bound (MEMORY_EXCESS_RATIO x the prediction and more than
    MEMORY_EXCESS_DEVICE_SHARE of the device's memory; per device, over its measured stages, as
    `_corrections` writes it); with `allow` (--allow-memory-excess), the warnings to report instead."""
    by_device: dict[str, list[dict[str, Any]]] = {}
    for row in stage_rows:
        if "measured_max_reserved_gib" in row:
            by_device.setdefault(canonical[row["device"]], []).append(row)
    found = []
    for name, rows in by_device.items():
        predicted = statistics.fmean(r["predicted_memory_gib"] for r in rows)
        measured = statistics.fmean(r["measured_max_reserved_gib"] for r in rows)
        extra = max(0.0, statistics.fmean(r["memory_difference_gib"] for r in rows))
        capacity = profiles.device(name).memory_gib
        if (predicted > 0 and measured > MEMORY_EXCESS_RATIO * predicted
                and extra > MEMORY_EXCESS_DEVICE_SHARE * capacity):
            found.append(f"{name}: measured max reserved {measured:.2f} GiB against {predicted:.2f} GiB predicted "
                         f"({measured / predicted:.2f}x, mean over {len(rows)} stage(s)), a memory_overhead_gib of "
                         f"+{extra:.2f} GiB ({extra / capacity:.0%} of the device's {capacity:g} GiB)")
    if not found:
        return []
    bound = (f"above {MEMORY_EXCESS_RATIO:g}x the prediction and {MEMORY_EXCESS_DEVICE_SHARE:.0%} of the device's "
             "memory")
    if allow:
        return [f"memory correction {bound}, written because of --allow-memory-excess: {f}" for f in found]
    raise PlannerInputError(
        measurement.memory_option,
        f"{measurement.source}: {'; '.join(found)}: {bound}, which no allocator overhead explains; the run is not "
        "what the planner priced: check the memory flags (--recompute-*, --use-distributed-optimizer, "
        "--sequence-parallel, --mbs), the model (--model, --num-layers, hidden sizes) and the allocator settings "
        "(PYTORCH_CUDA_ALLOC_CONF), or pass --allow-memory-excess to write it anyway; nothing was written")


def _corrections(measurement: Measurement, run: Any, cluster: Any, profiles: Any, names: list[str],
                 device_factors: dict[str, float], global_factor: float,
                 mem_diff: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Every time kind of each device (the old factor times the fitted ratio), and its memory
    overhead where memory was measured (never made smaller)."""
    provenance = {"kind": "calibrated",
                  "source": f"cli.py calibrate on {measurement.source} ({measurement.date}), "
                            f"{measurement.steady_iterations} steady iterations, "
                            f"run {run.model.name} on {describe_cluster(cluster, profiles)}"}
    corrections: list[dict[str, Any]] = []
    for name in names:
        ratio = device_factors.get(name, 1.0) * global_factor
        for kind in TIME_KINDS:
            corrections.append({"device": name, "kind": kind,
                                "factor": round(profiles.correction(name, kind) * ratio, 6),
                                "provenance": dict(provenance)})
        if name in mem_diff:
            extra = max(0.0, statistics.fmean(mem_diff[name]))
            corrections.append({"device": name, "kind": MEMORY_KIND,
                                "factor": round(profiles.correction(name, MEMORY_KIND) + extra, 4),
                                "provenance": dict(provenance)})
    return corrections


def _report(measurement: Measurement, run: Any, before: Any, after: Any, stage_rows: list[dict[str, Any]],
            mem_diff: dict[str, list[float]], fitted: dict[str, Any],
            corrections: list[dict[str, Any]]) -> dict[str, Any]:
    """The calibration report: what was measured, predicted before and after, the fitted factors
    (`fitted`), what is written (`corrections`: device, kind, factor), the stage rows and the warnings."""
    warnings = skipped_step_warnings(measurement)
    if measurement.per_rank_peak_bytes and not mem_diff:
        warnings.append("memory lines name ranks outside every stage of this configuration")
    return {
        "warnings": warnings,
        "measured": {
            "source": measurement.source, "date": measurement.date,
            "iteration_time_s": measurement.iteration_time_s,
            "throughput_tflops_per_gpu": measurement.throughput_tflops,
            "forward_backward_s": measurement.forward_backward_s,
            "steady_iterations": measurement.steady_iterations, "unreadable_lines": measurement.problems,
        },
        "predicted_before": {"iteration_time_s": before.iteration_time_s, "tflops_per_gpu": before.tflops_per_gpu,
                             "error": before.iteration_time_s / measurement.iteration_time_s - 1.0},
        "predicted_after": {"iteration_time_s": after.iteration_time_s, "tflops_per_gpu": after.tflops_per_gpu,
                            "error": after.iteration_time_s / measurement.iteration_time_s - 1.0},
        **fitted,
        "written_corrections": [{"device": c["device"], "kind": c["kind"], "factor": c["factor"]} for c in corrections],
        "stages": stage_rows,
        "method": "per-device compute factor from per-rank compute timers when present, then one global factor "
                  "on the remaining iteration time; memory: mean positive excess of max reserved per device",
    }


def _check_factors(measurement: Measurement, device_factors: dict[str, float], global_factor: float) -> None:
    """Refuse a fit that no cost-model error explains: non-finite, or outside FACTOR_RANGE."""
    low, high = FACTOR_RANGE
    for name, factor in [*device_factors.items(), ("global", global_factor)]:
        if not (math.isfinite(factor) and low <= factor <= high):
            raise PlannerInputError(
                "--megatron-log",
                f"{measurement.source}: the measured times give a {name} correction of x{factor:.3g}, beyond "
                f"{low:g}..{high:g} (10x either way); the log does not come from the run the flags and --cluster "
                "describe (check the model, the parallel flags, the batch sizes and the cluster); nothing was written",
            )


def _check_within_peak(measurement: Measurement, fitted: ProfileSet, devices: Iterable[str]) -> None:
    """Refuse corrections that make a kernel of the run's devices faster than its peak
    (ProfileSet.faster_than_peak): `estimate --profiles` would refuse them."""
    faster = fitted.faster_than_peak(devices)
    if faster:
        raise PlannerInputError(
            "--megatron-log", f"{measurement.source}: fitting the measured times would make {faster[0]}, which no "
                              "kernel does: the log claims an impossible speed, or does not come from the run the "
                              "flags and --cluster describe (model, sequence, batch, parallel flags); nothing was "
                              "written")


def _check_ratio(measurement: Measurement, before: Any) -> None:
    """A measured iteration time beyond 10x the prediction either way is no cost-model error (the
    shipped calibration is within tens of percent of published runs): the log is of another run."""
    low, high = FACTOR_RANGE
    ratio = measurement.iteration_time_s / before.iteration_time_s
    if not low <= ratio <= high:
        raise PlannerInputError(
            "--megatron-log", f"{measurement.source}: {measurement.iteration_time_s:.4g} s per iteration is "
                              f"{ratio:.3g}x the prediction ({before.iteration_time_s:.4g} s) for this run, beyond "
                              f"{low:g}..{high:g}x; the log does not come from the run the flags and --cluster describe "
                              "(check the model, the parallel flags, the batch sizes and the cluster); nothing was "
                              "written")


def _check_written(measurement: Measurement, corrections: list[dict[str, Any]]) -> None:
    """The composed factors (old factor x fitted ratio) stay within what --profiles loads."""
    low, high = FACTOR_RANGE
    for c in corrections:
        if c["kind"] in TIME_KINDS and not low <= c["factor"] <= high:
            raise PlannerInputError(
                "--megatron-log", f"{measurement.source}: the {c['device']} {c['kind']} correction would be "
                                  f"x{c['factor']:.3g} (the profiles' factor times the fitted one), beyond {low:g}..{high:g}; "
                                  "the log does not come from the run the flags describe; nothing was written")


def _check_measured_mfu(measurement: Measurement, before: Any, run: Any) -> None:
    """A measured iteration faster than the devices' peak allows for this model and batch (MFU above
    100%) comes from another run: corrections fitted to it would make every later estimate implausible."""
    peak = before.peak_flop_per_s_total
    flop = before.model_flop_per_iteration
    if not (peak > 0 and flop > 0 and measurement.iteration_time_s > 0):
        return
    mfu = flop / measurement.iteration_time_s / peak
    if mfu > 1.0:
        raise PlannerInputError(
            "--megatron-log", f"{measurement.source}: {measurement.iteration_time_s:.4g} s per iteration means "
                              f"MFU {mfu:.0%} for this model and batch on these GPUs, above the devices' peak; the "
                              "log does not come from the run the flags and --cluster describe (check the model, the "
                              "global batch and the cluster); nothing was written")


def loader_accepts(kind: str) -> bool:
    """Whether planner.profile_tables accepts this kind in corrections.yaml."""
    return kind in CORRECTION_KINDS


def write_corrections(result: CalibrationResult, out_dir: str | Path, *, force: bool = False,
                      inputs: Sequence[str | Path] = ()) -> list[Path]:
    """Write DIR/corrections.yaml (entries of other devices already there are kept), DIR/evidence.yaml (the
    measured conditions, added to those already there) and DIR/calibration_report.json.  An entry kind the
    loader does not accept yet (the imbalance factor) goes to DIR/moe_imbalance.yaml instead, so
    `--profiles DIR` keeps loading."""
    out = Path(out_dir)
    path = out / "corrections.yaml"
    keep: list[dict[str, Any]] = []
    new_keys = {(c["device"], c["kind"]) for c in result.corrections}
    if path_kind(path, "--out") == "file":
        old = load_document(path, "--out") or []
        if isinstance(old, dict):
            old = old.get("corrections", [])
        if not isinstance(old, list):
            raise PlannerInputError("--out", f"{path}: expected a list of corrections, keeping them is not possible")
        keep = [c for c in old if isinstance(c, dict) and (c.get("device"), c.get("kind")) not in new_keys]
    accepted = [c for c in result.corrections if loader_accepts(c["kind"])]
    held = [c for c in result.corrections if not loader_accepts(c["kind"])]
    header = ("# Calibrated corrections written by `cli.py calibrate` (contract: profiles/README.md).\n"
              "# Time kinds multiply the modelled time; memory_overhead_gib adds GiB per GPU.\n")
    files = {"corrections.yaml": header + yaml.safe_dump(keep + accepted, sort_keys=False, width=120)}
    if held:
        files["moe_imbalance.yaml"] = (
            "# Entries the profile loader does not accept yet; pass the factor as\n"
            "# --moe-imbalance-factor / training.moe_imbalance_factor meanwhile.\n"
            + yaml.safe_dump(held, sort_keys=False, width=120))
    if result.evidence:
        have = out / EVIDENCE_YAML
        cells = list(user_region([str(have)]).cells) if path_kind(have, "--out") == "file" else []
        cells += cells_of_docs(result.evidence)
        files[EVIDENCE_YAML] = ("# Conditions measured on this cluster, written by `cli.py calibrate` "
                                "(planner/uncertainty.py reads it from --profiles DIR).\n"
                                + yaml.safe_dump({"cells": [c.to_doc() for c in Region.of(cells).cells]},
                                                 sort_keys=False, width=120))
    if result.measured_plans:
        files[MEASURED_PLANS_JSON] = json_text({"measured_plans": _merged_plans(out / MEASURED_PLANS_JSON,
                                                                                result.measured_plans)})
    files["calibration_report.json"] = json_text(result.report)
    return write_files(out, files, "--out", CALIBRATE_OUTPUT, force=force, inputs=inputs)


MEASURED_PLANS_JSON = "measured_plans.json"
"""The plans `calibrate --trials` measured (plan, what it was made for, seconds): `solve --profiles DIR` reads them
(planner/trials.py `measured_plans`) and proposes no trial of a plan measured already."""


def _merged_plans(path: Path, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured plans already in `path` (a file an earlier calibrate wrote there) that the new ones do not
    measure again, then the new ones."""
    if path_kind(path, "--out") != "file":
        return list(new)
    old = parse_json(read_text(path, "--out"), "--out", str(path))
    entries = old.get("measured_plans") if isinstance(old, dict) else None
    if not isinstance(entries, list):
        raise PlannerInputError("--out", f"{path}: expected an object with a measured_plans list; keeping its "
                                         "entries is not possible")
    again = {(json.dumps(e.get("plan"), sort_keys=True), json.dumps(e.get("made_for"), sort_keys=True)) for e in new}
    kept = [e for e in entries if isinstance(e, dict)
            and (json.dumps(e.get("plan"), sort_keys=True), json.dumps(e.get("made_for"), sort_keys=True)) not in again]
    return kept + list(new)


def _written_lines(report: dict[str, Any]) -> list[str]:
    """What corrections.yaml receives, as written (device, factor, kinds: time kinds of one device with the
    same factor on one line), then the fit's decomposition of the time factors and how it maps to them."""
    groups: dict[tuple[str, str], list[str]] = {}
    for c in report.get("written_corrections", []):
        value = (f"+{c['factor']:.2f} GiB" if c["kind"] == MEMORY_KIND else f"x{c['factor']:.4f}")
        groups.setdefault((c["device"], value), []).append(c["kind"])
    lines = ["written    (device, factor, kinds)"]
    for (device, value), kinds in groups.items():
        every = sorted(kinds) == sorted(TIME_KINDS)
        named = f"all {len(kinds)} time kinds ({', '.join(kinds)})" if every else ", ".join(kinds)
        lines.append(f"  {device:<10} {value:<12} {named}")
    device_factors, g = report["device_factors"], report["global_factor"]
    parts = "".join(f", {d} compute x{f:.4f}" for d, f in device_factors.items())
    maps = "; ".join(f"{d}: x{f:.4f} x {g:.4f} = x{f * g:.4f}" for d, f in device_factors.items())
    lines.append(f"fit        global x{g:.4f}{parts}: the fit's decomposition, not separate entries; each device's "
                 "written time factor = its --profiles factor for the kind (1 without) x its compute factor (1 without "
                 f"compute timers) x global" + (f" ({maps})" if maps else ""))
    return lines


def render_report(report: dict[str, Any]) -> str:
    """A short human summary of a calibration report."""
    meas, before, after = report["measured"], report["predicted_before"], report["predicted_after"]
    lines = [f"warning: {w}" for w in report.get("warnings", [])] + [
        f"measured   {meas['iteration_time_s']:.4f} s/iteration over {meas['steady_iterations']} steady iteration"
        f"{'' if meas['steady_iterations'] == 1 else 's'} "
        f"({meas['source']}" + (f", {meas['unreadable_lines']} unreadable lines)" if meas['unreadable_lines'] else ")"),
        f"predicted  {before['iteration_time_s']:.4f} s before ({before['error']:+.1%}), "
        f"{after['iteration_time_s']:.4f} s after calibration ({round(after['error'], 4) + 0.0:+.1%})",
    ]
    lines += _written_lines(report)
    if report.get("moe_imbalance_factor") is not None:
        lines.append(f"MoE imbalance factor {report['moe_imbalance_factor']:.4f} (max/mean tokens per expert)")
    for row in report["stages"]:
        text = f"stage {row['stage']:>2} {row['device']:<10} {row['layers']:>3} layers  predicted {row['predicted_memory_gib']:.2f} GiB"
        if "measured_max_reserved_gib" in row:
            text += f", measured max reserved {row['measured_max_reserved_gib']:.2f} GiB"
        if "compute_ratio" in row:
            text += f", compute measured/predicted {row['compute_ratio']:.3f}"
        lines.append(text)
    return "\n".join(lines)
