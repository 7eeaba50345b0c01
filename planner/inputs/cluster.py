"""`--cluster`: a preset name, a YAML file, or the shorthand TYPE:COUNT[,TYPE:COUNT...] -> ClusterSpec.

Device types are canonicalised through the ProfileSet (case-insensitive, aliases accepted), so every
ClusterSpec this module returns names devices exactly as `ProfileSet.device()` does.  `describe_cluster` is the
way back: the text every output names a cluster by, which parse_cluster reads as the same cluster.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import PlannerInputError
from planner.inputs.files import load_document, name_from_path, path_kind, require_string_keys
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec, CrossTypeLink, NodeGroup, largest_segment
from planner.schemas.types import MAX_GPUS

FIELD = "--cluster"
FORMS = (
    "accepted forms: a preset name ({presets}); a YAML file (groups: [{{device_type, num_nodes, gpus_per_node}}], "
    "links: [{{between: [A, B], kind, bandwidth_gb_per_s, latency_us}}]); or TYPE:COUNT[,TYPE:COUNT...] "
    "such as H800:16,MI300X:16,910B:16 (COUNT may also be NODESxGPUS, e.g. H800:2x8)"
)
_ITEM = re.compile(r"^\s*([^:\s][^:]*?)\s*:\s*(\S+)\s*$")
_NODES_X_GPUS = re.compile(r"^([0-9]{1,9})[xX*]([0-9]{1,9})$")
_COUNT = re.compile(r"^[0-9]{1,9}$")
_GROUP_KEYS = {"device_type", "num_nodes", "gpus_per_node", "num_gpus", "scale_up_domain_gpus",
               "intra_node_bandwidth_gb_per_s", "inter_node_bandwidth_gb_per_s", "inter_node_kind"}
_TOP_KEYS = {"name", "groups", "links"}
_LINK_KEYS = {"between", "kind", "bandwidth_gb_per_s", "latency_us"}


def preset_paths(profiles: ProfileSet) -> dict[str, Path]:
    """Preset name (lower case) -> file, from the shipped clusters/ and any --profiles DIR/clusters/ (later wins)."""
    found: dict[str, Path] = {}
    for directory in profiles.cluster_dirs:
        if directory.is_dir():
            for path in sorted(directory.glob("*.yaml")):
                found[path.stem.lower()] = path
    return found


def _forms(profiles: ProfileSet) -> str:
    return FORMS.format(presets=", ".join(sorted(preset_paths(profiles))) or "none shipped")


def parse_cluster(text: str, profiles: ProfileSet) -> ClusterSpec:
    """Parse `--cluster`: a preset name, a YAML file path, or TYPE:COUNT[,TYPE:COUNT...]."""
    spec = (text or "").strip()
    if not spec:
        raise PlannerInputError(FIELD, f"empty; {_forms(profiles)}")
    presets = preset_paths(profiles)
    if spec.lower() in presets:
        return load_cluster_file(presets[spec.lower()], profiles)
    looks_like_file = spec.lower().endswith((".yaml", ".yml", ".json")) or "/" in spec
    if looks_like_file or (len(spec) <= 255 and "\x00" not in spec):
        kind = path_kind(Path(spec).expanduser(), FIELD)
        if kind != "missing":
            return load_cluster_file(Path(spec).expanduser(), profiles)
    if spec.lower().endswith((".yaml", ".yml", ".json")):
        raise PlannerInputError(FIELD, f"file not found: {spec}; {_forms(profiles)}")
    if ":" in spec:
        return parse_shorthand(spec, profiles)
    raise PlannerInputError(FIELD, f"{spec!r} is not a preset, a file, or TYPE:COUNT; {_forms(profiles)}")


def _group_for(device_type: str, count_text: str, profiles: ProfileSet, item: str) -> NodeGroup:
    """One shorthand item -> NodeGroup with the device's usual GPUs per node."""
    canonical = _canonical(device_type, profiles)
    node_size = profiles.device(canonical).gpus_per_node
    m = _NODES_X_GPUS.match(count_text)
    if m:
        nodes, per_node = int(m.group(1)), int(m.group(2))
        if nodes < 1 or per_node < 1:
            raise PlannerInputError(FIELD, f"{item!r}: NODESxGPUS must both be >= 1")
        return _node_group(item, profiles, device_type=canonical, num_nodes=nodes, gpus_per_node=per_node)
    if not _COUNT.match(count_text) or int(count_text) < 1:
        raise PlannerInputError(
            FIELD, f"{_short(item)!r}: COUNT must be a positive integer (digits 0-9) or NODESxGPUS, e.g. 2x8"
        )
    count = int(count_text)
    if count > MAX_GPUS:
        raise PlannerInputError(FIELD, f"{item!r}: {count} GPUs; the planner handles at most {MAX_GPUS}")
    if count < node_size:
        return _node_group(item, profiles, device_type=canonical, num_nodes=1, gpus_per_node=count)
    if count % node_size:
        raise PlannerInputError(
            FIELD,
            f"{item!r}: {count} {canonical} is not a multiple of its {node_size} GPUs per node; "
            f"use a multiple of {node_size}, a count below {node_size} (one partial node), or NODESxGPUS",
        )
    return _node_group(item, profiles, device_type=canonical, num_nodes=count // node_size, gpus_per_node=node_size)


def default_domain(profiles: ProfileSet, device_type: str, num_nodes: int, gpus_per_node: int) -> int | None:
    """The scale-up domain of a group that does not state one: none where the device's intra-node link stops at
    the host; else (GB200/GB300 NVL72) the hosts Slurm's --segment keeps together as NVIDIA's launcher sizes it
    (`largest_segment`: all of them up to the rack's, else the largest divisor of the host count up to it)."""
    domain = profiles.device(device_type).scale_up_domain_gpus
    if domain is None or domain % gpus_per_node or domain <= gpus_per_node:
        return None
    hosts = largest_segment(num_nodes, domain // gpus_per_node)
    return hosts * gpus_per_node if hosts > 1 else None


def domain_notes(cluster, profiles: ProfileSet) -> list[str]:
    """What a group of a multi-host NVLink device (GB200/GB300 NVL72) is priced with where its domain is smaller
    than the device's: the domain, and where it stops at the host, what would span trays."""
    out = []
    for g in cluster.groups:
        full = profiles.device(g.device_type).scale_up_domain_gpus
        if full is None or full <= g.gpus_per_node or g.domain_gpus >= min(full, g.num_gpus):
            continue
        hosts = g.domain_gpus // g.gpus_per_node
        text = (f"{g.device_type}: {g.num_nodes} hosts of {g.gpus_per_node} GPUs are priced in NVLink domains of "
                f"{g.domain_gpus} GPUs ({hosts} host{'s' if hosts > 1 else ''}), not the device's {full}")
        max_hosts = full // g.gpus_per_node
        if hosts == largest_segment(g.num_nodes, max_hosts):
            text += (f": the largest host count up to {max_hosts} that divides {g.num_nodes} (how NVIDIA's launcher "
                     "sizes sbatch --segment)")
        if hosts == 1:
            whole = (g.num_nodes // max_hosts) * max_hosts
            racks = _node_group(g.device_type, profiles, device_type=g.device_type, num_nodes=max(whole, 1),
                                gpus_per_node=g.gpus_per_node)
            item = _shorthand_item(racks, profiles)[0]
            text += (f"; every group across hosts then crosses the NIC. A cluster of whole domains spans trays "
                     f"on NVLink (--cluster {item} leaves the rest out)" if whole else "")
        out.append(text)
    return out


def _node_group(item: str, profiles: ProfileSet | None = None, **fields: Any) -> NodeGroup:
    if profiles is not None and fields.get("scale_up_domain_gpus") is None:
        fields["scale_up_domain_gpus"] = default_domain(profiles, fields["device_type"], fields["num_nodes"],
                                                        fields["gpus_per_node"])
    try:
        return NodeGroup(**fields)
    except ValidationError as exc:
        raise PlannerInputError(FIELD, f"{item!r}: {_errors(exc)}") from None


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _canonical(device_type: str, profiles: ProfileSet) -> str:
    try:
        return profiles.canonical_name(device_type)
    except PlannerInputError as exc:
        raise PlannerInputError(FIELD, str(exc).split(": ", 1)[-1]) from exc


def parse_shorthand(spec: str, profiles: ProfileSet) -> ClusterSpec:
    """TYPE:COUNT[,TYPE:COUNT...] -> ClusterSpec, one node group per type, in the order given."""
    groups: list[NodeGroup] = []
    for item in spec.split(","):
        if not item.strip():
            raise PlannerInputError(FIELD, f"empty item in {spec!r}; {_forms(profiles)}")
        m = _ITEM.match(item)
        if not m:
            raise PlannerInputError(FIELD, f"{_short(item.strip())!r} is not TYPE:COUNT; {_forms(profiles)}")
        group = _group_for(m.group(1), m.group(2), profiles, item.strip())
        if any(g.device_type == group.device_type for g in groups):
            raise PlannerInputError(FIELD, f"device type {group.device_type} is listed twice in {spec!r}; give one total")
        groups.append(group)
    try:
        cluster = ClusterSpec(name="cluster", groups=tuple(groups))
    except ValidationError as exc:
        raise PlannerInputError(FIELD, f"{_short(spec)!r}: {_errors(exc)}") from None
    return cluster.model_copy(update={"name": describe_cluster(cluster, profiles)})


_GROUP_SHAPE_KEYS = ("num_nodes", "gpus_per_node", "scale_up_domain_gpus", "intra_node_bandwidth_gb_per_s",
                     "inter_node_bandwidth_gb_per_s", "inter_node_kind")


def describe_cluster(cluster: ClusterSpec, profiles: ProfileSet) -> str:
    """The text `--cluster` reads back as this cluster (parse_cluster of it equals `cluster` but for the name):
    the shorthand, each group as TYPE:COUNT where the device's usual node makes COUNT mean that group, else
    TYPE:NODESxGPUS.  A cluster the shorthand cannot state (links, bandwidth or NIC overrides, a scale-up domain
    of its own, a type in several groups) is its preset's name where that preset loads as it, else its name with
    the shorthand of its GPUs and what that leaves out (no --cluster text but its file gives it)."""
    items = [_shorthand_item(g, profiles) for g in cluster.groups]
    text = ",".join(item for item, _ in items)
    unsaid = [f"{g.device_type} {', '.join(left)}" for g, (_, left) in zip(cluster.groups, items) if left]
    types = [g.device_type for g in cluster.groups]
    unsaid += [f"{t} in {types.count(t)} groups" for t in cluster.device_types if types.count(t) > 1]
    unsaid += [f"link {'-'.join(link.between)} {link.kind}" for link in cluster.links]
    if not unsaid:
        return text
    if _is_preset(cluster, profiles):
        return cluster.name
    return f"{cluster.name} ({text} with {'; '.join(unsaid)})"


def _shorthand_item(group: NodeGroup, profiles: ProfileSet) -> tuple[str, list[str]]:
    """TYPE:COUNT where it parses to `group`, else TYPE:NODESxGPUS, and the fields of `group` that item does not
    give (empty: it parses to `group`)."""
    explicit = f"{group.num_nodes}x{group.gpus_per_node}"
    parsed = None
    for count in (str(group.num_gpus), explicit):
        item = f"{group.device_type}:{count}"
        try:
            parsed = _group_for(group.device_type, count, profiles, item)
        except PlannerInputError:
            continue
        if parsed == group:
            return item, []
    item = f"{group.device_type}:{explicit}"
    if parsed is None:
        return item, ["(not a device of these profiles)"]
    return item, [f"{key} {getattr(group, key)}" for key in _GROUP_SHAPE_KEYS
                  if getattr(group, key) != getattr(parsed, key)]


def _is_preset(cluster: ClusterSpec, profiles: ProfileSet) -> bool:
    """Whether `cluster` is the preset of its name, as parse_cluster loads it."""
    path = preset_paths(profiles).get(cluster.name.lower())
    if path is None:
        return False
    try:
        return load_cluster_file(path, profiles) == cluster
    except PlannerInputError:
        return False


def load_cluster_file(path: Path, profiles: ProfileSet) -> ClusterSpec:
    """A cluster YAML file -> ClusterSpec (see profiles/README.md, "Cluster files")."""
    raw = load_document(path, FIELD)
    return cluster_from_dict(raw, profiles, source=str(path), default_name=Path(path).stem)


def cluster_from_dict(raw: Any, profiles: ProfileSet, *, source: str = "cluster", default_name: str = "cluster") -> ClusterSpec:
    """A cluster mapping -> ClusterSpec: groups with device_type, num_nodes (or num_gpus), optional
    gpus_per_node (default: the device's) and bandwidth overrides; links between groups, where a link
    without bandwidth/latency takes them from the links.yaml kind of the same name."""
    where = f"{source}"
    if not isinstance(raw, dict):
        raise PlannerInputError(FIELD, f"{where}: a cluster file is a mapping with `groups:`; {_forms(profiles)}")
    require_string_keys(raw, FIELD, where)
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise PlannerInputError(FIELD, f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    rows = raw.get("groups")
    if not isinstance(rows, list) or not rows:
        raise PlannerInputError(FIELD, f"{where}: `groups` must be a non-empty list")
    links_raw = raw.get("links")
    links_raw = [] if links_raw is None else links_raw
    if not isinstance(links_raw, list):
        raise PlannerInputError(FIELD, f"{where}: `links` must be a list of {{between: [A, B], kind, "
                                       f"bandwidth_gb_per_s, latency_us}} (or left out), got {links_raw!r}")
    name = raw.get("name")
    if name is None or name == "":
        name = name_from_path(default_name, FIELD, "the cluster's name comes from its file name (the file states no "
                                                   "`name:`)")
    if not isinstance(name, str):
        raise PlannerInputError(FIELD, f"{where}: `name` must be a string, got {name!r}")
    groups = [_group_from_row(row, i, profiles, where) for i, row in enumerate(rows)]
    links = [_link_from_row(row, i, profiles, where) for i, row in enumerate(links_raw)]
    try:
        return ClusterSpec(name=name, groups=tuple(groups), links=tuple(links))
    except ValidationError as exc:
        raise PlannerInputError(FIELD, f"{where}: {_errors(exc)}") from None


def _group_from_row(row: Any, i: int, profiles: ProfileSet, where: str) -> NodeGroup:
    at = f"{where}: groups[{i}]"
    if not isinstance(row, dict) or "device_type" not in row:
        raise PlannerInputError(FIELD, f"{at}: needs device_type and num_nodes (or num_gpus)")
    require_string_keys(row, FIELD, at)
    if not isinstance(row["device_type"], str):
        raise PlannerInputError(FIELD, f"{at}: device_type must be a device name, got {row['device_type']!r}")
    unknown = set(row) - _GROUP_KEYS
    if unknown:
        raise PlannerInputError(FIELD, f"{at}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_GROUP_KEYS)}")
    body = dict(row)
    canonical = _canonical(str(body.pop("device_type")), profiles)
    body.setdefault("gpus_per_node", profiles.device(canonical).gpus_per_node)
    if "num_gpus" in body:
        num_gpus = body.pop("num_gpus")
        gpn = body["gpus_per_node"]
        if "num_nodes" in body:
            raise PlannerInputError(FIELD, f"{at}: give num_nodes or num_gpus, not both")
        if not _is_int(num_gpus) or not _is_int(gpn) or num_gpus < 1 or gpn < 1 or num_gpus % gpn:
            raise PlannerInputError(FIELD, f"{at}: num_gpus {num_gpus!r} must be a positive multiple of gpus_per_node {gpn!r}")
        body["num_nodes"] = num_gpus // gpn
    if body.get("scale_up_domain_gpus") is None and _is_int(body.get("num_nodes")) and _is_int(body["gpus_per_node"]):
        if body["num_nodes"] >= 1 and body["gpus_per_node"] >= 1:
            body["scale_up_domain_gpus"] = default_domain(profiles, canonical, body["num_nodes"], body["gpus_per_node"])
    try:
        return NodeGroup(device_type=canonical, **body)
    except ValidationError as exc:
        raise PlannerInputError(FIELD, f"{at}: {_errors(exc)}") from exc


def _link_from_row(row: Any, i: int, profiles: ProfileSet, where: str) -> CrossTypeLink:
    at = f"{where}: links[{i}]"
    if not isinstance(row, dict):
        raise PlannerInputError(FIELD, f"{at}: a link is {{between: [A, B], kind, bandwidth_gb_per_s, latency_us}}")
    require_string_keys(row, FIELD, at)
    unknown = set(row) - _LINK_KEYS
    if unknown:
        raise PlannerInputError(FIELD, f"{at}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_LINK_KEYS)}")
    between = row.get("between")
    if not (isinstance(between, (list, tuple)) and len(between) == 2 and all(isinstance(t, str) for t in between)):
        raise PlannerInputError(FIELD, f"{at}: `between` must list two device types")
    body = dict(row)
    body["between"] = tuple(_canonical(t, profiles) for t in between)
    kind = body.get("kind")
    if not isinstance(kind, str):
        raise PlannerInputError(FIELD, f"{at}: `kind` is required (e.g. {', '.join(profiles.link_kinds())})")
    if "bandwidth_gb_per_s" not in body or "latency_us" not in body:
        if kind not in profiles.link_kinds():
            raise PlannerInputError(
                FIELD, f"{at}: kind {kind!r} has no default in links.yaml ({', '.join(profiles.link_kinds())}); "
                "give bandwidth_gb_per_s and latency_us",
            )
        template = profiles.link_kind(kind)
        body.setdefault("bandwidth_gb_per_s", template.bandwidth_gb_per_s)
        body.setdefault("latency_us", template.latency_us)
    try:
        return CrossTypeLink(**body)
    except ValidationError as exc:
        raise PlannerInputError(FIELD, f"{at}: {_errors(exc)}") from exc


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {str(e.get('msg')).removeprefix('Value error, ')}".lstrip(": ")
        for e in exc.errors()
    )
