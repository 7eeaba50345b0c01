"""Upstream Megatron-LM launcher: megatron_args.txt, launch.sh and hostfile from a Plan.

Upstream Megatron has one (TP, CP, DP, EP, ETP) and one recompute setting for the job; layers
per stage are free through `--pipeline-model-parallel-layout` (or the first/last-stage flags
when only the end stages differ); the device type of stage s is fixed by host order, since
stage s owns global ranks [s*TP*CP*DP, (s+1)*TP*CP*DP) (reference/megatron.md sections 1-3, 8).
"""

from __future__ import annotations

import re
from typing import Sequence

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
)
from planner.launcher.launch_sh import LaunchSpec, generated_launch_sh, node_checks, script_launch_sh
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
    needs_conn = needs_max_connections(plan, flags.final)
    if needs_conn:
        notes.append("CUDA_DEVICE_MAX_CONNECTIONS=1 is exported: Megatron needs it with TP or CP > 1 (pre-Blackwell GPUs)")
    spec = LaunchSpec(
        runtime="megatron",
        entry_script=script.entry_script if script is not None else MEGATRON_ENTRY,
        header=plan_header(plan, model, agents),
        notes=notes,
        needs_max_connections=needs_conn,
        applied=flags.applied,
        decided=flags.decided,
        agents=agents,
        master_port=_master_port(script),
        node_checks=node_checks(plan.member_types(), profiles),
        real_hosts=hosts is not None,
        refs=flags.refs,
        log_name=overrides.log_name,
    )
    launch = script_launch_sh(script, spec) if script is not None else generated_launch_sh(flags.generated, spec)
    return {
        "megatron_args.txt": args_file_text(group_flag_items(flags.final), flags.refs),
        "launch.sh": launch,
        "hostfile": hostfile_text(agents, template=hosts is None),
        **(slurm_hostfiles(agents) if hosts is not None else {}),
        **sourced_files(script),
    }


def sourced_files(script: LauncherScript | None) -> dict[str, str]:
    """The files the input script sources from its own directory, copied next to launch.sh at the
    same relative paths, so `source "$(dirname "$0")/common.sh"` works from there too."""
    return dict(script.sourced) if script is not None else {}


def needs_max_connections(plan: Plan, final_flags: list[str]) -> bool:
    """Megatron wants CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP > 1, except under Megatron-FSDP,
    which refuses it ("FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset", args.py)."""
    return (plan.tp > 1 or plan.cp > 1) and "--use-megatron-fsdp" not in final_flags


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
