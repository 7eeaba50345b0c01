"""The evaluator of the launcher-script reader: variables, arguments, expansions, control flow,
functions, eval / bash -c / source, tests, and the detection of the statement that starts
training.  Run by planner/inputs/script.py (see its docstring for what is evaluated and how what
cannot be known is read)."""

from __future__ import annotations

import copy
import fnmatch
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from planner.errors import PlannerInputError, ReadingTimeLimitError
from planner.inputs.files import read_text
from planner.inputs.shell.arith import MAX_ARITH_CHARS, eval_arith
from planner.inputs.shell.builtins import (
    CLUSTER_GEOMETRY_VARS, SchedulerValue, basename_of, dirname_of, echo_text, expr_value, getopt_text, ifs_split, printf_text, read_fields,
    sbatch_values, seq_words,
)
from planner.inputs.shell.lexer import ASSIGN_RE, NAME_RE, ArrayAssign, Lexer, Op, Part, Word, location
from planner.inputs.shell.syntax import AndOr, Arith, Case, Cond, Func, Group, If, Loop, Pipe, Simple, parse
from planner.inputs.slurm_options import SlurmOptionError, options_end

MAX_STEPS = 200_000  # statements evaluated (a launcher runs a few thousand; bash itself needs seconds for this)
DEADLINE_CHECK_STEPS = 256  # the clock is read every this many statements
# variables a scheduler or launcher sets when the job runs (unset while the script is read)
SCHEDULER_VAR = re.compile(r"SLURM_\w+|OMPI_\w+|PMIX?_\w+|PET_\w+|MLP_\w+|KUBERNETES_\w+|WORLD_SIZE|NNODES|"
                           r"NUM_NODES|NODE_RANK|N_NODES|NODE_COUNT|NODE_NUM|HOST_NUM|NPROC_PER_NODE|RANK|LOCAL_RANK|"
                           r"GROUP_RANK|MASTER_ADDR|MASTER_PORT|GPUS_PER_NODE|NGPUS|LSB_\w+|PBS_\w+")
MAX_DEPTH = 64  # nested eval / source / bash -c / function calls
MAX_SCRIPT_BYTES = 64 << 20
_DECLARE_WORDS = {"export", "declare", "typeset", "local", "readonly"}
_TORCH_LAUNCH_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
_JOB_ID = SchedulerValue("SLURM_JOB_ID", "1", "sbatch (the job's id)", stated=False)
"""A job sbatch starts has an id (a script that submits itself, `[ -z "$SLURM_JOB_ID" ] && sbatch "$0"`, runs its
training part in the job); its value is no one's, and no count."""
_IDENTITY_VARS = frozenset({"SLURM_JOB_ID", "SLURM_JOBID"})
"""Scheduler variables that name the job, no count: reading them (set or unset) is not noted."""
_OTHER_SCHEDULERS = frozenset({"qsub", "bsub"})
"""Other schedulers' submissions, whose jobs the reader does not follow (PBS's qsub passes a job no environment
without -V, so launch.sh's functions would not reach it either)."""
_CWD_PREFIX = re.compile(r"(`pwd`|\$\(pwd\)|\$\{?PWD\}?)/+")
"""A sourced path given from the directory the script runs in (`. $(pwd)/CONFIG.sh`, backquoted in Megatron-LM's SC21
scripts), which the reader does not know: the script's own directory is looked in first."""
_REMOTE_SHELLS = frozenset({"ssh", "pdsh", "pssh", "parallel-ssh", "clush", "mpssh"})
"""Programs that run a command string on other hosts, which the reader does not follow and launch.sh cannot reach."""
_SCRIPT_PATH = r"[\"']?\$\{?(0|BASH_SOURCE(\[0\])?)\}?[\"']?"
_SCRIPT_DIR = rf"dirname\s+({_SCRIPT_PATH}|[\"']?\$\(\s*(realpath|readlink\s+-[fem])\s+{_SCRIPT_PATH}\s*\)[\"']?)"
"""The script's own directory as launchers write it: `dirname "$0"`, `dirname "$(readlink -f "$0")"`,
`dirname "$(realpath "${BASH_SOURCE[0]}")"` (inside a `$(...)`, itself maybe inside `cd ... && pwd` or `realpath`)."""
_WRAPPERS = {"srun", "mpirun", "mpiexec", "env", "nohup", "exec", "time", "numactl", "stdbuf", "taskset", "nice",
             "ionice", "singularity", "apptainer", "docker", "enroot", "xargs", "timeout", "ddp", "nsys", "uv"}
_ALWAYS_OK = {"echo", "printf", "mkdir", "cd", "pushd", "popd", "export", "set", "ulimit", "trap", "shopt", "umask",
              "alias", "hash", "wait", "sleep", "touch", "cp", "mv", "rm", "ln", "chmod", "tee", "cat", "date",
              "module", "conda", "ml", "pip", "nvidia-smi", "hostname", "ls", "sync"}
# commands that print nothing (a command substitution around them is still known)
_SILENT = {"cd", "mkdir", "export", "set", "ulimit", "trap", "shopt", "umask", "alias", "hash", "wait", "sleep", "touch",
           "cp", "mv", "rm", "ln", "chmod", "sync", "module", "ml", "conda"}
_ARITH_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z_0-9]*|\d+)\}?")  # $X / ${X} / $1 inside $(( ))
_TRAIN_ENTRY = re.compile(r"(pretrain|train|finetune|sft)", re.IGNORECASE)
_ASSIGNED_NAME = re.compile(r"(?:^|[\s;(&|])(?:(?:export|declare|local|typeset|readonly)(?:\s+-\w+)*\s+)?([A-Za-z_][A-Za-z_0-9]*)(?:\[[^\]]*\])?\+?=", re.M)
_FLAG_TEXT = re.compile(r"(?<![\w-])(--[A-Za-z][A-Za-z0-9_-]*)")


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------
@dataclass
class BranchDecision:
    """A condition that could not be decided from the script alone, and how it was read."""

    line: int
    condition: str
    reading: str  # what the planner did, e.g. "false: skipped lines 40-44"
    reason: str  # why it could not be decided
    flags_skipped: list[str] = field(default_factory=list)
    flags_taken: list[str] = field(default_factory=list)
    path: str | None = None  # the file the line is in, where not the script itself (a file it sources or runs)

    def message(self, path: str | None) -> str:
        held = []
        if self.flags_skipped:
            held.append("skipped flags " + " ".join(self.flags_skipped))
        if self.flags_taken:
            held.append("kept flags " + " ".join(self.flags_taken))
        detail = f" ({'; '.join(held)})" if held else ""
        return f"{location(self.path or path, self.line)}: `{self.condition}` {self.reason}; read as {self.reading}{detail}"


@dataclass
class LaunchSite:
    """Where the launch happens in the script text: the statement the emitted launcher wraps.

    via: "direct" (the statement itself runs the launcher, possibly behind srun/mpirun), "eval"
    (`eval "$cmd"`), "string" (a `bash -c "..."` string, e.g. given to srun), "source" (a sourced
    file) or "function" (a function defined elsewhere runs it); `nested`: the launch is further in (a `bash -c`
    string inside the eval'd text), not in the text `via` runs itself."""

    line: int
    offset: int  # character offset of the statement's command word in the script text
    word: str  # that word as written
    via: str
    nested: bool = False


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------
@dataclass
class _Var:
    value: str | list[str]
    resolved: bool = True


class Break(Exception):
    def __init__(self, n: int):
        self.n = n


class Continue(Exception):
    def __init__(self, n: int):
        self.n = n


class Return(Exception):
    def __init__(self, status: int | None):
        self.status = status


class ScriptExit(Exception):
    def __init__(self, status: int | None, line: int, src: int, message: str = ""):
        self.status = status
        self.line = line
        self.src = src
        self.message = message


@dataclass
class Found:
    fields: list[str]
    wrapper: list[str]
    launcher: list[str]
    launcher_args: list[str]
    entry: str
    flags: list[str]
    prefix_env: dict[str, str]
    site: LaunchSite | None
    line: int
    job: dict[str, SchedulerValue] = field(default_factory=dict)  # the geometry the script states at the launch
    src: int = 0  # the source the launch's line is in (Interp.where): the script, or a file it sources or submits
    outer_env: dict[str, str] | None = None  # the environment of the srun/mpirun around the `bash -c` it is in
    in_sbatch_job: bool = False  # the launch is in a job script the script submits (`sbatch <<EOF`, `sbatch FILE`)


class _CannotCapture(Exception):
    """A command substitution whose output the reader does not know (it runs a program)."""


class _Unknown(Exception):
    """A test that cannot be decided."""

    def __init__(self, reason: str):
        self.reason = reason


