"""Fit the cost model's correction factors to the published runs, one factor per mechanism.

A `FitParam` is one mechanism's constant: a correction kind (a kernel kind such as `grouped_gemm`, a
dispatcher, an FP8 recipe, the router imbalance) shared by a device family (SM90: H100/H800/H200/H20,
which run the same kernels) or by every device (`*`).  Never one constant per row: each parameter is fitted
jointly on every row whose prediction it changes.

Method: the uncalibrated (datasheet-derived and published) profiles are the start; the loss is a Huber loss of the
log error of the predicted seconds per iteration, log(predicted / measured), least squares up to 15 % and linear
beyond (HUBER_LOG), each row weighted 1/(rows of its source); coordinate descent in log(factor), a golden
section search per coordinate inside [lo, hi], until a sweep moves no factor by more than 0.1 %.

`leave_one_out` refits, for each row, the parameters that row touches with that row removed (the others
keep their full-fit values), and predicts the row again.  `leave_one_source_out` does the same with every row
of the row's source removed at once: rows of one source share a software stack, so leave-one-row-out flatters
the model, and leave-one-source-out is the error to expect on a run from a source the fit has never seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.calibration.runs import CalibrationCase
from planner.profile_tables import ProfileSet
from planner.schemas.device import Provenance

SM90 = ("H100", "H800", "H200", "H20")
"""Hopper parts: same SM90 tensor cores and kernels (cuBLAS, FlashAttention, TE), so one factor each."""
GA100 = ("A100", "A100-40GB", "A800")
NCCL_NODES = SM90 + ("B200", "B300", "GB200", "GB300") + GA100
"""NVIDIA nodes (NVSwitch inside, InfiniBand/RoCE across): token dispatch runs NCCL (alltoall) or DeepEP (flex) on
the same kind of fabric, so the dispatchers' constants are shared by these parts (B300: HGX B300, NVLink5 NVSwitch
and one NIC per GPU, as B200; GB200/GB300: the same GPUs in NVL72 racks, whose NVLink switch trays join 72 of them)."""


@dataclass(frozen=True)
class FitParam:
    """One calibrated constant: correction `kind` on every device of `devices` (or "*")."""

    kind: str
    devices: tuple[str, ...]
    lo: float = 0.5
    hi: float = 2.0
    why: str = ""
    default: float = 1.0  # the uncalibrated value (what a row alone on this parameter is predicted with)
    fit_on: str = "all"  # all | dense | moe: which of the rows it changes it is fitted on
    prior: str = ""  # a group of like constants: with no row of its own left, it takes their geometric mean

    @property
    def name(self) -> str:
        return f"{self.kind}@{'/'.join(self.devices)}"

    def entries(self, factor: float) -> dict[tuple[str, str], float]:
        return {(d, self.kind): factor for d in self.devices}


ASSUMED_CURVE = "assumed-gemm-curve"
"""The GEMM constants of the device families whose GEMM curve is an assumption, not a kernel measurement (V100: the
A100 curve scaled; 910B: no public table): how far their software ran below the assumed curve.  A run on one of
them from a source the fit has not seen is assumed to run as far below it as the others did (their geometric
mean), not at the assumption."""

FIT_PARAMS: tuple[FitParam, ...] = (
    FitParam("gemm", SM90, fit_on="dense", why="dense GEMMs (cuBLAS) on SM90 against the MAMF-derived curve"),
    FitParam("dispatch_alltoall", NCCL_NODES, 0.3, 3.0,
             why="alltoall token dispatcher (NCCL all-to-all) on NVIDIA NVSwitch + InfiniBand nodes"),
    FitParam("fp8_tensorwise", SM90, 0.5, 3.0, why="per-tensor FP8 recipes (delayed, tensorwise) on SM90"),
    FitParam("fp8_blockwise", SM90, 0.5, 3.0, why="blockwise FP8 recipe on SM90"),
    FitParam("host_overhead", ("*",), 0.1, 10.0,
             why="host time per Python-level operation (x 50 us), which bounds layers with little GPU work"),
    FitParam("gemm", ("V100",), 0.5, 3.0, prior=ASSUMED_CURVE,
             why="dense GEMMs on V100 (its curve an assumption: the A100 curve scaled), from 2020 software"),
    FitParam("gemm", ("910B",), 0.5, 3.0, prior=ASSUMED_CURVE, why="GEMMs (CANN) on Ascend 910B"),
    # GA100 dense GEMMs of today's software are its measured (MAMF) curve, uncalibrated: every fitted row on it ran
    # Megatron-LM 2020 or NeMo-Megatron 2022, whose slower kernels are their own constant, applied to those rows only
    # (planner/profile_tables.py LEGACY_SOFTWARE_KINDS; published/README.md, 'Legacy software').  V100 has no
    # measured curve, so its 2020 rows calibrate its `gemm` itself (their legacy factor is none).
    FitParam("gemm_legacy_software", GA100, 0.5, 3.0,
             why="dense GEMMs of 2020-2022 software (Megatron-LM 2020, NeMo-Megatron 2022) on GA100"),
)

TOLERANCE = 1e-3
HUBER_LOG = math.log(1.15)
"""Errors up to 15 % weigh as least squares, larger ones linearly (Huber loss in log(predicted / measured)): a
source whose software the mechanisms do not capture pulls a shared constant as far as one row 15 % off, no
further, so the other sources keep their fit."""


def _loss(e: float) -> float:
    a = abs(e)
    return e * e if a <= HUBER_LOG else HUBER_LOG * (2 * a - HUBER_LOG)


@dataclass
class Fit:
    """Fitted factors, with the rows each parameter was fitted on."""

    factors: dict[str, float]
    rows: dict[str, tuple[str, ...]]
    params: tuple[FitParam, ...]
    base: ProfileSet = field(repr=False)

    def profiles(self, provenance: Provenance | None = None) -> ProfileSet:
        return apply_factors(self.base, self.params, self.factors, provenance)


def apply_factors(base: ProfileSet, params: tuple[FitParam, ...], factors: dict[str, float],
                  provenance: Provenance | None = None) -> ProfileSet:
    entries: dict[tuple[str, str], float] = {}
    for p in params:
        if p.name in factors:
            entries.update(p.entries(factors[p.name]))
    prov = provenance or Provenance(kind="calibrated", source="planner.calibration.fit (in-memory)")
    return base.with_corrections(entries, prov)


class _Evaluator:
    """Predicted seconds per iteration of each case under given factors, memoised by the factors of
    the parameters that touch the case."""

    def __init__(self, cases: list[CalibrationCase], base: ProfileSet, params: tuple[FitParam, ...]):
        self.cases = {c.id: c for c in cases}
        self.base = base
        self.params = params
        self.measured = {c.id: c.seconds_per_iteration() for c in cases}
        per_source: dict[str, int] = {}
        for c in cases:
            per_source[c.source_key] = per_source.get(c.source_key, 0) + 1
        self.weight = {c.id: 1.0 / per_source[c.source_key] for c in cases}
        """Each row weighs 1/(rows of its source): every source (one publication, one software stack) has one vote,
        so a source with many rows does not bend the shared constants to its own software."""
        self._cache: dict[tuple, float] = {}
        self._profiles: dict[tuple, ProfileSet] = {}
        """The corrected profiles per factors: a golden-section step prices every row of a parameter with the same
        factors, so they are built once per step, not once per row."""
        self.touches: dict[str, set[str]] = {}
        ones = {p.name: p.default for p in params}
        base_t = {cid: self._time(cid, ones) for cid in self.cases}
        for p in params:
            probe = {**ones, p.name: p.default * 1.5}
            self.touches[p.name] = {cid for cid in self.cases
                                    if abs(self._time(cid, probe) - base_t[cid]) > 1e-9 * base_t[cid]}
        self.fit_rows = {p.name: {cid for cid in self.touches[p.name]
                                  if p.fit_on == "all" or (p.fit_on == "moe") == self.cases[cid].run.model.is_moe}
                         for p in params}

    def _time(self, cid: str, factors: dict[str, float]) -> float:
        relevant = tuple(sorted((k, round(v, 9)) for k, v in factors.items()
                                if cid in self.touches.get(k, self.cases.keys())))
        key = (cid, relevant)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self.cases[cid].price(self._profiles_of(factors)).iteration_time_s
        return hit

    def _profiles_of(self, factors: dict[str, float]) -> ProfileSet:
        key = tuple(sorted(factors.items()))
        profiles = self._profiles.get(key)
        if profiles is None:
            profiles = self._profiles[key] = apply_factors(self.base, self.params, factors)
        return profiles

    def log_error(self, cid: str, factors: dict[str, float]) -> float:
        return math.log(self._time(cid, factors) / self.measured[cid])

    def loss(self, rows: set[str], factors: dict[str, float]) -> float:
        return sum(self.weight[cid] * _loss(self.log_error(cid, factors)) for cid in rows)


def _golden(f, lo: float, hi: float, tol: float = 1e-3) -> float:
    """Minimise f over [lo, hi] (log-space bounds) by golden-section search."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def _descend(ev: _Evaluator, free: list[FitParam], factors: dict[str, float], rows: set[str],
             max_sweeps: int = 12) -> dict[str, float]:
    factors = dict(factors)
    for _ in range(max_sweeps):
        moved = 0.0
        for p in free:
            fit_rows = ev.fit_rows[p.name] & rows
            if not fit_rows:
                continue

            def f(x: float, p: FitParam = p, fit_rows: set[str] = fit_rows) -> float:
                return ev.loss(fit_rows, {**factors, p.name: math.exp(x)})

            x = _golden(f, math.log(p.lo), math.log(p.hi))
            moved = max(moved, abs(math.exp(x) / factors[p.name] - 1))
            factors[p.name] = math.exp(x)
        if moved < TOLERANCE:
            break
    return factors


