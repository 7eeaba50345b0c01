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

srun and sbatch read their options with glibc's getopt_long (srun/opt.c, sbatch/opt.c, #SBATCH lines included), which
takes an unambiguous prefix of a long option as the option: `--ntasks-per-n 8` is `--ntasks-per-node 8`.  A prefix of
several options is ambiguous (`--nod`: --nodefile, --nodelist, --nodes), and getopt_long refuses it ("option '--nod'
is ambiguous; possibilities: ..."), unless they are one option under two names (the same `.val` in slurm_opt.c:
--cpu-bind and --cpu_bind); srun and sbatch then exit with an error.  `long_option` reads a word as getopt_long does:
the option's full name, or SlurmOptionError naming the candidates.  For that it knows every long option, those that
take no value or an optional one too (`_OTHER_*`); a site's own SPANK plugins add options this table does not hold.

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
# long names of the options that take no value, or one only attached with '=' (slurm_opt.c `.has_arg = no_argument`
# or `optional_argument`; pyxis's SPANK options with has_arg 0): they decide which prefixes are ambiguous
_OTHER_BOTH = """
consolidate-segments contiguous exclusive help hold nice no-kill oom-kill-step overcommit oversubscribe parsable
propagate quiet reboot resv-ports spread-job spread-segments stepmgr test-only usage use-min-nodes verbose version
container-mount-home no-container-mount-home container-remap-root no-container-remap-root container-entrypoint
no-container-entrypoint container-entrypoint-log container-writable container-readonly
"""
_OTHER_SRUN = """
async bcast compress debugger-test disable-status exact external-launcher immediate interactive kill-on-bad-exit label
multi-prog no-allocate overlap preserve-env pty quit-on-interrupt send-libs unbuffered wait-for-children whole x11
"""
_OTHER_SBATCH = "external get-user-env ignore-pbs no-requeue requeue wait"
_SAME_OPTION = {"cpu_bind": "cpu-bind", "tasks-per-node": "ntasks-per-node", "pack-group": "het-group"}
"""Second names of one option (the same `.val` in slurm_opt.c): getopt_long reads a prefix of both as that option."""


def _words(table: str) -> frozenset[str]:
    """`name/X` entries as the words that give them: `--name` and `-X`."""
    out: set[str] = set()
    for entry in table.split():
        name, _, short = entry.partition("/")
        out |= {f"--{name}"} | ({f"-{short}"} if short else set())
    return frozenset(out)


VALUED: dict[Scheduler, frozenset[str]] = {"srun": _words(_BOTH + _SRUN_ONLY), "sbatch": _words(_BOTH + _SBATCH_ONLY)}
"""For srun and sbatch, the option words whose value is the next word unless attached (`--nodes=2`, `-N2`)."""


_OTHERS: dict[Scheduler, str] = {"srun": _OTHER_BOTH + _OTHER_SRUN, "sbatch": _OTHER_BOTH + _OTHER_SBATCH}
LONG_NAMES: dict[Scheduler, frozenset[str]] = {
    scheduler: frozenset(w[2:] for w in VALUED[scheduler] if w.startswith("--")) | set(others.split())
    for scheduler, others in _OTHERS.items()}
"""Every long option name srun's and sbatch's getopt_long table holds (the valued ones and the others)."""


class SlurmOptionError(ValueError):
    """A long option getopt_long refuses as ambiguous: the message names it and the options it starts."""


def long_option(word: str, scheduler: Scheduler) -> str:
    """`word` as getopt_long reads it for srun or sbatch: a long option (`--name` or `--name=value`) given by an
    unambiguous prefix of its name written in full (`--ntasks-per-n=8` -> `--ntasks-per-node=8`); any other word
    (a full name, an option the table does not hold, a short option) unchanged.  SlurmOptionError for a prefix of
    several options (see the module docstring)."""
    if not word.startswith("--") or word == "--":
        return word
    name, eq, value = word[2:].partition("=")
    names = LONG_NAMES[scheduler]
    if name in names:
        return word
    candidates = sorted(n for n in names if n.startswith(name))
    if len({_SAME_OPTION.get(n, n) for n in candidates}) > 1:
        raise SlurmOptionError(
            f"{scheduler}'s option --{name} is ambiguous: it starts {', '.join(f'--{n}' for n in candidates)}, and "
            f"{scheduler} refuses it as Slurm's getopt_long does (\"option '--{name}' is ambiguous\"); give the "
            "option's full name (these are the options of Slurm and of NVIDIA's pyxis plugin; a site's own SPANK "
            "plugins add options of their own, which can make other prefixes ambiguous there too)")
    return f"--{candidates[0]}{eq}{value}" if candidates else word


def options_end(words: list[str], scheduler: Scheduler) -> int:
    """The index in `words` (what follows `srun` or `sbatch`) of the first word that is neither an option nor an
    option's value: the command srun runs, the job script sbatch submits (len(words) where there is none).  A long
    option may be an unambiguous prefix of its name (`long_option`; SlurmOptionError for an ambiguous one)."""
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        if words[i] == "--":  # the end of the options
            return i + 1
        word = long_option(words[i], scheduler)
        i += 2 if "=" not in word and word in VALUED[scheduler] else 1
    return min(i, len(words))
