"""The one staged writer: every command that writes a directory (`solve --out`, `solve/estimate --plot`,
`emit --out`, `profile`/`calibrate --out`, `bench --out`) fills a staging directory on the same file
system (inside DIR when it exists, else beside it), then moves the files into place, so an error or a
signal never leaves half-written files behind; DIR may be a mount point or a link to another file system.

The user's files are sacred.  Each directory the planner writes holds a manifest
(planner/output/manifest.py) of the files it wrote, with their hashes.  The rules:

- DIR may be a new directory, an empty one, or one that holds an earlier output of the same command
  (its manifest says so).  Any other non-empty directory is refused unless `--force` is given.
- A directory inside an earlier output (the launch/ of `solve --out DIR`) is recorded in that output's
  manifest.  The launcher files `solve --out DIR` wrote into DIR/launch/ are an earlier output of
  `emit --out` (LAUNCHER_OUTPUT.earlier_from): `emit --out DIR/launch` replaces them without --force, and
  the manifest above says so (the next `emit` there, or `solve --out DIR` again, needs no --force either;
  solve again replaces what emit wrote there, the Slurm host files of `emit --hosts` included, as its own).
  A subdirectory of an output is no earlier output of the command that wrote it: `solve --out DIR/launch`
  is refused (naming `emit --out DIR/launch`), and with --force the new plan goes beside DIR's files.
  Writing into another command's output (--force) keeps that directory's family, so its own command
  still finds it.
- A file the planner did not write (absent from the manifest, or edited since) is never overwritten
  or deleted, with or without --force: a new file of the same path is refused, naming it.
- The command's own inputs (`inputs`: the launcher script and what it sources, the plan, the model,
  cluster and log files), whatever their path, are never a write target.
- Replacing an earlier output removes only the earlier output's own files (listed, unchanged, written
  by the same command, or solve's launcher files in launch/ for emit); other files in DIR are left alone.
- SIGINT, SIGTERM and SIGHUP are held back while files are moved into place, so the directory is
  either as it was or complete; the staging directory is always removed (the CLI then exits 130/143).

`check_out_dir` runs first in every command that writes (before the search, before torch is
imported); it also refuses an empty path, a path too long for the system, a path through a regular
file, an existing file, a dangling symbolic link and a place where nothing can be created.
`StagedOutput` gives the staging directory to fill; `write_files` writes {relative path: text or
bytes}; `fill` writes such a mapping into a directory that is already staged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from planner.errors import PlannerInputError
from planner.inputs.files import path_kind
from planner.signals import held as held_signals
from planner.output.manifest import (
    MANIFEST_NAME, STAGING_PREFIX, Survey, entry_for, entry_unchanged, manifest_text, read_manifest, survey,
)


@dataclass(frozen=True)
class OutputKind:
    """What a command writes.  `writer` names the command in the manifest (its earlier files are the
    ones a new output replaces); `family` says which directories it may write into without --force
    (profile and calibrate share a profiles directory); `paths`: the files it usually writes, checked
    for collisions before any work starts (the exact list is checked again when the files are moved)."""

    what: str  # for messages: "plan", "launcher files", ...
    writer: str
    family: str
    paths: tuple[str, ...] = ()
    has_force: bool = True  # the command has a --force option (--plot has none)
    # (writer, subdirectory ending in '/', where this kind writes: a prefix): files that another command wrote
    # into that subdirectory of the manifest's directory which are this kind's files too, when this command
    # writes at that prefix: `emit --out DIR/launch` ("launch/") replaces the launcher files of solve --out DIR,
    # and `solve --out DIR` ("") the ones emit wrote into DIR/launch; `emit --out DIR` replaces none of them
    earlier_from: tuple[tuple[str, str, str], ...] = ()

    def is_earlier(self, writer: str | None, rel: str, prefix: str, family: str | None) -> bool:
        """Whether the planner's file `rel` (written by `writer`, in the directory of the manifest of
        `family`) is an earlier output of this kind when writing into that directory's `prefix`
        subdirectory.  This command's own file is one, but not in a subdirectory of its own family's output:
        there it is part of that output, written at its top (S/launch/launch.sh of `solve --out S` is no
        earlier output of `solve --out S/launch`); in another family's directory it was written at a prefix
        (`emit --out S/launch`)."""
        if writer == self.writer:
            return not prefix or family != self.family
        return any(writer == w and prefix == at and rel.startswith(sub) for w, sub, at in self.earlier_from)


PLOT_FILES = ("placement.png", "placement.json", "timeline.png", "timeline.json", "timeline.csv", "memory.png",
              "memory.json", "placement_vs_yours.png", "placement_vs_yours.json", "summary.md")
PLAN_OUTPUT = OutputKind("plan", "solve --out", "plan",
                         ("plan.json", "inputs.json", "summary.md", "launch/launch.sh", "launch/megatron_args.txt",
                          "launch/hostfile", *(f"plots/{p}" for p in PLOT_FILES if p != "summary.md"),
                          "trials/pick/launch.sh", "trials/pick/plan.json"),
                         earlier_from=(("emit --out", "launch/", ""),))
PLOTS_OUTPUT = OutputKind("pictures", "--plot", "plots", PLOT_FILES, has_force=False)
LAUNCHER_OUTPUT = OutputKind("launcher files", "emit --out", "launcher", ("launch.sh", "megatron_args.txt", "hostfile"),
                             earlier_from=(("solve --out", "launch/", "launch/"),))
PROFILE_OUTPUT = OutputKind("profiles directory", "profile --out", "profiles", ("profile_report.json",))
CALIBRATE_OUTPUT = OutputKind("profiles directory", "calibrate --out", "profiles",
                              ("corrections.yaml", "calibration_report.json", "moe_imbalance.yaml", "evidence.yaml",
                               "measured_plans.json"))
BENCH_OUTPUT = OutputKind("bench results", "bench --out", "bench",  # planner/bench.py BENCH_FILES (a test checks)
                          ("results.csv", "scaling.csv", "summary.json", "table2.md", "table3.md", "search_time.md",
                           "flagscale_tuner.md"))
_KINDS = (PLAN_OUTPUT, PLOTS_OUTPUT, LAUNCHER_OUTPUT, PROFILE_OUTPUT, CALIBRATE_OUTPUT, BENCH_OUTPUT)


def check_out_dir(path: str | os.PathLike[str], flag: str, kind: OutputKind, *, force: bool = False,
                  inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path:
    """The output directory, checked (see the module docstring); nothing is created."""
    text = os.fspath(path)
    if not text.strip():
        raise PlannerInputError(flag, "empty; give a directory to write into")
    found = path_kind(text, flag)
    if found == "missing" and os.path.islink(text):
        raise PlannerInputError(flag, f"{text} is a symbolic link to {os.readlink(text)}, which does not exist; "
                                      "remove the link or give another directory")
    if found in ("file", "other"):
        why = " (it is an input of this command)" if _is_input(Path(text), _inputs(inputs)) else ""
        raise PlannerInputError(flag, f"{text} exists and is not a directory{why}")
    if found == "dir":
        out = Path(text)
        root, prefix = _recorded_in(out)
        _check_existing(root, flag, kind, force, _inputs(inputs), [prefix + p for p in kind.paths], prefix=prefix)
        _probe_writable(out, flag)
        return out
    ancestor = Path(os.path.abspath(text)).parent
    while path_kind(ancestor, flag) == "missing":
        ancestor = ancestor.parent
    if path_kind(ancestor, flag) != "dir":
        raise PlannerInputError(flag, f"cannot create {text}: {ancestor} is a file, not a directory")
    _probe_writable(ancestor, flag, target=text)
    return Path(text)


def _inputs(paths: Iterable[str | os.PathLike[str] | None]) -> list[Path]:
    return [Path(p) for p in paths if p is not None and os.fspath(p) and os.path.exists(p)]


def _is_input(path: Path, inputs: Sequence[Path]) -> bool:
    for p in inputs:
        with contextlib.suppress(OSError):
            if os.path.samefile(path, p):
                return True
    return False


def _recorded_in(out: Path, levels: int = 8) -> tuple[Path, str]:
    """(the directory whose manifest records what is written into the existing directory `out`, `out`'s
    path inside it as a prefix ending in '/'): `out` itself ("") when it has a manifest or none above it
    lists a file in it; else the planner's output above it (at most `levels` up) that holds files in `out`,
    e.g. the launch/ directory of `solve --out DIR`, which `emit --out DIR/launch` writes into."""
    if read_manifest(out)[0] is not None:
        return out, ""
    here = Path(os.path.abspath(out))
    for parent in list(here.parents)[:levels]:
        family, listed = read_manifest(parent)
        if family is None:
            continue
        prefix = here.relative_to(parent).as_posix() + "/"
        if any(rel.startswith(prefix) and os.path.lexists(parent / rel) for rel in listed):
            return parent, prefix
    return out, ""


def _check_existing(out: Path, flag: str, kind: OutputKind, force: bool, inputs: Sequence[Path],
                    new_paths: Iterable[str], prefix: str = "") -> Survey:
    """Refuse to write `new_paths` into the existing directory `out` when that would touch a file the
    planner did not write or an input, or when `out` (its part under `prefix`) is neither empty, nor an
    earlier output of the same command or family, nor --force."""
    found = survey(out)
    for rel in [*new_paths, MANIFEST_NAME]:
        dest = out / rel
        if _is_input(dest, inputs):
            raise PlannerInputError(flag, f"{dest} is an input of this command; the planner never writes over its "
                                          "inputs: choose another directory")
        blocker = _blocker(out, rel, found)
        if blocker is not None:
            owner = _outer_output(out / blocker)
            if owner is not None:
                raise PlannerInputError(flag, f"{out / blocker} belongs to the planner's output in {owner} (its "
                                              f"{MANIFEST_NAME} lists it); writing here would leave that output "
                                              "inconsistent: choose another directory")
            raise PlannerInputError(flag, f"{out / blocker} {_whose(blocker, found)}; the planner never overwrites or "
                                          "deletes files it did not write (--force neither): move it, or choose "
                                          "another directory")
    part = found if not prefix else found.within(prefix)
    earlier = any(kind.is_earlier(found.writer_of(r), r, prefix, found.family) for r in part.ours)
    if part.empty or earlier or (found.family == kind.family and not prefix) or force:
        return found
    if found.family == kind.family:
        raise PlannerInputError(flag, _inside_own_output(out, prefix, kind))
    mine = f" (it holds the planner's {found.family} files, not {_article(kind.what)})" if found.family else ""
    users = part.users_files()
    example = f"; not written by the planner: {', '.join(users[:3])}{', ...' if len(users) > 3 else ''}" if users else ""
    hint = (", or add --force to write beside those files (files the planner did not write are never overwritten "
            "or deleted)"
            if kind.has_force else "")
    raise PlannerInputError(
        flag, f"{out / prefix} is a non-empty directory that holds no earlier {kind.what}{mine}{example}; choose a new "
              f"or empty directory{hint}")


def _inside_own_output(out: Path, prefix: str, kind: OutputKind) -> str:
    """Why writing into the `prefix` subdirectory of an output of this kind's own family is refused (`solve
    --out S/launch` would put a plan among S's launcher files), naming the command that rewrites it."""
    here = out / prefix.rstrip("/")
    rewriters = [k for k in _KINDS if (kind.writer, prefix, prefix) in k.earlier_from]
    how = "".join(f"to rewrite that {kind.what}'s {k.what}, use `{k.writer} {here}`, or " for k in rewriters[:1])
    return f"{here} is the {prefix} directory of the planner's {kind.what} in {out}; {how}choose another directory"


def _article(what: str) -> str:
    return f"a {what}" if what in ("plan",) else what


def _whose(rel: str, found: Survey) -> str:
    if rel in found.changed:
        return "was changed after the planner wrote it and would be overwritten"
    if rel == MANIFEST_NAME:
        return "is not a manifest the planner can read and would be overwritten"
    return "was not written by the planner and would be overwritten"


def _blocker(out: Path, rel: str, found: Survey) -> str | None:
    """The path (relative) that stops `rel` from being written: a user's file or link at `rel` or at
    one of its parent directories; None when `rel` is free or the planner's own unchanged file."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        p = out / parent
        if os.path.lexists(p) and (p.is_symlink() or not p.is_dir()):
            return parent
    dest = out / rel
    if not os.path.lexists(dest):
        return None
    if dest.is_dir() and not dest.is_symlink():
        return rel
    if rel == MANIFEST_NAME:
        return None if found.family is not None else rel
    return None if rel in found.ours else rel


def _outer_output(path: Path, levels: int = 8) -> Path | None:
    """The nearest directory above `path` (at most `levels` up) whose manifest lists it, unchanged."""
    here = Path(os.path.abspath(path))
    for parent in list(here.parents)[1:levels + 1]:
        family, listed = read_manifest(parent)
        if family is None:
            continue
        rel = here.relative_to(parent).as_posix()
        entry = listed.get(rel)
        if entry is not None and entry_unchanged(here, entry):
            return parent
    return None


def _probe_writable(directory: Path, flag: str, target: str | None = None) -> None:
    """Create and remove a temporary directory: the only reliable test on every file system."""
    try:
        probe = tempfile.mkdtemp(prefix=STAGING_PREFIX + "probe-", dir=directory)
        os.rmdir(probe)
    except OSError as exc:
        what = f"create {target}" if target else f"write into {directory}"
        raise PlannerInputError(flag, f"cannot {what}: {exc.strerror or exc} (in {directory})") from None


class StagedOutput:
    """A temporary directory to fill; on a normal exit its files are published into DIR all-or-nothing
    (see the module docstring), and on an error or a signal it is removed and DIR is left as it was.
    It is made where the files will go, so that they are moved, not copied: inside DIR when DIR exists
    (a mount point, or a link to another file system, included), else beside it.

        staged = StagedOutput(out_dir, "--out", PLAN_OUTPUT, inputs=[script_path])
        with staged as tmp:
            (tmp / "plan.json").write_text(...)
        written = staged.written
    """

    def __init__(self, out_dir: str | os.PathLike[str], flag: str, kind: OutputKind, *, force: bool = False,
                 inputs: Iterable[str | os.PathLike[str] | None] = ()):
        self.out, self.flag, self.kind, self.force = Path(out_dir), flag, kind, force
        self.inputs = _inputs(inputs)
        self.written: list[Path] = []
        self._tmp: Path | None = None

    def __enter__(self) -> Path:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            where = _recorded_in(self.out)[0] if self.out.is_dir() else self.out.parent
            with held_signals():
                self._tmp = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=where))
            self._tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700; DIR gets the mode mkdir would give it
        except OSError as exc:
            raise PlannerInputError(self.flag, f"cannot create {self.out}: {exc.strerror or exc}") from None
        return self._tmp

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        tmp = self._tmp
        assert tmp is not None
        with held_signals():
            try:
                if exc_type is None:
                    self.written = self._publish(tmp)
            except OSError as err:
                raise PlannerInputError(self.flag, f"cannot write {self.out}: {err.strerror or err}") from None
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return False

    def _publish(self, tmp: Path) -> list[Path]:
        new = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file() or p.is_symlink())
        if MANIFEST_NAME in new:
            raise PlannerInputError(self.flag, f"an output file may not be named {MANIFEST_NAME}")
        if not os.path.lexists(self.out):
            (tmp / MANIFEST_NAME).write_text(manifest_text([entry_for(tmp / r, r, self.kind.writer) for r in new],
                                                           self.kind.family))
            os.rename(tmp, self.out)  # the cleanup's rmtree of `tmp` then finds nothing
            return [self.out / r for r in new]
        root, prefix = _recorded_in(self.out)
        staged = {prefix + r: tmp / r for r in new}
        found = _check_existing(root, self.flag, self.kind, self.force, self.inputs, staged, prefix=prefix)
        _swap_in(staged, root, prefix, found, self.kind, self.inputs)
        return [self.out / r for r in new]


def _swap_in(staged: Mapping[str, Path], out: Path, prefix: str, found: Survey, kind: OutputKind,
             inputs: Sequence[Path]) -> None:
    """Move the staged files {path in `out`: staged file} into `out`.  The planner's earlier files of the
    same kind (OutputKind.is_earlier) under `prefix` that the new output does not have are removed (never an input); the
    planner's files it replaces are set aside first and put back if a move fails.  The manifest is
    written last, with the directory's family (another command's output written into keeps its own)."""
    entries = {r: entry_for(src, r, kind.writer) for r, src in staged.items()}
    stale = sorted(r for r in found.ours if kind.is_earlier(found.writer_of(r), r, prefix, found.family)
                   and r.startswith(prefix) and r not in entries and not _is_input(out / r, inputs))
    keep = [found.listed[r] for r in sorted(found.ours) if r not in entries and r not in stale]
    aside = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX + "old-", dir=out))
    moved_aside: list[str] = []
    moved_in: list[str] = []
    made: list[Path] = []
    try:
        for rel in [*staged, *stale, MANIFEST_NAME]:
            if os.path.lexists(out / rel) and (rel in found.ours or rel == MANIFEST_NAME):
                (aside / rel).parent.mkdir(parents=True, exist_ok=True)
                _move(out / rel, aside / rel)
                moved_aside.append(rel)
        for rel, src in staged.items():
            made += _make_parents(out, rel)
            _move(src, out / rel)
            moved_in.append(rel)
        manifest = aside / (STAGING_PREFIX + MANIFEST_NAME)  # aside/MANIFEST_NAME is the earlier one
        manifest.write_text(manifest_text([*keep, *entries.values()], found.family or kind.family))
        _move(manifest, out / MANIFEST_NAME)
    except OSError:
        for rel in moved_in:
            (out / rel).unlink(missing_ok=True)
        for rel in moved_aside:
            _move(aside / rel, out / rel)
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    _remove_emptied(out, stale)


def _move(src: Path, dest: Path) -> None:
    """Rename `src` to `dest`, replacing it; where they are on different file systems (a mount point
    below DIR), copy into a staging file beside `dest` and rename that, so `dest` is never half-written."""
    try:
        os.replace(src, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        fd, part = tempfile.mkstemp(prefix=STAGING_PREFIX, dir=dest.parent)
        os.close(fd)
        try:
            shutil.copy2(src, part)
            os.replace(part, dest)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(part)
            raise
        os.unlink(src)


def _make_parents(out: Path, rel: str) -> list[Path]:
    made = []
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = out.joinpath(*parts[:i])
        if not d.exists():
            d.mkdir()
            made.append(d)
    return made


def _remove_emptied(out: Path, removed: list[str]) -> None:
    """Remove the directories (under `out`, never `out` itself) that removing `removed` left empty."""
    dirs = sorted({out.joinpath(*r.split("/")[:i]) for r in removed for i in range(1, r.count("/") + 1)},
                  key=lambda p: -len(p.parts))
    for d in dirs:
        with contextlib.suppress(OSError):
            d.rmdir()  # only succeeds when empty


def fill(directory: Path, files: Mapping[str, str | bytes], *, executable: tuple[str, ...] = (".sh",)) -> None:
    """Write {relative path: text or bytes} under `directory` (a staging directory); names ending in
    `executable` are made executable."""
    for rel, content in files.items():
        dest = directory / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            dest.write_bytes(content)
        else:
            dest.write_text(content, encoding="utf-8")
        if dest.name.endswith(executable):
            dest.chmod(dest.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def write_files(
    out_dir: str | os.PathLike[str],
    files: Mapping[str, str | bytes],
    flag: str,
    kind: OutputKind,
    *,
    executable: tuple[str, ...] = (".sh",),
    force: bool = False,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
) -> list[Path]:
    """Write {relative path: text or bytes} into `out_dir`, all-or-nothing; return the paths in the order given."""
    staged = StagedOutput(out_dir, flag, kind, force=force, inputs=inputs)
    with staged as tmp:
        try:
            fill(tmp, files, executable=executable)
        except OSError as exc:
            raise PlannerInputError(flag, f"cannot write {out_dir}: {exc.strerror or exc}") from None
    return [Path(out_dir) / rel for rel in files]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


__all__ = [
    "BENCH_OUTPUT", "CALIBRATE_OUTPUT", "LAUNCHER_OUTPUT", "OutputKind", "PLAN_OUTPUT", "PLOTS_OUTPUT",
    "PROFILE_OUTPUT", "StagedOutput", "check_out_dir", "fill", "held_signals", "write_files",
]
