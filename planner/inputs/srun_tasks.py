"""The tasks a launcher script's `srun` starts (one GPU each): its own counts, and those it takes from the job.

srun inside a Slurm job takes what it does not give itself from the job's allocation: the job's nodes
(SLURM_NNODES), tasks per node (SLURM_NTASKS_PER_NODE) and tasks (SLURM_NTASKS), as the job script's `#SBATCH`
lines or sbatch's own options state them (planner/inputs/shell/builtins.py `sbatch_values`; those the reader
takes from --cluster are not the script's).  So `#SBATCH --nodes=2` and `--ntasks-per-node=8` (or `-N 2`) above a
bare `srun python pretrain_gpt.py` start 16 tasks, 8 on each node.

No count, with the reason, where it is not the script's: srun's node count without -N where the job states none
(the allocation's that runs the script: `sbatch -N 4 train.sh` sets it, not the script); and no --ntasks or
--ntasks-per-node in srun or the job, where Slurm starts one task per node, whatever GPUs the nodes hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from planner.inputs.shell.builtins import SchedulerValue, sbatch_options

COUNT_KEYS = ("nodes", "ntasks", "ntasks-per-node")  # srun's own count options, as sbatch_options names them


@dataclass(frozen=True)
class SrunTasks:
    """srun's tasks (None: no count the script states), tasks on each node (None: Slurm places them), where the
    counts it takes from the job are stated, and why there is no count (None: a count, or one not given as plain
    numbers)."""

    world: int | None
    per_node: int | None
    inherited: tuple[str, ...] = ()
    unstated: str | None = None


SRUN_SWITCHES = frozenset({
    "--exclusive", "--overlap", "--label", "-l", "--unbuffered", "-u", "--pty", "--no-kill", "-k", "--overcommit",
    "-O", "--oversubscribe", "-s", "--quiet", "-Q", "--verbose", "-v", "-vv", "-vvv", "--disable-status", "-X",
    "--test-only", "--multi-prog", "--spread-job", "--use-min-nodes", "--contiguous", "--exact", "--whole",
    "--kill-on-bad-exit", "-K", "--preserve-env", "-E", "--hold", "-H", "--immediate", "-I", "--no-allocate", "-Z",
    "--mpi", "--nice", "--propagate", "--help", "-h", "--usage", "--version", "-V"})
"""srun's options that take no value of their own in the next word (the others do, unless written `--opt=value` or
`-N2`): Slurm's srun man page.  Optional values (`--kill-on-bad-exit=1`, `--nice=5`) are attached with '='."""


def srun_words(words: list[str]) -> list[str]:
    """srun's own words of a wrapper `srun OPTIONS COMMAND ...`: up to the first word that is neither an option nor
    an option's value, so that `srun numactl -N 0 python ...` does not read numactl's -N as srun's nodes."""
    i = 1
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        word = words[i]
        attached = "=" in word or (not word.startswith("--") and len(word) > 2)  # --nodes=2, -N2
        i += 1 if attached or word in SRUN_SWITCHES else 2
    return words[:min(i, len(words))]


def srun_tasks(words: list[str], job: Mapping[str, SchedulerValue]) -> SrunTasks:
    """The tasks of `srun` with options `words` (`srun_words`: its own) in a job whose geometry the script states
    (`job`: the SLURM_* values of its #SBATCH lines and sbatch options, by name); see the module docstring."""
    own = {key: value for key, value in sbatch_options(srun_words(words)).items() if key in COUNT_KEYS}
    if any(not value.isdigit() for value in own.values()):
        return SrunTasks(None, None)  # a count that is not a plain number
    taken: list[str] = []

    def inherit(name: str) -> int | None:
        value = job.get(name)
        if value is None or not value.value.isdigit():
            return None
        taken.append(value.source)
        return int(value.value)

    nodes = int(own["nodes"]) if "nodes" in own else inherit("SLURM_NNODES")
    per = int(own["ntasks-per-node"]) if "ntasks-per-node" in own else (
        inherit("SLURM_NTASKS_PER_NODE") if "ntasks" not in own else None)
    total = int(own["ntasks"]) if "ntasks" in own else None
    if total is None and per is not None:
        if nodes is None:
            return SrunTasks(None, None, unstated=(
                f"srun starts {per} tasks on each node of the allocation it runs in, whose node count neither srun "
                "(-N) nor the script's #SBATCH lines (--nodes) state as a plain number; it is set where the job is "
                "submitted"))
        total = nodes * per
    if total is None:
        total = inherit("SLURM_NTASKS")
    if total is None and nodes is not None:
        return SrunTasks(None, None, unstated=(
            "neither srun nor the script's #SBATCH lines give --ntasks or --ntasks-per-node, so Slurm starts one "
            "task per node, whatever GPUs it holds"))
    if total is None:
        return SrunTasks(None, None, unstated=(
            "neither srun nor the script's #SBATCH lines state its nodes or tasks as plain numbers (-N, -n, "
            "--ntasks-per-node); they are the allocation's it runs in, set where the job is submitted"))
    if per is None and nodes and total % nodes == 0:
        per = total // nodes
    return SrunTasks(total, per, tuple(dict.fromkeys(taken)))
