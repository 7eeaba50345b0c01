"""Typed inputs and outputs (pydantic), validated at the boundary."""

from planner.schemas.cluster import ClusterSpec, CrossTypeLink, NodeGroup
from planner.schemas.device import DeviceProfile, EfficiencyCurve, LinkProfile, Provenance
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Plan, Recompute, StagePlan
from planner.schemas.training import TrainingSpec

__all__ = [
    "ClusterSpec",
    "CrossTypeLink",
    "DeviceProfile",
    "EfficiencyCurve",
    "LinkProfile",
    "ModelSpec",
    "NodeGroup",
    "Plan",
    "Provenance",
    "Recompute",
    "StagePlan",
    "TrainingSpec",
]
