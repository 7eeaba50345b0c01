"""The environment srun gives its tasks: which of the variables a launcher script sets reach a torchrun under srun.

srun's --export (SchedMD/slurm 284c3b95f08a2dc2478499837b03355e1b9c5c75, doc/man/man1/srun.1 --export; srun builds
the task's environment in src/srun/launch.c `_build_user_env`):

* ALL, or no --export: the task gets srun's whole environment (what the script exports, and what it sets in front
  of srun).
* NONE: "None of the user environment will be defined"; srun still gives the task the SLURM_* variables
  (`env_array_merge_slurm_spank`), and Slurm sets the task's own (SLURM_PROCID, its GPUs).  The list is read up to
  NONE: the entries before it still count.
* `[ALL,]NAME[=value],...`: "Exports all SLURM* environment variables along with explicitly defined variables": NAME
  copies srun's value (none where srun's environment has none), NAME=value sets it; with ALL, srun's whole
  environment too, which "will take precedence over any explicitly given environment variables".

srun without --export takes it from SRUN_EXPORT_ENV, else SLURM_EXPORT_ENV in its environment (src/srun/opt.c, the
variables it reads as options), and sbatch sets SLURM_EXPORT_ENV to the job's own --export where that is not ALL
(src/sbatch/opt.c: "srun ignores "ALL", it is the default"), so `#SBATCH --export=NONE` hides the script's
variables from the tasks of its srun too, unless the script sets SLURM_EXPORT_ENV=ALL.

What the task itself sets (`srun bash -c 'PET_NNODES=2 torchrun ...'`) is not srun's to filter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from planner.inputs.shell.builtins import SchedulerValue

EXPORT_VARIABLES = ("SRUN_EXPORT_ENV", "SLURM_EXPORT_ENV")  # srun reads these as --export, the first first


@dataclass(frozen=True)
class Export:
    """srun's --export as it runs (`NONE`, `ALL,PET_NNODES=2`) and where it is given."""

    value: str
    where: str

    def _entries(self) -> list[str]:
        """The list's entries up to NONE (srun reads no further)."""
        out: list[str] = []
        for entry in self.value.split(","):
            if entry.upper() == "NONE":
                break
            out.append(entry)
        return out

    @property
    def all(self) -> bool:
        """srun passes its whole environment (ALL among the entries it reads)."""
        return any(e.upper() == "ALL" for e in self._entries())

    def passes(self, name: str) -> bool:
        """A variable `name` of srun's environment reaches the task: ALL, or NAME listed without a value."""
        return self.all or name in self._entries()

    def task_environment(self, srun_env: Mapping[str, str]) -> dict[str, str]:
        """The variables the task gets of srun's environment `srun_env`, and those the list sets."""
        out: dict[str, str] = {}
        for entry in self._entries():
            name, eq, value = entry.partition("=")
            if eq:
                out[name] = value
            elif name in srun_env:
                out[name] = srun_env[name]
        if self.all:
            return out | dict(srun_env)
        return out | {k: v for k, v in srun_env.items() if k.startswith("SLURM_")}


def srun_export(own: str | None, srun_env: Mapping[str, str], script_env: Mapping[str, str],
                job: Mapping[str, SchedulerValue]) -> Export | None:
    """srun's --export: its own (`own`), else SRUN_EXPORT_ENV / SLURM_EXPORT_ENV in its environment (`srun_env`, what
    the script exports; SLURM_EXPORT_ENV also as the script sets it over the job's, `script_env`), else the job's
    (`job`: the SLURM_EXPORT_ENV its #SBATCH --export gives); None where none is given (ALL)."""
    if own is not None:
        return Export(own, f"`srun --export={own}`")
    for name in EXPORT_VARIABLES:
        if name in srun_env:
            return Export(srun_env[name], f"{name}={srun_env[name]} in srun's environment")
    stated = job.get("SLURM_EXPORT_ENV")
    if stated is None:
        return None
    value = script_env.get("SLURM_EXPORT_ENV", stated.value)
    return Export(value, stated.source if value == stated.value else f"SLURM_EXPORT_ENV={value} set by the script")