class Interp:
    """Variables, positional parameters, functions and the statement evaluator."""

    def __init__(self, text: str, path: str | None, args: list[str], *, scheduler: Iterable[SchedulerValue] = (),
                 deadline: float | None = None, max_steps: int = MAX_STEPS, steps_after_launch: int = 0):
        self.text = text
        self.path = path
        self.script_dir = str(Path(path).resolve().parent) if path else None
        self.vars: dict[str, _Var] = {}
        self.positional: list[str] = list(args)
        self.functions: dict[str, list] = {}
        self.exported: list[str] = []
        self.unresolved: list[str] = []
        self.misses = 0
        self.assumed: set[str] = set()  # env variables a condition read as unset
        self.test_mode = False
        self.steps = 0
        self.depth = 0
        self.sources: list[tuple[str | None, str]] = [(path, text)]  # src id -> (path, text)
        self.site: Simple | None = None
        self.via: list[str] = []  # eval / string / source nesting of the statement being run
        self.site_depth = 0  # len(self.via) when `site` was set
        self.last_unknown = "cannot be decided from the script"
        self.cur = (1, 0)  # (line, source) of the statement being run
        self.decisions: list[BranchDecision] = []
        self.warnings: list[str] = []
        self.found: Found | None = None  # the first launch
        self.at_launch: Interp | None = None  # a copy of this reader's state at the first launch (what it reports)
        self.launches: list[tuple[str, str]] = []  # (where, entry) of every launch, the first included
        self.steps_after_launch = steps_after_launch  # statements read past the first launch, for other launches
        self.skipped_launches: list[str] = []
        self.sbatch_wraps: list[str] = []  # where the script submits `sbatch --wrap` jobs (their command is not read)
        self.remote_launches: list[str] = []  # where a remote shell (ssh, pdsh) runs a training entry on other hosts
        self.other_jobs: list[str] = []  # where another scheduler's submission (qsub, bsub) holds the training
        self.foreign_launches: list[str] = []  # where a program the reader does not know starts a training entry
        self.outer_wrapper: list[str] = []  # srun/mpirun words around a `bash -c` string
        self.sbatch_depth = 0  # job scripts the script submits with sbatch that the statement being run is in
        self.outer_env: dict[str, str] | None = None  # the environment that wrapper runs with (None: no wrapper)
        self.self_relative = False  # the script locates files from its own directory ($0, BASH_SOURCE)
        self.sourced: list[Path] = []  # files it sourced
        # names the script assigns somewhere: unset at a given point, they are empty (as in bash);
        # names it never assigns come from the environment and stay literal in flag values
        self.assigned: set[str] = set(_ASSIGNED_NAME.findall(text))
        self.deadline = deadline  # time.monotonic() after which reading stops (the command's time limit)
        self.max_steps = max_steps
        self.started = time.monotonic()
        self.scheduler: dict[str, SchedulerValue] = {}  # the job geometry known before the script runs
        for value in scheduler:
            self.scheduler[value.name] = value
            self.vars[value.name] = _Var(value.value)
        self.scheduler_used: dict[str, str] = {}  # scheduler variable -> where its value was first read (file:line)
        self.scheduler_unset: dict[str, str] = {}  # scheduler variable read while unset -> where first (file:line)
        self.launch_defaults: dict[str, str] = {}  # scheduler variable unset here, read through its default -> where
        self.geometry_lookups: set[str] = set()  # CLUSTER_GEOMETRY_VARS looked up by name, set or not (a computed
        # name too: `$((N))` with N=SLURM_NNODES, `[[ -v $N ]]`)
        self.errexit = False  # set -e
        self.errexit_ignored = 0  # > 0 inside conditions and && / || lists, where set -e does not exit
        self._andor_tail = False  # the last && / || list ran its final command
        self.integers: set[str] = set()  # declare -i
        self.capture: list[list[str]] = []  # output of the command substitutions being evaluated
        self._substitutions: dict[tuple[str, int], tuple[int, list]] = {}  # (text, line) -> (src, tree)
        self.stray_lines: list[tuple[int, int]] = []  # (src, line) of a `\ ` at the end of a line
        self.split_elements: list[tuple[str, str, str, int]] = []  # (where, array, element, words) split by bash
        self.missing_sources: list[tuple[str, str]] = []  # (where, file) of a `source` whose file is not here

    # -- errors / bookkeeping ------------------------------------------------------------------
    def where(self, line: int, src: int = 0) -> str:
        return location(self.sources[src][0] if src < len(self.sources) else self.path, line)

    def step(self, line: int, src: int) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise PlannerInputError(
                self.where(line, src),
                f"the script runs more than {self.max_steps} statements before it launches training "
                "(a loop that never ends?); the reader stops here",
            )
        if self.deadline is not None and self.steps % DEADLINE_CHECK_STEPS == 0 and time.monotonic() > self.deadline:
            raise ReadingTimeLimitError(
                self.where(line, src),
                f"reading the inputs took {time.monotonic() - self.started:.1f} s ({self.steps} statements of the "
                "script before it launches training: a long loop?), which leaves no time to search; the reader "
                "stops at this line; raise --time-limit",
            )

    def _note(self, raw: str) -> str:
        if self.capture:
            raise _CannotCapture()
        self.misses += 1
        if not self.test_mode and raw not in self.unresolved:
            self.unresolved.append(raw)
        return raw

    # -- variables ------------------------------------------------------------------------------
    def scalar(self, name: str) -> tuple[str | None, bool]:
        """(value, resolved) of a variable or special parameter; None when unset."""
        if name.isdigit():
            k = int(name)
            if k == 0:
                return (self.path or "script.sh"), True
            if k <= len(self.positional):
                return self.positional[k - 1], True
            return None, True
        if name == "#":
            return str(len(self.positional)), True
        if name in ("@", "*"):
            return " ".join(self.positional), True
        if name == "?":
            return "0", True
        if name == "BASH_SOURCE":
            return (self.path or "script.sh"), True
        if name in CLUSTER_GEOMETRY_VARS:
            self.geometry_lookups.add(name)
        var = self.vars.get(name)
        if var is None:
            return None, True
        if name in self.scheduler and name not in self.scheduler_used and name not in _IDENTITY_VARS:
            self.scheduler_used[name] = self.where(*self.cur)
        if isinstance(var.value, list):
            return (var.value[0] if var.value else ""), var.resolved
        return var.value, var.resolved

    def note_unset(self, name: str) -> None:
        """A scheduler's variable read while unset (bash reads it as empty; arithmetic as 0)."""
        if (name not in self.assigned and name not in self.scheduler_unset and SCHEDULER_VAR.fullmatch(name)
                and name not in _IDENTITY_VARS and not self.capture):
            self.scheduler_unset[name] = self.where(*self.cur)

    def set_scalar(self, name: str, value: str, resolved: bool = True) -> None:
        self.vars[name] = _Var(value, resolved)

    # -- expansion ------------------------------------------------------------------------------
    def expand_part(self, part: Part) -> tuple[list[str] | str, bool]:
        """One part: a string or a list (array elements / "$@"), and whether it may be
        word-split (an unquoted expansion)."""
        split = not part.quoted
        kind = part.kind
        if kind == "lit":
            return part.text, False
        if kind == "raw":
            special = self._known_substitution(part.text)
            if special is None and part.text.startswith(("$(", "`")):
                special = self.substitute(part.text)
            if special is not None:
                return special, split
            if self.capture:
                raise _CannotCapture()
            if self.test_mode:
                raise _Unknown(f"depends on the output of {part.text}")
            return self._note(part.text), False
        if kind == "arith":
            try:
                return str(self.arith(self.arith_text(part.text))), False
            except ValueError:
                if self.capture:
                    raise _CannotCapture() from None
                if self.test_mode:
                    raise _Unknown(f"cannot evaluate $(({part.text}))") from None
                return self._note(f"$(({part.text}))"), False
        if kind == "arr":
            if part.text in ("@", "*"):
                return list(self.positional), split
            var = self.vars.get(part.text)
            if var is None:
                if self.test_mode or part.text in self.assigned:
                    if part.text not in self.assigned:
                        self.assumed.add(part.text)
                    return [], split
                return self._note("${" + part.text + "[" + part.op + "]}"), False
            values = var.value if isinstance(var.value, list) else [var.value]
            if part.op == "*" and part.quoted:
                return " ".join(values), False
            return list(values), split
        if kind == "aslice":
            var = self.vars.get(part.text)
            ref = "${" + part.text + "[" + part.op + "]:...}"
            if var is None:
                if self.test_mode or part.text in self.assigned:
                    return [], split
                return self._note(ref), False
            values = var.value if isinstance(var.value, list) else [var.value]
            return self._slice(values, part, ref, split, params=False)
        if kind == "alen":
            var = self.vars.get(part.text)
            values = [] if var is None else (var.value if isinstance(var.value, list) else [var.value])
            return str(len(values)), False
        if kind == "idx":
            var = self.vars.get(part.text)
            index_text, _ = self.expand_text(part.arg)
            if var is None:
                return self._note("${" + part.text + "[" + index_text + "]}"), False
            values = var.value if isinstance(var.value, list) else [var.value]
            try:
                i = self.arith(index_text)
            except ValueError:
                return self._note("${" + part.text + "[" + index_text + "]}"), False
            if i < 0:
                i += len(values)
            return (values[i] if 0 <= i < len(values) else ""), split
        if kind == "len":
            if part.text in ("@", "*", "#"):
                return str(len(self.positional)), False
            value, resolved = self.scalar(part.text)
            if value is None:
                return "0", False
            if not resolved:
                return self._note("${#" + part.text + "}"), False
            return str(len(value)), False
        return self._expand_var(part, split)

    def arith_text(self, text: str) -> str:
        """The text of $(( ... )) after bash's expansions inside it ($(cmd), ${X}); ValueError when a
        command's output there is not known."""
        if "$(" not in text and "`" not in text:
            return text
        word = Lexer(text, self.path).expansion_word(0, len(text))
        value, resolved = self.expand_text(word)
        if not resolved:
            raise ValueError(f"$(( {text} )) uses a command's output the reader does not know")
        return value

    def substitute(self, raw: str) -> str | None:
        """The output of `$(...)` / backquotes, when the commands inside only print what the reader
        knows (echo, printf, functions of the script that do, arithmetic, ...); None otherwise."""
        body = raw[2:-1] if raw.startswith("$(") else re.sub(r"\\([`$\\])", r"\1", raw[1:-1])
        if not body.strip() or self.depth >= MAX_DEPTH:
            return "" if not body.strip() else None
        key = (body, self.cur[0])
        if key not in self._substitutions:
            src = len(self.sources)
            path = self.sources[self.cur[1]][0] if self.cur[1] < len(self.sources) else self.path
            try:
                tree = parse(body, path, src, line_offset=self.cur[0] - 1)
            except PlannerInputError:
                return None
            self.sources.append((path, body))
            self._substitutions[key] = (src, tree)
        _, tree = self._substitutions[key]
        saved = self._subshell_state()
        self.capture.append([])
        self.depth += 1
        self.test_mode = False
        try:
            self.run_list(tree)
        except (ScriptExit, Return):
            pass  # exit / return end the substitution's subshell
        except (_CannotCapture, _Unknown, Break, Continue):
            return None
        finally:
            out = self.capture.pop()
            self.depth -= 1
            self._restore_subshell(saved)
        return "".join(out).rstrip("\n")

    def _subshell_state(self) -> tuple:
        """What a subshell ($(...), bash -c) changes and its parent does not see."""
        vars_copy = {k: _Var(list(v.value) if isinstance(v.value, list) else v.value, v.resolved)
                     for k, v in self.vars.items()}
        return (vars_copy, list(self.positional), dict(self.functions), set(self.integers), self.errexit,
                self.test_mode, self.cur)

    def _restore_subshell(self, saved: tuple) -> None:
        (self.vars, self.positional, self.functions, self.integers, self.errexit, self.test_mode,
         self.cur) = saved

    def output(self, text: str, node: Simple) -> None:
        """What a command prints: kept when a command substitution reads it."""
        if self.capture and not any(r.stdout for r in node.redirects):
            self.capture[-1].append(text)

    def _known_substitution(self, raw: str) -> str | None:
        """$(dirname "$0"), $(dirname "$(readlink -f "$0")"), $(cd "$(dirname ...)" && pwd), $(realpath
        "$(dirname ...)") and friends: the script's own directory, which is known."""
        if self.script_dir is None:
            return None
        body = raw[2:-1] if raw.startswith("$(") else raw[1:-1]
        if re.search(r"\$\{?(0|BASH_SOURCE)\b", body):
            self.self_relative = True
        if re.fullmatch(rf"\s*{_SCRIPT_DIR}\s*", body):
            return self.script_dir
        if re.fullmatch(rf"\s*cd\s+[\"']?\$\(\s*{_SCRIPT_DIR}\s*\)[\"']?\s*(&&|;)\s*pwd(\s+-P)?\s*", body):
            return self.script_dir
        if re.fullmatch(rf"\s*(realpath|readlink\s+-[fem])\s+[\"']?\$\(\s*{_SCRIPT_DIR}\s*\)[\"']?\s*", body):
            return self.script_dir
        return None

    def _expand_var(self, part: Part, split: bool) -> tuple[list[str] | str, bool]:
        name = part.text
        if name in ("@", "*") and not part.op:
            if part.quoted and name == "@":
                return list(self.positional), False
            return " ".join(self.positional), split
        if name in ("@", "*") and part.op == ":":  # ${@:offset[:length]}: offset 0 is $0
            return self._slice([self.path or "script.sh", *self.positional], part, "${" + name + ":...}", split,
                               params=True)
        is_name = bool(NAME_RE.fullmatch(name))
        ref = "${" + name + "}" if is_name else "$" + name
        value, resolved = self.scalar(name)
        op = part.op
        if value is None and is_name and name not in self.assigned and self.test_mode:
            self.assumed.add(name)
        if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            is_set = value is not None
            present = (is_set and value != "") if op.startswith(":") else is_set
            if op in (":+", "+"):
                if is_set and not resolved:
                    return self._note(ref), False
                return (self.expand_text(part.arg)[0] if present else ""), split
            if not present:
                if not is_set and is_name and SCHEDULER_VAR.fullmatch(name):
                    self.launch_defaults.setdefault(name, self.where(*self.cur))
                if op.endswith("?"):
                    if name.isdigit() or name in self.assigned:  # bash stops the script here
                        message, _ = self.expand_text(part.arg)
                        raise ScriptExit(1, *self.cur, message=f"{ref}: {message or 'parameter null or not set'}")
                    return self._note(ref), False  # an environment variable: set where it runs
                arg_text, arg_ok = self.expand_text(part.arg)
                if op.endswith("=") and is_name:
                    self.vars[name] = _Var(arg_text, arg_ok)
                return arg_text, split
        if value is None:
            if is_name and not op:
                self.note_unset(name)
            if self.test_mode or (is_name and name in self.assigned):
                return "", split
            return self._note(ref), False
        if not resolved:
            if self.capture:
                raise _CannotCapture()
            if self.test_mode:
                raise _Unknown(f"depends on {ref}, which holds text the planner cannot evaluate")
            self.misses += 1  # the value holds literal text (e.g. $(date)): expanded as that text
            if value in self.unresolved:  # one construct bash expands when it runs: one word, as written
                split = False
        if op and op not in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            return self._string_op(value, part), split
        return value, split

    def _slice(self, values: list[str], part: Part, ref: str, split: bool, *, params: bool) -> tuple[list[str] | str, bool]:
        """${@:off:len} (values: $0 and the positional parameters) or ${A[@]:off:len}, as bash slices them: whole
        elements, a negative offset counted from the end (past the first: nothing), a negative length an error (left
        for bash, as text).  Quoted with @: one word per element; with *: joined by a blank."""
        try:
            off = self.arith(self.expand_text(part.arg)[0])
            length = None if part.arg2 is None else self.arith(self.expand_text(part.arg2)[0])
        except ValueError:
            return self._note(ref), False
        if length is not None and length < 0:
            return self._note(ref), False
        if off < 0:
            off += len(values)
        picked = [] if off < 0 else values[off:] if length is None else values[off:off + length]
        if (part.text == "*" if params else part.op == "*") and part.quoted:
            return " ".join(picked), False
        return picked, split

    def _string_op(self, value: str, part: Part) -> str:
        op = part.op
        if op in ("^^", "^"):
            return value.upper() if op == "^^" else value[:1].upper() + value[1:]
        if op in (",,", ","):
            return value.lower() if op == ",," else value[:1].lower() + value[1:]
        if op == ":":
            try:
                off = self.arith(self.expand_text(part.arg)[0])
                if part.arg2 is not None:
                    length = self.arith(self.expand_text(part.arg2)[0])
                    return value[off:][:length] if length >= 0 else value[off:length]
                return value[off:]
            except ValueError:
                return self._note("${" + part.text + ":...}")
        pattern, _ = self.expand_text(part.arg)
        regex = fnmatch.translate(pattern)[:-2]  # drop the \Z anchor  (Python's "(?s:...)\Z")
        if op in ("#", "##"):
            best = None
            for k in range(len(value) + 1):
                if re.fullmatch(regex, value[:k]):
                    best = k
                    if op == "#":
                        break
            return value[best:] if best is not None else value
        if op in ("%", "%%"):
            best = None
            for k in range(len(value), -1, -1):
                if re.fullmatch(regex, value[k:]):
                    best = k
                    if op == "%":
                        break
            return value[:best] if best is not None else value
        if op in ("/", "//"):
            rep, _ = self.expand_text(part.arg2)
            if not pattern:
                return value
            try:
                return re.sub(regex, lambda m: rep, value, count=0 if op == "//" else 1)
            except re.error:
                return value
        return value

    def arith(self, expr: str) -> int:
        """$((...)): evaluated with the variables' integer values (unset or empty: 0)."""
        if len(expr) > MAX_ARITH_CHARS:
            raise ValueError(f"arithmetic longer than {MAX_ARITH_CHARS} characters")
        text = _ARITH_REF.sub(lambda m: f"__p{m.group(1)}" if m.group(1).isdigit() else m.group(1), expr)
        return eval_arith(text, self._arith_name)

    def _arith_name(self, name: str) -> int:
        """A variable's value in arithmetic: an integer, empty or unset (0), or the name of one."""
        if name.startswith("__p") and name[3:].isdigit():
            name = name[3:]
        value, resolved = self.scalar(name)
        if value is None:
            if name not in self.vars:
                self.assumed.add(name)
                self.note_unset(name)
            return 0
        if not resolved:
            raise ValueError(f"{name} is not known")
        v = value.strip()
        if re.fullmatch(r"-?\d+", v):
            return int(v)
        if v == "":
            return 0
        if len(v) < 200 and NAME_RE.fullmatch(v):  # one level of indirection, as bash
            inner, ok = self.scalar(v)
            if inner is not None and ok and re.fullmatch(r"\s*-?\d+\s*", inner):
                return int(inner)
        raise ValueError(f"{name}={value!r} is not an integer")

    def expand_text(self, word: Word | None) -> tuple[str, bool]:
        """A word expanded without field splitting (as on the right of `X=`), and whether every
        part resolved."""
        if word is None:
            return "", True
        before = self.misses
        out: list[str] = []
        for part in word.parts:
            value, _ = self.expand_part(part)
            out.append(" ".join(value) if isinstance(value, list) else value)
        return "".join(out), self.misses == before

    def ifs(self) -> str | None:
        """IFS as the script set it (None: unset, bash's default of blank, tab, newline)."""
        var = self.vars.get("IFS")
        return var.value if var is not None and isinstance(var.value, str) else None

    def expand_fields(self, word: Word) -> list[str]:
        """A command word expanded to fields (word splitting of unquoted expansions by IFS, arrays)."""
        parts = word.parts
        if len(parts) == 1 and parts[0].kind == "lit":  # a plain word (most of a long array): itself
            return [parts[0].text] if parts[0].text or parts[0].quoted else []
        fields: list[str] = []
        current: list[str] = []
        has_content = False

        def flush() -> None:
            nonlocal current, has_content
            if has_content:
                fields.append("".join(current))
            current, has_content = [], False

        def pieces_of(pieces: list[str]) -> None:
            """The words of one expansion: the first ends the field being built, each later one is a field of
            its own, the last one starts the next field."""
            nonlocal current, has_content
            if not pieces:
                return
            current.append(pieces[0])
            if len(pieces) > 1:
                fields.append("".join(current))
                fields.extend(pieces[1:-1])
                current = [pieces[-1]]
            has_content = True

        for part in parts:
            value, split = self.expand_part(part)
            if part.kind == "lit" and part.quoted:
                has_content = True
            if isinstance(value, list):
                pieces_of(self._split_elements(part, value) if split else value)
                continue
            if split and value:
                chunks, lead, trail = ifs_split(value, self.ifs(), self.unresolved)
                if lead:
                    flush()
                pieces_of(chunks)
                if trail:
                    flush()
                continue
            if value or part.quoted:
                current.append(value)
                has_content = has_content or bool(value) or part.quoted
        flush()
        return fields

    def _split_elements(self, part: Part, values: list[str]) -> list[str]:
        """The fields of an unquoted array expansion: each element split by IFS (recorded when bash
        makes several words of one element: `${ARGS[@]}` without quotes)."""
        pieces: list[str] = []
        for v in values:
            words = ifs_split(v, self.ifs(), self.unresolved)[0]
            if len(words) > 1 and part.kind == "arr" and part.text not in ("@", "*"):
                self.split_elements.append((self.where(*self.cur), part.text, v, len(words)))
            pieces.extend(words)
        return pieces

    # -- assignments ----------------------------------------------------------------------------
    def assign(self, tok: Word | ArrayAssign) -> str:
        """`NAME=value`, `NAME+=value`, `NAME[i]=value`, `NAME=(...)`, `NAME+=(...)`; returns NAME."""
        if isinstance(tok, ArrayAssign):
            values: list[str] = []
            for w in tok.words:
                values.extend(self.expand_fields(w))
            old = self.vars.get(tok.name)
            if tok.append and old is not None:
                if isinstance(old.value, list):
                    old.value.extend(values)  # in place: appending stays linear
                else:
                    self.vars[tok.name] = _Var([old.value, *values], old.resolved)
            else:
                self.vars[tok.name] = _Var(values)
            return tok.name
        m = ASSIGN_RE.match(tok.raw)
        assert m is not None
        name, index, append = m.group(1), m.group(2), bool(m.group(3))
        prefix_len = m.end()
        parts = list(tok.parts)
        first = parts[0]
        value_parts = [Part(first.kind, first.text[prefix_len:], first.quoted)] + parts[1:]
        value, resolved = self.expand_text(Word(value_parts, tok.raw[prefix_len:], tok.line, tok.pos))
        old = self.vars.get(name)
        if index:
            try:
                i = self.arith(index[1:-1])
            except ValueError:
                return name
            arr = list(old.value) if old is not None and isinstance(old.value, list) else ([old.value] if old else [])
            while len(arr) <= i:
                arr.append("")
            arr[i] = (arr[i] + value) if append else value
            self.vars[name] = _Var(arr, resolved and (old.resolved if old else True))
            return name
        if name in self.integers and resolved:  # declare -i: the value is arithmetic
            try:
                old_value = self.arith(name) if append and old is not None else 0
                value, append = str(old_value + self.arith(self.arith_text(value))), False
            except ValueError:
                pass
        if append and old is not None:
            if isinstance(old.value, list):
                old.value.append(value)
            else:
                self.vars[name] = _Var(old.value + value, old.resolved and resolved)
        else:
            self.vars[name] = _Var(value, resolved)
        return name

    # -- statements -----------------------------------------------------------------------------
    def run_list(self, nodes: list) -> int | None:
        status: int | None = 0
        for node in nodes:
            status = self.run(node)
            if status and self.errexit and not self.errexit_ignored and self._exits_on_failure(node):
                line = getattr(node, "line", self.cur[0])
                src = getattr(node, "src", self.cur[1])
                raise ScriptExit(status, line, src, message=f"`set -e` is on and `{self._line_text(line, src)}` "
                                                            f"returned {status}, so bash stops the script")
        return status

    def _exits_on_failure(self, node) -> bool:
        """set -e stops the script after a failing simple command, (( )), [[ ]], pipeline or subshell;
        after an && / || list only when its final command failed."""
        if isinstance(node, (Simple, Arith, Cond)):
            return True
        if isinstance(node, Pipe):
            return not node.negate
        if isinstance(node, Group):
            return node.subshell
        return isinstance(node, AndOr) and self._andor_tail

    def _line_text(self, line: int, src: int) -> str:
        text = self.sources[src][1] if src < len(self.sources) else self.text
        lines = text.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else "?"

    def _no_errexit(self, fn: Callable[[], int | None]) -> int | None:
        """Run a condition (if / while / && / || operand): set -e does not stop the script there."""
        self.errexit_ignored += 1
        try:
            return fn()
        finally:
            self.errexit_ignored -= 1

    def run(self, node) -> int | None:
        if isinstance(node, Simple):
            return self.simple(node)
        if isinstance(node, AndOr):
            return self.and_or(node)
        if isinstance(node, Pipe):
            return self.pipeline(node)
        if isinstance(node, If):
            return self.run_if(node)
        if isinstance(node, Loop):
            return self.loop(node)
        if isinstance(node, Case):
            return self.case(node)
        if isinstance(node, Group):
            if node.subshell:
                saved = (dict(self.vars), list(self.positional))
                try:
                    return self.run_list(node.body)
                except ScriptExit as exc:
                    return exc.status
                finally:
                    self.vars, self.positional = saved
            return self.run_list(node.body)
        if isinstance(node, Func):
            self.functions[node.name] = node.body
            return 0
        if isinstance(node, Arith):
            self.step(node.line, 0)
            try:
                return 0 if self.arith_command(node.expr) != 0 else 1
            except ValueError:
                return None
        if isinstance(node, Cond):
            return self.condition_status(lambda: self.cond_words(node.words))
        raise AssertionError(node)

    def pipeline(self, node: Pipe) -> int | None:
        """`a | b`: only the last command's output is the pipeline's (the others feed the next one)."""
        status = None
        for k, cmd in enumerate(node.cmds):
            last = k == len(node.cmds) - 1
            if self.capture and not last:
                self.capture.append([])
            try:
                status = self.run(cmd)
            finally:
                if self.capture and not last:
                    self.capture.pop()
        if node.negate:
            return None if status is None else int(status == 0)
        return status

    def arith_command(self, expr: str) -> int:
        """(( ... )): also the assignments i++, ++i, i--, i+=n, i=n (comma-separated)."""
        result = 0
        for piece in expr.split(","):
            piece = piece.strip()
            m = re.fullmatch(r"([A-Za-z_]\w*)\s*(\+\+|--)|(\+\+|--)\s*([A-Za-z_]\w*)", piece)
            if m:
                name = m.group(1) or m.group(4)
                old = self.arith(name)
                new = old + (1 if "+" in (m.group(2) or m.group(3)) else -1)
                self.set_scalar(name, str(new))
                result = old if m.group(1) else new
                continue
            m = re.fullmatch(r"([A-Za-z_]\w*)\s*([-+*/%]?)=(?!=)\s*(.+)", piece)
            if m:
                name, op, rhs = m.groups()
                value = self.arith(f"{name} {op} ({rhs})" if op else rhs)
                self.set_scalar(name, str(value))
                result = value
                continue
            result = self.arith(piece)
        return result

    def condition_status(self, fn: Callable[[], bool]) -> int | None:
        """Run a test in test mode: 0/1, or None when it cannot be decided."""
        saved = self.test_mode
        self.test_mode = True
        try:
            return 0 if fn() else 1
        except _Unknown as exc:
            self.last_unknown = exc.reason
            return None
        finally:
            self.test_mode = saved

    def and_or(self, node: AndOr) -> int | None:
        status = self._no_errexit(lambda: self.run(node.first))
        tail = False
        for k, (op, rhs) in enumerate(node.rest):
            if status is None:
                if self.capture:
                    raise _CannotCapture()
                # cannot tell: the guarded command is skipped (`[ -f x ] || exit 1`, `[ -d d ] && X=...`)
                self._record_guard(node, op, rhs)
                status = 0 if op == "||" else 1
                continue
            if (op == "&&" and status == 0) or (op == "||" and status != 0):
                tail = k == len(node.rest) - 1
                status = self.run(rhs) if tail else self._no_errexit(lambda r=rhs: self.run(r))
        self._andor_tail = tail
        return status

    def _record_guard(self, node: AndOr, op: str, rhs) -> None:
        flags = self._flags_in([rhs])
        if flags:
            self._decision(node.line, node.src, f"skipping the command after {op}", self._unknown_reason(),
                           flags_skipped=flags)

    def _unknown_reason(self) -> str:
        return getattr(self, "last_unknown", "cannot be decided from the script")

    def _decision(self, line: int, src: int, reading: str, reason: str, *, flags_skipped: list[str] | None = None,
                  flags_taken: list[str] | None = None) -> None:
        """Record how a condition that holds flags was read, with the file and line it is in."""
        path = self._file_of(src)
        self.decisions.append(BranchDecision(
            line, self._src_text(line, src), reading, reason, flags_skipped=flags_skipped or [],
            flags_taken=flags_taken or [], path=path if path != self.path else None))

    def _file_of(self, src: int) -> str | None:
        """The file the text `src` belongs to (a string run by eval or bash -c belongs to the file it is in)."""
        return self.sources[src][0] if src < len(self.sources) else self.path

    def _src_text(self, line: int, src: int) -> str:
        """The text of a line of the file it is in (a string run by eval or bash -c counts its lines in its file)."""
        path = self._file_of(src)
        text = next((t for p, t in self.sources if p == path), self.text)
        lines = text.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else "?"

    def _flags_in(self, nodes: Iterable) -> list[str]:
        """The --flags written in a block's source (for reports)."""
        words: list[str] = []

        def visit(n) -> None:
            if isinstance(n, list):
                for x in n:
                    visit(x)
            elif isinstance(n, Simple):
                for w in [*n.assigns, *n.words]:
                    words.append(w.raw)
            elif isinstance(n, (If,)):
                for c, b in n.arms:
                    visit(c)
                    visit(b)
                if n.orelse:
                    visit(n.orelse)
            elif isinstance(n, Loop):
                visit(n.body)
            elif isinstance(n, Case):
                for _, b in n.arms:
                    visit(b)
            elif isinstance(n, (Group, Func)):
                visit(n.body)
            elif isinstance(n, AndOr):
                visit(n.first)
                for _, r in n.rest:
                    visit(r)
            elif isinstance(n, Pipe):
                visit(n.cmds)

        visit(list(nodes))
        found: list[str] = []
        for w in words:
            for m in _FLAG_TEXT.finditer(w):
                if m.group(1) not in found:
                    found.append(m.group(1))
        return found

    def _cond_status(self, cond: list) -> tuple[int | None, set[str]]:
        self.assumed = set()
        self.last_unknown = "cannot be decided from the script"
        status = self._no_errexit(lambda: self.run_list(cond))
        if status is None and self.capture:
            raise _CannotCapture()
        return status, set(self.assumed)

    def run_if(self, node: If) -> int | None:
        for k, (cond, body) in enumerate(node.arms):
            status, assumed = self._cond_status(cond)
            others = [b for j, (_, b) in enumerate(node.arms) if j != k] + ([node.orelse] if node.orelse else [])
            cond_line = getattr(cond[0], "line", node.line) if cond else node.line
            if status is None:
                skipped = self._flags_in([body])
                if skipped or self._flags_in(others):
                    self._decision(cond_line, node.src, "false: its branch was skipped", self._unknown_reason(),
                                   flags_skipped=skipped)
                continue
            if assumed and (self._flags_in([body]) or self._flags_in(others)):
                names = ", ".join(sorted(assumed))
                taken = status == 0
                reading = "true: its branch was taken" if taken else "false: its branch was skipped"
                self._decision(cond_line, node.src, reading,
                               f"depends on {names}, which the script does not set (read as unset)",
                               flags_skipped=[] if taken else self._flags_in([body]),
                               flags_taken=self._flags_in([body]) if taken else [])
            if status == 0:
                return self.run_list(body)
        if node.orelse is not None:
            return self.run_list(node.orelse)
        return 0

    def loop(self, node: Loop) -> int | None:
        status: int | None = 0
        if node.kind == "for" or node.kind == "cfor":
            if node.kind == "cfor":
                init, cond, stepx = node.arith  # type: ignore[misc]
                try:
                    if init.strip():
                        self.arith_command(init)
                except ValueError:
                    return None
                items = None
            else:
                items = []
                if node.items is None:
                    items = list(self.positional)
                else:
                    for w in node.items:
                        items.extend(self.expand_fields(w))
            k = 0
            while True:
                self.step(node.line, 0)
                if node.kind == "cfor":
                    try:
                        if cond.strip() and self.arith_command(cond) == 0:
                            break
                    except ValueError:
                        break
                else:
                    if k >= len(items):
                        break
                    self.set_scalar(node.var, items[k])  # type: ignore[arg-type]
                    k += 1
                status, stop = self._body(node.body)
                if stop:
                    break
                if node.kind == "cfor":
                    try:
                        if stepx.strip():
                            self.arith_command(stepx)
                    except ValueError:
                        break
            return status
        while True:
            self.step(node.line, 0)
            cond_status, assumed = self._cond_status(node.cond or [])
            if cond_status is None:
                if self._flags_in([node.body]):
                    self._decision(node.line, node.src, "false: the loop stopped", self._unknown_reason(),
                                   flags_skipped=self._flags_in([node.body]))
                break
            if (cond_status == 0) != (node.kind == "while"):
                break
            status, stop = self._body(node.body)
            if stop:
                break
        return status

    def _body(self, body: list) -> tuple[int | None, bool]:
        """Run a loop body once: (its status, whether `break` ended the loop)."""
        try:
            return self.run_list(body), False
        except Break as b:
            if b.n > 1:
                raise Break(b.n - 1) from None
            return 0, True
        except Continue as c:
            if c.n > 1:
                raise Continue(c.n - 1) from None
            return 0, False

    def case(self, node: Case) -> int | None:
        self.step(node.line, 0)
        saved = self.test_mode
        self.test_mode = True  # an unset variable is empty here, as in bash
        try:
            value, ok = self.expand_text(node.word), True
            value = value[0]
        except _Unknown:
            value, ok = "", False
        finally:
            self.test_mode = saved
        for patterns, body in node.arms:
            for p in patterns:
                pat, _ = self.expand_text(p)
                if not ok:
                    if pat == "*":
                        return self.run_list(body)
                    continue
                if fnmatch.fnmatchcase(value, pat):
                    return self.run_list(body)
        if not ok:
            flags = self._flags_in([b for _, b in node.arms])
            if flags:
                self._decision(node.line, node.src, "no pattern matched", f"the word {node.word.raw} is not known",
                               flags_skipped=flags)
        return 0

    # -- simple commands ------------------------------------------------------------------------
    def simple(self, node: Simple) -> int | None:
        self.step(node.line, node.src)
        self.cur = (node.line, node.src)
        if node.src == 0:
            self.site = node
            self.site_depth = len(self.via)
        if not node.words:
            for tok in node.assigns:
                self.assign(tok)
            return 0
        head = node.words[0]
        if isinstance(head, Word) and head.raw in _DECLARE_WORDS:
            return self.declare(head.raw, node.words[1:])
        if isinstance(head, Word) and head.raw in ("[", "test"):
            return self.condition_status(lambda: self.test_words(head.raw, node.words[1:]))
        fields: list[str] = []
        for tok in node.words:
            if isinstance(tok, ArrayAssign):
                fields.append(tok.raw)
            else:
                fields.extend(self.expand_fields(tok))
        if not fields:
            for tok in node.assigns:
                self.assign(tok)
            return 0
        prefix_env: dict[str, str] = {}
        if node.assigns:
            saved = dict(self.vars)
            for tok in node.assigns:
                name = self.assign(tok)
                prefix_env[name] = self.scalar(name)[0] or ""
            self.vars = saved
        return self.command(fields, node, prefix_env)

    def declare(self, word: str, rest: list) -> int:
        """export / declare / local / typeset / readonly; `-i` makes later assignments arithmetic."""
        exporting = word == "export"
        integer = False
        for tok in rest:
            if isinstance(tok, Word) and tok.raw.startswith(("-", "+")) and not ASSIGN_RE.match(tok.raw):
                exporting = exporting or "x" in tok.raw
                integer = integer or (tok.raw.startswith("-") and "i" in tok.raw)
                continue
            m = None if isinstance(tok, ArrayAssign) else ASSIGN_RE.match(tok.raw)
            if isinstance(tok, ArrayAssign) or m is not None:
                name = tok.name if isinstance(tok, ArrayAssign) else m.group(1)
            elif NAME_RE.fullmatch(tok.raw):
                name = tok.raw
            else:
                continue
            if integer:
                self.integers.add(name)
            if isinstance(tok, ArrayAssign) or m is not None:
                self.assign(tok)
            if exporting and name not in self.exported:
                self.exported.append(name)
        return 0

    def command(self, fields: list[str], node: Simple, prefix_env: dict[str, str]) -> int | None:
        name = fields[0]
        base = name.rsplit("/", 1)[-1]
        split = launch_split(fields)
        if split is not None and (split[0] == 0 or base in _WRAPPERS):
            start, after, entry = split
            if _TRAIN_ENTRY.search(fields[entry].rsplit("/", 1)[-1]) or after > start + 1 or fields[start].endswith("torchrun"):
                return self._at_launch(fields, split, node, prefix_env)
            self.skipped_launches.append(f"{self.where(node.line, node.src)}: {fields[entry]}")
        if name in self.functions:
            return self.call(name, fields[1:], node)
        if base in _REMOTE_SHELLS and any(_TRAIN_ENTRY.search(f) for f in fields[1:]):
            self.remote_launches.append(f"{self.where(node.line, node.src)}: {base}")
        if base in _OTHER_SCHEDULERS and self._submits_training(fields[1:], node):
            self.other_jobs.append(f"{self.where(node.line, node.src)}: {base}")
        if base == "sbatch" or (base in ("bash", "sh") and all(f.startswith("-") and f != "-c" for f in fields[1:])
                                and any(r.heredoc for r in node.redirects)):
            return self.job_script(fields, node)
        if base in ("bash", "sh") or (base in _WRAPPERS and ("bash" in fields or "sh" in fields)):
            return self.child_shell(fields, node, prefix_env)
        handler = _BUILTINS.get(name)
        if handler is not None:
            return handler(self, fields, node, prefix_env)
        if name in _ALWAYS_OK:
            if self.capture and name not in _SILENT:
                raise _CannotCapture()
            return 0
        if self.capture:
            raise _CannotCapture()
        entry = next((f for f in fields[1:] if f.endswith(".py") and _TRAIN_ENTRY.search(f.rsplit("/", 1)[-1])), None)
        if entry is not None:  # `deepspeed pretrain_gpt.py`, `ray job submit -- python3 train.py`, `accelerate launch`
            self.foreign_launches.append(f"{self.where(node.line, node.src)}: `{base}` starts {entry.rsplit('/', 1)[-1]}")
        self.last_unknown = f"depends on the exit status of `{name}`"
        return None

    def _at_launch(self, fields: list[str], split: tuple[int, int, int], node: Simple,
                   prefix_env: dict[str, str]) -> int:
        """The statement starts training: every launch is recorded in `launches`; at the first, the reader's
        state is kept in `at_launch` and the reading goes on for `steps_after_launch` statements more (bash
        runs on past a launch), looking for the script's other launches."""
        if self.capture:
            raise _CannotCapture()
        if self.at_launch is None:
            self.found = self._found(fields, split, node, prefix_env)
            self.at_launch = self._state_copy()
            self.max_steps = min(self.max_steps, self.steps + self.steps_after_launch)
        self.launches.append((self.where(node.line, node.src), fields[split[2]]))
        return 0

    def _state_copy(self) -> "Interp":
        """This reader as it stands: its lists, dicts and sets copied, and the arrays of its variables (which
        `+=` extends in place), so that reading on does not change the copy."""
        state = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, (list, dict, set)):
                setattr(state, name, copy.copy(value))
        state.vars = {name: _Var(list(var.value), var.resolved) if isinstance(var.value, list) else var
                      for name, var in self.vars.items()}
        return state

    def child_shell(self, fields: list[str], node: Simple, prefix_env: dict[str, str] | None = None) -> int | None:
        """`bash -c STRING` (also behind srun/mpirun, whose environment is kept in `outer_env`: what srun's --export
        filters, planner/inputs/srun_export.py) and `bash FILE ARGS`."""
        idx = next((i for i, f in enumerate(fields) if f.rsplit("/", 1)[-1] in ("bash", "sh")), None)
        if idx is not None and "-c" in fields[idx + 1 : idx + 3]:
            c = fields.index("-c", idx)
            if c + 1 < len(fields):
                saved_outer, saved_env = self.outer_wrapper, self.outer_env
                self.outer_wrapper = saved_outer + fields[:idx]
                if saved_env is None and idx > 0:
                    self.outer_env = self.environment() | (prefix_env or {})
                try:
                    return self.run_string(fields[c + 1], node, "string", args=fields[c + 2 :])
                finally:
                    self.outer_wrapper, self.outer_env = saved_outer, saved_env
        if idx is not None and idx + 1 < len(fields) and not fields[idx + 1].startswith("-"):
            return self.source(fields[idx + 1], fields[idx + 2 :], node, child=True)
        return None

    def environment(self) -> dict[str, str]:
        """The variables the script exports, as they stand: the environment of a command it runs."""
        return {name: v.value for name in self.exported if (v := self.vars.get(name)) is not None
                and isinstance(v.value, str)}

    def stdin_text(self, node: Simple) -> str | None:
        """The text a here-document or here-string feeds the command (expanded as bash does)."""
        for r in node.redirects:
            if r.heredoc is not None:
                return r.heredoc.text if r.heredoc.word is None else self.expand_text(r.heredoc.word)[0]
            if r.op == "<<<" and r.target is not None:
                return self.expand_text(r.target)[0] + "\n"
        return None

    def job_script(self, fields: list[str], node: Simple) -> int | None:
        """`sbatch [options] <<EOF ... EOF`, `sbatch [options] FILE [args]`, `bash <<EOF`: the job
        script runs in a shell of its own, with the SLURM_* variables its #SBATCH lines (and sbatch's
        options) give."""
        sbatch = fields[0].rsplit("/", 1)[-1] == "sbatch"
        text = self.stdin_text(node)
        words = fields[1:]
        try:
            k = options_end(words, "sbatch") if sbatch else 0
        except SlurmOptionError as exc:  # an ambiguous prefix of an option: sbatch refuses the job
            raise PlannerInputError(self.where(node.line, node.src), str(exc)) from None
        options = words[:k] if sbatch else []
        if any(w == "--wrap" or w.startswith("--wrap=") for w in options):
            self.sbatch_wraps.append(self.where(node.line, node.src))
        # a job's shell has its job's id (a script that submits itself, `[ -z "$SLURM_JOB_ID" ] && sbatch "$0"`,
        # runs its training part there); a job of the script itself (`sbatch "$0"`) is no other job: launch.sh's own
        # functions are defined in it
        other = sbatch and not (text is None and k < len(words) and self._is_this_script(words[k]))
        self.sbatch_depth += other
        try:
            if text is None:
                if sbatch and k < len(words):
                    return self.source(words[k], words[k + 1 :], node, child=True, sbatch=options)
                return None
            return self.run_string(text, node, "heredoc", args=[], sbatch=options if sbatch else None,
                                   line=next((r.heredoc.line for r in node.redirects if r.heredoc), node.line))
        finally:
            self.sbatch_depth -= other

    def _submits_training(self, words: list[str], node: Simple) -> bool:
        """A qsub/bsub submission whose job (here-document, or a file among its words) runs a training entry."""
        text = self.stdin_text(node) or ""
        for w in words:
            path = Path(self.script_dir) / w if self.script_dir and not Path(w).is_absolute() else Path(w)
            try:
                if path.is_file() and 0 < path.stat().st_size < 1 << 20:  # /proc files say 0
                    text += "\n" + path.read_text(errors="replace")
            except (OSError, ValueError):
                continue
        return bool(_TRAIN_ENTRY.search(text))

    def _is_this_script(self, target: str) -> bool:
        """`target` (a path sbatch submits; read as `source` reads one) is the script being read."""
        if self.path is None:
            return False
        candidates = [Path(target)] + ([Path(self.script_dir) / target] if self.script_dir else [])
        try:
            return any(c.resolve() == Path(self.path).resolve() for c in candidates)
        except (OSError, ValueError):
            return False

    def getopts(self, words: list[str]) -> int:
        """`getopts OPTSTRING NAME [ARG...]`, one option per word (`-n 4`, `-n4`), with OPTIND."""
        if len(words) < 2:
            return 2
        spec, var, args = words[0], words[1], words[2:] or list(self.positional)
        index = int(self.scalar("OPTIND")[0] or "1") if (self.scalar("OPTIND")[0] or "1").isdigit() else 1
        if index > len(args) or not args[index - 1].startswith("-") or args[index - 1] in ("-", "--"):
            if index <= len(args) and args[index - 1] == "--":
                self.set_scalar("OPTIND", str(index + 1))
            self.set_scalar(var, "?")
            return 1
        word = args[index - 1]
        opt = word[1]
        at = spec.find(opt)
        if at < 0 or opt == ":":
            self.set_scalar(var, "?")
            self.set_scalar("OPTIND", str(index + 1))
            return 0
        self.set_scalar(var, opt)
        if spec[at + 1 : at + 2] == ":":
            if len(word) > 2:
                self.set_scalar("OPTARG", word[2:])
                index += 1
            elif index < len(args):
                self.set_scalar("OPTARG", args[index])
                index += 2
            else:
                self.set_scalar(var, "?")
                index += 1
        else:
            index += 1
        self.set_scalar("OPTIND", str(index))
        return 0

    def call(self, name: str, args: list[str], node: Simple) -> int | None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise PlannerInputError(self.where(node.line, node.src), f"function calls nested more than {MAX_DEPTH} deep")
        saved = self.positional
        self.positional = list(args)
        try:
            return self.run_list(self.functions[name])
        except Return as r:
            return r.status
        finally:
            self.positional = saved
            self.depth -= 1

    def run_string(self, text: str, node: Simple, via: str, args: list[str] | None = None,
                   sbatch: list[str] | None = None, line: int | None = None) -> int | None:
        """eval / bash -c / a here-document job script: parse and run a string in the current shell
        (bash -c and job scripts: in a copy of it)."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise PlannerInputError(self.where(node.line, node.src), f"eval / bash -c nested more than {MAX_DEPTH} deep")
        src = len(self.sources)
        path = self.sources[node.src][0] if node.src < len(self.sources) else self.path
        self.sources.append((path, text))
        stray: list[int] = []
        try:
            body = parse(text, path, src, line_offset=(line or node.line) - 1, stray=stray)
        except PlannerInputError as exc:
            self.depth -= 1
            raise PlannerInputError(exc.field, f"in the string given to {via}: {str(exc).split(': ', 1)[-1]}") from None
        self.stray_lines += [(src, k) for k in stray]
        child = via in ("string", "heredoc")
        saved = (dict(self.vars), list(self.positional)) if child else None
        if child and args is not None:
            self.positional = list(args[1:]) if args else []
        if sbatch is not None:
            self._job_geometry(sbatch_values(text, sbatch, path=path, first_line=line or node.line) + [_JOB_ID])
        self.via.append(via)
        try:
            return self.run_list(body)
        except ScriptExit as exc:
            if child:
                return exc.status
            raise
        finally:
            self.via.pop()
            self.depth -= 1
            if saved is not None:
                self.vars, self.positional = saved

    def _job_geometry(self, values: list[SchedulerValue]) -> None:
        """A job script's SLURM_* variables (set in its shell)."""
        for value in values:
            self.scheduler[value.name] = value
            self.vars[value.name] = _Var(value.value)

    def source(self, target: str, args: list[str], node: Simple, child: bool = False,
               sbatch: list[str] | None = None) -> int | None:
        """source FILE (relative to the script's directory, then the current one); `child`: run as
        `bash FILE` (a shell of its own), `sbatch`: as the job script of `sbatch [options] FILE`."""
        candidates = [Path(target)]
        if self.script_dir and not Path(target).is_absolute():
            candidates.insert(0, Path(self.script_dir) / target)
        cwd = _CWD_PREFIX.match(target)
        if cwd and self.script_dir:  # the directory it runs in: the script's own, where such a script is run from
            candidates.insert(0, Path(self.script_dir) / target[cwd.end():])
        path = next((p for p in candidates if p.is_file()), None)
        if path is not None and cwd and not child:
            self.warnings.append(f"{self.where(node.line, node.src)}: `source {target}`: {cwd.group(1)} read as the "
                                 f"script's directory, {path} read (run the script from there)")
        if path is None:
            if not child:
                where = self.where(node.line, node.src)
                self.missing_sources.append((where, target))
                self.warnings.append(f"{where}: `source {target}`: file not found here; skipped (the variables it "
                                     "sets are unset here)")
            return None
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise PlannerInputError(self.where(node.line, node.src), f"source nested more than {MAX_DEPTH} deep")
        try:
            text = _read_sourced(path)
            src = len(self.sources)
            self.sources.append((str(path), text))
            self.sourced.append(path)
            self.assigned |= set(_ASSIGNED_NAME.findall(text))  # a name the file sets is its own, not the environment's
            stray: list[int] = []
            body = parse(text, str(path), src, stray=stray)
            self.stray_lines += [(src, k) for k in stray]
            return self._run_sourced(body, args, child,
                                     sbatch_values(text, sbatch, path=str(path)) + [_JOB_ID] if sbatch is not None else None)
        finally:
            self.depth -= 1

    def _run_sourced(self, body: list, args: list[str], child: bool, geometry: list[SchedulerValue] | None) -> int | None:
        saved_pos = self.positional
        saved_vars = dict(self.vars) if child else None
        if args or child:
            self.positional = list(args)
        if geometry is not None:
            self._job_geometry(geometry)
        self.via.append("source")
        try:
            return self.run_list(body)
        except Return as r:
            return r.status
        except ScriptExit as exc:
            if child:
                return exc.status
            raise
        finally:
            self.via.pop()
            self.positional = saved_pos
            if saved_vars is not None:
                self.vars = saved_vars

    # -- tests ----------------------------------------------------------------------------------
    def test_words(self, name: str, words: list[Word]) -> bool:
        """`[ ... ]` / `test ...`: words expanded as bash does (unset variables are empty)."""
        args = [f for w in words for f in self.expand_fields(w)]
        if name == "[":
            if not args or args[-1] != "]":
                raise _Unknown("`[` without a closing `]`")
            args = args[:-1]
        return _TestEval(args, self, double=False).run()

    def cond_words(self, items: list) -> bool:
        """`[[ ... ]]`: expanded without word splitting; && || ( ) ! inside."""
        args: list[str] = []
        for tok in items:
            if isinstance(tok, Op):
                args.append(tok.text)
            else:
                text, _ = self.expand_text(tok)
                if tok.raw in ("!", "(", ")", "&&", "||") and all(p.kind == "lit" and not p.quoted for p in tok.parts):
                    args.append(tok.raw)
                else:
                    args.append(_Quoted(text) if any(p.quoted for p in tok.parts) else text)
        return _TestEval(args, self, double=True).run()

    def _found(self, fields: list[str], split: tuple[int, int, int], node: Simple, prefix_env: dict[str, str]) -> Found:
        start, after, entry = split
        site = None
        if self.site is not None:
            site_node = self.site
            via = self.via[self.site_depth] if len(self.via) > self.site_depth else "direct"
            if via == "direct" and site_node is not node:
                via = "function"  # e.g. a function from a sourced file: the launcher is reached inside it
            words = site_node.words
            w = words[0] if words else None
            if w is not None:
                site = LaunchSite(line=site_node.line, offset=w.pos, word=w.raw, via=via,
                                  nested=len(self.via) > self.site_depth + 1)
        job = {name: value for name, value in self.scheduler.items() if value.stated}
        return Found(fields, self.outer_wrapper + fields[:start], fields[start:after], fields[after:entry], fields[entry],
                      fields[entry + 1 :], prefix_env, site, node.line, job, node.src, self.outer_env,
                      self.sbatch_depth > 0)


