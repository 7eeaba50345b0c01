"""Launchers: turn a Plan into files that run it (megatron_args.txt, launch.sh, hostfile, and
FlagScale's YAML for the flagscale runtime).

`render_launch_files(run, plan, cluster, script=None)` dispatches on `plan.runtime` and returns the
files as {relative path: text}, rendered in memory; the commands write them with the staged writer
of planner/output/run_dir.py (`emit --out`, and launch/ of `solve --out`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from planner.errors import PlannerInputError
from planner.inputs.hosts import Host
from planner.inputs.script import LauncherScript
from planner.launcher.common import LaunchOverrides
from planner.launcher.flagscale import flagscale_files, refuse_flagscale_inputs
from planner.launcher.megatron import megatron_files
from planner.profile_tables import ProfileSet
from planner.runtime import FLAGSCALE, MEGATRON
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan

LAUNCHERS: dict[str, Callable[..., dict[str, str]]] = {
    MEGATRON.name: megatron_files, FLAGSCALE.name: flagscale_files,
}
"""The launcher of each runtime (planner/runtime.py), by name."""


def render_launch_files(
    run: MegatronRun, plan: Plan, cluster: ClusterSpec, script: LauncherScript | None = None, *,
    profiles: ProfileSet | None = None, hosts: Sequence[Host] | None = None,
    overrides: LaunchOverrides = LaunchOverrides(),
) -> dict[str, str]:
    """{relative path: text} of every launcher file for the plan's runtime.  `profiles` (default: the
    shipped ones) says each device type's vendor: a runtime that cannot hold the plan's vendors in one
    job (profiles/runtimes.yaml) is refused, and launch.sh checks each node's devices with its vendor's
    probe.  `hosts` (--hosts FILE): the real nodes; without them the host file is a template.
    `overrides`: flags a short trial adds and drops, and its log (planner/trials.py)."""
    render = LAUNCHERS.get(plan.runtime)
    if render is None:
        raise PlannerInputError("--runtime", f"unknown runtime {plan.runtime!r}; allowed: {', '.join(LAUNCHERS)}")
    return render(run, plan, cluster, script, profiles=profiles or ProfileSet.load(), hosts=hosts,
                  overrides=overrides)


def refuse_unlaunchable_inputs(runtime: str, run: MegatronRun, script: LauncherScript | None) -> None:
    """Refuse (PlannerInputError) now what the runtime's launcher would refuse for any plan: checked before a
    search whose plan is to be written (`solve --out`), which would otherwise run its whole time limit first."""
    if runtime == FLAGSCALE.name:
        refuse_flagscale_inputs(run, script)


__all__ = ["LaunchOverrides", "refuse_unlaunchable_inputs", "render_launch_files"]
