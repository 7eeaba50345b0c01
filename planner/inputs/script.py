"""Read a bash launcher script the way bash would run it, without running anything.

`parse_launcher_script(text, args=..., path=...)` evaluates the script in a small interpreter for
the subset of bash that training launchers use, until the statement that starts training (a
`torchrun ... pretrain_gpt.py <flags>`, `python -m torch.distributed.run|launch ...`,
`python <train>.py ...`, possibly behind `srun`/`mpirun`, inside `bash -c "..."`, run by
`eval "$cmd"`, or in the job script of `sbatch <<EOF` / `sbatch FILE`), and returns the flags given
to the entry script.

What it evaluates:
  * variables, `${X:-default}` and the other `${...}` forms, `$((...))`, quoting, word splitting by
    IFS, arrays (`A=(...)`, `A+=(...)`, `"${A[@]}"`, `${#A[@]}`), `export`/`declare`/`local`/`unset`,
    `declare -i`, `let`, `printf -v`, `read` from a here-string or here-document;
  * the script's own arguments (`$1`, `"$@"`, `$#`, `shift`, `set --`), given by the caller;
  * `if`/`elif`/`else`, `case`, `for`, `while`/`until` (also `while [[ $# -gt 0 ]]; do case $1 in
    ...; esac; shift; done` and `while getopts ...` option loops), `&&`/`||`, `[ ]`, `[[ ]]`,
    `test`, `(( ))`, functions, `set -e` (a failing command stops the script, as in bash);
  * `$(...)` and backquotes whose commands only print what is known: echo, printf, the script's
    own functions that do, `cat <<EOF`, expr, seq, basename, dirname, util-linux getopt;
  * `source FILE` / `. FILE` (read relative to the script), `eval`, `bash -c STRING`, here-documents;
  * a Slurm job's SLURM_* variables, from its `#SBATCH` lines (or the cluster, `scheduler=`).

What it cannot know (a program's output `$(hostname)`, an environment variable the script never
sets, whether a file exists on the cluster) is handled so the result is predictable:
  * in a flag value it stays literal text (`${DATA_PATH}`, `$(date)`), listed in `unresolved`;
  * in a condition, an unset variable reads as unset (empty), and a test that cannot be decided
    (a file test, an external command) reads as false; the branch it guards is skipped.
  Every such reading of a branch that holds flags is recorded in `decisions` and reported in
  `warnings`: which line, which way it was read, and which flags the branch holds.  So are a
  scheduler's variable read while unset (`$SLURM_NNODES`), a sourced file that is not here, an entry
  script other than pretrain_gpt.py, and every later launch of the script (the reading goes on
  past the first one, SCAN_STEPS_AFTER_LAUNCH statements at most).

Refused, as bash or Megatron would not run them: a script that exits (or stops under `set -e`)
before it launches; a lone space argument (`\\ ` at the end of a line); a comment inside the continued launch
command, which ends it before the flags below (bash runs those as a command of their own); an entry script that
builds another model (pretrain_bert.py, NON_GPT_ENTRIES).

Limits (a hostile or broken script is refused with one line naming the file and line, never a
hang): expansions nested more than MAX_NESTING deep, unterminated quotes or brackets, arithmetic
with more than MAX_ARITH_CHARS characters (and 64-bit wrap-around, as bash), more than `max_steps`
statements (MAX_STEPS; a loop that never ends), reading past `deadline` (the command's time limit),
eval/source/function calls deeper than MAX_DEPTH.  Lexing and evaluation are linear in the
script's size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from planner.errors import PlannerInputError, ReadingTimeLimitError
from planner.inputs.files import read_text
from planner.inputs.shell.arith import MAX_ARITH_CHARS, eval_arith
from planner.inputs.shell.builtins import CLUSTER_GEOMETRY_VARS, SchedulerValue, sbatch_options, sbatch_values
from planner.inputs.shell.interp import (
    MAX_DEPTH, MAX_SCRIPT_BYTES, MAX_STEPS, BranchDecision, LaunchSite, Break, Continue, ScriptExit, Interp, Return,
)
from planner.inputs.shell.lexer import MAX_NESTING, location
from planner.inputs.shell.syntax import parse
from planner.inputs.slurm_options import SlurmOptionError
from planner.inputs.srun_export import Export, srun_export
from planner.inputs.srun_tasks import SrunTasks, srun_tasks, srun_words
from planner.inputs.srun_torchrun import TorchrunTasks, torchrun_tasks
from planner.inputs.torchrun_counts import (
    Count, TorchrunOptionError, options, pet_variable, torchrun_count, torchrun_options,
)
from planner.schemas.cluster import ClusterSpec

FIELD = "--megatron-script"

__all__ = [
    "FIELD", "NON_GPT_ENTRIES", "SchedulerValue", "cluster_geometry", "reads_alike", "scheduler_fix", "MAX_ARITH_CHARS", "MAX_DEPTH", "MAX_NESTING", "MAX_SCRIPT_BYTES", "MAX_STEPS", "BranchDecision",
    "LaunchSite", "LauncherScript", "eval_arith", "parse_launcher_script", "read_launcher_script",
]


@dataclass
class LauncherScript:
    """What the planner keeps from a launcher script."""

    text: str
    megatron_flags: list[str]
    entry_script: str
    launcher: list[str]  # torchrun | python -m torch.distributed.run | python
    launcher_args: list[str]  # the launcher's own options, before the entry script
    wrapper: list[str] = field(default_factory=list)  # srun/mpirun ... before the launcher
    path: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    exported: list[str] = field(default_factory=list)
    launch_env: dict[str, str] = field(default_factory=dict)  # VAR=value before the launcher word
    outer_env: dict[str, str] | None = None  # the environment of the srun around the `bash -c` the launch is in
    in_sbatch_job: bool = False  # the launch is in a job script the script submits (`sbatch <<EOF`, `sbatch FILE`)
    site: LaunchSite | None = None
    extra_flags: list[str] = field(default_factory=list)  # --megatron-args given on top of the script
    sourced: dict[str, str] = field(default_factory=dict)  # files it sources from its own directory: path -> text
    self_relative: bool = False  # it locates files from its own directory ($(dirname "$0"), BASH_SOURCE)
    decisions: list[BranchDecision] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    scheduler_unset: dict[str, str] = field(default_factory=dict)  # scheduler variable read while unset -> where
    launch_defaults: dict[str, str] = field(default_factory=dict)  # scheduler variable unset here, read through
    # its default (`${NNODES:-1}`): the value the job's environment replaces when it runs -> where
    missing_sources: list[tuple[str, str]] = field(default_factory=list)  # (where, file) of a `source` not found
    split_elements: list[tuple[str, str, str, int]] = field(default_factory=list)  # (where, array, element, words)
    job: dict[str, SchedulerValue] = field(default_factory=dict)  # the SLURM_* geometry the script's own #SBATCH
    # lines (or sbatch options) state where it launches, by name: what an srun that states no count takes
    cluster_reads: list[str] = field(default_factory=list)  # the --cluster SLURM_* values the reading may have
    # seen (`reads_alike`)
    read_with: tuple[SchedulerValue, ...] = ()  # the scheduler values it was read with (`flags_with`)

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @property
    def world_size(self) -> int | None:
        """GPUs the script asks for: torchrun's nnodes * nproc-per-node (options, else PET_* variables, else 1 and
        1: `torchrun`; under srun, its tasks x torchrun's ranks in each: planner/inputs/srun_torchrun.py), or srun's
        tasks (its own counts and those it takes from the job's #SBATCH lines: `srun_tasks`), or mpirun's -np; 1 for
        a plain `python train.py`; None when a count is not a plain integer or not the script's."""
        by = self.launched_by
        if by == "srun":
            return self.srun.world
        if by in ("mpirun", "mpiexec"):
            return _wrapper_world(self.wrapper)
        return 1 if by is None else self.torchrun.world

    @property
    def gpus_per_node(self) -> int | None:
        """GPUs the script starts on each node: torchrun's nproc-per-node (under srun, times srun's tasks on each
        node), or srun's tasks per node (`srun_tasks`); 1 for a plain `python train.py`; None where the launch does
        not say (mpirun -np, srun -n without nodes) or a count is not a plain integer."""
        by = self.launched_by
        if by == "torchrun":
            return self.torchrun.per_node
        if by is None:
            return 1
        return self.srun.per_node if by == "srun" else None

    @property
    def srun(self) -> SrunTasks:
        """The tasks the launch's srun starts, with what it takes from the job (planner/inputs/srun_tasks.py)."""
        return srun_tasks(self.wrapper, self.job)

    @property
    def torchrun(self) -> TorchrunTasks:
        """The ranks the launch's torchrun starts (its counts: planner/inputs/torchrun_counts.py), one torchrun in each
        task where srun runs it (planner/inputs/srun_torchrun.py)."""
        env, launch = self.task_env, _legacy_launch(self.launcher)
        export, srun_env = self.srun_export, self.srun_env
        hidden = (srun_env, export.where) if export is not None and srun_env is not None else None
        nproc = torchrun_count(self.launcher_args, env, "nproc-per-node", launch=launch, hidden=hidden)
        nnodes = torchrun_count(self.launcher_args, env, "nnodes", launch=launch, hidden=hidden)
        if self.under_srun:
            return torchrun_tasks(self.wrapper, self.job, nproc, nnodes, env)
        if not (nproc.value.isdigit() and nnodes.number is not None):
            return TorchrunTasks(None, None)
        return TorchrunTasks(int(nproc.value) * nnodes.number, int(nproc.value))

    @property
    def task_env(self) -> dict[str, str]:
        """The variables the script gives the launch: those it exports, and those set in front of the command; under
        srun, those of them its --export passes to the task (planner/inputs/srun_export.py), and those the task sets
        itself (in a `bash -c` string srun runs).  The one reading of the environment the trainer's launcher gets:
        torchrun's PET_* counts, and the settings the estimate reads (planner/inputs/resolve.py
        `script_environment`)."""
        env = {name: self.env[name] for name in self.exported if name in self.env} | self.launch_env
        srun_env = self.srun_env
        export = self.srun_export
        if srun_env is None or export is None:
            return env
        task = {} if self.outer_env is None else {k: v for k, v in env.items() if self.outer_env.get(k) != v}
        return export.task_environment(srun_env) | task

    @property
    def hidden_env(self) -> tuple[list[str], str]:
        """The variables of srun's environment (what the script exports or sets in front of srun) that its --export
        keeps from the task, and where that --export is given; ([], "") where none."""
        srun_env, export = self.srun_env, self.srun_export
        if srun_env is None or export is None:
            return [], ""
        task = self.task_env
        return [name for name in srun_env if name not in task], export.where

    @property
    def srun_env(self) -> dict[str, str] | None:
        """The environment the launch's srun runs with (None: no srun): what the script exports and sets in front
        of srun, as it stands where srun runs."""
        if not self.under_srun:
            return None
        if self.outer_env is not None:
            return dict(self.outer_env)
        return {name: self.env[name] for name in self.exported if name in self.env} | self.launch_env

    @property
    def srun_export(self) -> Export | None:
        """The launch's srun's --export (planner/inputs/srun_export.py); None: no srun, or ALL by default."""
        srun_env = self.srun_env
        if srun_env is None:
            return None
        own = sbatch_options(srun_words(self.wrapper), "srun").get("export")
        return srun_export(own, srun_env, self.env, self.job)

    @property
    def sbatch_export(self) -> Export | None:
        """The --export of the job the script submits with sbatch and launches in, where it passes the job not all of
        the environment (`#SBATCH --export=NONE`, `sbatch --export=NONE <<EOF`): the job then gets none of launch.sh's
        exported functions, through which the plan reaches its launch; None where the launch is in no such job, or
        the job gets the whole environment."""
        value = self.job.get("SLURM_EXPORT_ENV") if self.in_sbatch_job else None
        export = None if value is None else Export(value.value, value.source)
        return None if export is None or export.all else export

    @property
    def under_srun(self) -> bool:
        return bool(self.wrapper) and self.wrapper[0].rsplit("/", 1)[-1] == "srun"

    @property
    def refused(self) -> str | None:
        """Why the launch is not one Megatron rank on each GPU it holds (None: it is): srun's (`SrunTasks.refused`),
        or a torchrun in each srun task that does not start one rank on each GPU Slurm gives the task
        (`TorchrunTasks.refused`)."""
        by = self.launched_by
        if by == "srun":
            return self.srun.refused
        return self.torchrun.refused if by == "torchrun" and self.under_srun else None

    @property
    def launched_by(self) -> str | None:
        """What starts the ranks: "torchrun" (also `python -m torch.distributed.run|launch`), else "srun",
        "mpirun" or "mpiexec" in front of the entry script; None for python started by the script itself (one
        process, unless whatever runs the script starts more)."""
        if self._torch_launcher:
            return "torchrun"
        name = self.wrapper[0].rsplit("/", 1)[-1] if self.wrapper else ""
        return name if name in ("srun", "mpirun", "mpiexec") else None

    @property
    def _torch_launcher(self) -> bool:
        return bool(self.launcher) and (self.launcher[0].rsplit("/", 1)[-1] == "torchrun" or "-m" in self.launcher)


def _legacy_launch(launcher: list[str]) -> bool:
    """The launcher is `python -m torch.distributed.launch`, whose parser has --use-env on top of torchrun's."""
    return launcher[-1:] == ["torch.distributed.launch"]


def _wrapper_world(words: list[str]) -> int | None:
    """World size from mpirun's -np (or -n/--ntasks, -N times --ntasks-per-node)."""
    short: dict[str, str] = {}
    for i, tok in enumerate(words[:-1]):
        if tok in ("-N", "-n", "-np", "-c"):
            short[tok] = words[i + 1]
    longs = options(words, {"nodes", "ntasks-per-node", "ntasks", "np"})
    total = longs.get("ntasks") or short.get("-n") or short.get("-np") or longs.get("np")
    if total and total.isdigit():
        return int(total)
    nodes = longs.get("nodes") or short.get("-N") or "1"
    per = longs.get("ntasks-per-node")
    if per and per.isdigit() and nodes.isdigit():
        return int(nodes) * int(per)
    return None


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------
_PARSED: dict[tuple[str | None, str], Any] = {}  # (path, text) -> (syntax tree, stray `\\ ` lines)


def _parsed(text: str, path_text: str | None):
    """The script's syntax tree (the interpreter only reads it) and the lines that end in a stray
    `\\ `, kept for the last few scripts: `solve --megatron-script` evaluates the script for its
    inputs and again for the launcher, and lexing a large script is most of the reading time."""
    key = (path_text, text)
    hit = _PARSED.get(key)
    if hit is None:
        stray: list[int] = []
        hit = (parse(text, path_text, 0, stray=stray), stray)
        if len(_PARSED) >= 4:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = hit
    return hit


SCAN_STEPS_AFTER_LAUNCH = 20_000  # statements read past the launch, looking for other launches

# Megatron-LM entry scripts that build another model than the GPT decoder the planner prices
NON_GPT_ENTRIES = {
    "pretrain_bert.py": "BERT", "pretrain_t5.py": "T5", "pretrain_ict.py": "an ICT (BERT) retriever",
    "pretrain_retro.py": "RETRO", "pretrain_vlm.py": "a vision-language model", "pretrain_mamba.py": "a Mamba hybrid",
    "pretrain_hybrid.py": "a Mamba hybrid", "pretrain_vision_classify.py": "a vision transformer",
    "pretrain_vision_dino.py": "a vision transformer", "pretrain_vision_inpaint.py": "a vision transformer",
}
# entry scripts of Megatron-LM and its forks that build Megatron's GPT decoder from these flags
_GPT_ENTRY = re.compile(r"(pre|post)train_gpt\.py|train_gpt\.py|pretrain_(mcore_)?(qwen|llama|mistral|mixtral|deepseek|"
                        r"gpt_oss|moe)\w*\.py")


def parse_launcher_script(
    text: str, *, args: Iterable[str] | None = None, path: str | Path | None = None,
    scheduler: Iterable[SchedulerValue] = (), deadline: float | None = None, max_steps: int = MAX_STEPS,
) -> LauncherScript:
    """Evaluate a bash launcher script with the given arguments; see the module docstring.

    `scheduler`: the job geometry known before the script runs (SLURM_* from `#SBATCH` lines and the
    cluster, planner.inputs.shell.builtins.SchedulerValue); the script's own `#SBATCH` lines are read
    here and win.  `deadline` (a time.monotonic() value) and `max_steps` bound the reading: past
    either, the reader stops naming the line it reached, with ReadingTimeLimitError (a time-limit error, exit
    status 3) past the deadline and PlannerInputError past the statements.

    Raises PlannerInputError naming the script file and line for a syntax error, a hostile
    construct, or a script that exits before it launches; naming --megatron-script when no
    statement runs a Python entry script, or when it runs one that builds another model."""
    path_text = str(path) if path is not None else None
    given = list(args) if args is not None else []
    scheduler = tuple(scheduler)
    if len(text) > MAX_SCRIPT_BYTES:
        raise PlannerInputError(path_text or FIELD, f"larger than {MAX_SCRIPT_BYTES >> 20} MiB")
    try:
        body, stray = _parsed(text, path_text)
    except RecursionError:  # a last guard; the nesting limits refuse such scripts first
        raise PlannerInputError(path_text or FIELD, f"nested more deeply than the reader follows ({MAX_NESTING})") from None
    geometry = {v.name: v for v in scheduler} | {v.name: v for v in sbatch_values(text, path=path_text)}
    interp = Interp(text, path_text, given, scheduler=geometry.values(), deadline=deadline, max_steps=max_steps,
                    steps_after_launch=SCAN_STEPS_AFTER_LAUNCH)
    interp.stray_lines += [(0, k) for k in stray]
    stopped = _run(interp, body, given)
    launch = interp.at_launch  # the reader's state at the first launch: what the script gives it
    if launch is None or launch.found is None:
        extra = f" (not a training entry: {', '.join(interp.skipped_launches)})" if interp.skipped_launches else ""
        if interp.remote_launches:
            extra += (f"; a remote shell runs the training on other hosts ({', '.join(dict.fromkeys(interp.remote_launches))}), "
                      "which the reader does not follow: give a script of the command each node runs (its torchrun "
                      "line) and run the launch.sh written for it on every node, as the remote shell did "
                      "(docs/running.md, 'Starting it: torchrun on every node')")
        if interp.other_jobs:
            extra += (f"; the training runs in a job submitted with another scheduler ("
                      f"{', '.join(dict.fromkeys(interp.other_jobs))}), which the reader does not follow: give the job "
                      "script itself and submit the launch.sh written for it (its #PBS/#BSUB lines stay at its top)")
        if interp.foreign_launches:
            extra += (f"; {', '.join(dict.fromkeys(interp.foreign_launches))}, a launcher the reader does not read "
                      "(Megatron-LM jobs are started by torchrun, python -m torch.distributed.run/launch or python): "
                      "give a script that starts the entry script with one of these")
        if interp.sbatch_wraps:
            extra += (f"; `sbatch --wrap` ({', '.join(interp.sbatch_wraps)}) is not read: put the job's command in a "
                      "here-document (`sbatch <<EOF` ... `EOF`) or a job script file")
        raise PlannerInputError(
            FIELD,
            f"{path_text or 'the script'}: no command runs a Python training entry script (expected "
            "`torchrun [args] pretrain_gpt.py <flags>`, `python -m torch.distributed.run [args] <script>.py "
            f"<flags>` or `python <train>.py <flags>`, possibly behind srun/mpirun, eval, bash -c or sbatch){extra}",
        )
    found = launch.found
    _check_launch(launch, found)
    warnings = _warnings(launch, found, path_text)
    warnings += _other_launches(interp, stopped)
    script = _script_of(launch, found, text, path_text, given, warnings)
    script.cluster_reads = _cluster_reads(interp, geometry)
    script.read_with = scheduler
    script.warnings += _unseen_pet_notes(script)
    return script


def _unseen_pet_notes(script: LauncherScript) -> list[str]:
    """torchrun's counts the script leaves to their PET_* variable, which it does not set: a PET_* of the
    environment the script runs in (the shell it is started from; under sbatch, the submitting shell's, which sbatch
    passes on by default, sbatch(1) --export=ALL) would set them, and the reader cannot see it.  Not where an
    --export keeps it from torchrun (the job's #SBATCH --export, srun's: planner/inputs/srun_export.py)."""
    if script.launched_by != "torchrun":
        return []
    given = torchrun_options(script.launcher_args, launch=_legacy_launch(script.launcher))
    env = script.task_env
    job = script.job.get("SLURM_EXPORT_ENV")
    exports = [e for e in (Export(job.value, job.source) if job else None, script.srun_export) if e is not None]
    where = f"{location(script.path, script.site.line)}: " if script.site is not None else ""
    out: list[str] = []
    names: tuple[Count, ...] = ("nnodes", "nproc-per-node")
    for name in names:
        variable = pet_variable(name)
        if name in given or variable in env or any(not e.passes(variable) for e in exports):
            continue
        out.append(f"{where}torchrun gets no --{name} and the script sets no {variable}: read as torchrun's default; "
                   f"a {variable} in the environment the job is submitted or run from (sbatch passes it on by default) "
                   f"would change it; give --{name} to make the count the script's")
    return out


def _cluster_reads(interp: Interp, geometry: dict[str, SchedulerValue]) -> list[str]:
    """The SLURM_* variables --cluster gives (CLUSTER_GEOMETRY_VARS) that the reading may have seen, whole script
    included: looked up by name (a computed one too), or named in a text it read (the script, a file it sourced,
    an eval, bash -c or $(...) string); those the script's own #SBATCH lines state are its own, whatever the
    cluster."""
    return sorted(name for name in CLUSTER_GEOMETRY_VARS
                  if not (name in geometry and geometry[name].stated)
                  and (name in interp.geometry_lookups or any(name in t for _, t in interp.sources)))


def _run(interp: Interp, body: list, given: list[str]) -> str:
    """Evaluate the script, in one pass: to its first launch (an error before it is the script's), then on for
    SCAN_STEPS_AFTER_LAUNCH statements at most, looking for other launches.  Returns where the reading past the
    launch stopped short of the end of the script ("": it did not)."""
    try:
        interp.run_list(body)
    except (PlannerInputError, ReadingTimeLimitError):
        if interp.at_launch is None:
            raise
        return interp.where(*interp.cur)  # the scan stops there; the plan's launch was found
    except ScriptExit as exc:
        if interp.at_launch is None:
            where = interp.where(exc.line, exc.src)
            hint = "" if given or "set -e" in exc.message else "; pass the script's own arguments after `--`"
            why = f" ({exc.message})" if exc.message else ""
            raise PlannerInputError(
                where, f"the script exits here (status {exc.status}){why} before it runs a launch command{hint}"
            ) from None
    except (Break, Continue, Return):
        pass
    except RecursionError:  # a last guard; the nesting limits above refuse such scripts first
        if interp.at_launch is None:
            raise PlannerInputError(interp.path or FIELD,
                                    f"nested more deeply than the reader follows ({MAX_NESTING})") from None
    return ""


def _comment_break(lines: list[str], first: int) -> int | None:
    """The 1-based line of a comment that ends the command starting on line `first` (1-based) while its lines
    continue (a backslash at their ends), when the line after the comment starts with a flag: bash reads a comment
    to the end of its line, backslash included, so the command ends there and the flags below run as a command of
    their own."""
    k = first - 1
    while k < len(lines) - 1:
        line = lines[k]
        head, hash_, _ = line.partition(" #")
        full_line = k > first - 1 and line.lstrip().startswith("#")  # reached by a continuation
        inline = bool(hash_) and not set("'\"`") & set(head) and line.rstrip().endswith("\\")
        if full_line or inline:
            return k + 1 if lines[k + 1].lstrip().startswith("-") else None
        if not line.rstrip().endswith("\\"):
            return None
        k += 1
    return None


def _check_launch(interp: Interp, found) -> None:
    """What bash would run but Megatron would not take: a lone blank argument (a backslash followed by
    a space where a line continuation was meant), an entry script that builds another model; a comment inside
    the launch command, which ends it before flags that follow; an srun option srun refuses as ambiguous."""
    lines = interp.text.splitlines()
    site = found.site
    if site is not None and site.via == "direct" and 0 < site.line <= len(lines):
        broken = _comment_break(lines, site.line)
        if broken is not None:
            after = lines[broken].split()[0] if lines[broken].split() else ""
            raise PlannerInputError(
                interp.where(broken), f"this comment ends the command that launches training (bash reads a comment "
                f"to the end of its line, backslash included): the flags from the next line on ({after} ...) are "
                "not part of it, and bash runs them as a command of their own after training; move the comment out "
                "of the command or delete it")
    if found.wrapper and found.wrapper[0].rsplit("/", 1)[-1] == "srun":
        try:
            srun_words(found.wrapper)
        except SlurmOptionError as exc:  # an ambiguous prefix of an option: srun refuses the launch
            raise PlannerInputError(FIELD, f"{interp.where(found.line, found.src)}: {exc}") from None
    if found.launcher and (found.launcher[0].rsplit("/", 1)[-1] == "torchrun" or "-m" in found.launcher):
        try:
            torchrun_options(found.launcher_args, launch=_legacy_launch(found.launcher))
        except TorchrunOptionError as exc:  # an ambiguous prefix of an option: torchrun exits with argparse's error
            raise PlannerInputError(FIELD, f"{interp.where(found.line, found.src)}: {exc}") from None
    entry = found.entry.rsplit("/", 1)[-1]
    if entry in NON_GPT_ENTRIES:
        raise PlannerInputError(
            FIELD, f"{interp.where(found.line, found.src)}: {found.entry} builds {NON_GPT_ENTRIES[entry]}, not the GPT "
            "decoder (pretrain_gpt.py) the planner prices and plans; it cannot plan this launch")
    if any(tok and not tok.strip() for tok in found.flags):
        stray = sorted(set(interp.stray_lines))
        where = ", ".join(interp.where(line, src) for src, line in stray) or interp.where(found.line, found.src)
        raise PlannerInputError(
            where, f"a backslash followed by a space (`\\ `) ends this line: bash passes a lone space to {entry} "
            "as an argument and ends the command at the end of the line, so the flags on the next lines are not "
            "part of it (Megatron refuses the space); remove the blank after the backslash")


def _warnings(interp: Interp, found, path_text: str | None) -> list[str]:
    warnings = list(interp.warnings)
    for d in interp.decisions:
        warnings.append(d.message(path_text))
    if interp.unresolved:
        warnings.append(
            "kept as literal text (bash expands them when the launcher runs): " + ", ".join(interp.unresolved)
        )
    entry = found.entry.rsplit("/", 1)[-1]
    if not _GPT_ENTRY.fullmatch(entry):
        warnings.append(f"{interp.where(found.line, found.src)}: the entry script {found.entry} is not pretrain_gpt.py: "
                        "it is planned as Megatron's GPT decoder with these flags; if it builds another model the plan "
                        "does not hold")
    for name, where in interp.scheduler_used.items():
        value = interp.scheduler[name]
        warnings.append(f"{where}: {name}={value.value} (set by the scheduler when the job runs), "
                        f"from {value.source}")
    for name, where in interp.scheduler_unset.items():
        warnings.append(f"{where}: {name} is set by the scheduler or launcher when the job runs and is "
                        "unset here, so it reads as empty (0 in arithmetic); " + scheduler_fix(name))
    return warnings


def scheduler_fix(name: str) -> str:
    """How to give the reader a scheduler variable's value."""
    if name in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        how = "add `#SBATCH --nodes=N` to the script, or give --cluster the nodes"
    elif name in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        how = "add `#SBATCH --nodes=N` and `#SBATCH --ntasks-per-node=K` to the script"
    elif name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        how = "add `#SBATCH --gpus-per-node=G` to the script"
    else:
        how = f"give {name} a default in the script (`${{{name}:-VALUE}}`)"
    return how + "; flags computed from it can be set with --gbs / --mbs / --tp ... or --megatron-args"


def _other_launches(interp: Interp, stopped: str) -> list[str]:
    """The script's launch statements other than the first, named (the plan covers the first one only), and
    `stopped`, where the reading past the launch stopped short of the end (_run)."""
    first_where = interp.where(interp.found.line, interp.found.src) if interp.found is not None else None
    seen: dict[tuple[str, str], int] = {}
    for where, entry in interp.launches:
        seen[(where, entry)] = seen.get((where, entry), 0) + 1
    out: list[str] = []
    for (where, entry), count in seen.items():
        times = f" ({count} times)" if count > 1 else ""
        if where == first_where:
            if count > 1:
                out.append(f"{where}: the launch runs {count} times (in a loop); each run gets the plan")
            continue
        out.append(f"{where}: the script launches {entry} again{times}; only the first launch ({first_where}) "
                   "was read and planned; check that this one should run with the plan, or remove it")
    if stopped:
        out.append(f"{stopped}: the script goes on past the launch for more than {SCAN_STEPS_AFTER_LAUNCH} "
                   "statements (a loop?); it was not read further for other launches")
    return out


def _script_of(interp: Interp, found, text: str, path_text: str | None, given: list[str],
               warnings: list[str]) -> LauncherScript:
    sourced: dict[str, str] = {}
    if interp.script_dir is not None:
        base = Path(interp.script_dir)
        texts: dict[str | None, str] = {}
        for source_path, source_text in interp.sources:  # a file's own text comes first: as read when sourced
            texts.setdefault(source_path, source_text)  # (the later entries of its path are its $(...) and eval strings)
        for f in interp.sourced:
            try:
                rel = f.resolve().relative_to(base)
            except ValueError:
                continue  # outside the script's directory: it is the cluster's (e.g. set_env.sh)
            sourced[str(rel)] = texts[str(f)]
    return LauncherScript(
        sourced=sourced,
        self_relative=interp.self_relative,
        text=text,
        megatron_flags=found.flags,
        entry_script=found.entry,
        launcher=found.launcher,
        launcher_args=found.launcher_args,
        wrapper=found.wrapper,
        path=path_text,
        args=given,
        env={n: v.value for n, v in interp.vars.items() if isinstance(v.value, str)},
        arrays={n: list(v.value) for n, v in interp.vars.items() if isinstance(v.value, list)},
        exported=list(interp.exported),
        launch_env=found.prefix_env,
        outer_env=found.outer_env,
        in_sbatch_job=found.in_sbatch_job,
        site=found.site,
        decisions=list(interp.decisions),
        unresolved=list(interp.unresolved),
        warnings=warnings,
        scheduler_unset=dict(interp.scheduler_unset),
        launch_defaults=dict(interp.launch_defaults),
        missing_sources=list(interp.missing_sources),
        split_elements=list(interp.split_elements),
        job=dict(found.job),
    )


def flags_with(script: LauncherScript, name: str, value: str) -> list[str] | None:
    """The script's Megatron flags read again as a job that gives the variable `name` (read unset the first time)
    `value`: which flags it makes; None where that reading fails."""
    given = SchedulerValue(name, value, "a probe of what the script makes of it", stated=False)
    try:
        again = parse_launcher_script(script.text, args=script.args, path=script.path,
                                      scheduler=[*script.read_with, given])
    except PlannerInputError:
        return None
    return again.megatron_flags


def cluster_geometry(cluster: ClusterSpec | None) -> list[SchedulerValue]:
    """The SLURM_* node counts a job on `cluster` would see (GPUs per node only when every node has
    the same number); the script's own `#SBATCH` lines win over these."""
    if cluster is None:
        return []
    nodes = str(sum(g.num_nodes for g in cluster.groups))
    source = "--cluster"
    out = [SchedulerValue(n, nodes, f"{source} ({nodes} nodes)", stated=False)
           for n in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES")]
    sizes = {g.gpus_per_node for g in cluster.groups}
    if len(sizes) == 1:
        gpn = str(sizes.pop())
        out += [SchedulerValue(n, gpn, f"{source} ({gpn} GPUs per node)", stated=False)
                for n in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE")]
    return out


def reads_alike(script: LauncherScript, read_on: ClusterSpec | None, other: ClusterSpec | None) -> bool:
    """Whether `script`, read as a job on `read_on`, reads the same as a job on `other` would: the SLURM_* values
    the two clusters give are the same for each one the reading may have seen (`cluster_reads`).  The reading
    depends on nothing else of the cluster."""
    ours, theirs = ({v.name: v for v in cluster_geometry(c)} for c in (read_on, other))
    return all(ours.get(name) == theirs.get(name) for name in script.cluster_reads)


def read_launcher_script(path: str | Path, args: Iterable[str] | None = None, *,
                         scheduler: Iterable[SchedulerValue] = (), deadline: float | None = None) -> LauncherScript:
    """Read and evaluate a launcher script file (see parse_launcher_script); a missing or unreadable
    file names --megatron-script."""
    p = Path(path)
    text = read_text(p, FIELD, max_bytes=MAX_SCRIPT_BYTES)
    return parse_launcher_script(text, args=args, path=str(p), scheduler=scheduler, deadline=deadline)