def _read_sourced(path: Path) -> str:
    return read_text(path, str(path), max_bytes=MAX_SCRIPT_BYTES)


class _Quoted(str):
    """A [[ ]] operand that was quoted: matched literally, not as a pattern."""


_UNARY_FILE = {"-e", "-f", "-d", "-r", "-w", "-x", "-s", "-L", "-h", "-p", "-S", "-b", "-c", "-g", "-u", "-k", "-O", "-G", "-N"}
_BINARY = {"=", "==", "!=", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "=~", "<", ">", "-nt", "-ot", "-ef"}


class _TestEval:
    """test / [ ] / [[ ]] expressions; raises _Unknown when a part cannot be decided."""

    def __init__(self, args: list[str], interp: Interp, double: bool):
        self.args = args
        self.i = 0
        self.interp = interp
        self.double = double
        self.depth = 0

    def run(self) -> bool:
        if not self.args:
            return False
        value = self.expr_or()
        if self.i < len(self.args):
            raise _Unknown(f"cannot read the test near `{self.args[self.i]}`")
        return value

    def peek(self) -> str | None:
        return self.args[self.i] if self.i < len(self.args) else None

    def expr_or(self) -> bool:
        left = self.expr_and()
        while self.peek() in (("||",) if self.double else ("-o",)):
            self.i += 1
            right_unknown = None
            try:
                right = self.expr_and()
            except _Unknown as exc:
                right, right_unknown = None, exc
            if left:
                continue
            if right_unknown is not None:
                raise right_unknown
            left = bool(right)
        return left

    def expr_and(self) -> bool:
        left = self.expr_not()
        while self.peek() in (("&&",) if self.double else ("-a",)):
            self.i += 1
            try:
                right = self.expr_not()
            except _Unknown:
                if not left:
                    continue
                raise
            left = left and right
        return left

    def expr_not(self) -> bool:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise PlannerInputError(self.interp.where(*self.interp.cur), f"a test nested more than {MAX_DEPTH} deep")
            if self.peek() == "!" and self.i + 1 < len(self.args):
                self.i += 1
                return not self.expr_not()
            return self.primary()
        finally:
            self.depth -= 1

    def primary(self) -> bool:
        tok = self.peek()
        if tok is None:
            raise _Unknown("an incomplete test")
        if tok == "(" and not isinstance(tok, _Quoted):
            self.i += 1
            value = self.expr_or()
            if self.peek() != ")":
                raise _Unknown("unbalanced ( in a test")
            self.i += 1
            return value
        nxt = self.args[self.i + 1] if self.i + 1 < len(self.args) else None
        if nxt in _BINARY and not isinstance(nxt, _Quoted) and self.i + 2 < len(self.args):
            a, b = tok, self.args[self.i + 2]
            self.i += 3
            return self.binary(a, nxt, b)
        if tok in ("-z", "-n") and nxt is not None:
            self.i += 2
            return (nxt == "") if tok == "-z" else (nxt != "")
        if tok in _UNARY_FILE and nxt is not None:
            self.i += 2
            raise _Unknown(f"tests a file on the machine that runs the script ({tok} {nxt})")
        if tok == "-v" and nxt is not None:
            self.i += 2
            if nxt in CLUSTER_GEOMETRY_VARS:
                self.interp.geometry_lookups.add(nxt)
            return nxt in self.interp.vars
        self.i += 1
        return tok != ""

    def binary(self, a: str, op: str, b: str) -> bool:
        if op in ("=", "=="):
            if self.double and not isinstance(b, _Quoted):
                return fnmatch.fnmatchcase(a, b)
            return a == b
        if op == "!=":
            if self.double and not isinstance(b, _Quoted):
                return not fnmatch.fnmatchcase(a, b)
            return a != b
        if op == "=~":
            try:
                return re.search(b, a) is not None
            except re.error:
                raise _Unknown(f"cannot read the regular expression {b!r}") from None
        if op in ("<", ">"):
            return a < b if op == "<" else a > b
        if op in ("-nt", "-ot", "-ef"):
            raise _Unknown("compares files on the machine that runs the script")
        try:
            x, y = (self.interp.arith(a) if self.double else int(a.strip())), (self.interp.arith(b) if self.double else int(b.strip()))
        except ValueError:
            raise _Unknown(f"compares {a!r} and {b!r} as integers") from None
        return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]


