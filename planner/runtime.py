"""The runtimes a plan can be written for, and what each can express.

A runtime is the training system that runs the plan: upstream Megatron-LM, or FlagScale's heterogeneous
process meshes.  The search, the rules, the launchers and the reports ask a `Runtime` what it can express
(one DP for the whole job or one per stage, CP, interleaving, ...) instead of comparing runtime names.
Plans, search choices and JSON carry the runtime by name (`Plan.runtime`, `GlobalChoice.runtime`);
`runtime_of(name)` turns a name into its Runtime.

Which runtime can run which cluster is data: profiles/runtimes.yaml (one row per runtime: the vendors
it runs, the vendor groups one job may span, each with its communication library and source), loaded by
planner/profile_tables.py.  `Runtime.can_run(types, profiles)` answers for a set of device types (a
cluster, or a plan's stages) with the reason; `choose_runtime` turns `--runtime auto|megatron|flagscale`
into the runtime and the part of the cluster one job of it can span, after leaving out the device types that do
not run the run's precision (planner/precision.py).

To add a runtime: a `Runtime` here and its row in profiles/runtimes.yaml, its rules in
planner/megatron/rules.py (`runtime_violations`), its launcher in planner/launcher/ (`LAUNCHERS`), and its
stage shapes in planner/search/space.py.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterable, Literal

from planner import precision as precisions
from planner.errors import PlannerInputError

if TYPE_CHECKING:  # types only: planner.schemas.plan imports this module (Plan.runtime), so no schema here
    from planner.profile_tables import ProfileSet
    from planner.schemas.cluster import ClusterSpec
    from planner.schemas.runtime_support import RuntimeSupport

RuntimeName = Literal["megatron", "flagscale"]
AUTO = "auto"
"""`--runtime auto`: the first runtime that runs the whole cluster, else the part one job can span."""


@dataclass(frozen=True)
class Runtime:
    """What one runtime can run.

    `per_stage_meshes`: every pipeline stage is a process mesh of its own, with its own DP (and its own
    micro-batch split), as FlagScale's `--hetero-process-meshes`; otherwise one (TP, CP, DP, EP, ETP) for
    the whole job, as upstream Megatron-LM.
    `per_stage_recompute`: each stage may choose its recompute (FlagScale's per-stage lists: full or none);
    otherwise one recompute setting for every stage.
    `contiguous_types`: each device type's stages must form one block of the pipeline (FlagScale orders
    ranks by device type); otherwise any order (`--contiguous-types` asks for blocks).
    `context_parallel`, `interleaving`: whether CP > 1 and VPP > 1 are available."""

    name: RuntimeName
    title: str
    per_stage_meshes: bool
    per_stage_recompute: bool
    contiguous_types: bool
    context_parallel: bool
    interleaving: bool

    def can_run(self, types: "ClusterSpec | Iterable[str]", profiles: "ProfileSet") -> "RunCheck":
        """Whether one job of this runtime can hold these device types (a cluster's, or a plan's
        stages'), by profiles/runtimes.yaml and the devices' vendors; the reason either way."""
        cluster_types = getattr(types, "device_types", None)  # a ClusterSpec
        device_types = list(cluster_types if cluster_types is not None else dict.fromkeys(types))
        row = profiles.runtime_support(self.name)
        title = row.title  # the row's: a hypothetical row (ProfileSet.assuming) says so in every message
        by_vendor: dict[str, list[str]] = {}
        for t in device_types:
            by_vendor.setdefault(_vendor_key(row, profiles.vendor(t)), []).append(t)
        what = _vendors_text(by_vendor)
        missing = [v for v in by_vendor if v not in row.vendors]
        if missing:
            why = "; ".join(_refusal(row, v) or f"runtimes.yaml lists no {v} support" for v in missing)
            return RunCheck(False, f"{title} cannot run {_vendors_text({v: by_vendor[v] for v in missing})}: {why}",
                            why=why)
        if len(by_vendor) == 1:
            (vendor,) = by_vendor
            lib = row.vendors[vendor]
            return RunCheck(True, f"{title} runs {what} with {lib.library}", lib.library,
                            tuple(n for n in (lib.needs,) if n))
        for group in row.cross_vendor:
            if set(by_vendor) <= set(group.vendors):
                return RunCheck(True, f"{title} runs {what} in one job with {group.library}", group.library,
                                tuple(n for n in (group.needs,) if n))
        why = _refusal(row, "*") or (f"no cross-vendor group of runtimes.yaml holds "
                                     f"{' + '.join(by_vendor)}")
        return RunCheck(False, f"{title} cannot run one job over {what}: {why}", why=why)


MEGATRON = Runtime(
    name="megatron", title="upstream Megatron-LM", per_stage_meshes=False, per_stage_recompute=False,
    contiguous_types=False, context_parallel=True, interleaving=True,
)
FLAGSCALE = Runtime(
    name="flagscale", title="FlagScale heterogeneous meshes", per_stage_meshes=True, per_stage_recompute=True,
    contiguous_types=True, context_parallel=False, interleaving=False,
)
RUNTIMES: dict[str, Runtime] = {r.name: r for r in (MEGATRON, FLAGSCALE)}
RUNTIME_NAMES: tuple[str, ...] = tuple(RUNTIMES)


RUNTIME_CHOICES: tuple[str, ...] = (AUTO, *RUNTIME_NAMES)
"""The values of `--runtime`."""


@dataclass(frozen=True)
class RunCheck:
    """`Runtime.can_run`'s answer: `ok`, and `reason` (how it runs, or why it cannot: one line), the
    communication library, and what the job needs besides the runtime (a plug-in, a fork)."""

    ok: bool
    reason: str
    library: str | None = None
    needs: tuple[str, ...] = ()
    why: str = ""  # when not ok: the refusal alone, without the runtime and the device types


@dataclass(frozen=True)
class RuntimeChoice:
    """What `--runtime` resolves to: the runtime, the part of the cluster its job runs on (the whole
    cluster when it can), and for every device type left out, why it stays idle: it does not run the run's
    precision (those in `lacks_precision`), or no job of the runtime holds it with the others."""

    requested: str
    runtime: Runtime
    cluster: ClusterSpec
    check: RunCheck
    left_out: dict[str, str] = field(default_factory=dict)
    lacks_precision: tuple[str, ...] = ()

    def as_json(self) -> dict:
        return {"requested": self.requested, "runtime": self.runtime.name, "library": self.check.library,
                "how": self.check.reason, "needs": list(self.check.needs), "device_types": list(
                    self.cluster.device_types), "left_out": dict(self.left_out)}


def _vendor_key(row: RuntimeSupport, vendor: str) -> str:
    """The row's spelling of a vendor (vendors compare case-insensitively)."""
    for name in (*row.vendors, *(r.vendor for r in row.refuses)):
        if name.lower() == vendor.lower():
            return name
    return vendor


def _refusal(row: RuntimeSupport, vendor: str) -> str | None:
    return next((r.why for r in row.refuses if r.vendor.lower() == vendor.lower()), None)


def _vendors_text(by_vendor: dict[str, list[str]]) -> str:
    return " and ".join(f"{'+'.join(types)} ({vendor})" for vendor, types in by_vendor.items())


def sub_cluster(cluster: ClusterSpec, types: Iterable[str]) -> ClusterSpec:
    """The node groups (and links between them) of these device types."""
    keep = set(types)
    if keep >= set(cluster.device_types):
        return cluster
    groups = tuple(g for g in cluster.groups if g.device_type in keep)
    links = tuple(link for link in cluster.links if set(link.between) <= keep)
    return cluster.model_copy(update={"groups": groups, "links": links})


Refusal = Callable[["Runtime"], "str | None"]
"""Why a runtime cannot run the model at any degrees (planner/megatron/rules.py `runtime_model_refusal`), or None."""


def _no_refusal(rt: "Runtime") -> None:
    return None


def choose_runtime(requested: str, cluster: ClusterSpec, profiles: "ProfileSet",
                   precision: str = "bf16", refuses: Refusal = _no_refusal) -> RuntimeChoice:
    """`--runtime` resolved.  The device types that do not run `precision` stay idle with the reason
    (planner/precision.py; none running it: PlannerInputError naming --cluster); the rest is the cluster the
    runtime is chosen for.  A named runtime must run all of it and the model (PlannerInputError with the reason
    and what would run it otherwise).  `auto`: the first runtime (megatron, then flagscale) that runs all of it
    and the model; when none does, the part one job can span with the most peak compute (at `precision`), every
    other device type idle with the reason.  `refuses(runtime)`: why the runtime cannot run the model (its
    model-level rules), or None."""
    idle = precisions.left_out(cluster, profiles, precision)
    have = cluster.gpus_by_type()
    choice = _choose(requested, sub_cluster(cluster, [t for t in cluster.device_types if t not in idle]), profiles,
                     precision, refuses, {t: have[t] for t in idle})
    if not idle:
        return choice
    left = {t: idle.get(t) or choice.left_out[t] for t in cluster.device_types if t in idle or t in choice.left_out}
    return replace(choice, left_out=left, lacks_precision=tuple(idle))


def _choose(requested: str, cluster: ClusterSpec, profiles: "ProfileSet", precision: str,
            refuses: Refusal, idle: dict[str, int]) -> RuntimeChoice:
    """choose_runtime on a cluster every type of which runs the precision (`idle`: the GPUs per type left out
    for the precision, for a refusal's steer)."""
    if requested != AUTO:
        rt = runtime_of(requested)
        check = rt.can_run(cluster, profiles)
        if not check.ok:
            raise PlannerInputError("--runtime", f"{check.reason}; {_steer(rt, cluster, profiles, precision, idle)}")
        why = refuses(rt)
        if why:
            raise PlannerInputError("--runtime", f"{rt.title} cannot run this model: {why}")
        return RuntimeChoice(requested, rt, cluster, check)
    for rt in plannable_runtimes(profiles):
        check = rt.can_run(cluster, profiles)
        if check.ok and not refuses(rt):
            return RuntimeChoice(AUTO, rt, cluster, check)
    return _best_part(cluster, profiles, precision, refuses)


def plannable_runtimes(profiles: "ProfileSet") -> list[Runtime]:
    """The runtimes with a launcher and a runtimes.yaml row, in RUNTIMES order."""
    rows = profiles.runtime_rows()
    return [rt for rt in RUNTIMES.values() if rt.name in rows and rows[rt.name].plannable]


def _best_part(cluster: ClusterSpec, profiles: "ProfileSet", precision: str,
               refuses: Refusal = _no_refusal) -> RuntimeChoice:
    """No runtime runs the whole cluster: the vendor subset one job can span with the most peak
    compute (then the most GPUs, then runtime order), of a runtime that runs the model."""
    by_vendor: dict[str, list[str]] = {}
    for t in cluster.device_types:
        by_vendor.setdefault(profiles.vendor(t).lower(), []).append(t)
    best: tuple | None = None
    for k in range(len(by_vendor), 0, -1):
        for vendors in itertools.combinations(by_vendor, k):
            part = sub_cluster(cluster, [t for v in vendors for t in by_vendor[v]])
            for order, rt in enumerate(plannable_runtimes(profiles)):
                check = rt.can_run(part, profiles)
                if check.ok and not refuses(rt):
                    key = (precisions.peak_flop_per_s(part, profiles, precision), part.world_size, -order)
                    if best is None or key > best[0]:
                        best = (key, rt, part, check)
    if best is None:
        refused = "; ".join(f"{rt.name}: {why}" for rt in plannable_runtimes(profiles) if (why := refuses(rt)))
        raise PlannerInputError("--cluster", "no runtime of profiles/runtimes.yaml runs any of its device types "
                                f"({', '.join(cluster.device_types)})"
                                + (f" with this model ({refused})" if refused else ""))
    _, rt, part, check = best
    left = {t: _why_left_out(t, part, profiles, refuses) for t in cluster.device_types
            if t not in part.device_types}
    return RuntimeChoice(AUTO, rt, part, check, left)


def _why_left_out(device_type: str, part: ClusterSpec, profiles: "ProfileSet", refuses: Refusal = _no_refusal
                  ) -> str:
    """Why no job of any runtime holds `device_type` together with `part`."""
    reasons = []
    for rt in plannable_runtimes(profiles):
        check = rt.can_run([*part.device_types, device_type], profiles)
        why = check.why if not check.ok else (refuses(rt) or check.reason)
        reasons.append(f"{rt.name}: {why}")
    return (f"no runtime runs {device_type} ({profiles.vendor(device_type)}) in one job with "
            f"{'+'.join(part.device_types)} ({'; '.join(reasons)})")


def _steer(rt: Runtime, cluster: ClusterSpec, profiles: "ProfileSet", precision: str,
           idle: dict[str, int]) -> str:
    """What runs this cluster instead of `rt`: another runtime, or auto's part of it (`idle`: the GPUs per type
    already left out for the precision, idle either way)."""
    for other in plannable_runtimes(profiles):
        if other is not rt and other.can_run(cluster, profiles).ok:
            return f"use --runtime {other.name} ({other.can_run(cluster, profiles).reason})"
    part = _best_part(cluster, profiles, precision)
    left = {**sub_cluster(cluster, part.left_out).gpus_by_type(), **idle}
    return (f"no runtime runs the whole cluster; --runtime auto plans {part.runtime.name} on its "
            f"{part.cluster.gpus_text()} and leaves its {' + '.join(f'{n} {t}' for t, n in left.items())} idle")


def runtime_of(name: str) -> Runtime:
    """The Runtime called `name`; ValueError naming the known ones otherwise."""
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(f"unknown runtime {name!r}; allowed: {', '.join(RUNTIME_NAMES)}") from None
