"""Predicted against measured for the published runs in ../shared/calibration/measured_runs.csv.

Each row's `megatron_args` is parsed exactly as given (planner.inputs.megatron_flags), its `cluster`
(`TYPE:COUNT`) through planner.inputs.cluster.parse_cluster, and priced by
planner.cost.estimate.estimate_run.  The row's `metric` is `iteration_time_s` or `tflops_per_gpu`.

The bar to beat (calibration/README.md) is the one-liner
    iteration time = Megatron's model FLOPs / (GPUs x dense peak x 0.45),
i.e. 0.45 MFU everywhere; its TFLOP/s/GPU is 0.45 x the dense peak.  Measured MFU is Megatron's model
FLOPs over (measured time x the summed dense peak of every GPU).

Errors are signed, in percent of the measured value of the row's own metric: for a TFLOP/s row a
negative error means the prediction is too slow.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd

from planner.cost.estimate import estimate_run
from planner.inputs.cluster import parse_cluster
from planner.inputs.megatron_flags import parse_megatron_flags

ONE_LINER_MFU = 0.45
"""The one-liner's assumed model-FLOPs utilisation (calibration/README.md, 'The bar to beat')."""
FAR_FROM_ONE_LINER_MFU = 0.10
"""A row is 'far from 45%' when |measured MFU - 0.45| > this (the rows the one-liner cannot get right)."""

DEFAULT_RUNS_CSV = Path(__file__).resolve().parents[3] / "shared" / "calibration" / "measured_runs.csv"
"""../shared/calibration/measured_runs.csv next to the repository root."""

COLUMNS = ("id", "metric", "measured", "predicted", "error_pct", "one_liner_pred", "one_liner_error_pct",
           "measured_mfu", "predicted_mfu", "is_moe", "far_from_one_liner")


def _error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def calibration_row(row: dict, profiles) -> dict:
    """Price one measured run and compare it with the measurement and the one-liner."""
    cluster = parse_cluster(str(row["cluster"]), profiles)
    run = parse_megatron_flags(shlex.split(str(row["megatron_args"])), world_size=cluster.world_size)
    cost = estimate_run(run, cluster, profiles)
    metric = str(row["metric"])
    measured = float(row["value"])
    flop = cost.model_flop_per_iteration
    peak_total = cost.peak_flop_per_s_total  # summed dense peak of every GPU of the plan
    one_liner_time_s = flop / (peak_total * ONE_LINER_MFU)
    if metric == "iteration_time_s":
        predicted = cost.iteration_time_s
        one_liner = one_liner_time_s
        measured_mfu = flop / (measured * peak_total)
    elif metric == "tflops_per_gpu":
        predicted = cost.tflops_per_gpu
        one_liner = flop / (one_liner_time_s * 1e12 * cost.world_size)
        measured_mfu = measured * 1e12 * cost.world_size / peak_total
    else:
        raise ValueError(f"row {row['id']}: unknown metric {metric!r}; expected iteration_time_s or tflops_per_gpu")
    return {
        "id": str(row["id"]),
        "metric": metric,
        "measured": measured,
        "predicted": predicted,
        "error_pct": _error_pct(predicted, measured),
        "one_liner_pred": one_liner,
        "one_liner_error_pct": _error_pct(one_liner, measured),
        "measured_mfu": measured_mfu,
        "predicted_mfu": cost.mfu,
        "is_moe": run.model.is_moe,
        "far_from_one_liner": abs(measured_mfu - ONE_LINER_MFU) > FAR_FROM_ONE_LINER_MFU,
    }


def calibration_table(profiles, runs_csv: str | Path | None = None) -> pd.DataFrame:
    """One row per measured run: id, metric, measured, predicted, error_pct, one_liner_pred,
    one_liner_error_pct (plus measured/predicted MFU, is_moe, far_from_one_liner)."""
    runs = pd.read_csv(runs_csv or DEFAULT_RUNS_CSV)
    rows = [calibration_row(r, profiles) for r in runs.to_dict("records")]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def format_table(table: pd.DataFrame) -> str:
    """The table as fixed-width text, with the median and worst absolute errors underneath."""
    lines = [f"{'id':28s} {'metric':15s} {'measured':>10s} {'predicted':>10s} {'err%':>7s} "
             f"{'one-liner':>10s} {'1l err%':>7s} {'MFU':>5s}"]
    for r in table.itertuples():
        lines.append(f"{r.id:28s} {r.metric:15s} {r.measured:10.3f} {r.predicted:10.3f} {r.error_pct:+7.1f} "
                     f"{r.one_liner_pred:10.3f} {r.one_liner_error_pct:+7.1f} {r.measured_mfu:5.2f}")
    abs_err = table["error_pct"].abs()
    worst = table.loc[abs_err.sort_values(ascending=False).index[:3], ["id", "error_pct"]]
    lines.append(f"median |error| {abs_err.median():.1f}% (one-liner {table['one_liner_error_pct'].abs().median():.1f}%); "
                 "worst: " + ", ".join(f"{w.id} {w.error_pct:+.1f}%" for w in worst.itertuples()))
    return "\n".join(lines)
