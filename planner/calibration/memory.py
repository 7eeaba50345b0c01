"""The memory model against measured peak memory of Megatron-family runs.

`planner/calibration/published/measured_memory.csv` ships the measured peaks (a copy of
`../shared/calibration/measured_memory.csv`, which is read too when present, plus the rows the calibration set's
notes carry), each with its source; `memory_annotations.csv` says which stage each row's measurement is of (the
last rank, the first, or the maximum over the model-parallel group) and the run's allocator settings where its
source states them (`expandable_segments`).

The metric says what was measured:
* `max_allocated_gib`: torch's allocated peak (Megatron's `mem-max-allocated-bytes`), compared with the stage's
  predicted allocated memory (weights, gradients, optimizer states, activations; no context, no communicator
  buffers: they live outside torch's allocator);
* `max_reserved_gib`: the allocator's reserved peak, which adds its cache; compared with the reserved peak the
  stage's run records (StageCost.recorded_reserved_bytes: the needed reserved peak, the allocated one and the cache
  planner/cost/memory.py prices for the run's allocator settings, and where tensor sizes vary between
  micro-batches the share RECORDED_CACHE_SHARE of the device memory left above it).

Two constants are fitted here: the share (`fit_recorded_cache_share`) and the torch-allocated memory the itemised
terms leave out (`fit_unitemised_gib`, planner/cost/memory.py UNITEMISED_ALLOCATED_GIB); `loso_errors` prices each
row with both fitted on the other sources' rows.

The errors feed the memory headroom (planner/calibration/uncertainty.py): the fraction of memory a plan keeps free
so that the worst measured under-prediction would still have fitted.
"""

from __future__ import annotations

import csv
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

from planner.calibration.runs import PUBLISHED_DIR
from planner.cost.estimate import plan_from_run
from planner.cost.memory import RECORDED_CACHE_SHARE, UNITEMISED_ALLOCATED_GIB, shapes_vary
from planner.cost.model import CostModel, StageCost
from planner.inputs.cluster import parse_cluster
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.units import GIB_BYTES

SHIPPED_MEMORY_CSV = PUBLISHED_DIR / "measured_memory.csv"
MEMORY_ANNOTATIONS_CSV = PUBLISHED_DIR / "memory_annotations.csv"
SHARED_MEMORY_CSV = Path(__file__).resolve().parents[3] / "shared" / "calibration" / "measured_memory.csv"
MEMORY_METRICS = ("max_allocated_gib", "max_reserved_gib")
STAGES = ("first", "last", "max")
TARGET_MEDIAN_ABS_PCT = 10.0
TARGET_WORST_UNDER_PCT = -10.0
VALIDATOR_ONLY_FLAGS = ("--moe-permute-fusion",)


SUPERSEDED = {
    "H100-swift-qwen3-30b-a3b-pp2ep8-sft": "A800-swift-qwen3-30b-a3b-tp2ep8-sft",
}
"""Rows of the shared copy the shipped file corrects under a new id (old id -> new): ms-swift's '16 * 60GiB' was
measured on 16 A800 with the script's April 2025 flags (TP2 EP8), not with the PP2 flags on H100 the shared row
carries (measured_memory.csv notes)."""


def load_memory_rows(*, shared: Path | None = SHARED_MEMORY_CSV, shipped: Path = SHIPPED_MEMORY_CSV) -> list[dict]:
    """Every measured-memory row, shipped first; a shared row with an id the shipped file has is left out (the
    shipped row is the curated one, as in runs.load_runs), and so is a shared row the shipped file corrects under a
    new id (SUPERSEDED)."""
    rows: dict[str, dict] = {}
    for path in (shipped, shared):
        if path is None or not path.is_file():
            continue
        with path.open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                if row["id"] not in SUPERSEDED:
                    rows.setdefault(row["id"], {**row, "origin": str(path)})
    return list(rows.values())


def load_memory_annotations(path: Path = MEMORY_ANNOTATIONS_CSV) -> dict[str, dict]:
    """id -> {"stage": which stage was measured, "expandable_segments": True/False, or None: not stated}."""
    with path.open(newline="", encoding="utf-8") as fh:
        return {r["id"]: {"stage": r["measured_stage"],
                          "expandable_segments": {"true": True, "false": False}.get(r.get("expandable_segments", ""))}
                for r in csv.DictReader(fh)}


