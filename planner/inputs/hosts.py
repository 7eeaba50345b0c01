"""`--hosts FILE`: the real nodes of the cluster, each with its device type, for the launcher's placement.

Format (one node per line; `#` starts a comment; blank lines are skipped):

    NAME TYPE [GPUS]                 e.g.  gpu-a01 H800 8
    NAME slots=GPUS type=TYPE        the planner's own host-file form (launch/hostfile), e.g. a template
                                     hostfile with its names replaced

NAME is the node's host name as `hostname -s` prints it (launch.sh picks a node's agents by it); TYPE any
device name or alias (profiles/devices); GPUS defaults to the cluster's node size for that type and must
equal it (the plan was priced on those node shapes).  Each name once.  The launcher takes the nodes of
each type in the order the file lists them; a plan that needs more nodes of a type than the file lists is
refused, naming the shortfall, and the nodes it leaves unused are named in a note (solve, emit).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlannerInputError
from planner.inputs.cluster import describe_cluster
from planner.inputs.files import read_text
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec
from planner.schemas.types import MAX_GPUS, MAX_GPUS_PER_NODE

FIELD = "--hosts"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


@dataclass(frozen=True)
class Host:
    """One node of --hosts: its name, device type (canonical), GPUs, and the file line it came from."""

    name: str
    device_type: str
    gpus: int
    line: int


def _int(text: str, where: str) -> int:
    if not re.fullmatch(r"[0-9]{1,7}", text) or not 1 <= int(text) <= MAX_GPUS_PER_NODE:
        raise PlannerInputError(FIELD, f"{where}: GPUS must be a whole number from 1 to {MAX_GPUS_PER_NODE}, "
                                       f"got {text!r}")
    return int(text)


def _name_rule(name: str) -> str:
    """What a host name may be, said for the way `name` breaks it."""
    rule = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 253 characters"
    if name[:1] in "._-":
        return f"it may not start with {name[0]!r} ({rule})"
    if len(name) > 253:
        return f"{len(name)} characters ({rule})"
    return rule


def _fields(tokens: list[str], where: str) -> tuple[str | None, str | None]:
    """(type, gpus text) of a line's tokens after the name: `TYPE [GPUS]` or key=value pairs."""
    kv = [t for t in tokens if "=" in t]
    if kv and len(kv) != len(tokens):
        raise PlannerInputError(FIELD, f"{where}: mix of `key=value` and bare words; write NAME TYPE [GPUS] or "
                                       "NAME slots=GPUS type=TYPE")
    if kv:
        return _pairs(kv, where)
    if len(tokens) > 2:
        raise PlannerInputError(FIELD, f"{where}: expected NAME TYPE [GPUS], got {len(tokens) + 1} words")
    return (tokens[0] if tokens else None), (tokens[1] if len(tokens) > 1 else None)


_KEYS = {"slots": "slots", "gpus": "slots", "type": "type"}
"""The keys of the `key=value` form, each to what it sets (gpus= is slots='s other name)."""


def _pairs(kv: list[str], where: str) -> tuple[str | None, str | None]:
    """(type, gpus text) of `key=value` words: each known key once (slots and gpus are one), with a value; a
    repeated or empty one was taken silently before (the last type, or the node size for an empty slots=)."""
    found: dict[str, tuple[str, str]] = {}
    for word in kv:
        key, value = word.split("=", 1)
        if key not in _KEYS:
            raise PlannerInputError(FIELD, f"{where}: unknown key {key!r}; allowed: slots (or gpus), type")
        if not value:
            raise PlannerInputError(FIELD, f"{where}: {key}= has no value")
        if _KEYS[key] in found:
            raise PlannerInputError(FIELD, f"{where}: {key}= repeats {found[_KEYS[key]][0]}= (each once)")
        found[_KEYS[key]] = (key, value)
    return found.get("type", (None, None))[1], found.get("slots", (None, None))[1]


def read_hosts(path: str | Path, cluster: ClusterSpec, profiles: ProfileSet, *, saved_plan: bool = False
               ) -> tuple[Host, ...]:
    """The nodes of a --hosts file, checked against the cluster (types it has, its node sizes); `saved_plan`: the
    cluster is a plan file's (emit), which a node size the file does not match cannot change."""
    text = read_text(path, FIELD)
    node_size = {g.device_type: g.gpus_per_node for g in cluster.groups}
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for k, raw in enumerate(text.splitlines(), 1):
        tokens = raw.split("#", 1)[0].split()
        if not tokens:
            continue
        where = f"{path} line {k}"
        name = tokens[0]
        if not _NAME.match(name):
            raise PlannerInputError(FIELD, f"{where}: {name!r} is not a host name: {_name_rule(name)}")
        if name in seen:
            raise PlannerInputError(FIELD, f"{where}: {name} is listed twice (first on line {seen[name]})")
        type_text, gpus_text = _fields(tokens[1:], where)
        if not type_text:
            raise PlannerInputError(FIELD, f"{where}: {name} has no device type (NAME TYPE [GPUS])")
        device_type = profiles.canonical_name(type_text) if _known(profiles, type_text) else None
        if device_type is None:
            raise PlannerInputError(FIELD, f"{where}: unknown device {type_text!r}; known: {', '.join(profiles.names())}")
        if device_type not in node_size:
            raise PlannerInputError(FIELD, f"{where}: {name} is {device_type}, which the cluster does not have "
                                           f"({describe_cluster(cluster, profiles)})")
        gpus = _int(gpus_text, where) if gpus_text is not None else node_size[device_type]
        if gpus != node_size[device_type]:
            fix = (f"re-run solve with --cluster {device_type}:NODESx{gpus} for these nodes, or list nodes of "
                   f"{node_size[device_type]}" if saved_plan else "give --cluster with that node size "
                   f"({device_type}:NODESx{gpus})")
            raise PlannerInputError(FIELD, f"{where}: {name} has {gpus} GPUs, but the plan is for {device_type} nodes of "
                                           f"{node_size[device_type]} ({'its plan file' if saved_plan else '--cluster'}); "
                                           f"{fix}")
        seen[name] = k
        hosts.append(Host(name, device_type, gpus, k))
        if len(hosts) > MAX_GPUS:
            raise PlannerInputError(FIELD, f"{path}: more than {MAX_GPUS} nodes")
    if not hosts:
        raise PlannerInputError(FIELD, f"{path}: no node listed (one line per node: NAME TYPE [GPUS])")
    return tuple(hosts)


def check_hosts_cover(hosts: tuple[Host, ...], cluster: ClusterSpec, path: str | Path, profiles: ProfileSet) -> None:
    """Before `solve` searches: the file lists at least the cluster's nodes of each type, as the search may
    place stages on all of them (after the search the launcher refuses a file short of what the plan uses;
    `emit` checks only that, as its plan is known)."""
    have: dict[str, int] = {}
    for g in cluster.groups:
        have[g.device_type] = have.get(g.device_type, 0) + g.num_nodes
    for device_type, count in have.items():
        listed = [h.name for h in hosts if h.device_type == device_type]
        if len(listed) < count:
            shown = ", ".join(listed[:8]) + (", ..." if len(listed) > 8 else "") or "none"
            raise PlannerInputError(
                FIELD, f"{path} lists {len(listed)} {device_type} node(s) ({shown}), but --cluster has {count} "
                       f"({describe_cluster(cluster, profiles)}): {count - len(listed)} short; list every node of the "
                       "cluster (the search may use them all), or give --cluster for the nodes listed")


def _known(profiles: ProfileSet, name: str) -> bool:
    try:
        profiles.canonical_name(name)
    except PlannerInputError:
        return False
    return True
