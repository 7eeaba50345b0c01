"""Launchers: turn a Plan into files that run it (megatron_args.txt, launch.sh, hostfile, and
FlagScale's YAML for the flagscale runtime).

`write_launch_files(run, plan, cluster, out_dir, script=None)` dispatches on `plan.runtime`.
All files are rendered in memory, written to a temporary directory next to `out_dir` and then
moved into place, so an error never leaves half-written files behind.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from planner.errors import PlannerInputError
from planner.inputs.script import LauncherScript
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan


def render_launch_files(
    run: MegatronRun, plan: Plan, cluster: ClusterSpec, script: LauncherScript | None = None
) -> dict[str, str]:
    """{relative path: text} of every launcher file for the plan's runtime."""
    if plan.runtime == "megatron":
        from planner.launcher.megatron import megatron_files

        return megatron_files(run, plan, cluster, script)
    if plan.runtime == "flagscale":
        from planner.launcher.flagscale import flagscale_files

        return flagscale_files(run, plan, cluster, script)
    raise PlannerInputError("--runtime", f"unknown runtime {plan.runtime!r}; allowed: megatron, flagscale")


def write_launch_files(
    run: MegatronRun,
    plan: Plan,
    cluster: ClusterSpec,
    out_dir: Path,
    script: LauncherScript | None = None,
) -> list[Path]:
    """Write the launcher files into `out_dir` (created if needed) and return their paths.
    launch.sh is made executable.  Other files already in `out_dir` are left alone."""
    files = render_launch_files(run, plan, cluster, script)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".hapmoe-launch-", dir=out_dir))
    written: list[Path] = []
    try:
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            if path.name.endswith(".sh"):
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        for rel in files:
            final = out_dir / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / rel, final)
            written.append(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written


__all__ = ["render_launch_files", "write_launch_files"]
