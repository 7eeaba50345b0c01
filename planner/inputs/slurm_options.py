"""srun's and sbatch's options that take their value as the next word (`-N 2`, `--gpus-per-task 1`): the one list
the script reader (planner/inputs/srun_tasks.py `srun_words`, planner/inputs/shell/interp.py `sbatch` of a job
script) and the launch.sh it writes (planner/launcher/launch_sh.py: `srun` and `sbatch` under --dry-run) skip
options by.  An option given as `--opt=value` or `-N2` is one word either way.

From Slurm's src/common/slurm_opt.c, the option table srun, sbatch and salloc share: an option with
`.has_arg = required_argument` that srun (`.set_func` or `.set_func_srun`) or sbatch (`.set_func_sbatch`) reads; the
srun(1) and sbatch(1) man pages write these `--opt=<value>`.  Options with an optional value (`--exclusive[=user]`,
`-K, --kill-on-bad-exit[=0|1]`, `-I, --immediate[=secs]`, `--nice[=adj]`) take it only attached with '='; -W is
srun's `--wait=<seconds>` but sbatch's `--wait`, which takes none.  Also the valued options of NVIDIA's pyxis
container plugin (SPANK options with an argument, pyxis args.c), which Megatron's Slurm examples give srun.

An option not listed here is read as one that takes no value, as getopt would read an option it knew as such.
"""

from __future__ import annotations

from typing import Literal

Scheduler = Literal["srun", "sbatch"]

# long/short names of slurm_opt.c's required_argument options, by which of srun and sbatch read them
_BOTH = """
account/A acctg-freq autocomplete bb bbf begin/b chdir/D cluster cluster-constraint clusters/M comment
constraint/C container container-id context core-spec/S cores-per-socket cpu-freq cpus-per-gpu cpus-per-task/c
deadline delay-boot dependency/d distribution/m error/e exclude/x export extra extra-node-info/B gpu-bind gpu-freq
gpus-per-node gpus-per-socket gpus-per-task gpus/G gres gres-flags hint input/i job-name/J licenses/L mail-type
mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mem-update mincpus network nodefile/F nodelist/w nodes/N
ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres ntasks/n open-mode output/o
partition/p prefer priority profile qos/q reservation resources runtime segment signal sockets-per-node switches
tasks-per-node thread-spec threads-per-core time-min time/t tmp tres-bind tres-per-task wckey
container-image container-mounts container-workdir container-name container-save container-env
"""
_SRUN_ONLY = """
accel-bind bcast-exclude cpu-bind cpu_bind epilog het-group ignore-signals jobid mpi msg-timeout pack-group prolog
relative/r slurmd-debug task-epilog task-prolog threads/T treewidth wait/W
"""
_SBATCH_ONLY = "array/a batch export-file gid kill-on-invalid-dep uid wait-all-nodes wrap"


def _words(table: str) -> frozenset[str]:
    """`name/X` entries as the words that give them: `--name` and `-X`."""
    out: set[str] = set()
    for entry in table.split():
        name, _, short = entry.partition("/")
        out |= {f"--{name}"} | ({f"-{short}"} if short else set())
    return frozenset(out)


VALUED: dict[Scheduler, frozenset[str]] = {"srun": _words(_BOTH + _SRUN_ONLY), "sbatch": _words(_BOTH + _SBATCH_ONLY)}
"""For srun and sbatch, the option words whose value is the next word unless attached (`--nodes=2`, `-N2`)."""


def options_end(words: list[str], scheduler: Scheduler) -> int:
    """The index in `words` (what follows `srun` or `sbatch`) of the first word that is neither an option nor an
    option's value: the command srun runs, the job script sbatch submits (len(words) where there is none)."""
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        if words[i] == "--":  # the end of the options
            return i + 1
        i += 2 if "=" not in words[i] and words[i] in VALUED[scheduler] else 1
    return min(i, len(words))
