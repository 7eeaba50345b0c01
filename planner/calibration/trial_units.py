"""What `calibrate --trials` fits: the multipliers the evaluator applies (units) and the parameters behind them.

A *unit* is one multiplier the cost model applies: a mechanism's correction kinds scaled on every device of the
trials (`Unit(mechanism, None)`), or on one device type only (`Unit(mechanism, device)`).  On trials of one device
type the units are the fitted mechanisms, each its own parameter t_k (planner/calibration/trials.py; nothing
here changes that case).

On trials whose plans use several device types, each mechanism that runs on one device (its conditions name the
`{device}` of a stage: the GEMMs, attention, the memory-bound passes, and the expert dispatch and TP/CP/DP
collectives among one type's GPUs, each priced with that type's corrections, planner/cost/mechanisms.py) gets a
unit per type; the pipeline sends, between the stages of two types over the link the types share, keep one.
The parameters are the mechanism's common part t_k and, per type d, the type's own part t_kd: the multiplier on d
is exp(t_k + t_kd), each with the Laplace prior of the module docstring of trials.py (t_k's s_k over every
trial's conditions, t_kd's s_kd over those of type d's stages).  So a mechanism off alike on every type costs the
prior one parameter (t_k) and one off on a single type one parameter (t_kd): the fit takes the fewest that explain
the logs.  Where the trials cannot tell the types apart (each trial has the same share of each type) the split is
the prior's: t_k where the shipped calibration knows the types alike, more on the type it knows less where not;
the report says so (trials.py `identification`), not that the trials measured it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.cost.mechanisms import BY_NAME, MECHANISM_OF_PART, MECHANISMS, stage_conditions
from planner.cost.model import GlobalShape, PlanCost
from planner.cost.ranges import RangeModel
from planner.profile_tables import TIME_CORRECTION_KINDS, ProfileSet
from planner.schemas.device import Provenance
from planner.schemas.plan import Plan

MIN_PRIOR_SD = 0.02
FITTED = tuple(m for m in MECHANISMS if any(k in TIME_CORRECTION_KINDS for k in m.kinds))
"""The mechanisms correction kinds scale (the recomputed forward runs the others' kernels: it has none)."""
PER_DEVICE = tuple(m.name for m in FITTED if "{device}" in m.conditions)
"""The fitted mechanisms that run on one device type (their conditions name a stage's device): fitted per type
where the trials use several."""


@dataclass(frozen=True)
class Unit:
    """One multiplier the evaluator applies: a mechanism's kinds on every device of the trials (device None) or
    on one device type."""

    mechanism: str
    device: str | None = None

    @property
    def key(self) -> str:
        return self.mechanism if self.device is None else f"{self.mechanism}@{self.device}"

    def words(self) -> str:
        """"expert GEMMs", or "expert GEMMs on A100"."""
        return BY_NAME[self.mechanism].words + (f" on {self.device}" if self.device else "")


@dataclass(frozen=True)
class Parameters:
    """The fit's parameters (`keys`, each with its prior sd) and the units they make: unit values are
    `matrix` @ parameters (None: one parameter per unit, the single-type case)."""

    units: tuple[Unit, ...]
    keys: tuple[str, ...]
    prior_sd: np.ndarray
    matrix: np.ndarray | None = None

    @property
    def per_device(self) -> bool:
        return self.matrix is not None

    def unit_values(self, p: np.ndarray) -> np.ndarray:
        return p if self.matrix is None else self.matrix @ p

    def jacobian(self, unit_jac: np.ndarray) -> np.ndarray:
        """d log T / d parameters from d log T / d units (trials x units)."""
        return unit_jac if self.matrix is None else unit_jac @ self.matrix

    def unit_covariance(self, cov: np.ndarray) -> np.ndarray:
        """The units' covariance from the parameters'."""
        return cov if self.matrix is None else self.matrix @ cov @ self.matrix.T

    def unit_prior_sd(self) -> np.ndarray:
        """Each unit's prior sd (the sum of its parameters', each taken as a Gaussian of the same variance)."""
        if self.matrix is None:
            return self.prior_sd
        return np.sqrt(np.diag(self.unit_covariance(np.diag(self.prior_sd ** 2))))


def parameters(devices: list[str], sd: dict[str, float], device_sd: dict[tuple[str, str], float]) -> Parameters:
    """The parameters for trials on `devices` (module docstring), with prior sds s_k (`sd`) and s_kd
    (`device_sd`, `prior_sds`)."""
    names = [m.name for m in FITTED]
    if len(devices) < 2:
        return Parameters(tuple(Unit(n) for n in names), tuple(names), np.array([sd[n] for n in names]))
    units = tuple(u for n in names for u in ([Unit(n, d) for d in devices] if n in PER_DEVICE else [Unit(n)]))
    own = [u for u in units if u.device is not None]
    keys = tuple(names) + tuple(u.key for u in own)
    matrix = np.zeros((len(units), len(keys)))
    for i, u in enumerate(units):
        matrix[i, names.index(u.mechanism)] = 1.0
        if u.device is not None:
            matrix[i, keys.index(u.key)] = 1.0
    prior = np.array([sd[n] for n in names] + [device_sd.get((u.mechanism, u.device), sd[u.mechanism]) for u in own])
    return Parameters(units, keys, prior, matrix)


def prior_sds(priced: list[tuple[RangeModel, Plan]]) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """s_k per fitted mechanism over every plan's conditions (trials.py `plans_prior_sd`), and s_kd per
    (per-device mechanism, member device type) over the conditions of that type's stages."""
    sd = {m.name: MIN_PRIOR_SD for m in FITTED}
    device_sd: dict[tuple[str, str], float] = {}
    for rm, plan in priced:
        for c in rm.plan_conditions(plan):
            if c.mechanism in sd:
                sd[c.mechanism] = max(sd[c.mechanism], -math.log(1.0 - rm.spread(c)))
        g = GlobalShape.of(plan)
        for st in plan.stages:
            for c in stage_conditions(rm.nominal, g, st.device_type, st.dp, st.recompute).values():
                if c.mechanism not in PER_DEVICE:
                    continue
                for d in st.member_types():
                    key = (c.mechanism, rm.nominal.profiles.canonical_name(d))
                    device_sd[key] = max(device_sd.get(key, MIN_PRIOR_SD), -math.log(1.0 - rm.spread(c)))
    return sd, device_sd


def unit_shares(cost: PlanCost, plan: Plan, profiles: ProfileSet,
                log_multipliers: dict[str, float] | None = None) -> dict[str, float]:
    """Per unit (`Unit.key`) of trials on several device types, its share of `plan`'s time: d log T / d log of its
    multiplier to first order, what the fit's Jacobian measures; at the shipped profiles, or with each unit's
    seconds scaled by exp(`log_multipliers[key]`) (the fit's multipliers somewhere in its prior: which stage is
    the slowest can change).  The schedule formula (planner/cost/model.py `CostModel.combine`) gives each stage's
    per-micro-batch parts the weight 1/vpp (the pipeline's fill) and the slowest stage's m - 1/vpp more, so a type
    whose stage is not the slowest still has a share; the DP sync, optimizer step and host time of the stage whose
    sync is longest count once, the boundaries' fill as pipeline sends.  The shares sum to 1.  A mechanism that
    runs on one device is the unit of the stage's type (a pooled stage's limiting member, whose corrections price
    it); the others are the mechanism's one unit."""
    scale = log_multipliers or {}

    def unit_seconds(part: str, device_type: str, seconds: float) -> tuple[str, float]:
        mechanism = MECHANISM_OF_PART.get(part)
        if mechanism is None:
            return "", seconds
        key = Unit(mechanism, profiles.limiting_member(device_type) if mechanism in PER_DEVICE else None).key
        return key, seconds * math.exp(scale.get(key, 0.0))

    stages = [[unit_seconds(part, st.device_type, sec) for part, sec in st.parts] for st in cost.stages]
    times = [sum(sec for _, sec in parts) for parts in stages]
    syncs = [[unit_seconds(part, st.device_type, sec) for part, sec in (
        ("dp_sync", st.dp_comm_s), ("optimizer", st.optimizer_s), ("iteration_overhead", st.iteration_overhead_s))]
        for st in cost.stages]
    m, v, slowest = cost.num_microbatches, plan.vpp, times.index(max(times))
    weights = [1.0 / v + ((m - 1.0 / v) if i == slowest else 0.0) for i in range(len(times))]
    terms = [(key, w * sec) for w, parts in zip(weights, stages) for key, sec in parts]
    terms += [unit_seconds("pp_comm", st.device_type, st.fill_out_s) for st in cost.stages]
    terms += max(syncs, key=lambda parts: sum(sec for _, sec in parts))
    total = sum(sec for _, sec in terms)
    out: dict[str, float] = {}
    for key, sec in terms:
        if key and sec:
            out[key] = out.get(key, 0.0) + sec / total
    return out


def scaled(profiles: ProfileSet, t: dict[str, float], devices: list[str], why: str,
           per_device: dict[tuple[str, str], float] | None = None) -> ProfileSet:
    """`profiles` with each fitted mechanism's correction kinds multiplied by exp(t[mechanism]) on `devices`, and
    by exp(per_device[(mechanism, device)]) more on that device."""
    own = per_device or {}
    entries = {}
    for m in FITTED:
        for d in devices:
            log_f = t.get(m.name, 0.0) + own.get((m.name, d), 0.0)
            if log_f:
                entries.update({(d, kind): profiles.correction(d, kind) * math.exp(log_f)
                                for kind in m.kinds if kind in TIME_CORRECTION_KINDS})
    return profiles.with_corrections(entries, Provenance(kind="calibrated", source=why)) if entries else profiles


def scaled_units(profiles: ProfileSet, units: tuple[Unit, ...], values, devices: list[str], why: str) -> ProfileSet:
    """`profiles` with each unit's log multiplier in `values` applied (`scaled`)."""
    common = {u.mechanism: float(v) for u, v in zip(units, values) if u.device is None}
    own = {(u.mechanism, u.device): float(v) for u, v in zip(units, values) if u.device is not None}
    return scaled(profiles, common, devices, why, own)
