"""Reading a FlagScale heterogeneous training config (its train YAML) back into a run, a plan and a cluster.

FlagScale's runner turns the train YAML into flags with `flatten_dict_to_args` (every nested key becomes
`--key-name`, True a switch, a list its values).  This reads the same flags with the planner's Megatron
flag reader, and the `system.hetero` section (`hetero_process_meshes`: TP CP EP DP PP per mesh,
`hetero_pipeline_layer_split`, `hetero_device_types`) into a flagscale-runtime Plan, so that a config
FlagScale itself ships (tests/functional_tests/test_cases/hetero_train/*) can be priced by the cost model
and emitted again.  Keys Megatron-LM does not know (FlagScale's own: `multiple_of`, `auto_skip_spiky_loss`,
...) are left out and listed.  What the planner's plans cannot say is refused with the reason: a TP that
differs between meshes, recompute that changes within an iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import PlannerInputError
from planner.inputs.files import parse_yaml, read_text
from planner.inputs.megatron_flags import known_flags, parse_megatron_flags
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec, NodeGroup
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan, Recompute, StagePlan

FIELD = "--flagscale-config"
HETERO_KEYS = ("enable_hetero", "hetero_process_meshes", "hetero_pipeline_layer_split", "hetero_device_types",
               "hetero_current_device_type", "standalone_embedding_stage", "use_partial_reduce_for_shared_embedding",
               "expert_tensor_parallel_size_per_process_mesh", "hetero_use_cpu_communication")
PER_STAGE_RECOMPUTE = ("recompute_granularity_per_stage_micro_batch", "recompute_method_per_stage_micro_batch",
                       "recompute_num_layers_per_stage_micro_batch")


@dataclass
class FlagScaleConfig:
    """A FlagScale train config read back: the run, its plan, a cluster that holds it, and what was left out."""

    run: MegatronRun
    plan: Plan
    cluster: ClusterSpec
    dropped: list[str] = field(default_factory=list)  # FlagScale-only keys (not Megatron flags)


def _flatten(node: dict[str, Any], out: dict[str, Any]) -> None:
    """FlagScale's flatten_dict_to_args order: nested keys, last one wins."""
    for key, value in node.items():
        if isinstance(value, dict):
            _flatten(value, out)
        else:
            out[key] = value


def _argv(flat: dict[str, Any], known: set[str]) -> tuple[list[str], list[str]]:
    """(Megatron flags, FlagScale-only keys) of the flattened train config."""
    argv: list[str] = []
    dropped: list[str] = []
    for key, value in flat.items():
        flag = "--" + key.replace("_", "-")
        if key in HETERO_KEYS or key in PER_STAGE_RECOMPUTE or value is None or value is False:
            continue
        if flag not in known:
            dropped.append(key)
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv, dropped


def train_config_path(path: Path) -> Path:
    """The train YAML of an experiment config (`defaults: [train: NAME]` -> conf/train/NAME.yaml), or `path`
    itself when it is a train YAML."""
    doc = parse_yaml(read_text(path, FIELD), FIELD, str(path)) or {}
    for entry in doc.get("defaults", []) if isinstance(doc, dict) else []:
        if isinstance(entry, dict) and "train" in entry:
            return path.parent / "train" / f"{entry['train']}.yaml"
    return path


def _stages(hetero: dict[str, Any], recompute: Recompute) -> tuple[int, list[StagePlan]]:
    """(TP, stages) of the meshes; refused when the meshes' TP or CP differ (one TP and CP per plan)."""
    numbers = list(hetero.get("hetero_process_meshes") or [])
    types = list(hetero.get("hetero_device_types") or [])
    split = list(hetero.get("hetero_pipeline_layer_split") or [])
    if not numbers or len(numbers) % 5 or len(types) != len(numbers) // 5:
        raise PlannerInputError(FIELD, "system.hetero needs hetero_process_meshes (TP CP EP DP PP per mesh) and one "
                                       "hetero_device_types entry per mesh")
    meshes = [numbers[i:i + 5] for i in range(0, len(numbers), 5)]
    if len({m[0] for m in meshes}) > 1 or len({m[1] for m in meshes}) > 1:
        raise PlannerInputError(FIELD, f"the meshes' TP/CP differ ({[m[:2] for m in meshes]}); a planner plan has "
                                       "one TP and one CP for every stage")
    dps = [m[3] for m in meshes for _ in range(m[4])]
    stage_types = [t for m, t in zip(meshes, types) for _ in range(m[4])]
    if len(split) != len(dps):
        raise PlannerInputError(FIELD, f"hetero_pipeline_layer_split has {len(split)} entries for {len(dps)} stages")
    return meshes[0][0], [StagePlan(device_type=t, num_layers=n, dp=dp, recompute=recompute)
                          for t, n, dp in zip(stage_types, split, dps)]


def _refuse_per_microbatch_recompute(flat: dict[str, Any]) -> None:
    for key in PER_STAGE_RECOMPUTE:
        for entry in flat.get(key) or []:
            values = entry[2::2]
            if len(set(values)) > 1:
                raise PlannerInputError(FIELD, f"{key} {entry} changes recompute between micro-batches; a planner plan "
                                               "has one setting per stage")


def _cluster(stages: list[StagePlan], tp: int, profiles: ProfileSet) -> ClusterSpec:
    """Nodes of each device type's usual size (one smaller node when fewer GPUs are used) holding the plan."""
    need: dict[str, int] = {}
    for s in stages:
        need[s.device_type] = need.get(s.device_type, 0) + tp * s.dp
    groups = []
    for t, n in need.items():
        gpn = min(n, profiles.device(t).gpus_per_node)
        groups.append(NodeGroup(device_type=t, num_nodes=math.ceil(n / gpn), gpus_per_node=gpn))
    return ClusterSpec(name="flagscale-config", groups=tuple(groups))


def read_flagscale_config(path: str | Path, profiles: ProfileSet | None = None) -> FlagScaleConfig:
    """A FlagScale experiment or train config -> (run, flagscale Plan, cluster); PlannerInputError
    naming the key when the config says what a plan cannot."""
    profiles = profiles or ProfileSet.load()
    train_path = train_config_path(Path(path))
    doc = parse_yaml(read_text(train_path, FIELD), FIELD, str(train_path)) or {}
    flat: dict[str, Any] = {}
    _flatten(doc if isinstance(doc, dict) else {}, flat)
    hetero = ((doc.get("system") or {}).get("hetero") or {}) if isinstance(doc, dict) else {}
    if not hetero.get("enable_hetero"):
        raise PlannerInputError(FIELD, f"{train_path}: system.hetero.enable_hetero is not set (not a heterogeneous config)")
    _refuse_per_microbatch_recompute(flat)
    argv, dropped = _argv(flat, set(known_flags()))
    types = [profiles.canonical_name(t) for t in hetero.get("hetero_device_types") or []]
    hetero = {**hetero, "hetero_device_types": types}
    _stages(hetero, Recompute.none())  # the meshes' shape is checked before the flags
    run = parse_megatron_flags(argv)
    tp, stages = _stages(hetero, run.parallel.recompute)
    t = run.training
    plan = Plan(runtime="flagscale", tp=tp, cp=1, ep=run.parallel.ep, etp=run.parallel.expert_tp, vpp=1,
                mbs=t.micro_batch_size, gbs=t.global_batch_size, sequence_parallel=run.parallel.sequence_parallel,
                stages=tuple(stages))
    return FlagScaleConfig(run=run, plan=plan, cluster=_cluster(stages, tp, profiles), dropped=dropped)
