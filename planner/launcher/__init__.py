"""Launchers: turn a Plan into files that run it (megatron_args.txt, launch.sh, hostfile, and
FlagScale's YAML for the flagscale runtime).

`render_launch_files(run, plan, cluster, script=None)` dispatches on `plan.runtime` and returns the
files as {relative path: text}, rendered in memory; the commands write them with the staged writer
of planner/output/run_dir.py (`emit --out`, and launch/ of `solve --out`).
"""

from __future__ import annotations

from planner.errors import PlannerInputError
from planner.inputs.script import LauncherScript
from planner.launcher.flagscale import flagscale_files
from planner.launcher.megatron import megatron_files
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan


def render_launch_files(
    run: MegatronRun, plan: Plan, cluster: ClusterSpec, script: LauncherScript | None = None
) -> dict[str, str]:
    """{relative path: text} of every launcher file for the plan's runtime."""
    if plan.runtime == "megatron":
        return megatron_files(run, plan, cluster, script)
    if plan.runtime == "flagscale":
        return flagscale_files(run, plan, cluster, script)
    raise PlannerInputError("--runtime", f"unknown runtime {plan.runtime!r}; allowed: megatron, flagscale")


__all__ = ["render_launch_files"]
