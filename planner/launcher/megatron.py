"""Upstream Megatron-LM launcher: megatron_args.txt, launch.sh and hostfile from a Plan.

Upstream Megatron has one (TP, CP, DP, EP, ETP) and one recompute setting for the job; layers
per stage are free through `--pipeline-model-parallel-layout` (or the first/last-stage flags
when only the end stages differ); the device type of stage s is fixed by host order, since
stage s owns global ranks [s*TP*CP*DP, (s+1)*TP*CP*DP) (reference/megatron.md sections 1-3, 8).
"""

from __future__ import annotations

import re
from typing import Sequence

from planner.cost.layer import BLACKWELL_DEVICES
from planner.cost.memory import EXPANDABLE_SEGMENTS_ASSUMED
from planner.errors import PlannerInputError
from planner.inputs.hosts import Host
from planner.inputs.script import LauncherScript
from planner.launcher.common import (
    DEFAULT_MASTER_PORT,
    MEGATRON_ENTRY,
    FlagItem,
    LaunchOverrides,
    args_file_text,
    effective_model,
    group_flag_items,
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
from planner.launcher.launch_sh import COMPANION, LaunchSpec, generated_launch_sh, node_checks, script_launch_sh
from planner.megatron.layout import split_flags
from planner.megatron.rules import assert_plan_ok, check_runtime_expressible, format_violations
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec
from planner.schemas.model import ModelSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan


def megatron_plan_items(plan: Plan, model: ModelSpec) -> list[FlagItem]:
    """The flags the plan decides: parallel sizes, sequence parallel, layout, batch, recompute."""
    items = [
        FlagItem("--tensor-model-parallel-size", [str(plan.tp)]),
        FlagItem("--pipeline-model-parallel-size", [str(plan.pp)]),
        FlagItem("--context-parallel-size", [str(plan.cp)]),
    ]
    if model.is_moe:
        items.append(FlagItem("--expert-model-parallel-size", [str(plan.ep)]))
        items.append(FlagItem("--expert-tensor-parallel-size", [str(plan.etp)]))
    if plan.tp > 1 and plan.sequence_parallel:
        items.append(FlagItem("--sequence-parallel"))
    items += [FlagItem(name, values) for name, values in split_flags(plan, model.mtp_num_layers)]
    items.append(FlagItem("--micro-batch-size", [str(plan.mbs)]))
    items.append(FlagItem("--global-batch-size", [str(plan.gbs)]))
    items += recompute_flag_items(plan.stages[0].recompute)
    return items


def megatron_files(
    run: MegatronRun, plan: Plan, cluster: ClusterSpec, script: LauncherScript | None = None, *,
    profiles: ProfileSet, hosts: Sequence[Host] | None = None, overrides: LaunchOverrides = LaunchOverrides(),
) -> dict[str, str]:
    """{file name: text} for the megatron runtime; refuses (PlannerInputError) a plan upstream
    Megatron cannot run, with the reason: one its rules refuse, or one whose devices span vendors."""
    refusals = check_runtime_expressible(plan)
    if refusals:
        raise PlannerInputError(
            "--runtime",
            "upstream Megatron-LM cannot run this plan: " + format_violations(refusals),
        )
    runs = job_check(plan, profiles)
    model, rule_items = effective_model(run.model, plan)
    assert_plan_ok(model, plan, run.training)
    agents = place_agents(plan, cluster, hosts)
    flags = launch_flags(run, model, megatron_plan_items(plan, model) + rule_items, script,
                         group_flag_items(list(overrides.added)), overrides.removed)
    notes = flags.notes + [f"{' '.join(i.tokens())} added: Megatron supports bias in MoE layers only with ETP == 1"
                           for i in rule_items]
    notes += script.warnings if script is not None else []
    notes += self_relative_notes(script) + runtime_notes(runs, plan, flags.final, profiles)
    notes += placement_notes(plan, cluster, hosts, script, agents)
    connections = max_connections(plan, flags.final)
    exports = domain_exports(model, plan, cluster, profiles)
    notes += max_connections_notes(connections) + domain_notes(plan, cluster, exports)
    allocator = allocator_default(run.training)
    notes += allocator_notes(allocator, conditional=True)
    spec = LaunchSpec(
        runtime="megatron",
        entry_script=script.entry_script if script is not None else MEGATRON_ENTRY,
        header=plan_header(plan, model, agents),
        notes=notes,
        max_connections=connections,
        exports=exports,
        allocator_default=allocator,
        applied=flags.applied,
        decided=flags.decided,
        agents=agents,
        master_port=_master_port(script),
        node_checks=node_checks(plan.member_types(), profiles),
        real_hosts=hosts is not None,
        refs=flags.refs,
        priced=flags.priced,
        log_name=overrides.log_name,
        log_dir=overrides.log_dir,
    )
    launch = script_launch_sh(script, spec) if script is not None else generated_launch_sh(flags.generated, spec)
    return {
        COMPANION: args_file_text(group_flag_items(flags.final), flags.refs),
        "launch.sh": launch,
        "hostfile": hostfile_text(agents, template=hosts is None),
        **(slurm_hostfiles(agents) if hosts is not None else {}),
        **sourced_files(script),
    }


def sourced_files(script: LauncherScript | None) -> dict[str, str]:
    """The files the input script sources from its own directory, copied next to launch.sh at the
    same relative paths, so `source "$(dirname "$0")/common.sh"` works from there too."""
    return dict(script.sourced) if script is not None else {}


EP_OVERLAP_MAX_CONNECTIONS = 32
"""CUDA_DEVICE_MAX_CONNECTIONS for --overlap-moe-expert-parallel-comm: the overlap needs more than one hardware queue
(megatron/core/transformer/moe/README.md, 'Requirements for EP A2A Overlap: ... CUDA_DEVICE_MAX_CONNECTIONS > 1');
32 is what NVIDIA's MoE Model Zoo exports with it (yanring/Megatron-MoE-ModelZoo sbatch_benchmarking.sh, A2A_OVERLAP=1)
and one of the two values Megatron offers when TP or CP > 1 shares the run (megatron/training/arguments.py: "1 or 32,
which depends on which parallelization you want to prioritize")."""


def max_connections(plan: Plan, final_flags: list[str]) -> int | None:
    """The CUDA_DEVICE_MAX_CONNECTIONS the launch exports, None for none.  With the EP all-to-all overlap
    (--overlap-moe-expert-parallel-comm) EP_OVERLAP_MAX_CONNECTIONS, whatever TP and CP: at 1 the overlap the cost
    model prices cannot happen.  Else 1 with TP or CP > 1, which Megatron requires on Hopper and earlier
    (arguments.py asserts it), except under Megatron-FSDP or Torch-FSDP2, which refuse it ("FSDP requires
    CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset", "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than
    one": validate_args), and where every GPU of the plan is a Blackwell part, where validate_args asks nothing
    ("CUDA_DEVICE_MAX_CONNECTIONS requirement no longer exists since the Blackwell architecture": the check runs for
    get_device_arch_version() < 10 only) and the cost model prices TP overlap as running without it
    (planner/cost/model.py `tp_overlap_runs`)."""
    if "--overlap-moe-expert-parallel-comm" in final_flags:
        return EP_OVERLAP_MAX_CONNECTIONS
    blackwell_only = all(t in BLACKWELL_DEVICES for t in plan.member_types())
    if (plan.tp > 1 or plan.cp > 1) and not {"--use-megatron-fsdp", "--use-torch-fsdp2"} & set(final_flags) \
            and not blackwell_only:
        return 1
    return None


HYBRID_EP_DOMAIN_ENV = "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"
"""HybridEP's topology (DeepEP hybrid-ep): the EP ranks that share one NVLink domain, the domain's size and whether it
spans hosts (multi-node NVLink).  NVIDIA's launcher sets the three for GB200/GB300 NVL72 to the EP size (at most 72),
72 and 1, and on 8-GPU hosts to min(EP, 8), 8 and 0 (Megatron-Bridge scripts/performance/utils/utils.py at 4ab94dfad3,
the HybridEP topology step; Megatron-LM's GB200 functional tests export the same)."""


def domain_exports(model, plan: Plan, cluster: ClusterSpec, profiles: ProfileSet) -> dict[str, str]:
    """Environment a plan needs for NVLink domains beyond one host: HybridEP's topology (HYBRID_EP_DOMAIN_ENV), where
    the domain (cluster group `domain_gpus`) is wider than a host; nothing elsewhere (HybridEP's defaults are an
    8-GPU host's)."""
    if plan.ep <= 1 or model.moe_token_dispatcher_type != "flex" or model.moe_flex_dispatcher_backend != "hybridep":
        return {}
    wide = [t for t in plan.member_types() if cluster.group_of(t).domain_gpus > cluster.group_of(t).gpus_per_node]
    if not wide:
        return {}
    ranks = min(plan.ep, *(cluster.group_of(m).domain_gpus for m in wide))
    rack = min(profiles.device(m).scale_up_domain_gpus or cluster.group_of(m).domain_gpus for m in wide)
    return {HYBRID_EP_DOMAIN_ENV: str(ranks), "NVLINK_DOMAIN_SIZE": str(rack), "USE_MNNVL": "1"}


def domain_notes(plan: Plan, cluster: ClusterSpec, exports: dict[str, str]) -> list[str]:
    """What a plan on NVLink domains wider than a host (NVL72) assumes of the placement, and what it exports."""
    notes = []
    for t in plan.member_types():
        g = cluster.group_of(t)
        if g.domain_gpus > g.gpus_per_node:
            hosts = g.domain_gpus // g.gpus_per_node
            notes.append(f"{t}: NVLink domains of {g.domain_gpus} GPUs ({hosts} hosts of {g.gpus_per_node}) are priced "
                         f"as one node: list each domain's {hosts} hosts one after another (the hostfile's order) and "
                         f"keep them in one NVL72 rack (Slurm: sbatch --segment={hosts})")
    if exports:
        notes.append(", ".join(f"{k}={v}" for k, v in exports.items()) + " are exported: HybridEP's topology on an "
                     "NVLink domain that spans hosts, as NVIDIA's launcher sets it")
    return notes


def max_connections_notes(connections: int | None) -> list[str]:
    """What the launch's CUDA_DEVICE_MAX_CONNECTIONS is for, in the output's words."""
    if connections is None:
        return []
    if connections == 1:
        return ["CUDA_DEVICE_MAX_CONNECTIONS=1 is exported: Megatron needs it with TP or CP > 1 (pre-Blackwell GPUs)"]
    return [f"CUDA_DEVICE_MAX_CONNECTIONS={connections} is exported: --overlap-moe-expert-parallel-comm needs more "
            "than one hardware queue (Megatron's MoE README); with TP or CP > 1 on Hopper or earlier Megatron warns "
            "that their communication then loses its launch order (--tp-comm-overlap is priced as hiding nothing "
            "there: planner/cost/model.py `tp_overlap_runs`)"]


def allocator_default(training) -> str | None:
    """The PYTORCH_CUDA_ALLOC_CONF the launch sets where the input states no allocator setting: the one the memory
    estimate assumed (planner/cost/memory.py EXPANDABLE_SEGMENTS_ASSUMED), so that the plan runs as it was priced.
    None where the input's script states one (its environment is kept as it is)."""
    if training.expandable_segments is not None or not EXPANDABLE_SEGMENTS_ASSUMED:
        return None
    return "expandable_segments:True"


def allocator_notes(value: str | None, *, conditional: bool) -> list[str]:
    """What the launch's allocator setting is for, in the output's words."""
    if value is None:
        return []
    where = ("where the environment sets neither PYTORCH_ALLOC_CONF nor PYTORCH_CUDA_ALLOC_CONF" if conditional
             else "(the input states none; it replaces the environment's)")
    return [f"PYTORCH_CUDA_ALLOC_CONF={value} is exported {where}: the reserved memory was priced with expandable "
            "segments (torch's default is off, which reserves more); state the allocator setting in the input "
            "script to price and keep yours"]


def self_relative_notes(script: LauncherScript | None) -> list[str]:
    """What the user must know when the input script finds files from its own directory."""
    if script is None or not script.self_relative:
        return []
    copied = f" ({', '.join(sorted(script.sourced))} copied next to it)" if script.sourced else ""
    return [f"the input script finds files from its own directory ($0 / BASH_SOURCE): launch.sh does the same "
            f"from where it lies{copied}; put it next to the input script if other files are looked up there"]


def _master_port(script: LauncherScript | None) -> str:
    """The script's MASTER_PORT when it sets a number, else torchrun's usual 6000."""
    port = script.env.get("MASTER_PORT", "") if script is not None else ""
    return port if re.fullmatch(r"[0-9]{1,5}", port) else str(DEFAULT_MASTER_PORT)