# --------------------------------------------------------------------------------------------
# Builtins: (interpreter, fields, the statement, its VAR=value prefix) -> exit status (None: unknown)
# --------------------------------------------------------------------------------------------
Builtin = Callable[[Interp, list[str], Simple, dict[str, str]], "int | None"]


def _b_eval(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int | None:
    return it.run_string(" ".join(f[1:]), node, "eval")


def _b_source(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int | None:
    return it.source(f[1], f[2:], node) if len(f) > 1 else 1


def _b_shift(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int:
    try:
        n = int(f[1]) if len(f) > 1 else 1
    except ValueError:
        return 1
    if n > len(it.positional):
        return 1
    it.positional = it.positional[n:]
    return 0


def _b_set(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int:
    """set -e / +e / -o errexit (bash stops at a failing command), set -- ARGS."""
    words = f[1:]
    for k, w in enumerate(words):
        if w == "--":
            it.positional = words[k + 1 :]
            break
        if w in ("-o", "+o") and k + 1 < len(words) and words[k + 1] == "errexit":
            it.errexit = w == "-o"
        elif re.fullmatch(r"[-+][a-zA-Z]+", w) and "e" in w:
            it.errexit = w[0] == "-"
    return 0


def _b_unset(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int:
    for name in f[1:]:
        if not name.startswith("-"):
            it.vars.pop(name, None)
            it.integers.discard(name)
    return 0


def _b_exit(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int:
    status = int(f[1]) if len(f) > 1 and f[1].lstrip("-").isdigit() else 0
    if f[0] == "return" and it.depth > 0:
        raise Return(status)
    raise ScriptExit(status, node.line, node.src)


def _b_break(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int:
    n = int(f[1]) if len(f) > 1 and f[1].isdigit() else 1
    raise (Break(n) if f[0] == "break" else Continue(n))


def _b_status(status: int) -> Builtin:
    return lambda it, f, node, env: status


def _b_getopts(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int:
    return it.getopts(f[1:])


def _b_echo(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int:
    it.output(echo_text(f[1:]), node)
    return 0


def _b_printf(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int | None:
    """printf FORMAT ARGS, printf -v VAR FORMAT ARGS."""
    args = f[1:]
    target = None
    if args[:1] == ["-v"] and len(args) >= 2:
        target, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        return 2
    try:
        text = printf_text(args[0], args[1:])
    except ValueError:
        if it.capture:
            raise _CannotCapture() from None
        return 1
    if target is None:
        it.output(text, node)
    elif NAME_RE.fullmatch(target):
        it.set_scalar(target, text)
    return 0


def _b_let(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int | None:
    value = 0
    for expr in f[1:]:
        try:
            value = it.arith_command(expr)
        except ValueError:
            return None
    return 0 if value != 0 else 1


def _b_read(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int | None:
    """read [-r] [-a ARRAY] [-d DELIM] NAME... from a here-string or here-document."""
    text = it.stdin_text(node)
    if text is None:
        if it.capture:
            raise _CannotCapture()
        return None
    args, names, array, delim = f[1:], [], None, "\n"
    k = 0
    while k < len(args):
        a = args[k]
        if a in ("-a", "-d", "-p", "-t", "-n", "-N", "-u") and k + 1 < len(args):
            array = args[k + 1] if a == "-a" else array
            delim = (args[k + 1][:1] or "\0") if a == "-d" else delim
            k += 2
            continue
        if not a.startswith("-"):
            names.append(a)
        k += 1
    line = text.split(delim, 1)[0] if delim in text else text
    ifs = env.get("IFS", it.ifs())
    if array is not None:
        it.vars[array] = _Var(ifs_split(line, ifs)[0])
        return 0 if delim in text else 1
    for name, value in zip(names or ["REPLY"], read_fields(line, len(names or ["REPLY"]), ifs)):
        it.set_scalar(name, value)
    return 0 if delim in text else 1


def _pure(fn: Callable[[list[str]], "str | list[str]"]) -> Builtin:
    """A utility that only computes text from its arguments (expr, seq, basename, dirname)."""
    def run(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int | None:
        try:
            out = fn(f[1:])
        except ValueError:
            if it.capture:
                raise _CannotCapture() from None
            return None
        it.output(("\n".join(out) if isinstance(out, list) else out) + "\n", node)
        return 0
    return run


def _b_getopt(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int | None:
    """util-linux getopt: the parameters it parsed, printed; status 1 when one did not parse (getopt_text)."""
    try:
        text, ok = getopt_text(f[1:])
    except ValueError:
        if it.capture:
            raise _CannotCapture() from None
        return None
    it.output(text + "\n", node)
    return 0 if ok else 1


def _b_cat(it: Interp, f: list[str], node: Simple, env: dict[str, str]) -> int | None:
    """`cat` of a here-document (as in VAR=$(cat <<EOF ...)); of files: unknown."""
    text = it.stdin_text(node) if len(f) == 1 else None
    if text is None:
        if it.capture:
            raise _CannotCapture()
        return 0
    it.output(text, node)
    return 0


_BUILTINS: dict[str, Builtin] = {
    "eval": _b_eval, "source": _b_source, ".": _b_source, "shift": _b_shift, "set": _b_set, "unset": _b_unset,
    "exit": _b_exit, "return": _b_exit, "break": _b_break, "continue": _b_break, "true": _b_status(0),
    ":": _b_status(0), "false": _b_status(1), "getopts": _b_getopts, "echo": _b_echo, "printf": _b_printf,
    "let": _b_let, "read": _b_read, "expr": _pure(expr_value), "seq": _pure(seq_words),
    "basename": _pure(basename_of), "dirname": _pure(dirname_of), "cat": _b_cat, "getopt": _b_getopt,
}


# --------------------------------------------------------------------------------------------
# Launch detection
# --------------------------------------------------------------------------------------------
def launch_split(fields: list[str]) -> tuple[int, int, int] | None:
    """(launcher start, launcher end, entry index) when the fields run a Python entry script."""
    for i, f in enumerate(fields):
        base = f.rsplit("/", 1)[-1]
        if base == "torchrun":
            start, after = i, i + 1
        elif re.fullmatch(r"python[0-9.]*", base):
            start = i
            if fields[i + 1 : i + 2] == ["-m"] and i + 2 < len(fields):
                if fields[i + 2] not in _TORCH_LAUNCH_MODULES:
                    return None
                after = i + 3
            else:
                after = i + 1
                while after < len(fields) and fields[after] in ("-u", "-O", "-B", "-W", "-X"):
                    after += 1
        else:
            continue
        for j in range(after, len(fields)):
            if fields[j].endswith(".py") and not fields[j].startswith("-"):
                return start, after, j
        return None
    return None
