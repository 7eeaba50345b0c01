"""The typed form of profiles/runtimes.yaml: which runtime can run which vendors' devices in one job,
through which communication library, and how a node's device type is checked at start-up.

Contract: profiles/README.md ("runtimes.yaml").  `planner/profile_tables.py` loads and checks the file;
`planner/runtime.py` answers `Runtime.can_run(...)` from it.  Every row says where it comes from
(`source`), as every other profile table does.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from planner.schemas.types import StrictModel


class VendorLibrary(StrictModel):
    """How a runtime runs a job of one vendor's devices: the communication library torch.distributed
    uses (`library`), and what the job needs besides the runtime (`needs`: a plug-in, a fork)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    library: str = Field(min_length=1, description="NCCL, RCCL, HCCL, FlagCX, ...")
    needs: str | None = Field(None, description="what the job needs on top of the runtime (e.g. MindSpeed)")
    source: str = Field(min_length=1)


class VendorGroup(StrictModel):
    """Vendors whose devices one job of the runtime can hold together (a cross-vendor job), and the
    library that carries the traffic between them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vendors: tuple[str, ...] = Field(min_length=2)
    library: str = Field(min_length=1)
    needs: str | None = None
    source: str = Field(min_length=1)


class VendorRefusal(StrictModel):
    """Why a runtime does not run a vendor (or does not mix it with others), with its source: the
    message a refusal gives."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vendor: str = Field(min_length=1)
    why: str = Field(min_length=1)
    source: str = Field(min_length=1)


class RuntimeSupport(StrictModel):
    """One runtime's row: the vendors it runs alone (`vendors`), the vendor groups one job may span
    (`cross_vendor`; empty: one vendor per job), the documented refusals (`refuses`), how it runs
    uneven stages (`uneven_stages`), and notes (ways out the planner does not price)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str = Field(min_length=1)
    vendors: dict[str, VendorLibrary]
    cross_vendor: tuple[VendorGroup, ...] = ()
    refuses: tuple[VendorRefusal, ...] = ()
    uneven_stages: str = Field(min_length=1)
    notes: tuple[str, ...] = ()
    plannable: bool = Field(True, description="false: documented only (no launcher; not a --runtime value)")
    hypothetical: str | None = Field(None, description="set on a row no public release provides (a `hypothetical` "
                                     "entry applied by ProfileSet.assuming): what it assumes; no launcher is written")

    @model_validator(mode="after")
    def _groups_use_known_vendors(self) -> "RuntimeSupport":
        for group in self.cross_vendor:
            unknown = [v for v in group.vendors if v not in self.vendors]
            if unknown:
                raise ValueError(f"cross_vendor group {list(group.vendors)} names {unknown}, which `vendors` "
                                 "does not list (a job of those vendors alone must be runnable too)")
        return self


class HypotheticalRuntime(StrictModel):
    """A runtime no public release provides, for the bench's table "as the paper assumes": the row of
    an existing runtime (`extends`: its meshes, rules and launcher shape, priced by the same cost model
    and links) widened to vendors it does not run in one job today.  Never picked by `--runtime auto`
    and never given a launcher: only `ProfileSet.assuming(name)` applies it, for the bench."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    extends: str = Field(min_length=1, description="the runtime whose row this widens (e.g. flagscale)")
    title: str = Field(min_length=1, description="its name in messages and tables; says HYPOTHETICAL")
    assumes: str = Field(min_length=1, description="what it assumes that no public runtime does")
    vendors: dict[str, VendorLibrary] = Field(description="vendors added to the row's own")
    cross_vendor: tuple[VendorGroup, ...] = Field(min_length=1, description="replaces the row's groups")
    source: str = Field(min_length=1)


class VendorProbe(StrictModel):
    """How launch.sh asks a node which devices it has: a command that prints the product names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    probe: str = Field(min_length=1, description="shell command printing the devices' product names")
    visible_devices: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="the variable that selects a "
                                 "process's devices (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ...): a shell variable "
                                 "name, which launch.sh exports")
    source: str = Field(min_length=1)


class RuntimesFile(StrictModel):
    """profiles/runtimes.yaml."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtimes: dict[str, RuntimeSupport]
    hypothetical: dict[str, HypotheticalRuntime] = {}
    probes: dict[str, VendorProbe] = {}
    reported_names: dict[str, tuple[str, ...]] = Field(
        {}, description="device -> extra names its vendor's probe prints (besides the device's name and aliases)")
