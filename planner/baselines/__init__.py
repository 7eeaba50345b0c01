"""Baseline planners for the evaluation (paper section 5; DESIGN section 7), every one planned under the
same cost model as HAPMoE and returning a Plan (None when it cannot fit or does not apply).

    plan_<name>(run, cluster, profiles, **options) -> Plan | None
    search_<name>(run, cluster, profiles, *, notes=None, **options) -> PricedPlan | None  (plan + cost)

PLANNERS maps a short name to its entry; `run_planner` times one and returns a PlannerResult.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from planner.baselines.alpa import plan_alpa, search_alpa
from planner.baselines.common import PricedPlan, geomean
from planner.baselines.deepspeed import plan_deepspeed, search_deepspeed
from planner.baselines.hapmoe import (
    SearchRun, plan_ablation, plan_hapmoe, search_ablation, search_hapmoe, solve_with_limit,
)
from planner.baselines.hetermoe import APPROXIMATION_NOTE, plan_hetermoe, search_hetermoe
from planner.baselines.metis import plan_metis, search_metis
from planner.baselines.mi import plan_mi, search_mi
from planner.errors import PlannerInputError


@dataclass(frozen=True)
class PlannerEntry:
    name: str
    label: str  # as in the paper's tables
    search: Callable[..., PricedPlan | None]
    plan: Callable[..., object]
    description: str


PLANNERS: dict[str, PlannerEntry] = {
    "mi": PlannerEntry("mi", "MI", search_mi, plan_mi, "uniform Megatron, manual recipe grid"),
    "alpa": PlannerEntry("alpa", "Alpa-style", search_alpa, plan_alpa,
                         "search as if every GPU were the slowest type, mapped onto the real devices"),
    "metis": PlannerEntry("metis", "Metis-style", search_metis, plan_metis,
                          "heterogeneous placement search, EP/ETP fixed from homogeneous profiling"),
    "hetermoe": PlannerEntry("hetermoe", "HeterMoE-style", search_hetermoe, plan_hetermoe,
                             "manual degrees, newest GPUs first, speed-proportional layers (crude approximation)"),
    "deepspeed": PlannerEntry("deepspeed", "DeepSpeed-MoE/Tutel-style", search_deepspeed, plan_deepspeed,
                              "EP + DP only, no PP unless needed, heterogeneity-unaware"),
    "ablation": PlannerEntry("ablation", "HAPMoE w/o non-uniform PP/DP", search_ablation, plan_ablation,
                             "megatron runtime, even layer split"),
    "hapmoe": PlannerEntry("hapmoe", "HAPMoE", search_hapmoe, plan_hapmoe,
                           "HS-DP search, megatron and flagscale runtimes, the better plan"),
}
BASELINE_NAMES = ("mi", "alpa", "metis", "hetermoe", "deepspeed")


@dataclass
class PlannerResult:
    """One planner on one scenario: its priced plan (None: nothing fits / not applicable)."""

    name: str
    priced: PricedPlan | None
    search_time_s: float
    notes: list[str] = field(default_factory=list)


def get_planner(name: str) -> PlannerEntry:
    """The registry entry for `name` (PlannerInputError listing the known names otherwise)."""
    if name not in PLANNERS:
        raise PlannerInputError("--planners", f"unknown planner {name!r}; known: {', '.join(PLANNERS)}")
    return PLANNERS[name]


def run_planner(name: str, run, cluster, profiles, **options) -> PlannerResult:
    """Run planner `name`, timing it and collecting its notes."""
    entry = get_planner(name)
    notes: list[str] = []
    t0 = time.perf_counter()
    priced = entry.search(run, cluster, profiles, notes=notes, **options)
    return PlannerResult(name=name, priced=priced, search_time_s=time.perf_counter() - t0, notes=notes)


__all__ = [
    "APPROXIMATION_NOTE", "BASELINE_NAMES", "PLANNERS", "PlannerEntry", "PlannerResult", "PricedPlan", "SearchRun",
    "geomean", "get_planner", "plan_ablation", "plan_alpa", "plan_deepspeed", "plan_hapmoe", "plan_hetermoe",
    "plan_metis", "plan_mi", "run_planner", "search_ablation", "search_alpa", "search_deepspeed", "search_hapmoe",
    "search_hetermoe", "search_metis", "search_mi", "solve_with_limit",
]
