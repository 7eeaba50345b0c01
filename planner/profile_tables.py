"""Device profiles, link kinds and correction factors: loading, validation and lookup.

`ProfileSet.load()` reads the shipped tables under `profiles/` (devices/*.yaml, links.yaml) and any
directories the user passes with `--profiles DIR`; a device file there replaces or extends a shipped
device, a `corrections.yaml` there adds calibrated time multipliers.  The contract for every file is
written out in profiles/README.md.

The cost model reads the tables: efficiency curves in planner/cost/curves.py, the collective cost formula
(alpha-beta, per link and per group of ranks) in planner/cost/communication.py.
"""

from __future__ import annotations

import copy
import hashlib
import os
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import MissingProfileError, PlannerInputError
from planner.inputs.files import parse_yaml, read_text
from planner.schemas.cluster import POOL_SEP, ClusterSpec, CrossTypeLink, NodeGroup, pool_members
from planner.schemas.device import DeviceProfile, LinkProfile, Provenance
from planner.schemas.runtime_support import HypotheticalRuntime, RuntimesFile, RuntimeSupport, VendorProbe
from planner.schemas.types import StrictModel

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
"""The shipped profiles: devices/, links.yaml, clusters/ (see profiles/README.md)."""
PUBLISHED_SUBDIR = "published"
"""profiles/published/devices/: overlays built from published component benchmarks (planner/profiling/published.py),
layered over profiles/devices/ like a `--profiles DIR` (provenance kind `published`)."""

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
"""The collectives a link's efficiency curves and the corrections name (priced in planner/cost/communication.py)."""
KERNEL_CORRECTION_KINDS = ("gemm", "attention", "grouped_gemm", "memory_bound")
DISPATCH_CORRECTION_KINDS = ("dispatch_alltoall", "dispatch_flex", "dispatch_allgather")
"""Time multipliers on MoE token dispatch + combine, per Megatron dispatcher (planner/cost/dispatch.py)."""
FP8_CORRECTION_KINDS = ("fp8_tensorwise", "fp8_blockwise", "fp8_mxfp8")
"""Time multipliers on FP8 GEMMs, per recipe family (planner/cost/kernels.py FP8_CORRECTION_KIND)."""
HOST_CORRECTION_KINDS = ("host_overhead", "iteration_overhead")
"""Time multipliers on the host-side costs (planner/cost/kernels.py): the CPU time per kernel launch that bounds a
small layer (`host_overhead`) and the fixed cost of every iteration (`iteration_overhead`)."""
LEGACY_SOFTWARE_KINDS = ("gemm_legacy_software",)
"""Time multipliers on the dense GEMMs of runs made with software older than the runtime the planner plans for
(Megatron-LM 2020, NeMo-Megatron 2022: cuBLAS and CUDA of their day on GA100, whose curve measures today's; ROCm 6.1
on MI300X, whose curve measures ROCm 6.3's).  GA100's is fitted; MI300X's is published (the ratio of one benchmark on
the two ROCm versions, profiles/published/corrections.yaml).  Applied to only the calibration rows annotated
`software: legacy` (planner/calibration/runs.py `CalibrationCase.profiles_for`): the cost model never reads them, so a
plan the planner writes is priced with today's kernels."""
TIME_CORRECTION_KINDS = (KERNEL_CORRECTION_KINDS + COLLECTIVES + DISPATCH_CORRECTION_KINDS + FP8_CORRECTION_KINDS
                         + HOST_CORRECTION_KINDS)
ADDITIVE_CORRECTION_KINDS = ("memory_overhead_gib",)
IMBALANCE_KIND = "moe_imbalance_factor"
"""Measured MoE router imbalance (max/mean tokens per expert, >= 1); written by `cli.py calibrate` for device *."""
CORRECTION_KINDS = TIME_CORRECTION_KINDS + LEGACY_SOFTWARE_KINDS + ADDITIVE_CORRECTION_KINDS + (IMBALANCE_KIND,)

TIME_FACTOR_RANGE = (0.1, 10.0)
"""A time correction beyond 10x either way is no cost-model error: the log it came from was another run."""
MEMORY_OVERHEAD_RANGE_GIB = (0.0, 1024.0)
IMBALANCE_RANGE = (1.0, 65_536.0)  # max/mean tokens per expert is at most num_experts / topk

SLOWER_NIC = "slower-nic"
"""links.yaml default meaning: use the inter-node link of whichever of the two types has the slower NIC."""


# --------------------------------------------------------------------------------------------- file formats


