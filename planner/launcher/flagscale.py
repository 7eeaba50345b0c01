"""FlagScale heterogeneous launcher: the train YAML, the experiment YAML, megatron_args.txt,
launch.sh and a host file with `type=` per node (reference/megatron.md section 6).

Each process mesh is a run of consecutive stages on one device type with the same DP; it is
written as `TP CP EP DP PP` in `hetero_process_meshes`.  Mesh i runs micro-batches of
DP0*mbs/DP_i samples per DP rank, so `--micro-batch-size` is the plan's mbs (stated for mesh 0).
Per-stage recompute becomes FlagScale's `recompute_*_per_stage_micro_batch` lists, whose entries
are `[n_stages, n_microbatches, value]` (granularity 1/0 = full recompute on/off; method
0 = uniform, 1 = block; num_layers k).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import yaml

from planner.errors import PlannerInputError
from planner.inputs.hosts import Host
from planner.inputs.script import LauncherScript
from planner.launcher.common import (
    Agent,
    FlagItem,
    LaunchOverrides,
    args_file_text,
    effective_model,
    group_flag_items,
    host_file_type,
    hostfile_text,
    slurm_hostfiles,
    job_check,
    launch_flags,
    place_agents,
    plan_header,
    recompute_flag_items,
    runtime_notes,
    placement_notes,
)
from planner.launcher.quoting import comment_lines
from planner.launcher.launch_sh import COMPANION, LaunchSpec, generated_launch_sh, node_checks, script_launch_sh
from planner.launcher.megatron import (
    _master_port, allocator_default, allocator_notes, domain_exports, domain_notes, max_connections,
    max_connections_notes, self_relative_notes, sourced_files,
)
from planner.inputs.megatron_flags import fork_flags_in
from planner.megatron.flags import array_of
from planner.megatron.rules import assert_plan_ok, check_runtime_expressible, format_violations, tied_embeddings
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec
from planner.schemas.model import ModelSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan, Recompute

FLAGSCALE_ENTRY = "flagscale/train/train_gpt.py"
TRAIN_CONFIG_NAME = "hapmoe"


@dataclass(frozen=True)
class Mesh:
    """One FlagScale process mesh: consecutive stages of one device type with equal DP."""

    device_type: str
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    etp: int
    first_stage: int

    def numbers(self) -> list[int]:
        """The five numbers of --hetero-process-meshes: TP CP EP DP PP."""
        return [self.tp, self.cp, self.ep, self.dp, self.pp]


def process_meshes(plan: Plan) -> list[Mesh]:
    """Group consecutive stages with the same device type and DP into meshes."""
    meshes: list[Mesh] = []
    for i, s in enumerate(plan.stages):
        last = meshes[-1] if meshes else None
        if last is not None and last.device_type == s.device_type and last.dp == s.dp:
            meshes[-1] = Mesh(last.device_type, last.tp, last.cp, last.ep, last.dp, last.pp + 1, last.etp, last.first_stage)
        else:
            meshes.append(Mesh(s.device_type, plan.tp, plan.cp, plan.ep, s.dp, 1, plan.etp, i))
    return meshes


def _runs(values: list[int]) -> list[tuple[int, int]]:
    """Consecutive equal values as (count, value)."""
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0] + 1, v)
        else:
            out.append((1, v))
    return out


def per_stage_recompute(plan: Plan) -> tuple[list[FlagItem], dict[str, list[list[int]]]]:
    """Recompute flags: the global flags when every stage agrees; otherwise full recompute
    globally plus FlagScale's per-stage lists (entries [n_stages, n_microbatches, value])."""
    recomputes = [s.recompute for s in plan.stages]
    if len({r.label for r in recomputes}) == 1:
        return recompute_flag_items(recomputes[0]), {}
    fulls = [r for r in recomputes if r.granularity == "full"]
    base: Recompute = fulls[0]
    m = plan.num_microbatches
    on = [1 if r.granularity == "full" else 0 for r in recomputes]
    method = [1 if r.granularity == "full" and r.method == "block" else 0 for r in recomputes]
    layers = [int(r.num_layers or 0) if r.granularity == "full" else 0 for r in recomputes]
    lists = {
        "recompute_granularity_per_stage_micro_batch": [[n, m, v] for n, v in _runs(on)],
        "recompute_method_per_stage_micro_batch": [[n, m, v] for n, v in _runs(method)],
        "recompute_num_layers_per_stage_micro_batch": [[n, m, v] for n, v in _runs(layers)],
    }
    items = recompute_flag_items(base)
    for key, entries in lists.items():
        flag = "--" + key.replace("_", "-")
        items.append(FlagItem(flag, [str(e) for e in entries]))
    return items, lists


