"""Derive profiles/uncertainty.yaml from the calibration set: the memory headroom and the per-mechanism time
uncertainties (what planner/uncertainty.py loads and planner/cost/ranges.py applies).

Memory headroom.  Over the measured peaks of torch-allocated memory (planner/calibration/memory.py), r_i =
measured / predicted.  A plan is accepted when its prediction is at most (1 - h) of the device's memory; the run
then fits if r (1 - h) <= 1.  The default headroom is the smallest whole percent with r_i (1 - h) <= 1 for every
row: the worst measured under-prediction would still have fitted.  The fit check applies it to the reserved peak
(the allocated one and the allocator's cache, planner/cost/memory.py).  Rows of reserved memory are reported beside
it, not used: the ones the calibration has are a whole run's peak (checkpoint loading inside it), not an
iteration's.

Time uncertainty.  Each calibration row gives its held-out relative residual e_i = (predicted - measured) /
measured (predicted by a fit that did not see the row, or its source) and the share s_ik of its predicted time
each mechanism family k carries (`planner.cost.ranges.time_shares`).  Per family and side, the share-weighted
mean of the one-sided residual magnitudes: slow_k = sum_i s_ik max(0, -e_i) / sum_i s_ik (the model too fast:
runs slower than predicted), fast_k likewise from max(0, e_i).  Both are then scaled by one factor c, the least
that makes the held-out range of COVERAGE_TARGET of the rows contain their measurement: a row's range is
[T / (1 + c sum_k fast_k s_ik), T / (1 - c sum_k slow_k s_ik)], the first-order form of what the range model
computes.  Twelve weighted means and one scale.  (Non-negative least squares of the residuals on the shares was
tried first: on these rows, most of whose time is GEMMs, it put the whole error on two families at the cap and
none on the rest.)
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass

import numpy as np
import yaml

from planner.calibration.memory import MemoryRow
from planner.calibration.runs import CalibrationCase
from planner.cost.ranges import MAX_UNCERTAINTY, MECHANISMS, time_shares
from planner.uncertainty import UNCERTAINTY_YAML, Uncertainty

COVERAGE_TARGET = 0.8
"""The fraction of held-out calibration rows whose measured time the range must contain."""


@dataclass(frozen=True)
class HeldOutResidual:
    """One calibration row for the uncertainty fit: its source (publication), its held-out relative residual
    (predicted - measured) / measured of the seconds per iteration, and its predicted time's share per
    mechanism family."""

    id: str
    source: str
    relative_residual: float
    shares: dict[str, float]


def held_out_residuals(cases: list[CalibrationCase], profiles, held_out_s: dict[str, float]) -> list[HeldOutResidual]:
    """The rows of the fit: `held_out_s` maps a row id to its predicted seconds per iteration from a fit that did
    not see it (leave-one-out today; leave-one-source-out where the calibration provides it)."""
    out = []
    for c in cases:
        if c.id not in held_out_s:
            continue
        measured = c.seconds_per_iteration()
        shares = time_shares(c.run.model, c.run.training, c.cluster, profiles, c.plan)
        out.append(HeldOutResidual(c.id, c.source, held_out_s[c.id] / measured - 1.0, shares))
    return out


@dataclass(frozen=True)
class MechanismFit:
    slow: dict[str, float]
    fast: dict[str, float]
    scale: float
    coverage: float
    rows: int

    def mechanisms(self) -> dict[str, float]:
        out = {}
        for family in MECHANISMS:
            out[f"{family}.slow"] = round(min(MAX_UNCERTAINTY, self.scale * self.slow[family]), 4)
            out[f"{family}.fast"] = round(min(MAX_UNCERTAINTY, self.scale * self.fast[family]), 4)
        return out


def _covered(r: HeldOutResidual, slow: dict[str, float], fast: dict[str, float], c: float) -> bool:
    up = min(MAX_UNCERTAINTY, c * sum(slow[k] * r.shares.get(k, 0.0) for k in MECHANISMS))
    down = c * sum(fast[k] * r.shares.get(k, 0.0) for k in MECHANISMS)
    ratio = 1.0 / (1.0 + r.relative_residual)  # measured over predicted
    return 1.0 / (1.0 + down) - 1e-12 <= ratio <= 1.0 / (1.0 - up) + 1e-12


def _weighted_mean(residuals: list[HeldOutResidual], family: str, values: np.ndarray) -> float:
    w = np.array([r.shares.get(family, 0.0) for r in residuals])
    return float(w @ values / w.sum()) if w.sum() > 0 else 0.0


def fit_mechanisms(residuals: list[HeldOutResidual]) -> MechanismFit:
    """Per family and side, the share-weighted mean of the one-sided held-out residuals, then the coverage
    scale (see the module docstring)."""
    e = np.array([r.relative_residual for r in residuals])
    slow = {k: _weighted_mean(residuals, k, np.maximum(0.0, -e)) for k in MECHANISMS}
    fast = {k: _weighted_mean(residuals, k, np.maximum(0.0, e)) for k in MECHANISMS}
    scale = 1.0
    for _ in range(200):
        cov = sum(_covered(r, slow, fast, scale) for r in residuals) / max(1, len(residuals))
        if cov >= COVERAGE_TARGET:
            break
        scale *= 1.05
    cov = sum(_covered(r, slow, fast, scale) for r in residuals) / max(1, len(residuals))
    return MechanismFit(slow=slow, fast=fast, scale=scale, coverage=cov, rows=len(residuals))


def memory_headroom(rows: list[MemoryRow]) -> tuple[float, str]:
    """The default headroom and the sentence that says where it comes from (see the module docstring)."""
    allocated = [r for r in rows if r.metric == "max_allocated_gib"]
    worst = max(allocated, key=lambda r: r.under_ratio)
    h = max(0.0, math.ceil(100 * (1.0 - 1.0 / worst.under_ratio) - 1e-9) / 100)
    reserved = [r for r in rows if r.metric != "max_allocated_gib"]
    src = (f"smallest whole percent h with measured <= predicted / (1 - h) on every measured allocated peak "
           f"({len(allocated)} rows of planner/calibration/published/measured_memory.csv); the worst, {worst.id}, "
           f"measured {worst.measured_gib:.2f} GiB against {worst.predicted_gib:.2f} predicted "
           f"({worst.error_pct:+.1f}%)")
    if reserved:
        src += ("; not used: " + ", ".join(f"{r.id} ({r.error_pct:+.1f}% on the reserved peak)" for r in reserved)
                + ", a whole run's reserved peak (checkpoint loading inside it), not an iteration's: raise "
                "--memory-headroom to cover such peaks")
    return h, src


def uncertainty_yaml(headroom: float, headroom_source: str, fit: MechanismFit, residual_kind: str) -> str:
    today = _dt.date.today().isoformat()
    header = ("# How far the cost model can be trusted (planner/uncertainty.py loads it).\n"
              "# Written by `python -m planner.calibration.report --write` (planner/calibration/uncertainty.py) on "
              f"{today}; do not edit by hand.\n")
    doc = {
        "memory": {"headroom": headroom, "provenance": {"kind": "calibrated", "source": headroom_source}},
        "time": {
            "method": (f"per mechanism family, the mean of the {residual_kind} one-sided relative "
                       f"residuals of {fit.rows} calibration rows, weighted by each row's time share of the family "
                       f"(slow: runs slower than predicted; fast: faster), scaled by {fit.scale:.3f} so that the range of "
                       f"{100 * fit.coverage:.0f}% of the rows contains their measurement (target "
                       f"{100 * COVERAGE_TARGET:.0f}%); a plan's range divides each family's seconds by (1 - slow) "
                       f"at the high end and by (1 + fast) at the low end (planner/cost/ranges.py)"),
            "mechanisms": fit.mechanisms(),
            "provenance": {"kind": "calibrated", "source": f"planner.calibration.uncertainty on {fit.rows} "
                           f"published runs (planner/calibration/published/measured_runs.csv and the shared rows)"},
        },
    }
    return header + yaml.safe_dump(doc, sort_keys=False, width=120)


def stale(shipped: Uncertainty, headroom: float, fit: MechanismFit) -> list[str]:
    """What differs between the shipped file and a fresh derivation (empty: up to date)."""
    out = []
    if abs(shipped.memory_headroom - headroom) > 1e-9:
        out.append(f"memory.headroom {shipped.memory_headroom} != {headroom}")
    fresh = fit.mechanisms()
    for k, v in fresh.items():
        if abs(shipped.mechanisms.get(k, -1.0) - v) > 0.005:
            out.append(f"time.mechanisms.{k} {shipped.mechanisms.get(k)} != {v}")
    return out


__all__ = ["COVERAGE_TARGET", "HeldOutResidual", "MechanismFit", "UNCERTAINTY_YAML", "fit_mechanisms",
           "held_out_residuals", "memory_headroom", "stale", "uncertainty_yaml"]
