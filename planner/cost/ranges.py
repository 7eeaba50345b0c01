"""A plan's iteration time with its uncertainty: the range [low, high] around the cost model's nominal time.

The cost model's time is built from mechanisms, each scaled by its correction kinds (profiles/corrections.yaml):
dense GEMMs, attention, expert GEMMs, memory-bound passes, MoE token dispatch, the collectives (TP/CP
communication, pipeline sends, gradient sync) and the host's fixed costs.  `MECHANISMS` groups those kinds into
seven families.  Each family
has two relative uncertainties (profiles/uncertainty.yaml, fitted by planner/calibration/uncertainty.py on the
held-out residuals of the calibration runs): `slow`, how much its seconds are under-predicted on runs the fit has
not seen, and `fast`, how much they are over-predicted.

A plan's range is the same evaluator run with every family's corrections scaled: the high end with each
family's seconds divided by (1 - slow), the low end by (1 + fast).  So the range follows the mechanisms the plan
leans on, through the schedule (a slower stage also lengthens the bubble) and the overlaps, with no second
formula.  The pessimistic cost model (the high end) is what `solve` optimises by default: the search tables are
built from it, and the reported nominal time is the float cost model's.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.model import CostModel, PlanCost
from planner.profile_tables import CORRECTION_KINDS, ProfileSet
from planner.schemas.cluster import ClusterSpec
from planner.schemas.device import Provenance
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Plan
from planner.schemas.training import TrainingSpec
from planner.uncertainty import Uncertainty, shipped_uncertainty

_FAMILIES: dict[str, tuple[str, ...]] = {
    "gemm": ("gemm", "fp8_tensorwise", "fp8_blockwise", "fp8_mxfp8"),
    "attention": ("attention",),
    "expert_gemm": ("grouped_gemm",),
    "memory_bound": ("memory_bound",),
    "expert_dispatch": ("dispatch_alltoall", "dispatch_flex", "dispatch_allgather", "all_to_all"),
    "collectives": ("all_reduce", "all_gather", "reduce_scatter", "p2p"),
    "host": ("host_overhead", "iteration_overhead"),
}
MECHANISMS: dict[str, tuple[str, ...]] = {
    family: tuple(k for k in kinds if k in CORRECTION_KINDS) for family, kinds in _FAMILIES.items()
}
"""Mechanism family -> the correction kinds (planner/profile_tables.py) whose seconds it covers (a family whose
kinds the loaded tables do not define covers nothing: its share is 0)."""
MAX_UNCERTAINTY = 0.8  # a family's seconds are never scaled by more than 1/(1 - 0.8) = 5x
SHARE_STEP = 0.01  # the relative step of the finite difference in `time_shares`


def scaled_profiles(profiles: ProfileSet, multipliers: dict[str, float], why: str) -> ProfileSet:
    """`profiles` with every correction kind of each family multiplied by the family's multiplier."""
    entries = {}
    for family, m in multipliers.items():
        if m == 1.0:
            continue
        for kind in MECHANISMS[family]:
            for device in profiles.names():
                entries[(device, kind)] = profiles.correction(device, kind) * m
    if not entries:
        return profiles
    return profiles.with_corrections(entries, Provenance(kind="calibrated", source=why))


def side_multipliers(uncertainty: Uncertainty, side: str) -> dict[str, float]:
    """Per family, the multiplier of its seconds at the high ("slow") or low ("fast") end of the range."""
    out = {}
    for family in MECHANISMS:
        u = min(MAX_UNCERTAINTY, uncertainty.mechanisms.get(f"{family}.{side}", 0.0))
        out[family] = 1.0 / (1.0 - u) if side == "slow" else 1.0 / (1.0 + u)
    return out


@dataclass(frozen=True)
class TimeRange:
    """Iteration time: the nominal (the cost model's) and the range around it, seconds."""

    low_s: float
    nominal_s: float
    high_s: float

    def contains(self, seconds: float) -> bool:
        return self.low_s <= seconds <= self.high_s


class RangeModel:
    """The nominal cost model and the two ends of its range, over the same inputs."""

    def __init__(self, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, profiles: ProfileSet, *,
                 memory_headroom: float | None = None, uncertainty: Uncertainty | None = None) -> None:
        self.uncertainty = uncertainty or shipped_uncertainty()
        self.nominal = CostModel(model, training, cluster, profiles, memory_headroom=memory_headroom)
        self.high = self._side(model, training, cluster, profiles, memory_headroom, "slow")
        self.low = self._side(model, training, cluster, profiles, memory_headroom, "fast")

    def _side(self, model, training, cluster, profiles, memory_headroom, side: str) -> CostModel:
        mult = side_multipliers(self.uncertainty, side)
        if all(m == 1.0 for m in mult.values()):
            return self.nominal
        scaled = scaled_profiles(profiles, mult, f"{side} end of the range ({self.uncertainty.source})")
        return CostModel(model, training, cluster, scaled, memory_headroom=memory_headroom)

    def time_range(self, plan: Plan, nominal: PlanCost | None = None) -> TimeRange:
        nominal_s = (nominal or self.nominal.evaluate(plan)).iteration_time_s
        return TimeRange(low_s=self.low.evaluate(plan).iteration_time_s, nominal_s=nominal_s,
                         high_s=self.high.evaluate(plan).iteration_time_s)


def time_shares(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, profiles: ProfileSet,
                plan: Plan) -> dict[str, float]:
    """Per mechanism family, the share of the plan's predicted iteration time it carries: the elasticity
    d ln(T) / d ln(family's seconds), by a finite difference of the one evaluator (so overlaps and the
    bubble count as they do in T).  The shares sum to at most 1; the rest is time no correction kind scales."""
    base = CostModel(model, training, cluster, profiles, memory_headroom=0.0).evaluate(plan).iteration_time_s
    out = {}
    for family in MECHANISMS:
        stepped = scaled_profiles(profiles, {family: 1.0 + SHARE_STEP}, "share probe")
        t = CostModel(model, training, cluster, stepped, memory_headroom=0.0).evaluate(plan).iteration_time_s
        out[family] = max(0.0, (t / base - 1.0) / SHARE_STEP)
    return out