@dataclass(frozen=True)
class MemoryRow:
    """One measured peak against the prediction of the stage it was measured on."""

    id: str
    metric: str
    measured_gib: float
    predicted_gib: float  # of the row's metric: allocated, or reserved
    stage: int
    weights_grads_optimizer_gib: float
    activations_gib: float
    outside_allocator_gib: float  # context + communicator buffers (not in the comparison)
    source: str
    predicted_allocated_gib: float = 0.0
    predicted_reserved_gib: float = 0.0  # needed (the fit check's), without the recorded cache
    free_gib: float = 0.0  # device memory left to the allocator above the needed reserved peak
    shapes_vary: bool = False  # tensor sizes change between micro-batches (planner/cost/memory.py shapes_vary)
    unitemised_gib: float = 0.0  # the unitemised allocated memory the prediction includes (UNITEMISED_ALLOCATED_GIB)

    @property
    def source_key(self) -> str:
        """The publisher (the repository the source names first): leave-one-source-out holds out its rows."""
        return self.source.split()[0] if self.source else self.id

    def recorded_gib(self, share: float, shift_gib: float = 0.0) -> float:
        """The recorded reserved peak with `share` of the free memory (0 where the shapes are fixed), the needed
        peak moved by `shift_gib` (and the free memory above it by as much the other way)."""
        free = max(0.0, self.free_gib - shift_gib)
        return self.predicted_reserved_gib + shift_gib + (share if self.shapes_vary else 0.0) * free

    def error_with_share_pct(self, share: float, unitemised_gib: float | None = None) -> float:
        """The error of the row priced with `share` (reserved rows) and `unitemised_gib` (None: as priced)."""
        shift = 0.0 if unitemised_gib is None else unitemised_gib - self.unitemised_gib
        predicted = (self.predicted_gib + shift if self.metric == "max_allocated_gib"
                     else self.recorded_gib(share, shift))
        return 100.0 * (predicted - self.measured_gib) / self.measured_gib

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_gib - self.measured_gib) / self.measured_gib

    @property
    def under_ratio(self) -> float:
        """Measured over predicted: how much more a run took than the model said (1.0: exact)."""
        return self.measured_gib / self.predicted_gib


def _stage_of(stages: tuple[StageCost, ...], which: str) -> StageCost:
    if which == "first":
        return stages[0]
    if which == "last":
        return stages[-1]
    return max(stages, key=lambda s: s.allocated_bytes)


def memory_row(row: dict, profiles, which: str, expandable_segments: bool | None = None) -> MemoryRow:
    """Price one measured row (headroom 0: the comparison is of bytes, not of fitting) with the run's allocator
    settings (None: not stated, as the planner assumes them)."""
    if row["metric"] not in MEMORY_METRICS:
        raise ValueError(f"memory row {row['id']}: metric {row['metric']!r}; expected one of {MEMORY_METRICS}")
    if which not in STAGES:
        raise ValueError(f"memory row {row['id']}: measured stage {which!r}; expected one of {STAGES}")
    cluster = parse_cluster(row["cluster"], profiles)
    run = parse_megatron_flags(shlex.split(row["megatron_args"]), world_size=cluster.world_size)
    run = run.model_copy(update={"training": run.training.model_copy(
        update={"expandable_segments": expandable_segments})})
    plan, _ = plan_from_run(run, cluster, profiles)
    cost = CostModel(run.model, run.training, cluster, profiles, memory_headroom=0.0).evaluate(plan)
    st = _stage_of(cost.stages, which)
    predicted = st.allocated_bytes if row["metric"] == "max_allocated_gib" else st.recorded_reserved_bytes
    return MemoryRow(
        id=row["id"], metric=row["metric"], measured_gib=float(row["value"]),
        predicted_gib=predicted / GIB_BYTES, stage=st.index,
        predicted_allocated_gib=st.allocated_bytes / GIB_BYTES, predicted_reserved_gib=st.reserved_bytes / GIB_BYTES,
        weights_grads_optimizer_gib=(st.weights_bytes + st.grads_bytes + st.optimizer_bytes) / GIB_BYTES,
        activations_gib=st.activations_bytes / GIB_BYTES, outside_allocator_gib=st.other_bytes / GIB_BYTES,
        source=row.get("source", ""),
        free_gib=max(0.0, st.device_memory_bytes - st.other_bytes - st.reserved_bytes) / GIB_BYTES,
        shapes_vary=shapes_vary(run.model), unitemised_gib=st.unitemised_bytes / GIB_BYTES,
    )


def memory_rows(profiles, rows: list[dict] | None = None) -> list[MemoryRow]:
    notes = load_memory_annotations()
    rows = load_memory_rows() if rows is None else rows
    out = []
    for r in rows:
        note = notes.get(r["id"], {})
        out.append(memory_row(r, profiles, note.get("stage", "max"), note.get("expandable_segments")))
    return out


