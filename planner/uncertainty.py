"""How far the cost model can be trusted: the memory headroom, the per-mechanism time uncertainties and the
region the calibration runs cover.

All three come from `profiles/uncertainty.yaml`, which `python -m planner.calibration.report --write` writes
from the calibration set (planner/calibration/uncertainty.py derives the figures; a test checks that the
shipped file is not stale):

* `memory.headroom`: the fraction of each device's memory a plan keeps free by default (`--memory-headroom`
  overrides it), derived from the memory model's error on measured peaks (planner/calibration/memory.py);
* `time.mechanisms`: per mechanism of the cost model (planner/cost/mechanisms.py), the relative uncertainty
  of its seconds where calibration runs cover it, fitted on the leave-one-source-out residuals of the
  calibration runs; `time.extrapolation`: the factor on that
  uncertainty where no run covers the plan's conditions, and `time.unmeasured_floor` the least uncertainty
  there (what a mechanism in conditions no run measured gets when its own figure, multiplied, is smaller).  A
  plan's range is its mechanisms' seconds at these (planner/cost/ranges.py);
* `evidence.cells`: the region each mechanism's calibration runs cover (`Region`): one cell per combination
  of categorical conditions some run measured, with the range of its numeric conditions.  `cli.py calibrate`
  writes cells of the user's own runs into `evidence.yaml` of its output, which `--profiles DIR` adds.

Without the file (a profiles directory that lacks it) the headroom is 0, every range is a point and no
mechanism is measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from pydantic import ConfigDict, Field

from planner.cost.mechanisms import UNPRICED, UNPRICED_SEP, Conditions, conditions_words, unpriced_of
from planner.errors import PlannerInputError
from planner.inputs.files import parse_yaml, read_text
from planner.profile_tables import PROFILES_DIR
from planner.schemas.device import Provenance
from planner.schemas.types import StrictModel

UNCERTAINTY_YAML = PROFILES_DIR / "uncertainty.yaml"
EVIDENCE_YAML = "evidence.yaml"
"""The file of measured cells `cli.py calibrate` writes beside its corrections (read from `--profiles DIR`)."""
NUMERIC_SLACK = 2.0
"""A numeric condition (tokens per expert, sequence per CP rank, bandwidth between nodes) is covered within this
factor of the range its calibration runs span, either way: about one step of the published kernel tables, which
double the tokens per step (DeepGEMM's FP8 grouped GEMM on H800: 47% of peak at 256 tokens per group, 53% at 512,
62% at 1024, 68% at 4096-8192; at most about 15% per doubling: ../shared/reference/components-t4.md section 3b)."""
AT_MOST_AXES = frozenset({"local_experts"})
"""Numeric conditions covered from 1 up to the most the runs measured, with no slack above it.  Local experts: at
a covered tokens per expert the grouped GEMM's bytes per FLOP (weights read, fp32 weight gradients written) are
the same whatever the expert count (both grow with it, planner/cost/layer.py `_expert_gemm_s`); what the count changes
is the grouped call, one kernel over every local expert's tiles.  Fewer experts than any run used is a smaller
call, priced from the measured dense-GEMM curve (one expert is a plain GEMM); more experts than any run used
(issue 31 item 2: 128 local experts of ~512 tokens on B200) is a grouped kernel at a scale no table step
describes."""


class MemoryUncertainty(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    headroom: float = Field(ge=0.0, lt=1.0, description="fraction of device memory kept free by default")
    provenance: Provenance


class TimeUncertainty(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str = Field(min_length=1)
    mechanisms: dict[str, float] = Field(description="relative uncertainty of each mechanism's seconds (>= 0)")
    extrapolation: float = Field(1.0, ge=1.0, description="factor on a mechanism's uncertainty outside its region")
    unmeasured_floor: float = Field(0.0, ge=0.0, lt=1.0, description=(
        "least relative uncertainty of a mechanism outside its region, whatever its own figure"))
    provenance: Provenance


class CellDoc(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    mechanism: str
    key: dict[str, str]
    ranges: dict[str, tuple[float, float]] = Field(default_factory=dict)
    runs: list[str] = Field(default_factory=list)


class EvidenceDoc(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str = ""
    cells: list[CellDoc] = Field(default_factory=list)


class UncertaintyFile(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    memory: MemoryUncertainty
    time: TimeUncertainty
    evidence: EvidenceDoc = Field(default_factory=EvidenceDoc)


@dataclass(frozen=True)
class Cell:
    """Conditions some calibration runs measured one mechanism in: the categorical key, the range of each
    numeric condition over those runs, and the runs."""

    mechanism: str
    key: frozenset[tuple[str, str]]
    ranges: tuple[tuple[str, float, float], ...]
    runs: tuple[str, ...]

    def covers_numbers(self, c: Conditions) -> bool:
        """Whether `c`'s numeric conditions lie within this cell's ranges (with NUMERIC_SLACK); the key is the
        Region's to match (its `unpriced` axis flag by flag)."""
        span = {name: (lo, hi) for name, lo, hi in self.ranges}

        def near(name: str, v: float) -> bool:
            if name not in span:
                return False
            lo, hi = span[name]
            if name in AT_MOST_AXES:
                return v <= hi
            return lo / NUMERIC_SLACK <= v <= hi * NUMERIC_SLACK

        return all(near(name, v) for name, v in c.numbers)

    def words(self) -> str:
        return conditions_words(self.mechanism, dict(self.key),
                                {n: f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}" for n, lo, hi in self.ranges})

    def to_doc(self) -> dict:
        return {"mechanism": self.mechanism, "key": dict(sorted(self.key)),
                "ranges": {name: [lo, hi] for name, lo, hi in self.ranges}, "runs": list(self.runs)}


def cell_of(c: Conditions, run: str) -> Cell:
    return Cell(c.mechanism, frozenset(c.key), tuple((n, v, v) for n, v in c.numbers), (run,))


def _base(key: frozenset) -> frozenset:
    """A cell's key without its `unpriced` axis."""
    return frozenset(kv for kv in key if kv[0] != UNPRICED)


@dataclass(frozen=True)
class Region:
    """Where each mechanism was measured: cells merged by mechanism and key (their numeric ranges joined).

    The `unpriced` axis (the run's flags that change a mechanism's time unpriced, planner/cost/mechanisms.py) is
    matched flag by flag: conditions are covered when the cells of their other axes cover them and each of their
    unpriced flags was in some calibration run of the mechanism (whose fitted constants carry its effect), so
    two flags measured apart do not make their pair unmeasured."""

    cells: tuple[Cell, ...] = ()
    _index: dict = field(default_factory=dict, compare=False, repr=False)  # (mechanism, key without unpriced) -> cell
    _unpriced: dict = field(default_factory=dict, compare=False, repr=False)  # mechanism -> flags some run had

    def __post_init__(self) -> None:
        for c in Region._merged(Cell(c.mechanism, _base(c.key), c.ranges, c.runs) for c in self.cells):
            self._index[(c.mechanism, c.key)] = c
        for c in self.cells:
            self._unpriced.setdefault(c.mechanism, set()).update(unpriced_of(c.key))

    @staticmethod
    def _merged(cells: Iterable[Cell]) -> list[Cell]:
        """Cells of one mechanism and key merged into one, their numeric ranges joined and runs listed once."""
        merged: dict[tuple, Cell] = {}
        for cell in cells:
            k = (cell.mechanism, cell.key)
            old = merged.get(k)
            if old is not None:
                span = {n: (lo, hi) for n, lo, hi in old.ranges}
                for n, lo, hi in cell.ranges:
                    a, b = span.get(n, (lo, hi))
                    span[n] = (min(a, lo), max(b, hi))
                cell = Cell(cell.mechanism, cell.key, tuple((n, a, b) for n, (a, b) in sorted(span.items())),
                            tuple(dict.fromkeys(old.runs + cell.runs)))
            merged[k] = cell
        return list(merged.values())

    @classmethod
    def of(cls, cells: Iterable[Cell]) -> "Region":
        return cls(tuple(cls._merged(cells)))

    def __add__(self, other: "Region") -> "Region":
        return Region.of(self.cells + other.cells)

    def unmeasured_flags(self, c: Conditions) -> list[str]:
        """The unpriced flags of `c` that no calibration run of its mechanism had, sorted."""
        return sorted(unpriced_of(c.key) - self._unpriced.get(c.mechanism, set()))

    def covers(self, c: Conditions) -> bool:
        cell = self._index.get((c.mechanism, _base(frozenset(c.key))))
        return cell is not None and cell.covers_numbers(c) and not self.unmeasured_flags(c)

    def why_not(self, c: Conditions) -> str:
        """Why `c` is outside the region, for the user: the unpriced flags no calibration run had, else what the
        calibration runs nearest to it measured (the same conditions at other sizes, else those sharing the most
        conditions), or that none measured the mechanism at all."""
        same = [cell for cell in self._index.values() if cell.mechanism == c.mechanism]
        if not same:
            return "no calibration run measured it"
        missing = self.unmeasured_flags(c)
        base = Conditions(c.mechanism, tuple(kv for kv in c.key if kv[0] != UNPRICED), c.numbers)
        flags = f"no calibration run had {UNPRICED_SEP.join(missing)}" if missing else ""
        if missing and self.covers(base):
            return flags
        key = frozenset(base.key)
        best = max(len(cell.key & key) for cell in same)
        near = [cell for cell in same if len(cell.key & key) == best][:2]
        what = "no calibration run in these conditions" if best < len(key) else "no calibration run at this size"
        return "; ".join(filter(None, (flags, f"{what}; the nearest measured: "
                                       + "; ".join(cell.words() for cell in near))))


@dataclass(frozen=True)
class Uncertainty:
    """The loaded figures (see the module docstring); `source` names the file."""

    memory_headroom: float = 0.0
    memory_source: str = "no uncertainty file: no headroom"
    mechanisms: dict[str, float] = field(default_factory=dict)
    extrapolation: float = 1.0
    unmeasured_floor: float = 0.0
    method: str = ""
    time_source: str = "no uncertainty file: ranges are points"
    source: str = ""
    region: Region = Region()


def cells_of_docs(docs: Iterable[dict]) -> tuple[Cell, ...]:
    """Cells from their documents (`Cell.to_doc`)."""
    return _cells(CellDoc.model_validate(d) for d in docs)


def _cells(docs: Iterable[CellDoc]) -> tuple[Cell, ...]:
    return tuple(Cell(d.mechanism, frozenset(d.key.items()),
                      tuple((n, lo, hi) for n, (lo, hi) in sorted(d.ranges.items())), tuple(d.runs)) for d in docs)


def load_uncertainty(path: Path = UNCERTAINTY_YAML) -> Uncertainty:
    if not path.is_file():
        return Uncertainty()
    doc = UncertaintyFile.model_validate(parse_yaml(read_text(path, "uncertainty"), "uncertainty", str(path)))
    bad = {k: v for k, v in doc.time.mechanisms.items() if not (v >= 0.0)}
    if bad:
        raise ValueError(f"{path}: time.mechanisms must be >= 0, got {bad}")
    return Uncertainty(memory_headroom=doc.memory.headroom, memory_source=doc.memory.provenance.source,
                       mechanisms=dict(doc.time.mechanisms), extrapolation=doc.time.extrapolation,
                       unmeasured_floor=doc.time.unmeasured_floor, method=doc.time.method,
                       time_source=doc.time.provenance.source, source=str(path),
                       region=Region.of(_cells(doc.evidence.cells)))


@lru_cache(maxsize=1)
def shipped_uncertainty() -> Uncertainty:
    return load_uncertainty()


def default_memory_headroom() -> float:
    """The shipped default fraction of device memory a plan keeps free."""
    return shipped_uncertainty().memory_headroom


def user_region(paths: Iterable[str]) -> Region:
    """The cells of the user's measured runs (`evidence.yaml` in `--profiles` directories, written by calibrate),
    read once per version of each file."""
    stamps = []
    for p in paths:
        try:
            st = Path(p).stat()
        except OSError:
            raise PlannerInputError("--profiles", f"{p}: cannot be read") from None
        stamps.append((p, st.st_mtime_ns, st.st_size))
    return _read_region(tuple(stamps))


@lru_cache(maxsize=32)
def _read_region(stamps: tuple[tuple[str, int, int], ...]) -> Region:
    cells: list[Cell] = []
    for p, _, _ in stamps:
        try:
            doc = EvidenceDoc.model_validate(parse_yaml(read_text(Path(p), "--profiles"), "--profiles", p) or {})
        except ValueError as exc:
            raise PlannerInputError("--profiles", f"{p}: {exc}") from None
        cells += _cells(doc.cells)
    return Region.of(cells)
