"""How far the cost model can be trusted: the memory headroom and the per-mechanism time uncertainties.

Both come from `profiles/uncertainty.yaml`, which `python -m planner.calibration.report --write` writes from the
calibration set (planner/calibration/uncertainty.py derives the figures; a test checks that the shipped file is
not stale):

* `memory.headroom`: the fraction of each device's memory a plan keeps free by default (`--memory-headroom`
  overrides it), derived from the memory model's error on measured peaks (planner/calibration/memory.py);
* `time.mechanisms`: per named mechanism of the cost model (the parts of a layer, the pipeline bubble, the
  DP sync and optimizer step, the fixed costs), the relative uncertainty of its seconds, fitted on the
  leave-one-source-out residuals of the calibration runs.  A plan's iteration-time range is its time parts
  weighted by these (planner/cost/ranges.py).

Without the file (a profiles directory that lacks it) the headroom is 0 and every range is a point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from pydantic import ConfigDict, Field

from planner.inputs.files import parse_yaml, read_text
from planner.profile_tables import PROFILES_DIR
from planner.schemas.device import Provenance
from planner.schemas.types import StrictModel

UNCERTAINTY_YAML = PROFILES_DIR / "uncertainty.yaml"


class MemoryUncertainty(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    headroom: float = Field(ge=0.0, lt=1.0, description="fraction of device memory kept free by default")
    provenance: Provenance


class TimeUncertainty(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str = Field(min_length=1)
    mechanisms: dict[str, float] = Field(description="relative uncertainty of each mechanism's seconds (>= 0)")
    provenance: Provenance


class UncertaintyFile(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    memory: MemoryUncertainty
    time: TimeUncertainty


@dataclass(frozen=True)
class Uncertainty:
    """The loaded figures (see the module docstring); `source` names the file."""

    memory_headroom: float = 0.0
    memory_source: str = "no uncertainty file: no headroom"
    mechanisms: dict[str, float] = field(default_factory=dict)
    method: str = ""
    time_source: str = "no uncertainty file: ranges are points"
    source: str = ""


def load_uncertainty(path: Path = UNCERTAINTY_YAML) -> Uncertainty:
    if not path.is_file():
        return Uncertainty()
    doc = UncertaintyFile.model_validate(parse_yaml(read_text(path, "uncertainty"), "uncertainty", str(path)))
    bad = {k: v for k, v in doc.time.mechanisms.items() if not (v >= 0.0)}
    if bad:
        raise ValueError(f"{path}: time.mechanisms must be >= 0, got {bad}")
    return Uncertainty(memory_headroom=doc.memory.headroom, memory_source=doc.memory.provenance.source,
                       mechanisms=dict(doc.time.mechanisms), method=doc.time.method,
                       time_source=doc.time.provenance.source, source=str(path))


@lru_cache(maxsize=1)
def shipped_uncertainty() -> Uncertainty:
    return load_uncertainty()


def default_memory_headroom() -> float:
    """The shipped default fraction of device memory a plan keeps free."""
    return shipped_uncertainty().memory_headroom
