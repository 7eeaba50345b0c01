"""ClusterSpec: node groups of one device type each, and the links between groups."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from planner.schemas.types import MAX_GPUS, BandwidthGBps, DisplayText, LatencyUs, StrictModel


NicKind = Literal["infiniband", "roce", "ethernet", "efa", "slingshot"]
"""The kinds of network between nodes a node group may state (LinkProfile.kind of a NIC)."""


class NodeGroup(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    device_type: DisplayText = Field(description="canonical device name, e.g. H800 (see profiles/devices)")
    num_nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    intra_node_bandwidth_gb_per_s: BandwidthGBps | None = Field(None, description="override, per GPU per direction")
    inter_node_bandwidth_gb_per_s: BandwidthGBps | None = Field(None, description="override, per GPU per direction")
    inter_node_kind: NicKind | None = Field(
        None, description="override of the device profile's NIC kind between nodes (efa: AWS's Elastic Fabric "
        "Adapter); priced with the device's inter-node curves at the group's bandwidth, and told apart by the evidence "
        "(a fabric no calibration run used is unmeasured)")

    scale_up_domain_gpus: int | None = Field(
        None, gt=0, description="GPUs that share the intra-node link, a multiple of gpus_per_node: an NVLink domain "
        "of several hosts (GB200/GB300 NVL72 racks: the trays Slurm's --segment keeps together, 4 GPUs each); None: "
        "one host")

    @model_validator(mode="after")
    def _check_domain(self) -> "NodeGroup":
        d = self.scale_up_domain_gpus
        if d is None:
            return self
        if d % self.gpus_per_node:
            raise ValueError(f"scale_up_domain_gpus {d} must be a multiple of gpus_per_node {self.gpus_per_node}: "
                             "a domain joins whole hosts")
        if self.num_gpus > d and self.num_gpus % d:
            raise ValueError(
                f"scale_up_domain_gpus {d}: the group's {self.num_gpus} GPUs are not whole domains of {d}; give a "
                f"domain that divides {self.num_gpus} (the trays of each rack a job uses, as sbatch --segment places "
                f"them: e.g. {self.num_gpus // self.gpus_per_node} hosts in domains of "
                f"{largest_segment(self.num_nodes, d // self.gpus_per_node)} hosts)")
        return self

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """GPUs that share the intra-node link: the scale-up domain, else the host."""
        return min(self.scale_up_domain_gpus or self.gpus_per_node, self.num_gpus)


def largest_segment(num_nodes: int, max_hosts: int) -> int:
    """The hosts of one scale-up domain a job of `num_nodes` hosts gets when each domain holds at most `max_hosts`:
    all of them where they fit, else the largest count up to `max_hosts` that divides `num_nodes` (how NVIDIA's
    Megatron-Bridge launcher sizes Slurm's --segment on GB200/GB300: scripts/performance/utils/executors.py)."""
    if num_nodes <= max_hosts:
        return num_nodes
    return next(k for k in range(max_hosts, 0, -1) if num_nodes % k == 0)


class CrossTypeLink(StrictModel):
    """How two device types talk (pipeline point-to-point only crosses types)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    between: tuple[DisplayText, DisplayText]
    kind: DisplayText = Field(description="e.g. host-memory, ethernet, infiniband")
    bandwidth_gb_per_s: BandwidthGBps = Field(description="per GPU per direction")
    latency_us: LatencyUs = 20.0


POOL_SEP = "+"
"""A pooled device type: the types of the cluster whose GPUs one pipeline stage's DP may span ("H100+H200")."""


def pool_members(device_type: str) -> tuple[str, ...]:
    """The device types a (pooled) stage type draws its GPUs from: itself, or the pool's members."""
    return tuple(device_type.split(POOL_SEP))


class ClusterSpec(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: DisplayText = "cluster"
    groups: tuple[NodeGroup, ...]
    links: tuple[CrossTypeLink, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> "ClusterSpec":
        if not self.groups:
            raise ValueError("a cluster needs at least one node group")
        if self.world_size > MAX_GPUS:
            raise ValueError(f"the cluster has {self.world_size} GPUs; the planner handles at most {MAX_GPUS}")
        self._check_node_shapes()
        self._check_links()
        return self

    def _check_node_shapes(self) -> None:
        """The planner prices one node shape per device type: groups of one type must agree on GPUs per
        node, on the bandwidth overrides and on the network between nodes (else the first group's would silently
        apply to all)."""
        first: dict[str, tuple[int, NodeGroup]] = {}
        for i, g in enumerate(self.groups):
            if g.device_type not in first:
                first[g.device_type] = (i, g)
                continue
            j, f = first[g.device_type]
            for key in ("gpus_per_node", "scale_up_domain_gpus", "intra_node_bandwidth_gb_per_s",
                        "inter_node_bandwidth_gb_per_s", "inter_node_kind"):
                if getattr(g, key) != getattr(f, key):
                    raise ValueError(
                        f"groups[{i}].{key}: {g.device_type} is also groups[{j}] with {key} {getattr(f, key)}, here "
                        f"{getattr(g, key)}; the planner models one node shape per device type: give both groups "
                        "the same, or list only one of them")

    def _check_links(self) -> None:
        """Each link joins two different device types of this cluster, and each pair is given once."""
        types = set(self.gpus_by_type())
        seen: dict[frozenset[str], int] = {}
        for i, link in enumerate(self.links):
            a, b = link.between
            if a == b:
                raise ValueError(f"links[{i}].between: [{a}, {b}] joins a type with itself; links join two device "
                                 "types (a type's own links are intra_node/inter_node of its profile or group)")
            missing = [t for t in (a, b) if t not in types]
            if missing:
                raise ValueError(f"links[{i}].between: the cluster has no {missing[0]} GPUs (its types: "
                                 f"{', '.join(sorted(types))})")
            pair = frozenset((a, b))
            if pair in seen:
                raise ValueError(f"links[{i}].between: the link {a}-{b} is already links[{seen[pair]}]; give each "
                                 "pair once")
            seen[pair] = i

    @property
    def world_size(self) -> int:
        return sum(g.num_gpus for g in self.groups)

    @property
    def device_types(self) -> tuple[str, ...]:
        """Device types in the order the cluster lists them, each once."""
        seen: list[str] = []
        for g in self.groups:
            if g.device_type not in seen:
                seen.append(g.device_type)
        return tuple(seen)

    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.device_type] = out.get(g.device_type, 0) + g.num_gpus
        return out

    def shortfalls(self, used: dict[str, int]) -> list[str]:
        """What the cluster lacks for `used` GPUs per stage type, a pooled type drawing on any of its members'
        GPUs (Hall's condition: every set of stage types fits in the GPUs of the types it may use)."""
        have = self.gpus_by_type()
        out = [f"{t} is not in the cluster ({self.gpus_text()})" for t in used
               if any(m not in have for m in pool_members(t))]
        if out:
            return out
        keys = sorted(used)
        for mask in range(1, 1 << len(keys)):
            chosen = [k for i, k in enumerate(keys) if mask >> i & 1]
            types = {m for k in chosen for m in pool_members(k)}
            need, supply = sum(used[k] for k in chosen), sum(have[m] for m in types)
            if need > supply:
                return [f"the plan uses {need} {'/'.join(chosen)} GPUs, the cluster has {supply} "
                        f"{'/'.join(sorted(types))} ({self.gpus_text()})"]
        return []

    def spread(self, used: dict[str, int]) -> dict[str, int]:
        """GPUs used per device type of the cluster: a pooled type's GPUs taken from its members in order,
        after the stages of one type have taken theirs."""
        have = self.gpus_by_type()
        out = {t: n for t, n in used.items() if POOL_SEP not in t}
        for t, n in used.items():
            for m in pool_members(t) if POOL_SEP in t else ():
                take = min(n, have.get(m, 0) - out.get(m, 0))
                out[m] = out.get(m, 0) + max(take, 0)
                n -= max(take, 0)
        return out

    def group_of(self, device_type: str) -> NodeGroup:
        for g in self.groups:
            if g.device_type == device_type:
                return g
        raise KeyError(device_type)

    def cross_link(self, a: str, b: str) -> CrossTypeLink | None:
        for link in self.links:
            if set(link.between) == {a, b}:
                return link
        return None

    def gpus_text(self) -> str:
        """The GPUs of each type in words ("16 H800 + 8 A100"), for messages; the text --cluster reads back as
        this cluster is planner/inputs/cluster.py `describe_cluster`."""
        return " + ".join(f"{n} {t}" for t, n in self.gpus_by_type().items())

    def legacy_description(self) -> str:
        """TYPE:COUNT per type: how earlier versions described a cluster in plan.json (`cluster`, made_for) and
        named a shorthand cluster.  It leaves the node shape out (2x6 H800 read "H800:12", which --cluster
        refuses), so it is only for accepting what those versions wrote."""
        return ",".join(f"{t}:{n}" for t, n in self.gpus_by_type().items())