class CorrectionEntry(StrictModel):
    """One row of corrections.yaml: a time multiplier (or, for memory_overhead_gib, GiB added)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str = Field(min_length=1, description="device name or alias, or * for every device")
    kind: str
    factor: float
    provenance: Provenance


class LinksFile(BaseModel):
    """profiles/links.yaml: cross-type link kinds and the default kind per vendor pair."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kinds: dict[str, dict[str, Any]] = {}
    same_vendor: str | None = None
    different_vendor: str | None = None
    vendor_pairs: list[dict[str, Any]] = []


@dataclass(frozen=True)
class FileRecord:
    """A file that contributed to the loaded set, with its content hash."""

    path: str
    sha256: str


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _display(path: Path) -> str:
    """Repository-relative path for shipped files, absolute otherwise."""
    try:
        return str(path.resolve().relative_to(PROFILES_DIR.parent))
    except ValueError:
        return str(path.resolve())


def _read_yaml(path: Path, field_name: str) -> Any:
    """A YAML file, read and checked by planner.inputs.files (UTF-8, size, depth; errors name the file)."""
    return parse_yaml(read_text(path, field_name), field_name, str(path))


def _validation_text(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err.get('loc', ())) or '(top)'}: {str(err.get('msg')).removeprefix('Value error, ')}"
        for err in exc.errors()
    )


def name_key(name: str) -> str:
    """Lookup key for device names: case-insensitive, ignoring '-', '_' and blanks (a host file writes
    `RTX 4090` as RTX_4090)."""
    return "".join(ch for ch in name.lower() if ch not in "-_" and not ch.isspace())