def fit_recorded_cache_share(rows: list[MemoryRow]) -> float | None:
    """RECORDED_CACHE_SHARE from measured reserved peaks of variable-shape runs: the median over them of
    (measured - needed reserved) / free memory, within [0, 1]; None without such rows."""
    shares = [min(1.0, max(0.0, (r.measured_gib - r.predicted_reserved_gib) / r.free_gib)) for r in rows
              if r.metric == "max_reserved_gib" and r.shapes_vary and r.free_gib > 0]
    return statistics.median(shares) if shares else None


def fit_unitemised_gib(rows: list[MemoryRow]) -> float | None:
    """UNITEMISED_ALLOCATED_GIB from measured allocated peaks: the median over them of the measured peak less the
    itemised prediction (weights, gradients, optimizer state, activations); None without such rows."""
    gaps = [r.measured_gib - (r.predicted_gib - r.unitemised_gib) for r in rows if r.metric == "max_allocated_gib"]
    return statistics.median(gaps) if gaps else None


def loso_errors(rows: list[MemoryRow]) -> dict[str, float]:
    """Leave-one-source-out: each row's error (%) with the share and the unitemised memory fitted on the other
    sources' rows (share 0 when none of them measured a reserved peak of a variable-shape run; unitemised 0 when
    none measured an allocated peak)."""
    out = {}
    for r in rows:
        others = [o for o in rows if o.source_key != r.source_key]
        share = fit_recorded_cache_share(others)
        out[r.id] = r.error_with_share_pct(share or 0.0, fit_unitemised_gib(others) or 0.0)
    return out


@dataclass(frozen=True)
class MemorySummary:
    rows: int
    median_abs_pct: float
    worst_pct: float  # the signed error of largest magnitude
    signed_median_pct: float
    worst_under_pct: float  # the most negative error (a prediction below the measurement)
    under_10_pct: int  # rows predicted more than 10% below their measurement

    @property
    def meets_targets(self) -> bool:
        return self.median_abs_pct <= TARGET_MEDIAN_ABS_PCT and self.worst_under_pct >= TARGET_WORST_UNDER_PCT


def summarise(rows: list[MemoryRow], errors: dict[str, float] | None = None) -> MemorySummary:
    """Median and worst error of `rows` (their own errors, or `errors` by id: leave-one-source-out)."""
    errs = [r.error_pct if errors is None else errors[r.id] for r in rows]
    return MemorySummary(
        rows=len(rows), median_abs_pct=statistics.median(abs(e) for e in errs),
        worst_pct=max(errs, key=abs), signed_median_pct=statistics.median(errs), worst_under_pct=min(errs),
        under_10_pct=sum(e < TARGET_WORST_UNDER_PCT for e in errs),
    )


def memory_text(rows: list[MemoryRow]) -> str:
    """The memory part of the calibration report."""
    lines = [f"{'measured peak memory':46s} {'metric':10s} {'stage':>5s} {'measured':>8s} {'predicted':>9s} "
             f"{'err%':>6s}  {'allocated/needed':>18s}  static/activations GiB"]
    for r in rows:
        metric = "allocated" if r.metric == "max_allocated_gib" else "reserved"
        lines.append(f"{r.id:46s} {metric:10s} {r.stage:5d} {r.measured_gib:8.2f} {r.predicted_gib:9.2f} "
                     f"{r.error_pct:+6.1f}  {r.predicted_allocated_gib:8.2f}/{r.predicted_reserved_gib:<9.2f}  "
                     f"{r.weights_grads_optimizer_gib:.2f}/{r.activations_gib:.2f}")
    for label, errors in (("memory |error|", None), ("leave-one-source-out", loso_errors(rows))):
        s = summarise(rows, errors)
        lines.append(f"{label}: median {s.median_abs_pct:.1f}% (target <= {TARGET_MEDIAN_ABS_PCT:g}%), worst "
                     f"{s.worst_pct:+.1f}%, signed median {s.signed_median_pct:+.1f}%; {s.under_10_pct} of {s.rows} "
                     f"predicted more than 10% below the measurement (target 0)")
    fitted = fit_recorded_cache_share(rows)
    lines.append(f"recorded cache share (reserved peaks of variable-shape runs): shipped {RECORDED_CACHE_SHARE:.2f}, "
                 + (f"fitted {fitted:.2f}" if fitted is not None else "no row to fit it on")
                 + " (planner/cost/memory.py RECORDED_CACHE_SHARE)")
    unitemised = fit_unitemised_gib(rows)
    lines.append(f"unitemised allocated memory (allocated peaks less weights, gradients, optimizer state and "
                 f"activations): shipped {UNITEMISED_ALLOCATED_GIB:.2f} GiB, "
                 + (f"fitted {unitemised:.2f} GiB" if unitemised is not None else "no row to fit it on")
                 + " (planner/cost/memory.py UNITEMISED_ALLOCATED_GIB)")
    return "\n".join(lines)