def flagscale_plan_items(plan: Plan, model: ModelSpec, meshes: list[Mesh],
                         cross_vendor: bool = False) -> tuple[list[FlagItem], dict[str, Any]]:
    """The flags the plan decides for FlagScale, and the same as YAML sections (system.hetero,
    system.recompute).  `cross_vendor`: the meshes span vendors, so torch.distributed runs FlagCX
    (`--distributed-backend flagcx`)."""
    tied = tied_embeddings(model)
    hetero: dict[str, Any] = {
        "enable_hetero": True,
        "hetero_process_meshes": [n for mesh in meshes for n in mesh.numbers()],
        "hetero_pipeline_layer_split": [s.num_layers for s in plan.stages],
        "hetero_device_types": [host_file_type(mesh.device_type) for mesh in meshes],
        "hetero_current_device_type": host_file_type(meshes[0].device_type),
    }
    if model.is_moe:
        hetero["expert_tensor_parallel_size_per_process_mesh"] = [mesh.etp for mesh in meshes]
    if tied and meshes[0].dp != meshes[-1].dp:
        hetero["use_partial_reduce_for_shared_embedding"] = True
    items = [
        FlagItem("--tensor-model-parallel-size", [str(plan.tp)]),
        FlagItem("--pipeline-model-parallel-size", [str(plan.pp)]),
    ]
    if model.is_moe:
        items.append(FlagItem("--expert-model-parallel-size", [str(plan.ep)]))
        items.append(FlagItem("--expert-tensor-parallel-size", [str(plan.etp)]))
    if plan.tp > 1 and plan.sequence_parallel:
        items.append(FlagItem("--sequence-parallel"))
    if cross_vendor:
        items.append(FlagItem("--distributed-backend", ["flagcx"]))
    for key, value in hetero.items():
        if key == "hetero_current_device_type":
            continue  # per host, in launch.sh
        flag = "--" + key.replace("_", "-")
        if value is True:
            items.append(FlagItem(flag))
        else:
            items.append(FlagItem(flag, [str(v) for v in value]))
    items.append(FlagItem("--micro-batch-size", [str(plan.mbs)]))
    items.append(FlagItem("--global-batch-size", [str(plan.gbs)]))
    recompute_items, lists = per_stage_recompute(plan)
    items += recompute_items
    recompute: dict[str, Any] = {}
    for item in recompute_items:
        key = item.name[2:].replace("-", "_")
        if key in lists:
            recompute[key] = lists[key]
        elif key == "recompute_modules":
            recompute[key] = list(item.values)
        else:
            recompute[key] = _yaml_scalar(item.values[0])
    return items, {"hetero": hetero, "recompute": recompute}


