"""Read a bash launcher script the way bash would run it, without running anything.

`parse_launcher_script(text, args=..., path=...)` evaluates the script in a small interpreter for
the subset of bash that training launchers use, until the statement that starts training (a
`torchrun ... pretrain_gpt.py <flags>`, `python -m torch.distributed.run|launch ...`,
`python <train>.py ...`, possibly behind `srun`/`mpirun`, inside `bash -c "..."`, or run by
`eval "$cmd"`), and returns the flags given to the entry script.

What it evaluates:
  * variables, `${X:-default}` and the other `${...}` forms, `$((...))`, quoting, word splitting,
    arrays (`A=(...)`, `A+=(...)`, `"${A[@]}"`, `${#A[@]}`), `export`/`declare`/`local`/`unset`;
  * the script's own arguments (`$1`, `"$@"`, `$#`, `shift`, `set --`), given by the caller;
  * `if`/`elif`/`else`, `case`, `for`, `while`/`until` (also `while [[ $# -gt 0 ]]; do case $1 in
    ...; esac; shift; done` and `while getopts ...` option loops), `&&`/`||`, `[ ]`, `[[ ]]`,
    `test`, `(( ))`, functions;
  * `source FILE` / `. FILE` (read relative to the script), `eval`, and `bash -c STRING`.

What it cannot know (a command's output `$(...)`, an environment variable the script never sets,
whether a file exists on the cluster) is handled so the result is predictable:
  * in a flag value it stays literal text (`${DATA_PATH}`, `$(date)`), listed in `unresolved`;
  * in a condition, an unset variable reads as unset (empty), and a test that cannot be decided
    (a file test, an external command) reads as false; the branch it guards is skipped.
  Every such reading of a branch that holds flags is recorded in `decisions` and reported in
  `warnings`: which line, which way it was read, and which flags the branch holds.

Limits (a hostile or broken script is refused with one line naming the file and line, never a
hang): expansions nested more than MAX_NESTING deep, unterminated quotes or brackets, arithmetic
with more than MAX_ARITH_CHARS characters (and 64-bit wrap-around, as bash), more than MAX_STEPS
evaluation steps (a loop that never ends), eval/source/function calls deeper than MAX_DEPTH.
Lexing and evaluation are linear in the script's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from planner.errors import PlannerInputError
from planner.inputs.shell.arith import MAX_ARITH_CHARS, eval_arith
from planner.inputs.shell.interp import (
    MAX_DEPTH, MAX_SCRIPT_BYTES, MAX_STEPS, BranchDecision, LaunchSite, Break, Continue, ScriptExit, Interp, Launched,
    Return,
)
from planner.inputs.shell.lexer import MAX_NESTING
from planner.inputs.shell.syntax import parse

FIELD = "--megatron-script"

__all__ = [
    "FIELD", "MAX_ARITH_CHARS", "MAX_DEPTH", "MAX_NESTING", "MAX_SCRIPT_BYTES", "MAX_STEPS", "BranchDecision",
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
    site: LaunchSite | None = None
    extra_flags: list[str] = field(default_factory=list)  # --megatron-args given on top of the script
    sourced: dict[str, str] = field(default_factory=dict)  # files it sources from its own directory: path -> text
    self_relative: bool = False  # it locates files from its own directory ($(dirname "$0"), BASH_SOURCE)
    decisions: list[BranchDecision] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @property
    def world_size(self) -> int | None:
        """GPUs the script asks for: torchrun's nnodes * nproc-per-node (defaults 1, 1), or srun's
        nodes * tasks per node, or mpirun's -np; 1 for a plain `python train.py`; None when a
        count is not a plain integer."""
        if self.wrapper and self.wrapper[0].rsplit("/", 1)[-1] in ("srun", "mpirun", "mpiexec") and not self._torch_launcher:
            return _wrapper_world(self.wrapper)
        if not self._torch_launcher:
            return 1
        values = _options(self.launcher_args, {"nproc-per-node", "nnodes"})
        nproc = values.get("nproc-per-node", "1")
        nnodes = values.get("nnodes", "1")
        if ":" in nnodes:  # elastic min:max
            nnodes = nnodes.split(":")[-1]
        if not (nproc.isdigit() and nnodes.isdigit()):
            return None
        return int(nproc) * int(nnodes)

    @property
    def _torch_launcher(self) -> bool:
        return bool(self.launcher) and (self.launcher[0].rsplit("/", 1)[-1] == "torchrun" or "-m" in self.launcher)


def _options(args: list[str], keys: set[str]) -> dict[str, str]:
    """{key: value} of long options given as `--k v` or `--k=v` (`_` and `-` alike)."""
    out: dict[str, str] = {}
    for i, tok in enumerate(args):
        name, eq, val = tok.partition("=")
        key = name.lstrip("-").replace("_", "-")
        if tok.startswith("-") and key in keys:
            out[key] = val if eq else (args[i + 1] if i + 1 < len(args) else "")
    return out


def _wrapper_world(words: list[str]) -> int | None:
    """World size from srun (-N/--nodes times --ntasks-per-node, or -n/--ntasks) or mpirun -np."""
    short: dict[str, str] = {}
    for i, tok in enumerate(words[:-1]):
        if tok in ("-N", "-n", "-np", "-c"):
            short[tok] = words[i + 1]
    longs = _options(words, {"nodes", "ntasks-per-node", "ntasks", "np"})
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
_PARSED: dict[tuple[str | None, str], Any] = {}  # (path, text) -> syntax tree; `solve` reads a script twice


def _parsed(text: str, path_text: str | None):
    """The script's syntax tree (the interpreter only reads it), kept for the last few scripts:
    `solve --megatron-script` evaluates the script for its inputs and again for the launcher, and
    lexing a large script is most of the reading time."""
    key = (path_text, text)
    body = _PARSED.get(key)
    if body is None:
        body = parse(text, path_text, 0)
        if len(_PARSED) >= 4:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = body
    return body


def parse_launcher_script(
    text: str, *, args: Iterable[str] | None = None, path: str | Path | None = None
) -> LauncherScript:
    """Evaluate a bash launcher script with the given arguments; see the module docstring.

    Raises PlannerInputError naming the script file and line for a syntax error, a hostile
    construct, or a script that exits before it launches; naming --megatron-script when no
    statement runs a Python entry script."""
    path_text = str(path) if path is not None else None
    given = list(args) if args is not None else []
    if len(text) > MAX_SCRIPT_BYTES:
        raise PlannerInputError(path_text or FIELD, f"larger than {MAX_SCRIPT_BYTES >> 20} MiB")
    try:
        body = _parsed(text, path_text)
    except RecursionError:  # a last guard; the nesting limits refuse such scripts first
        raise PlannerInputError(path_text or FIELD, f"nested more deeply than the reader follows ({MAX_NESTING})") from None
    interp = Interp(text, path_text, given)
    try:
        interp.run_list(body)
    except Launched:
        pass
    except ScriptExit as exc:
        if interp.found is None:
            where = interp.where(exc.line, exc.src)
            hint = "" if given else "; pass the script's own arguments after `--`"
            why = f" ({exc.message})" if exc.message else ""
            raise PlannerInputError(
                where, f"the script exits here (status {exc.status}){why} before it runs a launch command{hint}"
            ) from None
    except (Break, Continue, Return):
        pass
    except RecursionError:  # a last guard; the nesting limits above refuse such scripts first
        raise PlannerInputError(path_text or FIELD, f"nested more deeply than the reader follows ({MAX_NESTING})") from None
    found = interp.found
    if found is None:
        extra = f" (not a training entry: {', '.join(interp.skipped_launches)})" if interp.skipped_launches else ""
        raise PlannerInputError(
            FIELD,
            f"{path_text or 'the script'}: no command runs a Python training entry script (expected "
            "`torchrun [args] pretrain_gpt.py <flags>`, `python -m torch.distributed.run [args] <script>.py "
            f"<flags>` or `python <train>.py <flags>`, possibly behind srun/mpirun, eval or bash -c){extra}",
        )
    warnings = list(interp.warnings)
    for d in interp.decisions:
        warnings.append(d.message(path_text))
    if interp.unresolved:
        warnings.append(
            "kept as literal text (bash expands them when the launcher runs): " + ", ".join(interp.unresolved)
        )
    sourced: dict[str, str] = {}
    if interp.script_dir is not None:
        base = Path(interp.script_dir)
        for f in interp.sourced:
            try:
                rel = f.resolve().relative_to(base)
            except ValueError:
                continue  # outside the script's directory: it is the cluster's (e.g. set_env.sh)
            sourced[str(rel)] = f.read_text(encoding="utf-8")
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
        site=found.site,
        decisions=list(interp.decisions),
        unresolved=list(interp.unresolved),
        warnings=warnings,
    )


def read_launcher_script(path: str | Path, args: Iterable[str] | None = None) -> LauncherScript:
    """Read and evaluate a launcher script file; a missing or unreadable file names --megatron-script."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_SCRIPT_BYTES:
            raise PlannerInputError(FIELD, f"{p}: larger than {MAX_SCRIPT_BYTES >> 20} MiB")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlannerInputError(FIELD, f"file not found: {p}") from None
    except IsADirectoryError:
        raise PlannerInputError(FIELD, f"{p} is a directory, not a script") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerInputError(FIELD, f"cannot read {p}: {exc}") from None
    return parse_launcher_script(text, args=args, path=str(p))
