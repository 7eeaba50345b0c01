"""Which device types run the run's precision (a T4 or V100 has no bf16, an A100 no fp8).

A device type runs a precision when its profile lists a peak for it (DeviceProfile.peak_flop_per_s).  The
runtime choice (planner/runtime.py) leaves every type that does not idle, with the reason and how to use it,
as it leaves out the types no job of the runtime can hold; a cluster none of whose types runs the precision is
refused (PlannerInputError naming --cluster and the types), and so is a plan with a stage on such a type
(planner/checker.py `precision_problems`: the cost model has no peak to price it with).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.errors import MissingProfileError, PlannerInputError

if TYPE_CHECKING:  # types only: planner.schemas imports planner.runtime (Plan.runtime), which imports this module
    from planner.profile_tables import ProfileSet
    from planner.schemas.cluster import ClusterSpec

PRECISION_FIELD = "--cluster"
"""The option a precision refusal names: the cluster holds the types; the precision comes from the run."""

MIXED_PRECISIONS: dict[str, str] = {"bf16": "--bf16", "fp16": "--fp16"}
"""The precisions a refusal proposes instead, with the Megatron flag that sets each."""


def runs_precision(device_type: str, profiles: "ProfileSet", precision: str) -> bool:
    """Whether the device type's profile has a peak for `precision` (fp32 falls back to bf16 there)."""
    try:
        profiles.device(device_type).peak_flop_per_s(precision)
    except MissingProfileError:
        return False
    return True


def peak_flop_per_s(cluster: "ClusterSpec", profiles: "ProfileSet", precision: str) -> float:
    """The cluster's peak FLOP/s at `precision`, over the types that run it (a type that does not has none)."""
    return sum(g.num_gpus * profiles.device(g.device_type).peak_flop_per_s(precision) for g in cluster.groups
               if runs_precision(g.device_type, profiles, precision))


def listed(device_type: str, profiles: "ProfileSet") -> str:
    """The precisions the type's profile lists a peak for, as a reader sees them."""
    return ", ".join(sorted(profiles.device(device_type).peak_tflops))


def _instead(cluster: "ClusterSpec", profiles: "ProfileSet") -> str | None:
    """A precision every type of the cluster runs, as the flag or the model file's key that sets it (None: none)."""
    common = [p for p in MIXED_PRECISIONS if all(runs_precision(t, profiles, p) for t in cluster.device_types)]
    if not common:
        return None
    return (f"{MIXED_PRECISIONS[common[0]]} (in --megatron-args or the script's flags) or precision: {common[0]} in "
            f"the model file's training block")


def left_out(cluster: "ClusterSpec", profiles: "ProfileSet", precision: str) -> dict[str, str]:
    """The device types of the cluster that do not run `precision`: type -> why its GPUs stay idle (what
    RuntimeChoice.left_out says), in the cluster's order.  Every type lacking it: PlannerInputError."""
    lacking = [t for t in cluster.device_types if not runs_precision(t, profiles, precision)]
    if not lacking:
        return {}
    if len(lacking) == len(cluster.device_types):
        raise PlannerInputError(PRECISION_FIELD, _none_runs(lacking, cluster, profiles, precision))
    instead = _instead(cluster, profiles)
    use = f"; use {instead} to plan with {'+'.join(lacking)} too" if instead else ""
    return {t: f"{t} has no {precision}, the run's precision (its profile lists {listed(t, profiles)}){use}"
            for t in lacking}


def _none_runs(lacking: list[str], cluster: "ClusterSpec", profiles: "ProfileSet", precision: str) -> str:
    each = "; ".join(f"{t} does not run {precision} (it runs {listed(t, profiles)})" for t in lacking)
    instead = _instead(cluster, profiles)
    return (f"no device type of the cluster runs {precision}, the run's precision: {each}; choose other devices"
            + (f", or a precision they run: {instead}" if instead else ""))