def fit(cases: list[CalibrationCase], params: tuple[FitParam, ...] = FIT_PARAMS,
        base: ProfileSet | None = None) -> tuple[Fit, _Evaluator]:
    """Fit every parameter jointly on all rows."""
    base = base or ProfileSet.uncalibrated()
    ev = _Evaluator(cases, base, params)
    start = {p.name: p.default for p in params}
    factors = _descend(ev, list(params), start, set(ev.cases))
    rows = {p.name: tuple(sorted(ev.fit_rows[p.name])) for p in params}
    return Fit(factors=factors, rows=rows, params=params, base=base), ev


def leave_one_out(result: Fit, ev: _Evaluator, factors_out: dict[str, dict[str, float]] | None = None
                  ) -> dict[str, float]:
    """Per row: the predicted seconds per iteration with that row left out of the fit (and, in
    `factors_out` when given, the factors that prediction used)."""
    return leave_groups_out(result, ev, {cid: (cid,) for cid in ev.cases}, factors_out)


def leave_one_source_out(result: Fit, ev: _Evaluator, sources: dict[str, str],
                         factors_out: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """Per row: the predicted seconds per iteration with every row of its source (`sources`: row id ->
    source key) left out of the fit.  Rows of one source share a software stack, so this is the error to
    expect on a run from a stack the fit has never seen."""
    groups: dict[str, list[str]] = {}
    for cid in ev.cases:
        groups.setdefault(sources.get(cid, cid), []).append(cid)
    return leave_groups_out(result, ev, {k: tuple(v) for k, v in groups.items()}, factors_out)


def _group_priors(params: tuple[FitParam, ...], ev: _Evaluator, factors: dict[str, float],
                  held: set[str]) -> dict[str, float]:
    """A constant with a `prior` group and no row left outside `held` takes the geometric mean of the constants
    of its group that still have rows."""
    out = dict(factors)
    for p in params:
        if not p.prior or ev.fit_rows[p.name] - held:
            continue
        peers = [factors[q.name] for q in params
                 if q.prior == p.prior and q.name != p.name and ev.fit_rows[q.name] - held]
        if peers:
            out[p.name] = math.exp(sum(math.log(f) for f in peers) / len(peers))
    return out


def leave_groups_out(result: Fit, ev: _Evaluator, groups: dict[str, tuple[str, ...]],
                     factors_out: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """For each group of rows: refit the parameters its rows touch on every other row (the rest keep their
    full-fit values; a parameter no other row calibrates falls back to its prior group's geometric mean
    (`_group_priors`), else to its uncalibrated default), and predict the group's rows with those factors."""
    out: dict[str, float] = {}
    everything = set(ev.cases)
    for members in groups.values():
        held = set(members)
        free = [p for p in result.params if ev.fit_rows[p.name] & held]
        start = dict(result.factors)
        for p in free:
            if not ev.fit_rows[p.name] - held:
                start[p.name] = p.default  # no other row calibrates it: the uncalibrated value
        factors = _descend(ev, free, start, everything - held) if free else start
        factors = _group_priors(result.params, ev, factors, held)
        for cid in members:
            out[cid] = ev._time(cid, factors)
            if factors_out is not None:
                factors_out[cid] = factors
    return out
