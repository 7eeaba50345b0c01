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
* `max_reserved_gib`: the allocator's reserved peak, which adds its cache; compared with the stage's predicted
  reserved peak (StageCost.reserved_bytes: the allocated peak and the cache planner/cost/memory.py prices for the
  run's allocator settings).

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


def load_memory_rows(*, shared: Path | None = SHARED_MEMORY_CSV, shipped: Path = SHIPPED_MEMORY_CSV) -> list[dict]:
    """Every measured-memory row, shipped first; a shared row with the same id replaces the shipped one."""
    rows: dict[str, dict] = {}
    for path in (shipped, shared):
        if path is None or not path.is_file():
            continue
        with path.open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                rows[row["id"]] = {**row, "origin": str(path)}
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
    predicted_reserved_gib: float = 0.0

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
    predicted = st.allocated_bytes if row["metric"] == "max_allocated_gib" else st.reserved_bytes
    return MemoryRow(
        id=row["id"], metric=row["metric"], measured_gib=float(row["value"]),
        predicted_gib=predicted / GIB_BYTES, stage=st.index,
        predicted_allocated_gib=st.allocated_bytes / GIB_BYTES, predicted_reserved_gib=st.reserved_bytes / GIB_BYTES,
        weights_grads_optimizer_gib=(st.weights_bytes + st.grads_bytes + st.optimizer_bytes) / GIB_BYTES,
        activations_gib=st.activations_bytes / GIB_BYTES, outside_allocator_gib=st.other_bytes / GIB_BYTES,
        source=row.get("source", ""),
    )


def memory_rows(profiles, rows: list[dict] | None = None) -> list[MemoryRow]:
    notes = load_memory_annotations()
    rows = load_memory_rows() if rows is None else rows
    out = []
    for r in rows:
        note = notes.get(r["id"], {})
        out.append(memory_row(r, profiles, note.get("stage", "max"), note.get("expandable_segments")))
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


def summarise(rows: list[MemoryRow]) -> MemorySummary:
    errs = [r.error_pct for r in rows]
    return MemorySummary(
        rows=len(rows), median_abs_pct=statistics.median(abs(e) for e in errs),
        worst_pct=max(errs, key=abs), signed_median_pct=statistics.median(errs), worst_under_pct=min(errs),
        under_10_pct=sum(e < TARGET_WORST_UNDER_PCT for e in errs),
    )


def memory_text(rows: list[MemoryRow]) -> str:
    """The memory part of the calibration report."""
    lines = [f"{'measured peak memory':46s} {'metric':10s} {'stage':>5s} {'measured':>8s} {'predicted':>9s} "
             f"{'err%':>6s}  {'allocated/reserved':>18s}  static/activations GiB"]
    for r in rows:
        metric = "allocated" if r.metric == "max_allocated_gib" else "reserved"
        lines.append(f"{r.id:46s} {metric:10s} {r.stage:5d} {r.measured_gib:8.2f} {r.predicted_gib:9.2f} "
                     f"{r.error_pct:+6.1f}  {r.predicted_allocated_gib:8.2f}/{r.predicted_reserved_gib:<9.2f}  "
                     f"{r.weights_grads_optimizer_gib:.2f}/{r.activations_gib:.2f}")
    s = summarise(rows)
    lines.append(f"memory |error|: median {s.median_abs_pct:.1f}% (target <= {TARGET_MEDIAN_ABS_PCT:g}%), worst "
                 f"{s.worst_pct:+.1f}%, signed median {s.signed_median_pct:+.1f}%; {s.under_10_pct} of {s.rows} "
                 f"predicted more than 10% below the measurement (target 0)")
    return "\n".join(lines)