# --------------------------------------------------------------------------------------------
# YAML
# --------------------------------------------------------------------------------------------
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z_0-9]*|[1-9])\}|\$([A-Za-z_][A-Za-z_0-9]*|[1-9])|(\$\{)")
SCRIPT_ARG_ENV = "HAPMOE_SCRIPT_ARG_"
"""`$3` of the input script becomes ${oc.env:HAPMOE_SCRIPT_ARG_3} in the YAML: FlagScale's runner writes the
flags into a host script `cmd="torchrun ... $3"`, where the positional parameter would expand to nothing."""


def _env_name(ref: str) -> str:
    return SCRIPT_ARG_ENV + ref if ref.isdigit() else ref


def _yaml_scalar(value: str) -> Any:
    """Integers as ints; `${NAME}` / `$NAME` as OmegaConf's env resolver (a positional `$N` as
    HAPMOE_SCRIPT_ARG_N, which the user exports: the YAML has no arguments), the rest as text (any other
    `${` escaped, so OmegaConf reads it as text)."""
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    return _ENV_REF.sub(lambda m: "\\${" if m.group(3) else "${oc.env:" + _env_name(m.group(1) or m.group(2)) + "}", value)


def _yaml_literal(value: Any) -> Any:
    """Text (a device type) as OmegaConf reads it back, `${` escaped; numbers and switches unchanged."""
    if isinstance(value, list):
        return [_yaml_literal(v) for v in value]
    return value.replace("${", "\\${") if isinstance(value, str) else value


def env_refs(cfg: Any) -> list[str]:
    """The environment variables the YAML's ${oc.env:...} values need: the script's own in the order the YAML
    names them, then the script's arguments by N (HAPMOE_SCRIPT_ARG_1, _2, ...)."""
    text = yaml.safe_dump(cfg)
    names = list(dict.fromkeys(re.findall(r"\$\{oc\.env:([A-Za-z_][A-Za-z_0-9]*)\}", text)))
    args = [n for n in names if n.startswith(SCRIPT_ARG_ENV) and n[len(SCRIPT_ARG_ENV):].isdigit()]
    return [n for n in names if n not in args] + sorted(args, key=lambda n: int(n[len(SCRIPT_ARG_ENV):]))


def _yaml_value(item: FlagItem) -> Any:
    if not item.values:
        return True
    values = [_yaml_scalar(v) for v in item.values]
    return values[0] if len(values) == 1 else values


CHECKPOINT_FLAGS = ("--save", "--load", "--save-interval", "--no-save-optim", "--no-save-rng", "--no-load-optim",
                    "--no-load-rng", "--ckpt-format", "--finetune", "--pretrained-checkpoint")
"""Flags FlagScale reads under system.checkpoint: its runner sets checkpoint.save/load itself
(runner_train._update_config_train: <exp_dir>/checkpoints unless given there), so they must be there."""
DEFAULT_SAVE_INTERVAL = 1000
"""--save-interval when the run names none (FlagScale always passes --save, and Megatron's validate_args
asserts `args.save_interval is not None` with --save): the run's --train-iters when it has them."""

_SECTION = {
    "MODEL_PARALLEL_ARGS": ("system",),
    "EVAL_AND_LOGGING_ARGS": ("system", "logging"),
    "OTHER_ARGS": ("system",),
    "MODEL_ARGS": ("model",),
    "MOE_ARGS": ("model",),
    "TRAINING_ARGS": ("model",),
    "DATA_ARGS": ("data",),
}


def train_yaml(items: list[FlagItem], sections: dict[str, Any]) -> dict[str, Any]:
    """FlagScale's train config (system / model / data); every key becomes `--key-name` again
    through FlagScale's flatten_dict_to_args."""
    cfg: dict[str, Any] = {"system": {}, "model": {}, "data": {}}
    plan_keys = set(sections["hetero"]) | set(sections["recompute"])
    for item in items:
        key = item.name.lstrip("-").replace("-", "_")
        if key in plan_keys:
            continue
        if item.name.split("=")[0] in CHECKPOINT_FLAGS:
            path: tuple[str, ...] = ("system", "checkpoint")
        elif item.inline or not item.name.startswith("--"):
            path = ("system",)
        else:
            path = _SECTION[array_of(item.name)]
        node = cfg
        for part in path:
            node = node.setdefault(part, {})
        node[key] = _yaml_value(item)
    cfg["system"]["hetero"] = {key: _yaml_literal(value) for key, value in sections["hetero"].items()}
    if sections["recompute"]:
        cfg["system"]["recompute"] = sections["recompute"]
    checkpoint = cfg["system"].setdefault("checkpoint", {})
    if "save_interval" not in checkpoint:
        iters = next((i.values[0] for i in items if i.name == "--train-iters" and i.values), None)
        checkpoint["save_interval"] = _yaml_scalar(iters) if iters is not None else DEFAULT_SAVE_INTERVAL
    return cfg


def visible_device_envs(agents: list[Agent], profiles: ProfileSet) -> dict[str, dict[str, str]]:
    """experiment.envs.device_type_specific: each device type's visible-devices variable (its vendor's:
    CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ...) listing the GPUs its hosts run.  FlagScale's runner
    reads the number of processes per host from the first *_VISIBLE_DEVICES variable, and fails when
    there is none (runner_train.run_node)."""
    out: dict[str, dict[str, str]] = {}
    for ag in agents:
        probe = profiles.probe(profiles.vendor(ag.device_type))
        var = probe.visible_devices if probe is not None else "CUDA_VISIBLE_DEVICES"
        slots = sum(a.nproc for a in agents if a.host == ag.host)
        current = out.get(host_file_type(ag.device_type), {}).get(var, "")
        if len(current.split(",")) < slots or not current:
            out[host_file_type(ag.device_type)] = {var: ",".join(str(g) for g in range(slots))}
    return out


def experiment_yaml(entry: str, agents: list[Agent], max_connections: int | None,
                    device_envs: dict[str, dict[str, str]], exports: dict[str, str] | None = None) -> dict[str, Any]:
    """FlagScale's experiment config: runner, host file and environment."""
    envs: dict[str, Any] = {}
    if max_connections is not None:
        envs["CUDA_DEVICE_MAX_CONNECTIONS"] = max_connections
    envs.update(exports or {})
    envs["device_type_specific"] = device_envs
    nnodes = len({ag.host for ag in agents})
    nproc = max(sum(a.nproc for a in agents if a.host == ag.host) for ag in agents)
    return {
        "defaults": [{"train": TRAIN_CONFIG_NAME}, "_self_"],
        "experiment": {
            "exp_name": "hapmoe",
            "exp_dir": "./outputs_hapmoe",
            "task": {"type": "train", "backend": "megatron", "entrypoint": entry},
            "runner": {
                "backend": "torchrun",
                "nnodes": nnodes,
                "nproc_per_node": nproc,
                "hostfile": "hostfile",
            },
            "envs": envs,
        },
        "action": "run",
        "hydra": {"run": {"dir": "${experiment.exp_dir}/hydra"}},
    }


class _Dumper(yaml.SafeDumper):
    """Block style for mappings, flow style ([1, 2, 3]) for lists of scalars."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(not isinstance(v, (list, dict)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def _dump(header: str, data: dict[str, Any]) -> str:
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return "".join(line + "\n" for line in comment_lines(header.split("\n"))) + body


def train_config_text(run: MegatronRun) -> str:
    """FlagScale's train config (system / model / data) of the run alone, without a plan: what FlagScale's
    auto-tuner starts from (it chooses the meshes, the layer split and recompute)."""
    batch = [FlagItem("--micro-batch-size", [str(run.training.micro_batch_size)]),
             FlagItem("--global-batch-size", [str(run.training.global_batch_size)])]
    flags = launch_flags(run, run.model, batch, None)
    items = group_flag_items(flags.final)
    return _dump(f"{run.model.name}: the run's flags for FlagScale's auto-tuner (no plan)",
                 train_yaml(items, {"hetero": {"enable_hetero": True}, "recompute": {}}))


def refuse_what_flagscale_refuses(items: list[FlagItem]) -> None:
    """Flags FlagScale 0.8.0's train_gpt.py refuses, found by its own validator on the launcher corpus:
    another fork's flags (its parser does not know them) and a batch-size ramp-up with --train-iters
    (its Megatron fork asserts "expected no batch-size rampup for iteration-based training")."""
    names = {i.name.split("=")[0] for i in items}
    forks = fork_flags_in([i.name for i in items])
    if forks:
        listed = "; ".join(f"{fork}: {', '.join(flags)}" for fork, flags in forks.items())
        raise PlannerInputError("--runtime", f"FlagScale's train_gpt.py does not take another fork's flags ({listed}); "
                                "remove them, or plan for --runtime megatron on one vendor's devices")
    if "--rampup-batch-size" in names and "--train-iters" in names:
        raise PlannerInputError("--runtime", "FlagScale's Megatron fork refuses --rampup-batch-size with --train-iters "
                                "(\"expected no batch-size rampup for iteration-based training\"): give --train-samples, "
                                "or plan for --runtime megatron on one vendor's devices")


def refuse_flagscale_inputs(run: MegatronRun, script: LauncherScript | None) -> None:
    """`refuse_what_flagscale_refuses` on the run's own flags, before any plan: what it refuses does not depend on
    the plan, so `solve --out` for the flagscale runtime says so at once instead of after its search."""
    refuse_what_flagscale_refuses(group_flag_items(launch_flags(run, run.model, [], script).final))


def flagscale_files(
    run: MegatronRun, plan: Plan, cluster: ClusterSpec, script: LauncherScript | None = None, *,
    profiles: ProfileSet, hosts: Sequence[Host] | None = None, overrides: LaunchOverrides = LaunchOverrides(),
) -> dict[str, str]:
    """{relative path: text} for the flagscale runtime; refuses (PlannerInputError) a plan
    FlagScale cannot run, with the reason.  A job over several vendors communicates through FlagCX
    (`--distributed-backend flagcx`, profiles/runtimes.yaml)."""
    refusals = check_runtime_expressible(plan, run.model)
    if refusals:
        raise PlannerInputError(
            "--runtime", "FlagScale cannot run this plan: " + format_violations(refusals)
        )
    runs = job_check(plan, profiles)
    model, rule_items = effective_model(run.model, plan)
    assert_plan_ok(model, plan, run.training)
    meshes = process_meshes(plan)
    agents = place_agents(plan, cluster, hosts)
    cross_vendor = len({profiles.vendor(s.device_type).lower() for s in plan.stages}) > 1
    plan_items, sections = flagscale_plan_items(plan, model, meshes, cross_vendor)
    flags = launch_flags(run, model, plan_items + rule_items, script, group_flag_items(list(overrides.added)),
                         overrides.removed)
    notes = flags.notes + [f"{' '.join(i.tokens())} added: Megatron supports bias in MoE layers only with ETP == 1"
                           for i in rule_items]
    notes += script.warnings if script is not None else []
    notes += self_relative_notes(script) + runtime_notes(runs)
    notes += placement_notes(plan, cluster, hosts, script, agents)
    entry = FLAGSCALE_ENTRY  # the heterogeneous meshes live in FlagScale's entry, not in the script's
    if script is not None and script.entry_script.rsplit("/", 1)[-1] != FLAGSCALE_ENTRY.rsplit("/", 1)[-1]:
        notes.append(f"entry {script.entry_script} replaced by FlagScale's {FLAGSCALE_ENTRY}")
    per_agent = {
        ag.node_rank: [FlagItem("--hetero-current-device-type", [host_file_type(ag.device_type)])] for ag in agents
    }
    connections = max_connections(plan, flags.final)
    exports = domain_exports(model, plan, cluster, profiles)
    notes += max_connections_notes(connections) + domain_notes(plan, cluster, exports)
    allocator = allocator_default(run.training)
    notes += allocator_notes(allocator, conditional=False)
    spec = LaunchSpec(
        runtime="flagscale",
        entry_script=entry,
        header=plan_header(plan, model, agents)
        + [f"FlagScale meshes (TP CP EP DP PP): {[m.numbers() for m in meshes]}"],
        notes=notes,
        max_connections=connections,
        exports=exports,
        applied=flags.applied,
        decided=flags.decided | {"--hetero-current-device-type"},
        agents=agents,
        per_agent_items=per_agent,
        master_port=_master_port(script),
        node_checks=node_checks(plan.member_types(), profiles),
        real_hosts=hosts is not None,
        refs=flags.refs,
        priced=flags.priced,
        log_name=overrides.log_name,
        log_dir=overrides.log_dir,
    )
    items = group_flag_items(flags.final)
    refuse_what_flagscale_refuses(items)
    header = "\n".join(plan_header(plan, model, agents))
    train = train_yaml(items, sections)
    needed = env_refs(train)
    if needed:
        header += ("\nrun.py resolves ${oc.env:...}: export " + ", ".join(needed) + " first"
                   + (f" ({SCRIPT_ARG_ENV}N: the input script's N-th argument, which solve was not given)"
                      if any(n.startswith(SCRIPT_ARG_ENV) for n in needed) else ""))
    return {
        COMPANION: args_file_text(items, flags.refs),
        "launch.sh": script_launch_sh(script, spec) if script is not None else generated_launch_sh(flags.generated, spec),
        "hostfile": hostfile_text(agents, template=hosts is None),
        **(slurm_hostfiles(agents) if hosts is not None else {}),
        f"flagscale/conf/train/{TRAIN_CONFIG_NAME}.yaml": _dump(header, train),
        "flagscale/conf/config.yaml": _dump(
            header + "\nRun: python run.py --config-path <this dir> --config-name config",
            experiment_yaml(entry, agents, connections, visible_device_envs(agents, profiles),
                            {**exports, **({"PYTORCH_CUDA_ALLOC_CONF": allocator} if allocator else {})}),
        ),
        **sourced_files(script),
    }
