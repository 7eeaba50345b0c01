"""The one staged writer: every command that writes a directory fills a staging directory beside it,
then moves it into place, so an error never leaves half-written files behind.

`check_out_dir` runs first in every command that writes (before the search, before torch is
imported).  It refuses, in one line naming the flag:
- an empty path, a path too long for the system, a path through a regular file, an existing file;
- a place where nothing can be created (a read-only or virtual file system such as /proc);
- an existing non-empty directory that holds no earlier output of the same command, unless
  `--force` is given.  An earlier output (`OutputKind.markers`) is replaced by the new one.

`StagedOutput` gives a temporary directory beside DIR to fill.  When it is complete it is published
in one of two ways:
- replace (`--out DIR`): it becomes DIR (a rename, when DIR does not exist), or its entries are
  swapped in (the command's earlier entries are kept aside until the new ones are in place, and put
  back if anything fails).  Other files in DIR are never touched.
- merge (`--plot DIR`): each staged file replaces the file of the same path under DIR; everything
  else in DIR stays.
`write_files` does this for {relative path: text or bytes}; `fill` writes such a mapping into a
directory that is already staged.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from planner.errors import PlannerInputError
from planner.inputs.files import path_kind


@dataclass(frozen=True)
class OutputKind:
    """What a command writes into --out.  `markers`: top-level entries that show an earlier output of
    the command (then DIR may be written again); `owned`: the entries a new output replaces as a whole,
    even where the new output has no entry of that name (a stale FlagScale config, say)."""

    what: str  # for messages: "a plan", "launcher files", ...
    markers: tuple[str, ...]
    owned: tuple[str, ...] = ()


PLAN_OUTPUT = OutputKind("plan", ("plan.json", "inputs.json", "summary.md", "launch"),
                         owned=("plan.json", "inputs.json", "summary.md", "launch", "plots"))
LAUNCHER_OUTPUT = OutputKind("launcher files", ("launch.sh", "megatron_args.txt", "hostfile"),
                             owned=("launch.sh", "megatron_args.txt", "hostfile", "flagscale", "slurm_hostfile.nodes",
                                    "slurm_hostfile.ranks"))
PROFILES_OUTPUT = OutputKind(  # profile and calibrate write into one profiles directory, each its own files
    "profiles directory",
    ("corrections.yaml", "calibration_report.json", "moe_imbalance.yaml", "devices", "profile_report.json",
     "links.yaml", "clusters"),
)
BENCH_OUTPUT = OutputKind("bench results", ("results.csv", "summary.json", "table2.md", "table3.md", "search_time.md"))


def check_out_dir(path: str | os.PathLike[str], flag: str, kind: OutputKind, *, force: bool = False) -> Path:
    """The output directory, checked (see the module docstring); nothing is created."""
    text = os.fspath(path)
    if not text.strip():
        raise PlannerInputError(flag, "empty; give a directory to write into")
    found = path_kind(text, flag)
    if found == "file" or found == "other":
        raise PlannerInputError(flag, f"{text} exists and is not a directory")
    if found == "dir":
        try:
            entries = os.listdir(text)
        except OSError as exc:
            raise PlannerInputError(flag, f"cannot list {text}: {exc.strerror or exc}") from None
        earlier = [e for e in entries if e in kind.markers]
        if entries and not earlier and not force:
            raise PlannerInputError(
                flag,
                f"{text} is a non-empty directory that holds no earlier {kind.what} "
                f"({len(entries)} entries, e.g. {sorted(entries)[0]!r}); choose a new or empty directory, "
                "or add --force to write into it anyway",
            )
        _probe_writable(Path(text), flag)
        return Path(text)
    ancestor = Path(os.path.abspath(text)).parent
    while path_kind(ancestor, flag) == "missing":
        ancestor = ancestor.parent
    if path_kind(ancestor, flag) != "dir":
        raise PlannerInputError(flag, f"cannot create {text}: {ancestor} is a file, not a directory")
    _probe_writable(ancestor, flag, target=text)
    return Path(text)


def _probe_writable(directory: Path, flag: str, target: str | None = None) -> None:
    """Create and remove a temporary directory: the only reliable test on every file system."""
    try:
        probe = tempfile.mkdtemp(prefix=".hapmoe-probe-", dir=directory)
        os.rmdir(probe)
    except OSError as exc:
        what = f"create {target}" if target else f"write into {directory}"
        raise PlannerInputError(flag, f"cannot {what}: {exc.strerror or exc} (in {directory})") from None


class StagedOutput:
    """A temporary directory beside DIR to fill (text, pictures, anything); on a normal exit it is published
    into DIR all-or-nothing (see the module docstring for replace and merge), and on an error it is removed
    and DIR is left as it was.

        staged = StagedOutput(out_dir, "--out", PLAN_OUTPUT)
        with staged as tmp:
            (tmp / "plan.json").write_text(...)
        written = staged.written

    `flag` is the option a file-system refusal names (a PlannerInputError); with None the OSError
    itself goes up, worded by the file system (`--plot DIR`).  `kind` is needed to replace, not to merge.
    """

    def __init__(self, out_dir: str | os.PathLike[str], flag: str | None, kind: OutputKind | None = None, *,
                 merge: bool = False):
        if kind is None and not merge:
            raise ValueError("StagedOutput: replacing DIR's entries needs the OutputKind that owns them")
        self.out, self.flag, self.kind, self.merge = Path(out_dir), flag, kind, merge
        self.written: list[Path] = []
        self._tmp: Path | None = None

    def __enter__(self) -> Path:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = Path(tempfile.mkdtemp(prefix=".hapmoe-", dir=self.out.parent))
            self._tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700; DIR gets the mode mkdir would give it
        except OSError as exc:
            if self.flag is None:
                raise
            raise PlannerInputError(self.flag, f"cannot create {self.out}: {exc.strerror or exc}") from None
        return self._tmp

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        tmp = self._tmp
        assert tmp is not None
        try:
            if exc_type is None:
                self.written = self._publish(tmp)
        except OSError as err:
            if self.flag is None:
                raise
            raise PlannerInputError(self.flag, f"cannot write {self.out}: {err.strerror or err}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return False

    def _publish(self, tmp: Path) -> list[Path]:
        if self.merge:
            return _move_into(tmp, self.out)
        assert self.kind is not None
        relative = sorted(p.relative_to(tmp) for p in tmp.rglob("*") if p.is_file())
        if not self.out.exists():
            os.rename(tmp, self.out)
        else:
            _swap_in(tmp, self.out, self.kind)
        return [self.out / rel for rel in relative]


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
) -> list[Path]:
    """Write {relative path: text or bytes} into `out_dir`, all-or-nothing; return the paths in the order given."""
    staged = StagedOutput(out_dir, flag, kind)
    with staged as tmp:
        try:
            fill(tmp, files, executable=executable)
        except OSError as exc:
            raise PlannerInputError(flag, f"cannot write {out_dir}: {exc.strerror or exc}") from None
    return [Path(out_dir) / rel for rel in files]


def _swap_in(tmp: Path, out: Path, kind: OutputKind) -> None:
    """Move the new top-level entries of `tmp` into `out`; the command's earlier entries (and any entry
    the new output replaces) are set aside first and restored if a move fails."""
    new = sorted(os.listdir(tmp))
    aside = Path(tempfile.mkdtemp(prefix=".hapmoe-old-", dir=out.parent))
    moved_aside: list[str] = []
    moved_in: list[str] = []
    try:
        for name in sorted(set(kind.owned) | set(new)):
            if os.path.lexists(out / name):
                os.replace(out / name, aside / name)
                moved_aside.append(name)
        for name in new:
            os.replace(tmp / name, out / name)
            moved_in.append(name)
    except OSError:
        for name in moved_in:
            _remove(out / name)
        for name in moved_aside:
            os.replace(aside / name, out / name)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _move_into(tmp: Path, dest: Path) -> list[Path]:
    """Move every file under `tmp` to the same place under `dest`; returns the moved paths."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for item in sorted(tmp.rglob("*")):
        if item.is_file():
            target = dest / item.relative_to(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(item), target)
            written.append(target)
    return written


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


__all__ = [
    "BENCH_OUTPUT", "LAUNCHER_OUTPUT", "OutputKind", "PLAN_OUTPUT", "PROFILES_OUTPUT", "StagedOutput",
    "check_out_dir", "fill", "write_files",
]