def _merge_device(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Overlay a (possibly partial) device file on a full one: top-level keys replace, except
    intra_node/inter_node, which merge key by key, their `efficiency` per collective."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if key in ("intra_node", "inter_node") and isinstance(value, dict) and isinstance(out.get(key), dict):
            link = out[key]
            for lkey, lvalue in value.items():
                if lkey == "efficiency" and isinstance(lvalue, dict) and isinstance(link.get("efficiency"), dict):
                    link["efficiency"].update(copy.deepcopy(lvalue))
                else:
                    link[lkey] = copy.deepcopy(lvalue)
        else:
            out[key] = copy.deepcopy(value)
    out["name"] = base["name"]
    return out


def _provenance_kinds(obj: Any) -> set[str]:
    """Every provenance kind found anywhere inside a profile model."""
    kinds: set[str] = set()
    if isinstance(obj, Provenance):
        kinds.add(obj.kind)
    elif isinstance(obj, BaseModel):
        for name in type(obj).model_fields:
            kinds |= _provenance_kinds(getattr(obj, name))
    elif isinstance(obj, dict):
        for value in obj.values():
            kinds |= _provenance_kinds(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            kinds |= _provenance_kinds(value)
    return kinds


# --------------------------------------------------------------------------------------------- the set


def _check_correction_range(entry: CorrectionEntry, where: str, field_name: str) -> None:
    """Time factors within TIME_FACTOR_RANGE, the memory overhead and the imbalance within theirs."""
    if entry.kind in TIME_CORRECTION_KINDS + LEGACY_SOFTWARE_KINDS:
        (low, high), what = TIME_FACTOR_RANGE, (
            "a correction beyond 10x either way is no cost-model error: the log it was fitted to came from another "
            "run (model, cluster, flags); re-run calibrate on a log of the run the flags describe")
    elif entry.kind == IMBALANCE_KIND:
        (low, high), what = IMBALANCE_RANGE, "max/mean tokens per expert is >= 1 and at most num_experts/topk"
    else:
        (low, high), what = MEMORY_OVERHEAD_RANGE_GIB, "GiB added per GPU"
    if not low <= entry.factor <= high:
        raise PlannerInputError(field_name, f"{where} ({entry.device} {entry.kind}): factor {entry.factor:g} is outside "
                                            f"{low:g}..{high:g}; {what}")


@dataclass
class _Builder:
    """Mutable state while files are read; frozen into a ProfileSet at the end."""

    raw_devices: dict[str, dict[str, Any]] = field(default_factory=dict)  # canonical -> raw dict
    device_files: dict[str, list[FileRecord]] = field(default_factory=dict)
    link_kinds: dict[str, LinkProfile] = field(default_factory=dict)
    link_files: list[FileRecord] = field(default_factory=list)
    same_vendor: str = SLOWER_NIC
    different_vendor: str = "host-memory"
    vendor_pairs: dict[frozenset[str], str] = field(default_factory=dict)
    corrections: dict[tuple[str, str], CorrectionEntry] = field(default_factory=dict)
    correction_files: list[FileRecord] = field(default_factory=list)
    published_corrections: dict[tuple[str, str], CorrectionEntry] = field(default_factory=dict)  # not fitted
    published_correction_files: list[FileRecord] = field(default_factory=list)
    cluster_dirs: list[Path] = field(default_factory=list)
    user_files: list[str] = field(default_factory=list)  # files read from --profiles directories
    evidence_files: list[str] = field(default_factory=list)  # evidence.yaml of --profiles dirs (planner/uncertainty.py)
    measured_plan_files: list[str] = field(default_factory=list)  # measured_plans.json of --profiles dirs (trials)
    runtimes: dict[str, RuntimeSupport] = field(default_factory=dict)
    hypothetical: dict[str, HypotheticalRuntime] = field(default_factory=dict)
    probes: dict[str, VendorProbe] = field(default_factory=dict)
    reported_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    runtime_files: list[FileRecord] = field(default_factory=list)

    def _index(self) -> dict[str, str]:
        index: dict[str, str] = {}
        for canonical, raw in self.raw_devices.items():
            for n in [canonical, *raw.get("aliases", [])]:
                index[name_key(str(n))] = canonical
        return index

    def add_device_file(self, path: Path, field_name: str) -> None:
        raw = _read_yaml(path, field_name)
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise PlannerInputError(field_name, f"{path}: a device file is a mapping with at least `name:`")
        known = self._index().get(name_key(raw["name"]))
        if known is not None:
            merged = _merge_device(self.raw_devices[known], raw)
            canonical = known
        else:
            merged, canonical = raw, raw["name"]
        try:
            profile = DeviceProfile.model_validate(merged)
        except ValidationError as exc:
            what = "overlay on " + known if known else "new device (a complete profile is needed)"
            raise PlannerInputError(field_name, f"{path} ({what}): {_validation_text(exc)}") from exc
        index = self._index()
        for alias in profile.aliases:
            other = index.get(name_key(alias))
            if other is not None and other != canonical:
                raise PlannerInputError(field_name, f"{path}: alias {alias!r} already names device {other}")
        self.raw_devices[canonical] = merged
        self.device_files.setdefault(canonical, []).append(FileRecord(_display(path), _sha256(path)))

    def add_links_file(self, path: Path, field_name: str) -> None:
        raw = _read_yaml(path, field_name) or {}
        try:
            parsed = LinksFile.model_validate(raw)
            for kind, body in parsed.kinds.items():
                self.link_kinds[kind] = LinkProfile.model_validate({"kind": kind, **body})
        except ValidationError as exc:
            raise PlannerInputError(field_name, f"{path}: {_validation_text(exc)}") from exc
        if parsed.same_vendor:
            self.same_vendor = parsed.same_vendor
        if parsed.different_vendor:
            self.different_vendor = parsed.different_vendor
        for row in parsed.vendor_pairs:
            between, kind = row.get("between"), row.get("kind")
            if not (isinstance(between, list) and len(between) == 2 and isinstance(kind, str)):
                raise PlannerInputError(field_name, f"{path}: vendor_pairs rows are {{between: [VENDOR, VENDOR], kind: KIND}}")
            self.vendor_pairs[frozenset(v.lower() for v in between)] = kind
        for kind in [self.same_vendor, self.different_vendor, *self.vendor_pairs.values()]:
            if kind != SLOWER_NIC and kind not in self.link_kinds:
                raise PlannerInputError(field_name, f"{path}: default kind {kind!r} is not defined under `kinds`")
        self.link_files.append(FileRecord(_display(path), _sha256(path)))

    def add_corrections_file(self, path: Path, field_name: str) -> None:
        raw = _read_yaml(path, field_name) or []
        if isinstance(raw, dict):
            raw = raw.get("corrections", [])
        if not isinstance(raw, list):
            raise PlannerInputError(field_name, f"{path}: corrections.yaml is a list of {{device, kind, factor, provenance}}")
        index = self._index()
        seen: set[tuple[str, str]] = set()
        for i, row in enumerate(raw):
            try:
                entry = CorrectionEntry.model_validate(row)
            except ValidationError as exc:
                raise PlannerInputError(field_name, f"{path} entry {i}: {_validation_text(exc)}") from exc
            if entry.kind not in CORRECTION_KINDS:
                raise PlannerInputError(
                    field_name, f"{path} entry {i}: unknown kind {entry.kind!r}; allowed: {', '.join(CORRECTION_KINDS)}"
                )
            _check_correction_range(entry, f"{path} entry {i}", field_name)
            device = "*" if entry.device == "*" else index.get(name_key(entry.device))
            if device is None:
                raise PlannerInputError(
                    field_name, f"{path} entry {i}: unknown device {entry.device!r}; known: {', '.join(sorted(self.raw_devices))}"
                )
            key = (device, entry.kind)
            if key in seen:
                raise PlannerInputError(field_name, f"{path} entry {i}: duplicate correction for {device} {entry.kind}")
            seen.add(key)
            self.corrections[key] = entry
        self.correction_files.append(FileRecord(_display(path), _sha256(path)))

    def add_runtimes_file(self, path: Path, field_name: str) -> None:
        """runtimes.yaml: rows replace the rows of the same runtime name; probes and reported names
        are added (later files win).  Device names must be known devices."""
        raw = _read_yaml(path, field_name) or {}
        try:
            parsed = RuntimesFile.model_validate(raw)
        except ValidationError as exc:
            raise PlannerInputError(field_name, f"{path}: {_validation_text(exc)}") from exc
        index = self._index()
        for device, names in parsed.reported_names.items():
            canonical = index.get(name_key(device))
            if canonical is None:
                raise PlannerInputError(field_name, f"{path}: reported_names: unknown device {device!r}; known: "
                                                    f"{', '.join(sorted(self.raw_devices))}")
            self.reported_names[canonical] = tuple(names)
        self.runtimes.update(parsed.runtimes)
        self.hypothetical.update(parsed.hypothetical)
        self.probes.update(parsed.probes)
        self.runtime_files.append(FileRecord(_display(path), _sha256(path)))

    def add_dir(self, root: Path, field_name: str) -> None:
        """Read one profiles directory: devices/*.yaml, links.yaml, corrections.yaml, clusters/, and note its
        evidence.yaml (the conditions its calibration measured) and measured_plans.json (the plans its trials
        measured, `calibrate --trials`).  Other files (profile_report.json, calibration_report.json, ...) are not
        read."""
        if not root.is_dir():
            raise PlannerInputError(field_name, f"{root} is not a directory")
        files = sorted((root / "devices").glob("*.yaml")) if (root / "devices").is_dir() else []
        for path in files:
            self.add_device_file(path, field_name)
            self.user_files.append(str(path))
        if os.path.lexists(root / "links.yaml"):  # read only if a regular file: anything else is refused
            self.add_links_file(root / "links.yaml", field_name)
            self.user_files.append(str(root / "links.yaml"))
        if os.path.lexists(root / "corrections.yaml"):
            self.add_corrections_file(root / "corrections.yaml", field_name)
            self.user_files.append(str(root / "corrections.yaml"))
        if os.path.lexists(root / "runtimes.yaml"):
            self.add_runtimes_file(root / "runtimes.yaml", field_name)
        if (root / "evidence.yaml").is_file():  # measured conditions, read by planner/uncertainty.py user_region
            self.evidence_files.append(str(root / "evidence.yaml"))
        if (root / "measured_plans.json").is_file():  # the trials' measured plans, read by planner/trials.py
            self.measured_plan_files.append(str(root / "measured_plans.json"))
        if (root / "clusters").is_dir():
            self.cluster_dirs.append(root / "clusters")


class ProfileSet:
    """Every known device profile, link kind and correction factor.  Build with `ProfileSet.load()`."""

    def __init__(self, builder: _Builder):
        self._devices: dict[str, DeviceProfile] = {
            name: DeviceProfile.model_validate(raw) for name, raw in builder.raw_devices.items()
        }
        self._index = builder._index()
        self._by_name: dict[str, DeviceProfile] = {}  # device(name) memo: the cost model asks per stage
        self._device_files = {k: tuple(v) for k, v in builder.device_files.items()}
        self._link_kinds = dict(builder.link_kinds)
        self._link_files = tuple(builder.link_files)
        self._same_vendor = builder.same_vendor
        self._different_vendor = builder.different_vendor
        self._vendor_pairs = dict(builder.vendor_pairs)
        self._corrections = dict(builder.corrections)
        self._correction_files = tuple(builder.correction_files)
        self.cluster_dirs: tuple[Path, ...] = tuple(builder.cluster_dirs)
        self.user_files: tuple[str, ...] = tuple(builder.user_files)  # read from --profiles directories
        self.evidence_files: tuple[str, ...] = tuple(builder.evidence_files)
        self.measured_plan_files: tuple[str, ...] = tuple(builder.measured_plan_files)
        self._runtimes = dict(builder.runtimes)
        self._hypothetical = dict(builder.hypothetical)
        self._probes = dict(builder.probes)
        self._reported_names = dict(builder.reported_names)
        self._runtime_files = tuple(builder.runtime_files)

    # ---- loading

    @classmethod
    def load(cls, extra_dirs: Iterable[str | Path] = ()) -> "ProfileSet":
        """The shipped profiles (cached), overlaid with each `--profiles DIR` in order (later wins)."""
        extra = tuple(Path(d) for d in extra_dirs)
        if not extra:
            return _load_shipped()
        builder = _shipped_builder()
        for root in extra:
            builder.add_dir(root, "--profiles")
        out = cls(builder)
        faster = out.faster_than_peak()
        if faster:
            files = ", ".join(out.user_files[:3]) + (", ..." if len(out.user_files) > 3 else "")
            raise PlannerInputError("--profiles", f"{files}: the corrections make {faster[0]}; no kernel runs faster "
                                                  "than its device's peak: the log they were fitted to claims an "
                                                  "impossible speed, or came from another run (re-run calibrate on a "
                                                  "log of the run the flags describe)")
        return out

    @classmethod
    def uncalibrated(cls) -> "ProfileSet":
        """The shipped device and link tables without profiles/corrections.yaml: the datasheet-derived
        model the calibration fit (planner/calibration/fit.py) starts from, with the published (not fitted)
        factors of profiles/published/corrections.yaml."""
        return _load_shipped_uncalibrated()

    def with_corrections(self, factors: dict[tuple[str, str], float], provenance: Provenance) -> "ProfileSet":
        """A copy whose corrections are these {(device or "*", kind): factor} on top of this set's
        (same precedence: a device-specific entry beats "*")."""
        out = copy.copy(self)
        out._corrections = dict(self._corrections)
        for (device, kind), factor in factors.items():
            if kind not in CORRECTION_KINDS:
                raise ValueError(f"unknown correction kind {kind!r}; allowed: {', '.join(CORRECTION_KINDS)}")
            canonical = "*" if device == "*" else self.canonical_name(device)
            out._corrections[(canonical, kind)] = CorrectionEntry(
                device=canonical, kind=kind, factor=factor, provenance=provenance)
        return out

    def correction_entries(self) -> list[CorrectionEntry]:
        """Every loaded correction, sorted by device and kind."""
        return [self._corrections[k] for k in sorted(self._corrections)]

    # ---- devices

    def names(self) -> list[str]:
        """Canonical device names, sorted."""
        return sorted(self._devices)

    def canonical_name(self, name: str) -> str:
        """The canonical name for a device name or alias (case-insensitive; '-', '_', spaces ignored); a
        pooled type ("H100+H200", planner/schemas/cluster.py POOL_SEP) names each member canonically."""
        if POOL_SEP in name:
            return POOL_SEP.join(self.canonical_name(m) for m in pool_members(name))
        canonical = self._index.get(name_key(name))
        if canonical is None:
            raise PlannerInputError(
                "device",
                f"unknown device {name!r}; known: {', '.join(self.names())} (case-insensitive; aliases accepted)",
            )
        return canonical

    def device(self, name: str) -> DeviceProfile:
        """A device's profile; a pooled type's is its limiting member's (limiting_member)."""
        found = self._by_name.get(name)
        if found is None:
            found = self._by_name[name] = self._devices[self.limiting_member(name)]
        return found

    def pool(self, type_a: str, type_b: str, precision: str) -> str | None:
        """The pooled type of two device types whose GPUs one stage's DP may span ("H100+H200", the limiting
        member first), or None: they must share a vendor (one software stack, one job), both run the
        precision, and the member with the least memory must also be the slowest (peak for the precision,
        then memory bandwidth), so that the stage runs at its speed and fits in its memory."""
        a, b = self.canonical_name(type_a), self.canonical_name(type_b)
        da, db = self._devices[a], self._devices[b]
        if a == b or da.vendor.lower() != db.vendor.lower():
            return None
        try:
            speed = {t: (d.peak_flop_per_s(precision), d.hbm_bandwidth_tb_per_s) for t, d in ((a, da), (b, db))}
        except MissingProfileError:
            return None
        low = self.limiting_member(a + POOL_SEP + b)
        high = b if low == a else a
        return low + POOL_SEP + high if speed[low] <= speed[high] else None

    def limiting_member(self, name: str) -> str:
        """The canonical type a (pooled) stage type is priced as: itself, or the pool's member with the least
        memory, then the least peak (planner/search/space.py forms pools only where that member is also the
        slowest, so that a stage spanning the pool runs at its speed and fits in its memory)."""
        members = [self.canonical_name(m) for m in pool_members(name)]
        return min(members, key=lambda m: (self._devices[m].memory_gib, min(self._devices[m].peak_tflops.values()), m))

    def group_links(self, group: NodeGroup) -> tuple[LinkProfile, LinkProfile]:
        """(intra_node, inter_node) links of a node group, with the group's bandwidth and NIC-kind overrides applied."""
        dev = self.device(group.device_type)
        intra, inter = dev.intra_node, dev.inter_node
        if group.intra_node_bandwidth_gb_per_s is not None:
            intra = intra.model_copy(update={"bandwidth_gb_per_s": group.intra_node_bandwidth_gb_per_s})
        if group.inter_node_bandwidth_gb_per_s is not None:
            inter = inter.model_copy(update={"bandwidth_gb_per_s": group.inter_node_bandwidth_gb_per_s})
        if group.inter_node_kind is not None:
            inter = inter.model_copy(update={"kind": group.inter_node_kind})
        return intra, inter

    def vendor(self, name: str) -> str:
        """The vendor of a device type (profiles/devices/*.yaml `vendor`)."""
        return self.device(name).vendor

    def reported_names(self, name: str) -> tuple[str, ...]:
        """Every name a node's probe may print for this device: its name, aliases and reported_names."""
        canonical = self.canonical_name(name)
        return tuple(dict.fromkeys((canonical, *self._devices[canonical].aliases, *self._reported_names.get(canonical, ()))))

    # ---- runtimes (runtimes.yaml)

    def runtime_support(self, runtime: str) -> RuntimeSupport:
        """The runtimes.yaml row of a runtime (MissingProfileError when no file gives one)."""
        if runtime not in self._runtimes:
            raise MissingProfileError(f"runtimes.yaml has no row for runtime {runtime!r} (rows: "
                                      f"{', '.join(sorted(self._runtimes)) or 'none'})")
        return self._runtimes[runtime]

    def runtime_rows(self) -> dict[str, RuntimeSupport]:
        return dict(self._runtimes)

    def hypothetical_runtimes(self) -> dict[str, HypotheticalRuntime]:
        """runtimes.yaml's `hypothetical` entries: runtimes no public release provides."""
        return dict(self._hypothetical)

    def assuming(self, name: str) -> "ProfileSet":
        """These profiles with the hypothetical runtime `name` in place of the row it extends: that
        runtime then runs the widened vendor groups in one job, its row says HYPOTHETICAL and what it
        assumes (`RuntimeSupport.hypothetical`; the launchers refuse such a row).  Devices, links and
        corrections are these, so a plan is priced as it would be on the runtime it extends.  For the
        bench's table "as the paper assumes" only."""
        if name not in self._hypothetical:
            raise MissingProfileError(f"runtimes.yaml has no hypothetical runtime {name!r} (hypothetical: "
                                      f"{', '.join(sorted(self._hypothetical)) or 'none'})")
        hyp = self._hypothetical[name]
        base = self.runtime_support(hyp.extends)
        added = {v.lower() for v in hyp.vendors}
        row = base.model_copy(update={
            "title": hyp.title, "hypothetical": hyp.assumes, "plannable": False,
            "vendors": {**base.vendors, **hyp.vendors}, "cross_vendor": hyp.cross_vendor,
            "refuses": tuple(r for r in base.refuses if r.vendor.lower() not in added)})
        out = copy.copy(self)
        out._runtimes = {**self._runtimes, hyp.extends: row}
        return out

    def probe(self, vendor: str) -> VendorProbe | None:
        """How launch.sh asks a node of this vendor for its device names (None: no probe known)."""
        for name, probe in self._probes.items():
            if name.lower() == vendor.lower():
                return probe
        return None

    # ---- links

    def link_kind(self, kind: str) -> LinkProfile:
        """A cross-type link kind from links.yaml (host-memory, ethernet, ...)."""
        if kind not in self._link_kinds:
            raise MissingProfileError(f"unknown link kind {kind!r}; links.yaml defines {sorted(self._link_kinds)}")
        return self._link_kinds[kind]

    def link_kinds(self) -> list[str]:
        return sorted(self._link_kinds)

    def cross_link(self, type_a: str, type_b: str, cluster: ClusterSpec | None = None) -> LinkProfile:
        """The link pipeline activations cross between two device types.

        A cluster's explicit CrossTypeLink wins (its bandwidth/latency, with the efficiency curves of
        the links.yaml kind of the same name, or of the slower device's inter-node link otherwise).
        Else links.yaml: an explicit vendor pair, then `same_vendor` (default `slower-nic`: the
        inter-node link of the type with the slower NIC) or `different_vendor` (default host-memory).
        The same type on both sides gets its own inter-node link."""
        if POOL_SEP in type_a or POOL_SEP in type_b:  # the slowest link between any two members
            links = [self.cross_link(x, y, cluster) if x != y else self._nic(self.canonical_name(x), cluster)
                     for x in pool_members(type_a) for y in pool_members(type_b)]
            return min(links, key=lambda link: link.bandwidth_gb_per_s)
        a, b = self.canonical_name(type_a), self.canonical_name(type_b)
        nic_a, nic_b = self._nic(a, cluster), self._nic(b, cluster)
        slower = nic_a if nic_a.bandwidth_gb_per_s <= nic_b.bandwidth_gb_per_s else nic_b
        if cluster is not None:
            explicit = self._explicit_link(a, b, cluster)
            if explicit is not None:
                template = self._link_kinds.get(explicit.kind, slower)
                return LinkProfile(
                    kind=explicit.kind,
                    bandwidth_gb_per_s=explicit.bandwidth_gb_per_s,
                    latency_us=explicit.latency_us,
                    efficiency=template.efficiency,
                    provenance=Provenance(
                        kind="datasheet-derived",
                        source=f"cluster {cluster.name!r}: declared {a}<->{b} link ({explicit.kind}, "
                        f"{explicit.bandwidth_gb_per_s:g} GB/s, {explicit.latency_us:g} us); efficiency curves from "
                        f"{template.kind!r}: {template.provenance.source}",
                    ),
                )
        if a == b:
            return nic_a
        va, vb = self._devices[a].vendor.lower(), self._devices[b].vendor.lower()
        kind = self._vendor_pairs.get(frozenset({va, vb}))
        if kind is None:
            kind = self._same_vendor if va == vb else self._different_vendor
        return slower if kind == SLOWER_NIC else self.link_kind(kind)

    def _nic(self, canonical: str, cluster: ClusterSpec | None) -> LinkProfile:
        if cluster is not None:
            for group in cluster.groups:
                if name_key(group.device_type) == name_key(canonical) or self._index.get(
                    name_key(group.device_type)
                ) == canonical:
                    return self.group_links(group)[1]
        return self._devices[canonical].inter_node

    def _explicit_link(self, a: str, b: str, cluster: ClusterSpec) -> CrossTypeLink | None:
        for link in cluster.links:
            ends = {self._index.get(name_key(n), n) for n in link.between}
            if ends == {a, b}:
                return link
        return None

    # ---- corrections

    def correction(self, device: str, kind: str) -> float:
        """Time multiplier for `kind` on `device` from the loaded corrections (1.0 when none);
        for `memory_overhead_gib` the GiB to add (0.0 when none); for `moe_imbalance_factor` the
        max/mean tokens per expert (1.0 when none; see also `moe_imbalance_factor()`).  A
        device-specific entry beats `*`."""
        if kind not in CORRECTION_KINDS:
            raise PlannerInputError("correction", f"unknown kind {kind!r}; allowed: {', '.join(CORRECTION_KINDS)}")
        canonical = self.limiting_member(device)
        entry = self._corrections.get((canonical, kind)) or self._corrections.get(("*", kind))
        if entry is None:
            return 0.0 if kind in ADDITIVE_CORRECTION_KINDS else 1.0
        return entry.factor

    def faster_than_peak(self, devices: Iterable[str] | None = None) -> list[str]:
        """Each compute kernel (GEMMs, grouped GEMMs, attention, FP8 GEMMs) whose corrections make it faster
        than the device's FLOP peak: the best point of its efficiency curve over its time factor
        (planner/cost/kernels.py) above 1 where the factor is below 1 (a profile's own curve may reach 1.2:
        measured clocks above the datasheet's).  Empty for any set that prices real runs (the shipped one
        peaks at 97%).  `devices`: those to check (default: every one)."""
        out: list[str] = []
        for name in self.names() if devices is None else devices:
            d, c = self.device(name), partial(self.correction, name)
            gemm = max(p.efficiency for p in d.gemm_efficiency.points)
            grouped = gemm * max(p.efficiency for p in d.grouped_gemm_efficiency.points)
            fp8 = min(c(k) for k in FP8_CORRECTION_KINDS)
            checks = (("GEMMs", gemm, c("gemm")), ("grouped expert GEMMs", grouped, c("grouped_gemm")),
                      ("attention", max(p.efficiency for p in d.attention_efficiency.points), c("attention")),
                      ("FP8 GEMMs", gemm * d.fp8_gemm_efficiency_ratio, fp8 * c("gemm")))
            out += [f"{name}'s {what} run at {best / factor:.0%} of its peak (best efficiency {best:.0%}, time factor "
                    f"{factor:.3g})" for what, best, factor in checks if factor < 1 and best / factor > 1]
        return out

    def moe_imbalance_factor(self) -> float | None:
        """The calibrated MoE imbalance factor (corrections row `device: "*"`, kind moe_imbalance_factor),
        or None when no corrections file gives one."""
        entry = self._corrections.get(("*", IMBALANCE_KIND))
        return entry.factor if entry is not None else None

    def corrections_for(self, device: str) -> dict[str, float]:
        """Every correction kind for one device (defaults filled in)."""
        return {kind: self.correction(device, kind) for kind in CORRECTION_KINDS}

    # ---- provenance

    def provenance_manifest(self) -> list[dict[str, Any]]:
        """Where every loaded table came from: one row per device, link kind set and corrections file,
        with the effective file, its sha256, every layered file in order, and the provenance kinds."""
        rows: list[dict[str, Any]] = []
        for name in self.names():
            files = self._device_files.get(name, ())
            rows.append(
                {
                    "item": "device",
                    "name": name,
                    "file": files[-1].path if files else None,
                    "sha256": files[-1].sha256 if files else None,
                    "layers": [{"file": f.path, "sha256": f.sha256} for f in files],
                    "provenance_kinds": sorted(_provenance_kinds(self._devices[name])),
                }
            )
        for f in self._link_files:
            rows.append(
                {
                    "item": "links",
                    "name": "cross-type link kinds",
                    "file": f.path,
                    "sha256": f.sha256,
                    "layers": [{"file": f.path, "sha256": f.sha256}],
                    "provenance_kinds": sorted(_provenance_kinds(self._link_kinds)),
                }
            )
        for f in self._runtime_files:
            rows.append(
                {
                    "item": "runtimes",
                    "name": "which runtime can run which vendors",
                    "file": f.path,
                    "sha256": f.sha256,
                    "layers": [{"file": f.path, "sha256": f.sha256}],
                    "provenance_kinds": [],
                }
            )
        for f in self._correction_files:
            rows.append(
                {
                    "item": "corrections",
                    "name": "correction factors",
                    "file": f.path,
                    "sha256": f.sha256,
                    "layers": [{"file": f.path, "sha256": f.sha256}],
                    "provenance_kinds": sorted({e.provenance.kind for e in self._corrections.values()}),
                }
            )
        return rows


@lru_cache(maxsize=1)
def _shipped_builder_cached() -> _Builder:
    builder = _Builder()
    root = PROFILES_DIR
    for path in sorted((root / "devices").glob("*.yaml")):
        builder.add_device_file(path, "profiles")
    for path in sorted((root / PUBLISHED_SUBDIR / "devices").glob("*.yaml")):
        builder.add_device_file(path, "profiles")  # published component tables over the datasheet ones
    if (root / "links.yaml").is_file():
        builder.add_links_file(root / "links.yaml", "profiles")
    if (root / PUBLISHED_SUBDIR / "corrections.yaml").is_file():  # ratios of public kernel measurements, not fitted
        builder.add_corrections_file(root / PUBLISHED_SUBDIR / "corrections.yaml", "profiles")
        builder.published_corrections = dict(builder.corrections)
        builder.published_correction_files = list(builder.correction_files)
    if (root / "corrections.yaml").is_file():
        builder.add_corrections_file(root / "corrections.yaml", "profiles")
    builder.add_runtimes_file(root / "runtimes.yaml", "profiles")
    builder.cluster_dirs.append(root / "clusters")
    return builder


def _shipped_builder() -> _Builder:
    """A private copy of the shipped builder, safe to extend."""
    return copy.deepcopy(_shipped_builder_cached())


@lru_cache(maxsize=1)
def _load_shipped() -> ProfileSet:
    return ProfileSet(_shipped_builder_cached())


@lru_cache(maxsize=1)
def _load_shipped_uncalibrated() -> ProfileSet:
    builder = copy.copy(_shipped_builder_cached())
    builder.corrections = dict(builder.published_corrections)  # the fit starts from the published factors
    builder.correction_files = list(builder.published_correction_files)
    return ProfileSet(builder)
