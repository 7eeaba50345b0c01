"""Calibration report: the cost model against every published measured run.

    python -m planner.calibration.report            # table, targets, pairs, memory (shipped corrections)
    python -m planner.calibration.report --loo      # plus leave-one-out errors (refits per row)
    python -m planner.calibration.report --write    # refit; rewrite profiles/corrections.yaml and uncertainty.yaml
    python -m planner.calibration.report --json     # the same figures as one JSON object

Errors are signed, in percent of the measured value of the row's own metric (a negative error on a
TFLOP/s row means the prediction is too slow).  The one-liner is calibration/README.md's bar:
iteration time = Megatron's model FLOPs / (GPUs x dense BF16 peak x 0.45).  MFU is Megatron's model FLOPs
over (seconds x summed dense BF16 peak of every GPU).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from planner.calibration.fit import FIT_PARAMS, Fit, fit, leave_one_out
from planner.calibration.memory import MemoryRow, memory_rows, memory_text, summarise
from planner.calibration.uncertainty import (
    COVERAGE_TARGET, MechanismFit, fit_mechanisms, held_out_residuals, memory_headroom, stale as uncertainty_stale,
    uncertainty_yaml,
)
from planner.uncertainty import UNCERTAINTY_YAML, load_uncertainty
from planner.calibration.runs import CalibrationCase, cases, load_runs
from planner.profile_tables import PROFILES_DIR, ProfileSet
from planner.schemas.device import Provenance

ONE_LINER_MFU = 0.45
FAR_FROM_ONE_LINER_MFU = 0.10
TARGET_MEDIAN_PCT = 8.0
TARGET_WORST_PCT = 20.0
CORRECTIONS_YAML = PROFILES_DIR / "corrections.yaml"


def _err_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


@dataclass(frozen=True)
class Row:
    id: str
    metric: str
    measured: float
    predicted: float
    error_pct: float
    one_liner: float
    one_liner_error_pct: float
    measured_mfu: float
    predicted_mfu: float
    is_moe: bool
    memory_gib: float
    capacity_gib: float
    fits: bool
    memory_settings: str
    measured_s: float
    predicted_s: float
    loo_error_pct: float | None = None

    @property
    def far_from_one_liner(self) -> bool:
        return abs(self.measured_mfu - ONE_LINER_MFU) > FAR_FROM_ONE_LINER_MFU


def dense_peak_total(case: CalibrationCase, profiles: ProfileSet) -> float:
    """Summed dense BF16 (FP16 on parts without BF16) peak of every GPU of the run, FLOP/s."""
    total = 0.0
    for s in case.plan.stages:
        dev = profiles.device(s.device_type)
        key = "bf16" if "bf16" in dev.peak_tflops else "fp16"
        total += case.plan.tp * case.plan.cp * s.dp * dev.peak_tflops[key] * 1e12
    return total


def in_metric(case: CalibrationCase, seconds: float) -> float:
    if case.metric == "iteration_time_s":
        return seconds
    return case.model_flop / (seconds * 1e12 * case.cluster.world_size)


def row_of(case: CalibrationCase, profiles: ProfileSet, loo_s: float | None = None) -> Row:
    cost = case.price(profiles)
    flop = case.model_flop
    peak = dense_peak_total(case, profiles)
    one_liner_s = flop / (peak * ONE_LINER_MFU)
    measured_s = case.seconds_per_iteration()
    # a measured run ran: it must be predicted to fit in the device's memory (the planning headroom aside)
    worst = max(cost.stages, key=lambda s: s.memory_bytes / s.device_memory_bytes)
    predicted = in_metric(case, cost.iteration_time_s)
    return Row(
        id=case.id, metric=case.metric, measured=case.measured, predicted=predicted,
        error_pct=_err_pct(predicted, case.measured), one_liner=in_metric(case, one_liner_s),
        one_liner_error_pct=_err_pct(in_metric(case, one_liner_s), case.measured),
        measured_mfu=flop / (measured_s * peak), predicted_mfu=flop / (cost.iteration_time_s * peak),
        is_moe=case.run.model.is_moe, memory_gib=worst.memory_gib, capacity_gib=worst.device_memory_bytes / 2**30,
        fits=all(s.memory_bytes <= s.device_memory_bytes for s in cost.stages), memory_settings=case.memory_settings, measured_s=measured_s,
        predicted_s=cost.iteration_time_s,
        loo_error_pct=None if loo_s is None else _err_pct(in_metric(case, loo_s), case.measured),
    )


@dataclass(frozen=True)
class PairCheck:
    faster_measured: str
    slower_measured: str
    measured_ratio: float
    predicted_ratio: float

    @property
    def ordered(self) -> bool:
        return self.predicted_ratio > 1.0


def pair_checks(all_cases: list[CalibrationCase], rows: dict[str, Row]) -> list[PairCheck]:
    """Every pair of rows on one model, cluster and batch (see CalibrationCase.group): is the one that
    measured faster also predicted faster?"""
    groups: dict[tuple, list[CalibrationCase]] = {}
    for c in all_cases:
        groups.setdefault(c.group, []).append(c)
    out = []
    for members in groups.values():
        for a, b in itertools.combinations(members, 2):
            ra, rb = rows[a.id], rows[b.id]
            fast, slow = (ra, rb) if ra.measured_s <= rb.measured_s else (rb, ra)
            out.append(PairCheck(fast.id, slow.id, slow.measured_s / fast.measured_s,
                                 slow.predicted_s / fast.predicted_s))
    return out


@dataclass
class Report:
    rows: list[Row]
    pairs: list[PairCheck]
    factors: dict[str, float]
    fit_rows: dict[str, tuple[str, ...]]
    stale: list[str]
    loo: bool
    memory: list[MemoryRow] = field(default_factory=list)  # measured peak memory (planner/calibration/memory.py)
    uncertainty: MechanismFit | None = None  # per-mechanism time uncertainty (with --loo / --write)

    def summary(self) -> dict:
        def stats(rs: list[Row], attr: str) -> dict:
            vals = [abs(getattr(r, attr)) for r in rs if getattr(r, attr) is not None]
            if not vals:
                return {"median_abs_pct": None, "worst_abs_pct": None, "rows": 0}
            return {"median_abs_pct": statistics.median(vals), "worst_abs_pct": max(vals), "rows": len(vals)}

        dense = [r for r in self.rows if not r.is_moe]
        moe = [r for r in self.rows if r.is_moe]
        known = [r for r in self.rows if r.memory_settings == "known"]
        out = {
            "rows": len(self.rows),
            "in_sample": stats(self.rows, "error_pct"),
            "in_sample_dense": stats(dense, "error_pct"),
            "in_sample_moe": stats(moe, "error_pct"),
            "one_liner": stats(self.rows, "one_liner_error_pct"),
            "pairs": len(self.pairs),
            "pairs_ordered": sum(p.ordered for p in self.pairs),
            "memory_known_rows": len(known),
            "memory_known_fit": sum(r.fits for r in known),
            "beats_one_liner_moe": all(abs(r.error_pct) < abs(r.one_liner_error_pct) for r in moe),
            "beats_one_liner_far": all(abs(r.error_pct) < abs(r.one_liner_error_pct)
                                       for r in self.rows if r.far_from_one_liner),
        }
        if self.loo:
            out["leave_one_out"] = stats(self.rows, "loo_error_pct")
            out["leave_one_out_moe"] = stats(moe, "loo_error_pct")
        return out

    def to_json(self) -> dict:
        return {
            "summary": self.summary(),
            "targets": {"median_abs_pct": TARGET_MEDIAN_PCT, "worst_abs_pct": TARGET_WORST_PCT},
            "rows": [r.__dict__ | {"far_from_one_liner": r.far_from_one_liner} for r in self.rows],
            "pairs": [p.__dict__ | {"ordered": p.ordered} for p in self.pairs],
            "factors": self.factors,
            "fit_rows": {k: list(v) for k, v in self.fit_rows.items()},
            "stale_corrections": self.stale,
            "memory": {"rows": [r.__dict__ | {"error_pct": r.error_pct} for r in self.memory],
                       "summary": summarise(self.memory).__dict__ if self.memory else None},
        }

    def text(self) -> str:
        lines = [f"{'id':38s} {'metric':8s} {'measured':>9s} {'predicted':>9s} {'err%':>6s} "
                 + (f"{'LOO%':>6s} " if self.loo else "")
                 + f"{'1-liner%':>8s} {'MFU':>5s} {'mem GiB':>12s}"]
        for r in self.rows:
            metric = "s/iter" if r.metric == "iteration_time_s" else "TFLOP/s"
            mem = f"{r.memory_gib:5.1f}/{r.capacity_gib:<4.0f}{'' if r.fits else '!'}"
            mark = {"known": "k", "unknown": " ", "unclassified": "?"}[r.memory_settings]
            lines.append(
                f"{r.id:38s} {metric:8s} {r.measured:9.3f} {r.predicted:9.3f} {r.error_pct:+6.1f} "
                + (f"{r.loo_error_pct:+6.1f} " if self.loo else "")
                + f"{r.one_liner_error_pct:+8.1f} {r.measured_mfu:5.2f} {mem:>11s}{mark}")
        s = self.summary()
        ins = s["in_sample"]
        lines.append("")
        lines.append(f"in-sample |error|: median {ins['median_abs_pct']:.1f}% (target <= {TARGET_MEDIAN_PCT:g}%), "
                     f"worst {ins['worst_abs_pct']:.1f}% (target <= {TARGET_WORST_PCT:g}%); dense median "
                     f"{s['in_sample_dense']['median_abs_pct']:.1f}%, MoE median {s['in_sample_moe']['median_abs_pct']:.1f}%; "
                     f"one-liner median {s['one_liner']['median_abs_pct']:.1f}%")
        if self.loo:
            lo, lm = s["leave_one_out"], s["leave_one_out_moe"]
            lines.append(f"leave-one-out |error|: median {lo['median_abs_pct']:.1f}%, worst {lo['worst_abs_pct']:.1f}% "
                         f"(MoE rows: median {lm['median_abs_pct']:.1f}%, worst {lm['worst_abs_pct']:.1f}%)")
        lines.append(f"plan pairs ordered as measured: {s['pairs_ordered']} of {s['pairs']}")
        for p in self.pairs:
            lines.append(f"  {'ok   ' if p.ordered else 'WRONG'} {p.faster_measured} faster than {p.slower_measured}: "
                         f"measured x{p.measured_ratio:.3f}, predicted x{p.predicted_ratio:.3f}")
        lines.append(f"runs with known memory settings predicted to fit: {s['memory_known_fit']} of "
                     f"{s['memory_known_rows']} (k = known; ! = predicted not to fit)")
        lines.append(f"beats the one-liner on every MoE row: {s['beats_one_liner_moe']}; on every row with MFU far "
                     f"from 45%: {s['beats_one_liner_far']}")
        lines.append("calibrated factors (one per mechanism, fitted jointly on the rows each one changes):")
        for name, f in self.factors.items():
            lines.append(f"  {name:34s} x{f:.3f}  ({len(self.fit_rows.get(name, ()))} rows)")
        if self.stale:
            lines.append("profiles/corrections.yaml differs from a fresh fit: " + ", ".join(self.stale)
                         + " (run python -m planner.calibration.report --write)")
        if self.memory:
            lines += ["", memory_text(self.memory)]
            h, why = memory_headroom(self.memory)
            lines.append(f"memory headroom {100 * h:.0f}%: {why}")
        lines += self._uncertainty_lines()
        return "\n".join(lines)

    def _uncertainty_lines(self) -> list[str]:
        u = self.uncertainty
        if u is None:
            return ["(time uncertainty per mechanism: with --loo or --write)"]
        out = ["", f"time uncertainty per mechanism (held-out residuals of {u.rows} rows, scale {u.scale:.2f}; the "
                   f"range holds {100 * u.coverage:.0f}% of the measured rows, target {100 * COVERAGE_TARGET:.0f}%):"]
        for k, v in u.mechanisms().items():
            out.append(f"  {k:28s} {100 * v:5.1f}%")
        if self.memory:
            h, _ = memory_headroom(self.memory)
            stale = uncertainty_stale(load_uncertainty(), h, u)
            if stale:
                out.append(f"{UNCERTAINTY_YAML} differs from a fresh derivation: " + "; ".join(stale)
                           + " (run python -m planner.calibration.report --write)")
        return out


def shipped_factors(profiles: ProfileSet, params=FIT_PARAMS) -> dict[str, float]:
    out = {}
    for p in params:
        if p.devices == ("*",):
            value = profiles.moe_imbalance_factor() if p.kind == "moe_imbalance_factor" else None
            out[p.name] = value if value is not None else p.default
        else:
            out[p.name] = profiles.correction(p.devices[0], p.kind)
    return out


def build_report(*, loo: bool = False, refit: bool = False) -> tuple[Report, Fit]:
    """Rows priced with the shipped corrections (or the fresh fit with `refit`)."""
    base = ProfileSet.uncalibrated()
    all_cases = cases(base)
    result, ev = fit(all_cases, base=base)
    shipped = ProfileSet.load()
    have = shipped_factors(shipped)
    stale = [n for n, f in result.factors.items() if abs(have[n] / f - 1) > 0.01]
    profiles = result.profiles() if refit else shipped
    loo_s = leave_one_out(result, ev) if loo else {}
    rows = [row_of(c, profiles, loo_s.get(c.id)) for c in all_cases]
    by_id = {r.id: r for r in rows}
    factors = result.factors if refit else have
    unc = fit_mechanisms(held_out_residuals(all_cases, profiles, loo_s)) if loo else None
    return Report(rows, pair_checks(all_cases, by_id), factors, result.rows, [] if refit else stale, loo,
                  memory_rows(profiles), unc), result


def corrections_yaml(result: Fit) -> str:
    today = _dt.date.today().isoformat()
    header = (
        "# Calibrated correction factors (time multipliers), one per mechanism and device family.\n"
        "# Written by `python -m planner.calibration.report --write` (planner/calibration/fit.py) on "
        f"{today}; do not edit by hand.\n"
        "# Each factor was fitted jointly on every published run it changes (provenance.source lists them);\n"
        "# the leave-one-out error of that fit is in the calibration report.\n")
    entries = []
    for p in result.params:
        f = result.factors[p.name]
        rows = result.rows[p.name]
        for d in p.devices:
            src = (f"fit by planner.calibration.fit on {len(rows)} published runs ({', '.join(rows)}); {p.why}"
                   + ("" if d == p.devices[0] else f"; shared with {p.devices[0]} (same kernels)"))
            entries.append({"device": d, "kind": p.kind, "factor": round(f, 4),
                            "provenance": {"kind": "calibrated", "source": src}})
    return header + yaml.safe_dump({"corrections": entries}, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.calibration.report", description=__doc__.split("\n")[0])
    ap.add_argument("--loo", action="store_true", help="also report leave-one-out errors (refits per row)")
    ap.add_argument("--refit", action="store_true", help="price with a fresh fit instead of profiles/corrections.yaml")
    ap.add_argument("--write", action="store_true",
                    help="refit and rewrite profiles/corrections.yaml and profiles/uncertainty.yaml (runs --loo)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    report, result = build_report(loo=args.loo or args.write, refit=args.refit or args.write)
    if args.write:
        CORRECTIONS_YAML.write_text(corrections_yaml(result), encoding="utf-8")
        print(f"wrote {CORRECTIONS_YAML}", file=sys.stderr)
        h, why = memory_headroom(report.memory)
        UNCERTAINTY_YAML.write_text(uncertainty_yaml(h, why, report.uncertainty, "leave-one-out"), encoding="utf-8")
        print(f"wrote {UNCERTAINTY_YAML}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
